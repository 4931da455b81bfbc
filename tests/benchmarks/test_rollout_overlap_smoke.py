"""Smoke test of benchmarks/rollout_overlap.py: its pieces on the real tiny model, at tiny sizes.

Only structural facts are asserted (every trajectory ran T turns of exactly K tokens, each tool replayed
its own latency, a mode waited at least as long as its sleeps force it to); never a speedup.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from arlctl.inference.chat import ChatCodec
from arlctl.inference.loader import load_policy

BENCH_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "rollout_overlap.py"


def _load_bench():
    spec = importlib.util.spec_from_file_location("rollout_overlap_bench", BENCH_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


bench = _load_bench()

# Three trajectories x two turns; distinct latencies so a mix-up of (trajectory, turn) would show.
LATENCIES = np.array([[0.03, 0.01], [0.00, 0.05], [0.02, 0.02]])
TOKENS = 4


@pytest.fixture(scope="module")
def policy():
    pol = load_policy("tiny", max_batch=4, num_threads=1, progress=False)
    bench.ignore_eos(pol)
    yield pol
    asyncio.run(pol.close())


def test_latency_draw_is_seeded_and_long_tailed():
    a = bench.draw_latencies(8, 4, seed=3)
    assert a.shape == (8, 4)
    np.testing.assert_array_equal(a, bench.draw_latencies(8, 4, seed=3))
    assert not np.array_equal(a, bench.draw_latencies(8, 4, seed=4))
    big = bench.draw_latencies(1000, 200, seed=0)  # 200k draws: the sample mean's std error is ~0.003
    assert abs(big.mean() - 0.5) < 0.03
    # p99 = exp(mu + 2.3263 sigma), mu = ln 0.5 - 1.5^2 / 2 = -1.8181: exp(-1.8181 + 3.4895) = exp(1.6714) = 5.32
    assert math.isclose(float(np.quantile(big, 0.99)), 5.32, rel_tol=0.06)


def test_lower_bound_arithmetic():
    # Critical path: trajectory 0 has 0.03 + 0.01 = 0.04 s of tools, trajectory 1 has 0.05: 0.05 + 2 x 0.1 = 0.25.
    bound = bench.lower_bound(LATENCIES, gen_full_s=0.2, gen_single_turn_s=0.1)
    assert math.isclose(bound["critical_path_s"], 0.25)
    assert math.isclose(bound["bound_s"], 0.25)
    # When full-batch generation takes longer than any trajectory's own path, it is the bound.
    assert math.isclose(bench.lower_bound(LATENCIES, gen_full_s=0.4, gen_single_turn_s=0.1)["bound_s"], 0.4)


def test_latency_summary_tools_alone():
    s = bench.latency_summary(LATENCIES)
    assert math.isclose(s["lockstep_tool_s"], 0.03 + 0.05)  # per turn, the slowest tool: 0.03, then 0.05
    assert math.isclose(s["longest_trajectory_tool_s"], 0.05)  # trajectory 1: 0.00 + 0.05


def test_arlctl_loop_replays_each_trajectorys_latencies(policy):
    calls: list[tuple[int, int]] = []
    (gen_latencies, tokens, turns), wall = asyncio.run(
        _timed(bench.arlctl_loop(policy, LATENCIES, TOKENS, seed=0, calls=calls))
    )
    assert sorted(calls) == [(i, t) for i in range(3) for t in range(2)]
    assert turns == [2, 2, 2]
    assert tokens == [TOKENS] * 6  # EOS is ignored: every turn generates exactly K tokens
    assert len(gen_latencies) == 6
    assert wall >= LATENCIES.sum(axis=1).max()  # no trajectory can finish before its own sleeps


@pytest.mark.parametrize("mode", ["lockstep", "serial", "minimal"])
def test_reference_loops_do_the_same_work(policy, mode):
    codec = ChatCodec(policy.tokenizer)
    if mode == "lockstep":
        body, floor = bench.lockstep(policy, codec, LATENCIES, TOKENS, seed=0), LATENCIES.max(axis=0).sum()
    elif mode == "serial":
        body, floor = (
            bench.free_running(policy, codec, LATENCIES, TOKENS, seed=0, concurrency=1),
            LATENCIES.sum(),
        )
    else:
        body, floor = bench.free_running(policy, codec, LATENCIES, TOKENS, seed=0, concurrency=3), 0.05
    (gen_latencies, tokens, turns), wall = asyncio.run(_timed(body))
    assert turns == [2, 2, 2]
    assert tokens == [TOKENS] * 6
    assert len(gen_latencies) == 6
    assert wall >= floor  # lockstep waits for the slowest tool each turn; serial sleeps every latency


def test_run_benchmark_report_is_consistent(policy):
    out = bench.run_benchmark(
        policy, n=2, turns=2, tokens=TOKENS, seed=1, modes=("arlctl", "lockstep"), mean_latency=0.01
    )
    out = asyncio.run(out)
    b = out["bound"]
    assert b["bound_s"] == max(b["gen_full_batch_s"], b["critical_path_s"])
    for name in ("arlctl", "lockstep"):
        mode = out["modes"][name]
        assert mode["generate_calls"] == 4
        assert mode["tokens_per_turn_min"] == mode["tokens_per_turn_max"] == TOKENS
        assert math.isclose(mode["ratio_to_bound"], mode["wall_s"] / b["bound_s"], rel_tol=0.02, abs_tol=0.01)
    # The speedup is computed from the unrounded walls, the walls shown are rounded to 1 ms: at tens of ms
    # that alone moves their ratio by a few percent, so the tolerance is that rounding's bound.
    lockstep, arlctl = out["modes"]["lockstep"]["wall_s"], out["modes"]["arlctl"]["wall_s"]
    rounding = (lockstep / arlctl) * (0.0005 / arlctl + 0.0005 / lockstep) + 0.0005
    assert abs(out["speedup"]["arlctl_over_lockstep"] - lockstep / arlctl) <= rounding + 1e-9
    assert "arlctl within 1.2x of the bound" in bench.report(out)


async def _timed(body):
    start = time.perf_counter()
    result = await body
    return result, time.perf_counter() - start
