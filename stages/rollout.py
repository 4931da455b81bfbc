"""The rollout driver: groups of trajectories, many in flight, each finished group handed to a sink.

`rollout()` runs every task as a group of G trajectories (stages/agent_loop.py runs each one), at most
`concurrency` in flight; a group is always returned whole: members that fail end with a status, members
cut by a stop end `aborted` with everything they had recorded. With --history per-turn a group's
trajectories are emitted one row per turn. The daemon policy (reloads, backpressure) comes in as hooks
from stages/rollout_daemon.py. Every row records where its env ran (env_info, schema v3: the env's
optional env_info(), read before the env closes, whatever the status); a member topped up after an
env_error lists the attempts it replaced, and where they ran, under `replaced_from`.

Re-runs resume per sample: a group's id is derived from the configuration's hash, the task and the epoch
(`Resume.group_id`), so a re-run with the same arguments names the same groups, skips the (group, sample)
units an earlier invocation committed (arlctl/io/ledger.py `written_samples`) and rolls out only the rest,
whose rows join the group they belong to (seeds are per task and sample already: the same draws).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from arlctl.envs.base import Env, as_env
from arlctl.inference.base import Policy, as_policy
from arlctl.inference.chat import ChatCodec
from arlctl.schemas.rows import TrajectoryRow
from arlctl.schemas.safe_text import safe_row

if TYPE_CHECKING:
    from arlctl.stages.harness_run import HarnessDriver
from arlctl.stages.agent_loop import (
    RolloutConfig,
    Stats,
    Trajectory,
    being_cancelled,
    crashed,
    final_state_after_bound,
    record_env_info,
    run_trajectory,
)

__all__ = ["GroupAborted", "Resume", "rollout", "run_group"]

GroupSink = Callable[[list[TrajectoryRow]], Awaitable[None]]

# Starting trajectories is paced by the event loop: after every START_BURST starts the driver yields.
# A start costs real CPU (reset, prompt rendering, first request); thousands at once would put thousands of
# first steps into one loop iteration and stall every timer and socket for seconds. Paced, each iteration
# carries a few starts beside the turns of the trajectories already running. While the loop is saturated
# (an iteration took longer than START_BUSY_S), the driver waits for a quick one before starting more, at
# most START_MAX_WAITS iterations: the turns in flight go first, so starting thousands never stalls them.
START_BURST = 8
START_BUSY_S = 0.005
START_MAX_WAITS = 20


EnvChooser = Callable[[str], Callable[[], Env]]  # env name -> factory (per-row `env`, --env-mix)

GROUP_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "arlctl:rollout-group")


@dataclass
class Resume:
    """Which (group, sample) units a rollout still has to run, and how many it skipped.

    key: the configuration's hash; without one (a Python caller that resumes nothing) a random key, so
    group ids stay unique per invocation. written: group_id -> sample indices already committed.
    """

    key: str = field(default_factory=lambda: uuid.uuid4().hex)
    written: dict[str, set[int]] = field(default_factory=dict)
    samples_skipped: int = 0
    groups_skipped: int = 0  # groups with every sample written: not started at all

    def group_id(self, task: Any, epoch: int, occurrence: int) -> str:
        """The group of `task` in `epoch`; occurrence tells apart a task id listed twice in one pass."""
        task_id = str(task.get("task_id", "")) if isinstance(task, dict) else repr(task)
        return str(uuid.uuid5(GROUP_NAMESPACE, json.dumps([self.key, task_id, epoch, occurrence])))

    def samples_left(self, group_id: str, group_size: int) -> list[int]:
        written = self.written.get(group_id, set())
        left = [i for i in range(group_size) if i not in written]
        self.samples_skipped += group_size - len(left)
        self.groups_skipped += not left
        return left


async def run_group(task: dict[str, Any], policy: Policy, env_factory: Callable[[], Env], codec: ChatCodec,
                    cfg: RolloutConfig, stats: Stats, slots: asyncio.Semaphore,
                    turn_hook: Callable[[], Awaitable[None]] | None = None, epoch: int = 0,
                    env_for: EnvChooser | None = None, group_id: str | None = None,
                    samples: list[int] | None = None, harness: HarnessDriver | None = None) -> list[TrajectoryRow]:
    """The G samples of one task; a group is always returned whole (aborted members included).

    env_for: when given, the group runs the env named by the task's own "env" field (cfg.env if it has
    none); an env that cannot be made ends the group's rows as env_error with the cause.
    group_id, samples: the group's id and the sample indices still to run (a resumed group); default a
    fresh id and all of 0..G-1.
    harness: run each sample through this agent harness instead of the built-in loop (stages/harness_run.py).
    """
    group_id = group_id or str(uuid.uuid4())
    samples = list(range(cfg.group_size)) if samples is None else samples
    env_name = str(task.get("env") or cfg.env) if env_for is not None else cfg.env
    trajs = [Trajectory(task, group_id, i, env_name, policy, epoch) for i in samples]
    top_ups_left = [cfg.max_top_up]

    async def member(position: int) -> TrajectoryRow:
        """One sample; while it ends env_error (an infrastructure failure) and the group's top-up budget
        lasts, it is run again from scratch with a new seed, so the group stays at G usable rows."""
        row = await one(trajs[position])
        earlier: list[dict[str, Any]] = []  # where the attempts given up ran (env_info replaced_from)
        while row.status == "env_error" and top_ups_left[0] > 0:
            top_ups_left[0] -= 1
            stats.top_ups += 1
            attempt = trajs[position].attempt
            if row.env_info is not None:
                earlier.append({**row.env_info, "cause": "env_error", "attempt": attempt})
            trajs[position] = Trajectory(task, group_id, samples[position], env_name, policy, epoch, attempt + 1)
            row = await one(trajs[position])
        if earlier and row.env_info is not None:  # the member moved: say from where, oldest first
            row.env_info["replaced_from"] = [*earlier, *row.env_info.get("replaced_from", [])]
        stats.outcomes[row.status] = stats.outcomes.get(row.status, 0) + 1
        return row

    async def one(traj: Trajectory) -> TrajectoryRow:
        async with slots:
            stats.in_flight += 1
            stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)
            env: Env | None = None
            try:
                env = as_env((env_for(env_name) if env_for is not None else env_factory)())
                if harness is not None:
                    from arlctl.stages.harness_run import run_harness

                    return await run_harness(traj, env, cfg, stats, harness)
                row = await run_trajectory(traj, policy, env, codec, cfg, stats, turn_hook)
                if row.final_state is None and row.turns:  # ended by a bound: keep what the env holds
                    await final_state_after_bound(row, env, cfg, stats)
                return row
            except asyncio.CancelledError as err:
                if being_cancelled():
                    raise  # the rollout is stopping: the group turns this into aborted rows
                return crashed(traj, err, stats)  # an env or backend cancelled its own work
            except Exception as err:  # a bug or a hostile value anywhere above: a row with a status, not a lost group
                return crashed(traj, err, stats)
            finally:
                stats.in_flight -= 1
                stats.trajectories_done += 1
                if env is not None:
                    if harness is None:  # a harness run records it in each of its rows
                        record_env_info(traj.row, env, stats)  # on every status, before close releases the sandbox
                    await _close_env(env, cfg, stats)

    tasks = [asyncio.ensure_future(member(i)) for i in range(len(trajs))]
    try:
        # return_exceptions: one member that raised never leaves its siblings running unawaited
        results = await asyncio.gather(*tasks, return_exceptions=True)
    except asyncio.CancelledError:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        rows = [t.result() if t.done() and not t.cancelled() and t.exception() is None
                else _aborted(trajs[i], stats) for i, t in enumerate(tasks)]
        stats.groups_done += 1
        raise GroupAborted(_emit(cfg, trajs, rows)) from None
    rows = [r if isinstance(r, TrajectoryRow) else crashed(trajs[i], r, stats) for i, r in enumerate(results)]
    stats.groups_done += 1
    return [*(extra for traj in trajs for extra in traj.extra_rows), *_emit(cfg, trajs, rows)]


def _aborted(traj: Trajectory, stats: Stats) -> TrajectoryRow:
    stats.outcomes["aborted"] = stats.outcomes.get("aborted", 0) + 1
    return traj.finish("aborted", "error")


def _emit(cfg: RolloutConfig, trajs: list[Trajectory], rows: list[TrajectoryRow]) -> list[TrajectoryRow]:
    """The group's rows as written: one per trajectory, or one per turn with --history per-turn."""
    if cfg.history != "per-turn":
        return rows
    return [turn_row for traj in trajs for turn_row in traj.turn_rows()]


