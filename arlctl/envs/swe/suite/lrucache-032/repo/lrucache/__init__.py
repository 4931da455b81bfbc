"""lrucache: a bounded least-recently-used cache with stats."""

from lrucache.cache import LRUCache

__all__ = ["LRUCache"]
