"""prioq: a priority queue of jobs."""

from prioq.jobs import Job
from prioq.queue import PriorityQueue

__all__ = ["Job", "PriorityQueue"]
