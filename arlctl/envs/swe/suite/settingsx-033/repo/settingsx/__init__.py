"""settingsx: layered settings."""

from settingsx.defaults import DEFAULTS
from settingsx.loader import load

__all__ = ["DEFAULTS", "load"]
