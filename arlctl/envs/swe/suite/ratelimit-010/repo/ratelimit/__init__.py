"""ratelimit: a token bucket with an injectable clock."""

from ratelimit.bucket import TokenBucket
from ratelimit.clock import FakeClock

__all__ = ["TokenBucket", "FakeClock"]
