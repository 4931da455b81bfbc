"""Per-file statistics."""

from bytecount.reader import read_text


def char_count(path):
    return len(read_text(path).rstrip("\n"))


def longest_line(path):
    lines = read_text(path).splitlines()
    return max(lines, key=len) if lines else ""
