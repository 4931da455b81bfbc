"""phonecheck: validate and normalise phone numbers."""

from phonecheck.normalize import normalize
from phonecheck.validate import is_valid

__all__ = ["is_valid", "normalize"]
