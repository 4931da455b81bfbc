"""Daemon policy of `arlctl rollout --watch`: follow the published policy, and hold back new groups.

`PolicyFollower` reloads the policy at turn boundaries when RUN/policy/LATEST names a newer version;
`Backpressure` is the gate before each new group (the untrained backlog, and the lag its rows will have
when they are trained).
The agent loop (stages/agent_loop.py) and the driver (stages/rollout.py) know nothing of either: the
driver takes them as a turn hook and a before-group gate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from arlctl.inference.base import Policy


class PolicyFollower:
    """Follows a run's policy directory: when LATEST names a newer version, reload the policy.

    Called from the turn hook (so weights change only at a turn boundary) and from the backpressure
    gate; LATEST is read at most every `poll_s` seconds. One reload at a time: a turn that arrives while
    another reloads carries on (the backend queues its generation behind the swap). Versions only move
    forward; a failed reload is recorded and retried at the next check.
    """

    def __init__(self, policy: Policy, policy_dir: str, poll_s: float,
                 on_reload: Callable[[int, int], None] | None = None):
        self.policy = policy
        self.policy_dir = policy_dir
        self.poll_s = poll_s
        self.on_reload = on_reload
        self.reloads = 0
        self.last_error: str | None = None
        self._last_check = float("-inf")
        self._lock = asyncio.Lock()

    async def maybe_reload(self) -> bool:
        if self._lock.locked() or time.monotonic() - self._last_check < self.poll_s:
            return False
        async with self._lock:
            self._last_check = time.monotonic()
            try:
                newest = await asyncio.to_thread(self._newest)
                if newest is None or newest[1] <= self.policy.version:
                    return False
                path, version = newest
                previous = self.policy.version
                await self.policy.reload(path, version)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # a half-pruned version, a bad file: keep the old weights, retry later
                self.last_error = f"reload failed: {type(err).__name__}: {err}"
                return False
            self.reloads += 1
            if self.on_reload is not None:
                self.on_reload(previous, version)
            return True

    def _newest(self) -> tuple[str, int] | None:
        """(model directory, version) when LATEST names a version newer than the loaded one, else None."""
        from arlctl.inference import loader

        named = loader.latest_version(self.policy_dir)  # one small read of LATEST, local or remote
        if named is None or named <= self.policy.version:
            return None  # nothing published yet, or nothing newer
        path = loader.latest_version_dir(self.policy_dir)  # a URL's version is downloaded to a local cache
        return str(path), loader.read_version(path)


def projected_lag(state: dict, policy_version: int) -> tuple[int, int]:
    """(lag at train time of a group that starts now at `policy_version`, optimizer steps queued in front of it).

    A row's lag when trained is the version the trainer's weights are at then minus the row's policy version
    (train's `row_lags`). The trainer is at `trainer_version`; before it reaches the new group it takes one
    step per batch shard waiting for it, plus one per `rows_per_step` rows still upstream (waiting at reward
    or filter, or in flight in this process): the rows the filter consumed per batch it wrote, so its drops
    are counted. Before the filter's first batch that ratio is unknown and rows upstream count for nothing
    (a guess could hold back the rows the first batch needs: a deadlock); train's --max-lag catches the rest.
    `state` is arlctl.runstate.backlog's dict.
    """
    upstream = state["rollouts"] + state["rewarded"] + state["in_flight"]
    per_step = state.get("rows_per_step")
    queued = state.get("batch_shards", 0) + (int(upstream // per_step) if per_step else 0)
    return state["trainer_version"] + queued - policy_version, queued


class Backpressure:
    """The gate before each new group in daemon mode (docs/daemons.md "Running as daemons").

    A group of G starts only when (1) backlog + G <= max_pending, where backlog is the untrained rows of
    the run (arlctl.runstate.backlog) plus the rows this process started but has not committed, so the
    backlog never exceeds max_pending; and (2) its projected lag at train time (`projected_lag`: the
    trainer's version plus the steps queued in front of it, minus policy.version) <= max_staleness, so
    rows are not generated only to be dropped as stale when their turn comes. While blocked it commits
    buffered groups at every poll (so downstream can consume them), tries a reload, and logs each wait once.
    """

    def __init__(self, run: str, group_size: int, policy: Policy, in_flight: Callable[[], int],
                 max_pending: int | None = None, max_staleness: int | None = None, poll_s: float = 5.0,
                 follower: PolicyFollower | None = None, flush: Callable[[], Awaitable[None]] | None = None,
                 log: Callable[[str], None] = print, committed: Callable[[], int] | None = None):
        from arlctl.runstate import ShardCache

        self.run, self.group_size, self.policy, self.in_flight = run, group_size, policy, in_flight
        # Rows this process has committed (its writer's count). With it, a scan of the run younger than
        # rescan_s is reused for the next group instead of listing the run again per group (thousands of
        # groups start at once with a large --concurrency): our own commits since the scan are added to it,
        # and what downstream consumed since can only make it larger than the truth, never smaller.
        self.committed = committed
        self.rescan_s = min(poll_s, 1.0)
        # The staleness bound reads the trainer's version from the same scan: at most rescan_s old, as if the
        # check had run that much earlier.
        self._scan: tuple[float, dict, int] | None = None  # (when, backlog state, committed rows then)
        self._reused = False  # the last check reused a scan
        self.max_pending, self.max_staleness, self.poll_s = max_pending, max_staleness, poll_s
        self.follower, self.flush, self.log = follower, flush, log
        self.cache = ShardCache()
        self.waited_s = {"backlog": 0.0, "staleness": 0.0}
        self.waits = {"backlog": 0, "staleness": 0}
        self.max_backlog = 0  # the largest backlog (new group included) this gate let through
        self.max_staleness_started = 0  # the largest projected lag at train time a group started at

    async def wait(self) -> None:
        reason, since = None, time.monotonic()
        while True:
            blocked, message, backlog_now, lag = await self._check(fresh=False)
            if blocked is not None and self._reused:
                blocked, message, backlog_now, lag = await self._check(fresh=True)  # never wait on a reused scan
            now = time.monotonic()
            if reason is not None:
                self.waited_s[reason] += now - since
            since = now
            if blocked is None:
                self.max_backlog = max(self.max_backlog, backlog_now)
                self.max_staleness_started = max(self.max_staleness_started, lag)
                return
            if blocked != reason:
                self.waits[blocked] += 1
                self.log(message)
            if self.flush is not None:
                await self.flush()  # groups that finished while we wait count as backlog only once committed
            reason = blocked
            await asyncio.sleep(self.poll_s)

    async def _check(self, fresh: bool) -> tuple[str | None, str, int, int]:
        if self.follower is not None:
            await self.follower.maybe_reload()  # a newer LATEST may clear the staleness bound
        state = await self._backlog(fresh)
        after = state["total"] + self.group_size
        lag, queued = projected_lag(state, self.policy.version)
        if self.max_pending is not None and after > self.max_pending:
            return ("backlog", f"waiting: backlog {after} > max-pending {self.max_pending} "
                    f"(rollouts {state['rollouts']}, rewarded {state['rewarded']}, batches {state['batches']}, "
                    f"in flight {state['in_flight']}, next group {self.group_size})", after, lag)
        if self.max_staleness is not None and lag > self.max_staleness:
            how = "waiting for a newer policy/LATEST" if self.follower else "no policy directory to reload from"
            return ("staleness", f"waiting: lag at train time would be {lag} > max-staleness {self.max_staleness} "
                    f"(trainer version {state['trainer_version']} + {queued} steps queued in front of it - policy "
                    f"version {self.policy.version}; {state.get('batch_shards', 0)} batch shards waiting; {how})",
                    after, lag)
        return None, "", after, lag

    async def _backlog(self, fresh: bool) -> dict:
        """The run's backlog with this process's in-flight rows: a new scan, or a recent one brought up to
        date with our own commits (see __init__)."""
        from arlctl.runstate import backlog

        now = time.monotonic()
        if not fresh and self.committed is not None and self._scan is not None and now - self._scan[0] < self.rescan_s:
            self._reused = True
            _, state, committed_then = self._scan
            grown, in_flight = self.committed() - committed_then, self.in_flight()
            return {**state, "rollouts": state["rollouts"] + grown, "in_flight": in_flight,
                    "total": state["total"] - state["in_flight"] + grown + in_flight}
        self._reused = False
        committed_then = self.committed() if self.committed is not None else 0  # before: commits during the
        state = await asyncio.to_thread(backlog, self.run, self.cache, self.in_flight())  # scan count twice
        self._scan = (now, state, committed_then) if self.committed is not None else None
        return state
