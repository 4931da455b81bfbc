"""Counting words."""

from collections import Counter

from wordstat.tokens import words


def word_count(text):
    return len(words(text))


def top_words(text, n=3):
    counts = Counter(words(text))
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