def _retrieve(fut: asyncio.Future) -> None:
    """Done callback: mark a background future's outcome as seen (no "exception was never retrieved")."""
    if not fut.cancelled():
        fut.exception()


async def _close_env(env: Env, cfg: RolloutConfig, stats: Stats) -> None:
    """Close an env, bounded by the step timeout; a close that fails or hangs is counted, never raised.

    The row is already final: a broken close says nothing about the trajectory, but it is not hidden.
    """
    try:
        closing = asyncio.ensure_future(env.close())
    except Exception as err:  # close() missing or not a coroutine
        stats.fault("close_error", f"env close failed: {type(err).__name__}: {err}")
        return
    closing.add_done_callback(_retrieve)
    try:
        await asyncio.wait_for(asyncio.shield(closing), cfg.step_timeout)
    except TimeoutError:
        stats.fault("infra:close_timeout", f"env close did not finish within {cfg.step_timeout:g}s")
    except asyncio.CancelledError:
        if being_cancelled():
            raise
        stats.fault("close_error", "env close was cancelled")
    except Exception as err:
        stats.fault("close_error", f"env close failed: {type(err).__name__}: {err}")


def _failed_group(task: Any, policy: Policy, cfg: RolloutConfig, epoch: int, stats: Stats, group_id: str,
                  samples: list[int]) -> list[TrajectoryRow]:
    """env_error rows for the samples of a group that could not be set up, so the failure is in the output,
    not only in the summary. A task that is not a JSON object is kept as its repr."""
    kept = task if isinstance(task, dict) else {"task_id": "", "invalid_task": repr(task)[:1000]}
    try:
        name = str(kept.get("env") or cfg.env)
        rows = [Trajectory(kept, group_id, i, name, policy, epoch).finish("env_error", "error") for i in samples]
    except Exception:  # nothing sensible can be built; the fault is counted, and so are its trajectories
        rows = []
    # Failed trajectories either way: the error share (--max-error-frac) must see them even without rows.
    stats.outcomes["env_error"] = stats.outcomes.get("env_error", 0) + len(samples)
    return rows


