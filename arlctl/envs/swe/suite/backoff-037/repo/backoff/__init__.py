"""backoff: retry with capped exponential backoff."""

from backoff.delays import delay_for, schedule
from backoff.retry import retry

__all__ = ["delay_for", "schedule", "retry"]
