"""Clocks: the real monotonic clock, and a fake one tests can advance."""

import time


class MonotonicClock:
    def now(self):
        return time.monotonic()


class FakeClock:
    def __init__(self, start=0.0):
        self.t = start

    def now(self):
        return self.t

    def advance(self, seconds):
        self.t += seconds
