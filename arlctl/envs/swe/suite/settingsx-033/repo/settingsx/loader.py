"""Merge overrides on top of the defaults."""

from settingsx.defaults import DEFAULTS
from settingsx.validate import check


def load(overrides):
    settings = DEFAULTS
    settings.update(overrides)
    check(settings)
    return settings
