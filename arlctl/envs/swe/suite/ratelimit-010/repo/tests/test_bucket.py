from ratelimit import FakeClock, TokenBucket


def test_burst_then_block():
    bucket = TokenBucket(3, 1.0, FakeClock())
    assert [bucket.allow() for _ in range(4)] == [True, True, True, False]


def test_refill():
    clock = FakeClock()
    bucket = TokenBucket(1, 2.0, clock)
    assert bucket.allow()
    assert not bucket.allow()
    clock.advance(0.5)
    assert bucket.allow()
