from lrucache import LRUCache


def test_evicts_oldest():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.put("c", 3)
    assert c.keys() == ["b", "c"]


def test_stats():
    c = LRUCache(1)
    c.put("a", 1)
    c.get("a")
    c.get("z")
    assert c.stats.ratio() == 0.5
