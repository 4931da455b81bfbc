"""Lookups and conversions through the shared registry."""

from unitreg.registry import _units as UNITS


def lookup(name):
    return UNITS[name]


def convert(value, src, dst):
    return value * lookup(src) / lookup(dst)
