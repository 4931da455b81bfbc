"""unitreg: a registry of length units in metres."""

from unitreg.convert import convert, lookup
from unitreg.registry import clear, register, registered

__all__ = ["register", "registered", "clear", "lookup", "convert"]
