"""Split a string into text and digit runs."""

import re

_RUNS = re.compile(r"(\d+)")


def runs(text):
    return [part for part in _RUNS.split(text) if part != ""]
