"""Environments: the Env protocol (base.py) and the math, swe and code environments."""
