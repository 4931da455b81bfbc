"""Thousands of trajectories in flight through the real rollout (run_rollout: driver, agent loop, shard
writer, metrics row) with the synthetic policy and env in process: none lost, every row written exactly
once, all of them in flight at once, and what the process reports about itself (loop lag, RSS per
trajectory) present and plausible. Structural asserts only; the speed is benchmarks/rollout_scale.py's.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from arlctl.io.shards import read_shard
from arlctl.models import tiny_model_dir
from arlctl.stages.agent_loop import RolloutConfig
from arlctl.stages.rollout_job import RolloutJob, run_rollout
from arlctl.synthetic import LatencyEnv, SyntheticPolicy, latency_tasks, tool_latencies

N = 2000
TURNS = 2
MEAN_S, SIGMA = 0.2, 1.0


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(tiny_model_dir()), local_files_only=True)


class Picker:
    """The job's env chooser (what EnvPicker is to the CLI): every name gets `make`."""

    def __init__(self, make):
        self.make = make

    def __call__(self, name: str):
        return self.make

    async def aclose(self) -> None:
        return None


class BarrierEnv(LatencyEnv):
    """LatencyEnv whose first step waits until `expected` trajectories are all in their first step: the
    run can only finish if that many were in flight at the same moment."""

    arrived = 0
    expected = N
    everyone: asyncio.Event | None = None

    async def step(self, action):
        if self.turn == 0:
            cls = type(self)
            cls.arrived += 1
            if cls.arrived >= cls.expected:
                cls.everyone.set()
            await cls.everyone.wait()
        return await super().step(action)


def _job(tmp_path, n: int, env_cls: type, flush_groups: int) -> RolloutJob:
    cfg = RolloutConfig(env="latency", group_size=1, concurrency=n, max_turns=TURNS, max_new_tokens=16,
                        max_tokens=4096, step_timeout=600.0, trajectory_timeout=600.0, seed=1)
    envs = Picker(lambda: env_cls(turns=TURNS, mean=MEAN_S, sigma=SIGMA, seed=3))
    return RolloutJob(cfg=cfg, tasks=latency_tasks(n), envs=envs, out=str(tmp_path / "rollouts"),
                      backend="synthetic", flush_groups=flush_groups, flush_seconds=0.5)


@pytest.mark.slow
def test_two_thousand_in_flight_none_lost_each_row_once(tmp_path, tokenizer):
    async def main() -> Any:
        BarrierEnv.arrived, BarrierEnv.everyone = 0, asyncio.Event()
        policy = SyntheticPolicy(tokenizer, per_token_s=0.0005)
        # flush_groups 7: shards are committed while other groups keep arriving (the writer's overlap path)
        return await run_rollout(_job(tmp_path, N, BarrierEnv, flush_groups=7), policy, asyncio.Event(),
                                 log=lambda line: None)

    result = asyncio.run(main())
    assert BarrierEnv.arrived == N
    assert result.peak_in_flight == N  # every trajectory was in flight at once (the barrier made sure)
    assert result.status == {"ok": N} and result.outcomes == {"ok": N} and result.errors == 0

    # Every trajectory exactly once across the shards, each with its T turns.
    assert result.rows_written == N and result.shards_written == len(result.shards) > 1
    tables = [read_shard(path) for path in result.shards]
    task_ids = [t for table in tables for t in table.column("task_id").to_pylist()]
    assert sorted(task_ids) == sorted(f"job-{i}" for i in range(N))
    trajectory_ids = [t for table in tables for t in table.column("trajectory_id").to_pylist()]
    assert len(set(trajectory_ids)) == N
    assert {n for table in tables for n in table.column("num_turns").to_pylist()} == {TURNS}
    metrics = pq.read_table(result.metrics).to_pylist()[0]
    assert metrics["peak_in_flight"] == N and metrics["rows_written"] == N

    # What the process says about itself: memory per in-flight trajectory, loop lag, CPU per turn.
    assert result.peak_rss_mb >= result.start_rss_mb > 0
    assert 0 < result.rss_per_trajectory_kb < 1024  # bounded: far under a MB each for a 2-turn trajectory
    assert result.cpu_per_turn_ms > 0
    # The loop never froze for as long as the longest trajectory's own tool time.
    longest_tools_s = max(tool_latencies(i, TURNS, 3, MEAN_S, SIGMA).sum() for i in range(N))
    assert 0 <= result.loop_lag_p99_ms <= result.loop_lag_max_ms < 1000 * longest_tools_s


class BlockingEnv(LatencyEnv):
    """A step that blocks the event loop (a synchronous sleep): the probe must see it."""

    async def step(self, action):
        time.sleep(0.3)
        return await super().step(action)


