from tallyho import summarize


def test_list():
    assert summarize([2, 4]) == {"count": 2, "total": 6, "mean": 3.0}


def test_empty():
    assert summarize([]) == {"count": 0, "total": 0, "mean": 0.0}
