"""bytecount: statistics of UTF-8 text files."""

from bytecount.stats import char_count, longest_line

__all__ = ["char_count", "longest_line"]
