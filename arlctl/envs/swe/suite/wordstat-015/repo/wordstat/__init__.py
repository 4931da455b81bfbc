"""wordstat: word counts and frequencies."""

from wordstat.counts import top_words, word_count

__all__ = ["word_count", "top_words"]
