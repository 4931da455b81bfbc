"""Daemon mode (`--watch`): poll, process what is new, sleep; stop cleanly on SIGTERM/SIGINT.

`watch_loop` drives a stage's `process_once()` (which handles everything pending and returns how many
units it committed). A signal only sets a stop flag: the unit in progress finishes and commits, and the
loop exits before starting another, so a signal never interrupts a write. A round with a long backlog
should check the same `stop` event between units (pass it to both) so a stop need not drain it. Transient errors (a held lock,
a store that is down, an input not ready) never end the loop: they are logged and retried with
exponential backoff up to a cap; an OSError from the store counts as transient. Typed terminal errors
(and PermissionError) are logged and retried the same way unless `fail_fast=True`, which re-raises them.
Any other exception is a bug and propagates (a supervisor such as `arlctl up` restarts the daemon).

`GracefulStop` is the signal-to-flag helper behind it, usable from plain and from asyncio code (rollout):

    async with GracefulStop() as stop:
        while not stop.is_set():
            ...                       # one trajectory batch
            await stop.wait(poll_s)   # an interruptible sleep
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from arlctl.errors import ArlctlError

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class GracefulStop:
    """A stop flag that SIGTERM/SIGINT set. Handlers are installed on enter (main thread only) and the
    previous ones restored on exit. `signal_received` names the signal, or None if stopped otherwise."""

    def __init__(self, event: threading.Event | None = None):
        self.event = event or threading.Event()
        self.signal_received: str | None = None
        self._previous: dict[int, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._async_event: asyncio.Event | None = None

    def is_set(self) -> bool:
        return self.event.is_set()

    def set(self) -> None:
        self.event.set()
        if self._loop is not None and self._async_event is not None:
            self._loop.call_soon_threadsafe(self._async_event.set)

    def sleep(self, seconds: float) -> bool:
        """Sleep up to `seconds`, waking at once on stop. Returns True if stopping."""
        return self.event.wait(max(0.0, seconds))

    async def wait(self, seconds: float) -> bool:
        """The asyncio form of `sleep` (needs `async with`). Returns True if stopping."""
        assert self._async_event is not None, "use `async with GracefulStop()` for async waits"
        try:
            await asyncio.wait_for(self._async_event.wait(), timeout=max(0.0, seconds))
        except TimeoutError:
            pass
        return self.is_set()

    def _handle(self, signum: int, frame: Any) -> None:
        # Only set a flag: raising here could interrupt a half-done write.
        name = signal.Signals(signum).name
        if self.signal_received is None:
            log.warning("%s received: finishing the current unit, then stopping", name)
        self.signal_received = self.signal_received or name
        self.set()

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    async def __aenter__(self) -> GracefulStop:
        self._loop = asyncio.get_running_loop()
        self._async_event = asyncio.Event()
        if self.event.is_set():
            self._async_event.set()
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__()
        self._loop = self._async_event = None


def is_transient(err: BaseException) -> bool:
    """Typed errors say so themselves; an OSError from a store (connection reset, timeout, disk full, a
    file gone between list and read) is worth retrying, except a permission problem."""
    if isinstance(err, ArlctlError):
        return err.transient
    return isinstance(err, OSError) and not isinstance(err, PermissionError)


@dataclass
class WatchStats:
    units: int = 0  # units committed, summed over process_once() calls
    rounds: int = 0  # process_once() calls
    transient_errors: int = 0
    terminal_errors: int = 0
    stopped_by: str = ""  # "SIGTERM", "SIGINT", "stop" (event set by the caller) or "idle"


def watch_loop(
    process_once: Callable[[], int],
    poll_s: float,
    stop: threading.Event | None = None,
    idle_exit_after: float | None = None,
    fail_fast: bool = False,
    backoff_cap_s: float = 60.0,
    backoff_start_s: float = 1.0,
) -> WatchStats:
    """Run `process_once()` until stopped. Returns what happened.

    poll_s: sleep between rounds that processed nothing (a round that did work is followed at once).
    stop: an event another thread may set; SIGTERM/SIGINT set it too when called from the main thread.
    idle_exit_after: return once nothing was processed for this many seconds (tests, drains).
    backoff_start_s, backoff_cap_s: the sleep after the first failed round, doubling per consecutive
        failure up to the cap.
    """
    stats = WatchStats()
    failures = 0  # consecutive failed rounds: the backoff exponent
    idle_since = time.monotonic()
    with GracefulStop(stop) as flag:
        while not flag.is_set():
            stats.rounds += 1
            try:
                done = process_once()
            except (ArlctlError, OSError) as err:
                transient = is_transient(err)
                if not transient and fail_fast:
                    raise
                failures += 1
                kind = "transient" if transient else "terminal"
                setattr(stats, f"{kind}_errors", getattr(stats, f"{kind}_errors") + 1)
                delay = min(backoff_cap_s, backoff_start_s * 2 ** (failures - 1))
                log.error("%s error (retrying in %.2fs): %s", kind, delay, err)
            else:
                failures, delay = 0, poll_s
                stats.units += done
                if done:
                    idle_since = time.monotonic()
                    continue
            # A round that failed counts as idle too, so a drain with a broken input still ends.
            if idle_exit_after is not None and time.monotonic() - idle_since >= idle_exit_after:
                stats.stopped_by = "idle"
                return stats
            flag.sleep(delay)
        stats.stopped_by = flag.signal_received or "stop"
    log.info("stopped (%s) after %d units", stats.stopped_by, stats.units)
    return stats


__all__ = ["GracefulStop", "STOP_SIGNALS", "WatchStats", "is_transient", "watch_loop"]