@pytest.mark.slow
def test_the_loop_probe_sees_a_blocked_loop(tmp_path, tokenizer):
    async def main() -> Any:
        policy = SyntheticPolicy(tokenizer, per_token_s=0.0)
        return await run_rollout(_job(tmp_path, 2, BlockingEnv, flush_groups=1), policy, asyncio.Event(),
                                 log=lambda line: None)

    result = asyncio.run(main())
    assert result.rows_written == 2
    assert result.loop_lag_max_ms >= 250  # 300 ms blocked, minus the 10 ms tick's slack and rounding
    assert result.loop_lag_max_ms >= result.loop_lag_p99_ms


def test_tool_latencies_are_seeded_per_trajectory_and_long_tailed():
    a = tool_latencies(5, 4, seed=1, mean=0.5, sigma=1.0)
    assert np.array_equal(a, tool_latencies(5, 4, seed=1, mean=0.5, sigma=1.0))
    assert not np.array_equal(a, tool_latencies(6, 4, seed=1, mean=0.5, sigma=1.0))
    draws = np.concatenate([tool_latencies(i, 4, 0, 0.5, 1.0) for i in range(2000)])
    assert draws.mean() == pytest.approx(0.5, rel=0.1)  # lognormal mean exp(mu + sigma^2 / 2) = 0.5
    assert np.quantile(draws, 0.99) > 4 * np.median(draws)  # long tail


def test_backpressure_reuses_a_recent_scan_and_stays_exact_for_its_own_commits(tmp_path, monkeypatch):
    """Thousands of groups starting at once must not list the run once each; a reused scan plus this
    process's own commits since gives the same backlog a new scan gives."""
    import arlctl.runstate as runstate
    from arlctl.io.shards import Lineage, shard_name, write_shard
    from arlctl.stages.rollout_daemon import Backpressure
    from arlctl.synthetic import synthetic_table

    run = tmp_path / "run"
    (run / "rollouts").mkdir(parents=True)
    scans = []
    real_backlog = runstate.backlog
    monkeypatch.setattr(runstate, "backlog", lambda *a, **k: scans.append(1) or real_backlog(*a, **k))
    counters = {"started": 0, "committed": 0}

    class Pol:
        version = 0

    gate = Backpressure(str(run), 2, Pol(), in_flight=lambda: counters["started"] * 2 - counters["committed"],
                        max_pending=10_000, poll_s=30.0, committed=lambda: counters["committed"])

    async def main():
        for _ in range(200):  # 200 group starts inside one rescan interval
            await gate.wait()
            counters["started"] += 1
        assert len(scans) == 1
        # Our writer commits 6 rows (3 groups): on disk now, out of flight.
        write_shard(synthetic_table(3, group_size=2), str(run / "rollouts" / shard_name("part")),
                    Lineage(stage="rollout"))
        counters["committed"] += 6
        reused, fresh = await gate._backlog(fresh=False), await gate._backlog(fresh=True)
        assert reused["total"] == fresh["total"] == 200 * 2
        assert reused["rollouts"] == fresh["rollouts"] == 6 and reused["in_flight"] == fresh["in_flight"] == 394

    asyncio.run(main())


def test_starting_waits_while_the_loop_is_saturated_and_not_when_it_is_idle():
    """The driver's yield between bursts of starts: one iteration on an idle loop; on a loop whose
    iterations each take 8 ms of other work (turns in flight), it waits them out, up to its cap."""
    from arlctl.stages.rollout import START_BUSY_S, START_MAX_WAITS, _let_running_turns_go_first

    async def idle_iterations() -> int:
        ticks = [0]

        async def ticker() -> None:  # counts loop iterations, holding the loop for no time
            while True:
                ticks[0] += 1
                await asyncio.sleep(0)

        task = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        before = ticks[0]
        await _let_running_turns_go_first()
        task.cancel()
        return ticks[0] - before

    async def busy_iterations(before_quiet: int) -> int:
        done = [0]

        async def other_work() -> None:  # a turn in flight that holds the loop 8 ms per iteration
            while done[0] < before_quiet:
                time.sleep(0.008)
                done[0] += 1
                await asyncio.sleep(0)

        worker = asyncio.ensure_future(other_work())
        await asyncio.sleep(0)  # it has started
        await _let_running_turns_go_first()
        waited = done[0]
        done[0] = before_quiet  # stop it
        await worker
        return waited

    assert START_BUSY_S < 0.008
    assert asyncio.run(idle_iterations()) < START_MAX_WAITS  # idle: back at once, not after its cap
    assert 5 <= asyncio.run(busy_iterations(5)) <= 6  # waits until the busy iterations end
    assert asyncio.run(busy_iterations(10 * START_MAX_WAITS)) <= START_MAX_WAITS + 1  # never forever
