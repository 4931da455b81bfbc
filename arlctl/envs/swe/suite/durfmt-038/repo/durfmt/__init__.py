"""durfmt: human-readable durations."""

from durfmt.format import format_duration
from durfmt.parse import parse_duration

__all__ = ["format_duration", "parse_duration"]
