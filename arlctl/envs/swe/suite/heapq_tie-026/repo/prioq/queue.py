"""A min-priority queue on heapq."""

import heapq


class PriorityQueue:
    def __init__(self):
        self._heap = []

    def push(self, priority, job):
        heapq.heappush(self._heap, (priority, job))

    def pop(self):
        if not self._heap:
            raise IndexError("pop from empty queue")
        return heapq.heappop(self._heap)[-1]

    def __len__(self):
        return len(self._heap)
