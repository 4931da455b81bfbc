"""triex: a prefix tree of words."""

from triex.trie import Trie

__all__ = ["Trie"]
