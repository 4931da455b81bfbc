"""Scale-out by partition: `--worker I/N` gives each of N copies of a stage a disjoint share of the shards.

Worker I (numbered from 0, like a Kubernetes indexed Job's completion index) owns a shard when
sha256(basename) mod N == I. The hash depends only on the shard's name — not on the process, the machine
or Python's per-process `hash()` seed — so N workers on N machines never take the same shard and
together take all of them, with no coordination beyond agreeing on N.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Iterable

from arlctl.errors import UsageError

_HINT = "write --worker I/N with 0 <= I < N, e.g. --worker 0/4 ... --worker 3/4 for four workers"


def parse_worker(spec: str | None) -> tuple[int, int]:
    """Parse "I/N" into (i, n). None or "" means a single worker: (0, 1)."""
    if spec is None or spec.strip() == "":
        return 0, 1
    text = spec.strip()
    parts = text.split("/")
    if len(parts) != 2:
        raise UsageError(f"--worker {text!r}: expected I/N, e.g. 0/4", hint=_HINT)
    try:
        i, n = int(parts[0]), int(parts[1])
    except ValueError:
        raise UsageError(f"--worker {text!r}: I and N must be whole numbers", hint=_HINT) from None
    if n < 1:
        raise UsageError(f"--worker {text!r}: N (the number of workers) must be at least 1", hint=_HINT)
    if not 0 <= i < n:
        raise UsageError(
            f"--worker {text!r}: I must be in 0..{n - 1} (workers are numbered from 0)", hint=_HINT
        )
    return i, n


def shard_bucket(name: str, n: int) -> int:
    """The worker index in 0..n-1 that owns `name` (a URL, path or basename: only the basename counts)."""
    base = posixpath.basename(name.rstrip("/"))
    digest = hashlib.sha256(base.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % n


def owns(name: str, i: int, n: int) -> bool:
    """True when worker i of n owns the shard `name`."""
    return n <= 1 or shard_bucket(name, n) == i


def partition(names: Iterable[str], i: int, n: int) -> list[str]:
    """The subset of `names` that worker i of n owns, in the given order."""
    return [name for name in names if owns(name, i, n)]


__all__ = ["owns", "parse_worker", "partition", "shard_bucket"]
