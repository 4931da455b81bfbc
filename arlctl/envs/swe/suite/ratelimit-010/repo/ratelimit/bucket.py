"""Token bucket: capacity tokens, refilled at rate tokens per second."""

from ratelimit.clock import MonotonicClock


class TokenBucket:
    def __init__(self, capacity, rate, clock=None):
        self.capacity = capacity
        self.rate = rate
        self.clock = clock or MonotonicClock()
        self.tokens = float(capacity)
        self.updated = self.clock.now()

    def _refill(self):
        now = self.clock.now()
        self.tokens = self.tokens + (now - self.updated) * self.rate
        self.updated = now

    def allow(self):
        self._refill()
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False
