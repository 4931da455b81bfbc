"""Reading files as text. Files are UTF-8."""

from pathlib import Path


def read_text(path):
    return Path(path).read_bytes().decode("latin-1")