class GroupAborted(Exception):
    """Raised out of a cancelled group, carrying its rows (finished ones as they were, others aborted)."""

    def __init__(self, rows: list[TrajectoryRow]):
        super().__init__("group aborted")
        self.rows = rows


async def rollout(tasks: Iterable[dict[str, Any]], policy: Policy, env_factory: Callable[[], Env],
                  cfg: RolloutConfig, sink: GroupSink, stats: Stats | None = None,
                  stop: asyncio.Event | None = None,
                  turn_hook: Callable[[], Awaitable[None]] | None = None,
                  epochs: int | None = 1,
                  before_group: Callable[[], Awaitable[None]] | None = None,
                  env_for: EnvChooser | None = None, resume: Resume | None = None) -> Stats:
    """Run every task as a group of cfg.group_size trajectories, handing each finished group to sink.

    At most cfg.concurrency trajectories are in flight. When `stop` is set, no new group starts and the
    groups in flight are aborted; their rows still reach the sink (status aborted), so nothing completed
    is lost.

    epochs: how many passes over `tasks` (None: until stopped). Epoch e > 0 seeds its sampling with e,
        so with a --seed the passes differ yet stay reproducible.
    before_group: awaited before each new group starts (daemon backpressure); a stop cuts it short.
    env_for: env name -> factory; each group then runs the env its task names (per-row `env`, --env-mix).
    resume: names the groups and holds the units already written, which are skipped (default: none).
    """
    stats = stats or Stats()
    resume = resume or Resume()
    stop = stop or asyncio.Event()
    policy = as_policy(policy)  # a full Policy: vocab_size and the rest declared, defaults for third-party ones
    task_list = tasks if epochs == 1 else list(tasks)  # one pass may stream; epochs re-iterate a list
    codec = ChatCodec(policy.tokenizer, cfg.template_kwargs)
    stats.template_rewrites_history = codec.rewrites_history
    slots = asyncio.Semaphore(cfg.concurrency)
    # Keep enough groups started that every trajectory slot stays busy, but not the whole task list.
    group_slots = asyncio.Semaphore(max(1, -(-cfg.concurrency // cfg.group_size) + 1))
    running: set[asyncio.Task] = set()  # the group runners; cancelled on stop
    sinking: set[asyncio.Task] = set()  # runner + sink per group; never cancelled, so nothing is lost
    sink_failures: list[BaseException] = []  # a sink that cannot write stops the rollout, then re-raises
    harness = None
    if cfg.harness:  # its gateway starts on the first sample
        from arlctl.stages.harness_run import HarnessDriver

        harness = HarnessDriver(policy, cfg)

    async def one_group(task: dict[str, Any], epoch: int, group_id: str, samples: list[int]) -> None:
        runner = asyncio.ensure_future(
            run_group(task, policy, env_factory, codec, cfg, stats, slots, turn_hook, epoch, env_for, group_id, samples,
                      harness))
        running.add(runner)
        try:
            rows = await asyncio.shield(runner)
        except GroupAborted as aborted:
            rows = aborted.rows
        except Exception as err:  # the group could not even be set up (e.g. a task that is not a dict)
            stats.fault("group_error", f"group failed: {type(err).__name__}: {err}")
            stats.groups_done += 1
            rows = _failed_group(task, policy, cfg, epoch, stats, group_id, samples)
        finally:
            running.discard(runner)
            group_slots.release()
        try:
            await sink([safe_row(r) for r in rows])
        except Exception as err:
            sink_failures.append(err)
            stop.set()

    idle = asyncio.Event()  # set whenever no group is left to sink: _drain waits on it, not on every group
    idle.set()

    def sunk(t: asyncio.Task) -> None:
        sinking.discard(t)
        if not sinking:
            idle.set()

    started_this_tick = 0
    epoch = 0
    while task_list and (epochs is None or epoch < epochs) and not stop.is_set():
        stats.epoch = epoch
        occurrences: dict[str, int] = {}  # group id of a task's first listing -> listings so far
        for task in task_list:
            first_id = resume.group_id(task, epoch, 0)
            occurrence = occurrences[first_id] = occurrences.get(first_id, -1) + 1
            group_id = first_id if occurrence == 0 else resume.group_id(task, epoch, occurrence)
            samples = resume.samples_left(group_id, cfg.group_size)
            if not samples:
                continue  # every sample of this group was written by an earlier invocation
            if started_this_tick >= START_BURST:
                started_this_tick = 0
                await _let_running_turns_go_first()
            if not await _acquire_or_stop(group_slots, stop):
                break
            if before_group is not None and not await _until_or_stop(before_group(), stop):
                group_slots.release()
                break
            stats.groups_started += 1
            started_this_tick += len(samples)
            idle.clear()
            t = asyncio.ensure_future(one_group(task, epoch, group_id, samples))
            sinking.add(t)
            t.add_done_callback(sunk)
        else:
            stats.epochs_done += 1
        epoch += 1
    try:
        await _drain(running, sinking, idle, stop)
    finally:
        if harness is not None:
            await harness.close()
    if sink_failures:
        raise sink_failures[0]
    return stats


async def _let_running_turns_go_first() -> None:
    """Yield one loop iteration, then more while iterations are slow (see START_BUSY_S)."""
    loop = asyncio.get_running_loop()
    for _ in range(START_MAX_WAITS):
        before = loop.time()
        await asyncio.sleep(0)
        if loop.time() - before < START_BUSY_S:
            return


async def _until_or_stop(awaitable: Awaitable[Any], stop: asyncio.Event,
                         on_stop: Callable[[], Any] | None = None) -> bool:
    """Await `awaitable` unless `stop` fires first (then cancel it). True when it completed and no stop.

    on_stop: undoes a completion that raced with the stop (e.g. releases a semaphore just acquired).
    """
    work = asyncio.ensure_future(awaitable)
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    if stop.is_set():
        if work.done() and not work.cancelled() and work.exception() is None and on_stop is not None:
            on_stop()
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        return False
    work.result()  # a failure in the awaitable propagates
    return True


async def _acquire_or_stop(slot: asyncio.Semaphore, stop: asyncio.Event) -> bool:
    """Take a group slot unless `stop` fires first; a free slot is taken without a trip around the loop."""
    if stop.is_set():
        return False
    if not slot.locked():
        await slot.acquire()  # returns at once: no task, no wait (the common case while starting up)
        return True
    return await _until_or_stop(slot.acquire(), stop, on_stop=slot.release)


async def _drain(running: set[asyncio.Task], sinking: set[asyncio.Task], idle: asyncio.Event,
                 stop: asyncio.Event) -> None:
    """Wait for the groups in flight; if `stop` fires meanwhile, abort them (their rows still flush).

    Waits on two events (every group sunk, or stop), so a finished group costs O(1) here, not a new wait
    over every group still in flight.
    """
    if not idle.is_set():
        done_or_stop = [asyncio.ensure_future(idle.wait()), asyncio.ensure_future(stop.wait())]
        await asyncio.wait(done_or_stop, return_when=asyncio.FIRST_COMPLETED)
        for waiter in done_or_stop:
            waiter.cancel()
    # Cancelling a runner delivers CancelledError into run_group's gather, which turns it into
    # GroupAborted with the partial rows; one_group then still hands those rows to the sink.
    for runner in list(running):
        runner.cancel()
    await asyncio.gather(*list(sinking), return_exceptions=True)
