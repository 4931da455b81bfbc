"""Hit and miss counters."""


class Stats:
    def __init__(self):
        self.hits = 0
        self.misses = 0

    def ratio(self):
        total = self.hits + self.misses
        return self.hits / total if total else 0.0
