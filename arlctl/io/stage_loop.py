"""How every stage runs once (cron) or as a daemon (--watch), under its run lock (no CLI here: a stage's
job and `arlctl <stage>` both call it).

`run_stage` takes the stage's `once(stop)` (process everything pending, return a summary) and:
  - holds a RunLock on the stage's output (per worker share), so two cron-launched copies never
    overlap: the second waits up to --lock-wait seconds, else exits 75 with a message naming the holder;
  - without --watch, calls once() and returns its summary; SIGTERM/SIGINT set its `stop` too, so a stage
    that checks it (train between steps, reward between shards) ends at a unit boundary, committed;
  - with --watch, calls once() every --poll seconds until SIGTERM/SIGINT, which lets the current round
    finish and commit; `on_round` sees each round's summary (print it, log it).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any


def run_stage(once: Callable[[threading.Event | None], dict[str, Any]], *, out: str, lock_name: str,
              watch: bool, poll: float, lock_wait: float, dry_run: bool = False,
              units: Callable[[dict[str, Any]], int] = lambda s: 1,
              on_round: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    from arlctl.io.lock import RunLock
    from arlctl.io.watch import GracefulStop, watch_loop

    rounds: list[dict[str, Any]] = []

    def step(stop: threading.Event | None) -> int:
        summary = once(stop)
        rounds.append(summary)
        if on_round is not None:
            on_round(summary)
        return units(summary)

    stop = threading.Event()
    with contextlib.nullcontext() if dry_run else RunLock(out, lock_name, wait_s=lock_wait):
        if watch:
            watch_loop(lambda: step(stop), poll, stop=stop)
        else:
            with GracefulStop(stop):
                step(stop)
    return rounds
