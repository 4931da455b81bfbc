"""Scoring rows with a reward: per row, per GRPO group, or as a batch, with an optional cache.

The reward stage (stages/reward.py) and the reward server (arlctl/rewards/server.py) both score through
`score_items(reward, items, ctx)`:

- a reward whose score function carries `score_group` (an async `score_group(items, **options) ->
  [(reward, components, info)]`, items as `Item.as_dict()` of one group in row order) is called once per
  group (rows sharing group_id) instead of once per row; the options bound by get_reward (a
  functools.partial) are bound to it too;
- a reward with `score_batch(items, ctx, done)` scores all items itself (a composite reward scores each
  component through score_items again; a remote reward posts them to a reward server);
- any other reward is called per row: `score(final_state, task, response_text)`, sync or async; a score
  function that declares a `turns` parameter also gets `turns=[text of each turn]` (judge's steps=1).

At most `ctx.slots` calls run at once (a row, a group, or one remote request each). Every result is
checked (`checked`: numbers, finite as float32) and, with a cache, stored as soon as it is known.
TransientError (retry later) and UsageError (wrong options) propagate; any other failure becomes the
row's, or the whole group's, null reward with reward_info.error naming the cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import math
import numbers
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from arlctl.errors import TransientError, UsageError
from arlctl.rewards.cache import RewardCache, group_keys, item_key


class Scorer(Protocol):
    """What the stage needs of a reward: registry.Reward (score), or a composite or remote one (score_batch)."""

    name: str
    version: str  # written to reward_version; also half of the cache key


FLOAT32_MAX = 3.4028234663852886e38
Scored = tuple[float | None, dict[str, float] | None, dict[str, Any]]  # (reward, components, info)


def row_error(cause: str) -> Scored:
    return None, None, {"error": cause}


def checked(result: Any) -> Scored:
    """A scorer's (reward, components, info), or a row error when any number in it is not finite.

    A scorer says "this row cannot be graded" (a grader that could not run its tests: an infrastructure
    failure, never the policy's) by returning reward None with info["error"]: the row keeps that info."""
    try:
        value, parts, info = result
    except (TypeError, ValueError):
        return row_error(f"the reward function returned {type(result).__name__}, not (reward, components, info)")
    if value is None:
        info = dict(info) if isinstance(info, dict) else {}
        return None, None, {**info, "error": str(info.get("error") or "the reward function returned no reward")}
    try:
        reward = number(value)
        components = {str(k): number(v) for k, v in parts.items()}
    except (TypeError, ValueError, AttributeError) as err:
        return row_error(f"the reward function returned a non-number ({one_line(err)})")
    # Finite as float32 too: the columns are float32, where 1e39 would land as inf.
    if not all(math.isfinite(x) and abs(x) <= FLOAT32_MAX for x in (reward, *components.values())):
        return row_error(f"the reward function returned a non-finite value (reward {reward}, "
                         f"components {components})")
    return reward, components, info


def number(value: Any) -> float:
    """A reward or component as a float: only a real number (int, float, numpy's), never a bool or a
    string such as "1.0" that float() would take; a TypeError names anything else."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{type(value).__name__} {str(value)[:60]!r} is not a number")
    return float(value)


def one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"[:300]


@dataclass
class Item:
    """What a reward reads of one scored trajectory (its task already parsed)."""

    final_state: str | None
    task: dict[str, Any]
    response_text: str
    trajectory_id: str = ""
    group_id: str = ""
    turns: list[str] = field(default_factory=list)  # each turn's text, for a score function taking `turns`

    def as_dict(self) -> dict[str, Any]:
        """The form `score_group` receives (and the reward server's rows)."""
        return {"final_state": self.final_state, "task": self.task, "response_text": self.response_text,
                "trajectory_id": self.trajectory_id}

    def key(self) -> str:
        return item_key(self.final_state, self.task, self.response_text, self.turns)


class Interrupted(TransientError):
    """The stage was asked to stop (SIGTERM/SIGINT) while scoring: no further call starts, the calls in
    flight are cancelled, and the shard is not written (it stays pending; exit 75)."""


STOPPED = ("stopped by a signal while scoring: the shard in progress is not written and stays pending "
           "(rows already scored are kept in the reward cache, when there is one)")


class Slots:
    """At most `n` scoring calls at once. wait_s bounds the wait for a slot (None: no bound); past it the
    call fails with a TransientError (the reward server answers 503: busy, retry later). stop: anything
    with is_set(); once set, no call gets a slot (Interrupted): the stage stops at the next row."""

    def __init__(self, n: int, wait_s: float | None = None, stop: Any = None):
        self.n, self.wait_s, self.stop = n, wait_s, stop
        self.active = self.waiting = 0
        self.peak_active = self.peak_waiting = 0  # the most at once so far (the reward server's /health)
        self._sem = asyncio.Semaphore(n)

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        self.waiting += 1
        self.peak_waiting = max(self.peak_waiting, self.waiting)
        try:
            if self.wait_s is None:
                await self._sem.acquire()
            else:
                try:
                    await asyncio.wait_for(self._sem.acquire(), self.wait_s)
                except TimeoutError:
                    raise TransientError(f"all {self.n} scoring slots stayed busy for {self.wait_s:g} s",
                                         hint="retry later, or raise the server's --concurrency") from None
        finally:
            self.waiting -= 1
        if self.stop is not None and self.stop.is_set():
            self._sem.release()
            raise Interrupted(STOPPED)
        self.active += 1
        self.peak_active = max(self.peak_active, self.active)
        try:
            yield
        finally:
            self.active -= 1
            self._sem.release()


@dataclass
class ScoreContext:
    """What every scoring call of one shard (or one reward-server request) shares."""

    slots: Slots
    cache: RewardCache | None = None
    offload: bool = False  # run synchronous score functions in threads (the reward server's event loop)


Done = Callable[[int, Scored], None]  # report the result of items[i] as soon as it is known
T = TypeVar("T")
STOP_POLL_S = 0.1  # how often a scoring run looks at its stop flag (a threading.Event, set by a signal)


async def until_stopped(work: Awaitable[T], stop: Any) -> T:
    """Await `work`; once `stop` (anything with is_set(), or None) is set, cancel it and raise Interrupted,
    so a call in flight (a reward server dripping its answer) never holds a stopping stage."""
    task = asyncio.ensure_future(work)
    if stop is None:
        return await task
    try:
        while True:
            finished, _ = await asyncio.wait({task}, timeout=STOP_POLL_S)
            if finished:
                return task.result()
            if stop.is_set():
                raise Interrupted(STOPPED)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


def group_scorer(reward: Any) -> Callable[..., Any] | None:
    """The reward's `score_group(items, **options)` with its options bound, or None for a per-row reward.

    get_reward binds options with functools.partial(score, **options): the group function hangs on the
    function underneath and takes the same keywords."""
    score = getattr(reward, "score", None)
    if isinstance(score, functools.partial):
        found = getattr(score.func, "score_group", None)
        return functools.partial(found, **score.keywords) if callable(found) else None
    found = getattr(score, "score_group", None)
    return found if callable(found) else None


def _groups(items: list[Item]) -> list[list[int]]:
    """Indices of `items` by group_id, groups in order of their first member, members in row order."""
    groups: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(item.group_id, []).append(i)
    return list(groups.values())


async def score_items(reward: Any, items: list[Item], ctx: ScoreContext) -> list[Scored]:
    """Score `items` with one reward: cache hits first, then the rest per row, per group (`score_group`),
    or as a batch (a reward with `score_batch`: composite and remote rewards). Results are checked
    (`checked`) and stored in the cache as each one is known, so a shard interrupted by a TransientError
    keeps what it already paid for. TransientError and UsageError propagate; any other failure is the
    row's (or the group's) null reward with its cause."""
    results: list[Scored | None] = [None] * len(items)
    grouped = group_scorer(reward)
    cache = ctx.cache if getattr(reward, "cacheable", True) else None
    keys = _cache_keys(items, grouped is not None) if cache is not None else []
    todo = _cache_hits(reward, items, keys, cache, grouped is not None, results)

    def done(j: int, scored: Scored) -> None:
        i = todo[j]
        results[i] = checked(scored)
        if cache is not None:
            cache.put(reward.version, keys[i], results[i])

    pending = [items[i] for i in todo]
    batch = getattr(reward, "score_batch", None)
    if pending and batch is not None:
        await batch(pending, ctx, done)
    elif pending and grouped is not None:
        await asyncio.gather(*(_score_group(grouped, [pending[j] for j in members], members, ctx, done)
                               for members in _groups(pending)))
    else:
        turns = takes_turns(reward.score)
        await asyncio.gather(*(_score_row(reward, item, j, ctx, done, turns) for j, item in enumerate(pending)))
    return [r if r is not None else row_error("the reward function gave no result for this row") for r in results]


def _cache_keys(items: list[Item], grouped: bool) -> list[str]:
    keys = [item.key() for item in items]
    if grouped:  # a group reward's result depends on every member: the key covers the whole group
        for members in _groups(items):
            for i, key in zip(members, group_keys([keys[i] for i in members]), strict=True):
                keys[i] = key
    return keys


def _cache_hits(reward: Any, items: list[Item], keys: list[str], cache: RewardCache | None, grouped: bool,
                results: list[Scored | None]) -> list[int]:
    """Fill `results` from the cache; return the indices left to score (a group only hits whole)."""
    if cache is None:
        return list(range(len(items)))
    todo: list[int] = []
    for members in _groups(items) if grouped else [[i] for i in range(len(items))]:
        found = [cache.get(reward.version, keys[i]) for i in members]
        if all(f is not None for f in found):
            for i, scored in zip(members, found, strict=True):
                results[i] = scored
            cache.hits += len(members)
        else:
            todo += members
            cache.misses += len(members)
    return sorted(todo)


async def _call(fn: Callable[..., Any], args: tuple[Any, ...], ctx: ScoreContext) -> Any:
    result = await asyncio.to_thread(fn, *args) if ctx.offload else fn(*args)
    return await result if inspect.isawaitable(result) else result


def takes_turns(score: Callable[..., Any]) -> bool:
    """Whether a score function declares a `turns` keyword (it then gets each turn's text, e.g. judge steps=1)."""
    try:
        return "turns" in inspect.signature(score).parameters
    except (TypeError, ValueError):  # no signature to read (a C callable)
        return False


async def _score_row(reward: Any, item: Item, j: int, ctx: ScoreContext, done: Done, turns: bool) -> None:
    score = functools.partial(reward.score, turns=list(item.turns)) if turns else reward.score
    async with ctx.slots.hold():
        try:
            result = await _call(score, (item.final_state, item.task, item.response_text), ctx)
        except (TransientError, UsageError):
            raise  # retry later / wrong reward options: nothing is written, the shard stays pending
        except Exception as err:  # anything else is this row's own outcome, recorded with its cause
            result = row_error(f"the reward function failed on this row ({one_line(err)})")
    done(j, result)


async def _score_group(grouped: Callable[..., Any], members: list[Item], indices: list[int], ctx: ScoreContext,
                       done: Done) -> None:
    """One score_group call for one group; a failure or a wrong number of results nulls the whole group."""
    async with ctx.slots.hold():
        try:
            results = await _call(grouped, ([m.as_dict() for m in members],), ctx)
            results = list(results)
            if len(results) != len(members):
                raise ValueError(f"score_group returned {len(results)} results for a group of {len(members)}")
        except (TransientError, UsageError):
            raise
        except Exception as err:
            results = [row_error(f"the group reward failed on this group ({one_line(err)})")] * len(members)
    for j, result in zip(indices, results, strict=True):
        done(j, result)


