"""Validation."""


def check(settings):
    if not isinstance(settings["workers"], int) or settings["workers"] < 1:
        raise ValueError("workers must be a positive int")
