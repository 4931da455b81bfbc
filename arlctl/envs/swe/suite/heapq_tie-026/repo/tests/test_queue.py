from prioq import Job, PriorityQueue


def test_order():
    q = PriorityQueue()
    q.push(3, Job("c"))
    q.push(1, Job("a"))
    q.push(2, Job("b"))
    assert [q.pop().name for _ in range(3)] == ["a", "b", "c"]
