"""`arlctl plan`: the ledger of a fixture run whose every number is known, checked against hand arithmetic.

The fixture: two swe trajectories (each holds a sandbox) in RUN/rollouts, one rollout, one reward and two
train metrics rows, written with the stages' own writers.

  row A: prompt 10; turn 0 generates 4 then 6 env tokens, turn 1 (gen_start 10) generates 2;
         wall 5.0 s, policy 2.0 s, env 3.0 s
  row B: prompt 20; one turn generating 10; wall 3.0 s, policy 2.5 s, env 0.5 s
"""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.io.shards import Lineage, write_shard
from arlctl.plan import Prices, Rates, calibrate, ledger
from arlctl.schemas.rows import TrajectoryRow, Turn, rows_to_table
from arlctl.stages.reward import RewardResult
from arlctl.stages.reward_job import write_reward_metrics
from arlctl.stages.rollout_job import write_rollout_metrics
from arlctl.stages.train import _write_metrics

runner = CliRunner()


def row(prompt: int, turns: list[tuple[int, int]], wall: float, gen: float, env: float,
        env_name: str = "swe") -> TrajectoryRow:
    """turns: (generated, environment) tokens per turn."""
    ids, mask, made = [], [], []
    for i, (g, o) in enumerate(turns):
        made.append(Turn(index=i, gen_start=len(ids), gen_len=g, obs_len=o, text="t"))
        ids += [1] * (g + o)
        mask += [1] * g + [0] * o
    return TrajectoryRow(group_id="g", sample_index=0, task_id="t", env=env_name, env_version="1", task={},
                         policy="p", prompt_text="q", prompt_ids=[1] * prompt, response_ids=ids, response_mask=mask,
                         response_logprobs=[-0.5 if m else 0.0 for m in mask], turns=made, wall_time_s=wall,
                         gen_time_s=gen, env_time_s=env)


@pytest.fixture
def run(tmp_path):
    run = tmp_path / "r1"
    rows = [row(10, [(4, 6), (2, 0)], wall=5.0, gen=2.0, env=3.0), row(20, [(10, 0)], wall=3.0, gen=2.5, env=0.5)]
    write_shard(rows_to_table(rows), str(run / "rollouts" / "part-1.parquet"), Lineage(stage="rollout"))
    write_rollout_metrics({"trajectories": 2, "seconds": 4.0, "generated_tokens": 16, "last_error": None,
                           "error_causes": {}, "backend_metrics": {"generated_tokens": 16, "busy_s": 0.5}},
                          str(run / "metrics"), "hf")
    total = RewardResult(rows=2, row_errors=[], seconds=1.0, reward_sum=1.0)
    write_reward_metrics(total, "math@1", str(run / "metrics"))
    for step, seconds in ((1, 1.5), (2, 2.5)):
        _write_metrics(str(run / "metrics"), step, f"b{step}", {"rows": 2, "step_time_s": seconds, "tokens": 16,
                                                                "loss": 0.0, "warning": ""})
    return run


def test_the_ledger_equals_the_hand_computation(run):
    rates = calibrate(str(run))
    assert rates.trajectories == 2
    assert rates.generated_tokens == (6 + 10) / 2 == 8
    # no prefix cache: each turn reads prompt + everything before it. A: (10 + 0) + (10 + 10) = 30; B: 20
    assert rates.prefill_tokens == (30 + 20) / 2 == 25
    # perfect prefix cache: prompt + tokens appended between generations. A: 10 + (10 - 4) = 16; B: 20
    assert rates.prefill_tokens_cached == (16 + 20) / 2 == 18
    assert (rates.turns, rates.wall_s, rates.gen_s, rates.env_s) == (1.5, 4.0, 2.25, 1.75)
    assert rates.engine_tok_s == 16 / 0.5 == 32  # engine tokens / busy seconds
    assert rates.rollout_traj_s == 2 / 4.0 and rates.reward_s == 1.0 / 2 and rates.reward_rows_s == 2 / 1.0
    assert rates.rows_per_step == 2 and rates.train_step_s == (1.5 + 2.5) / 2 and rates.train_tokens == 32 / 4
    assert any(n.startswith("sandbox-seconds") for n in rates.not_recorded)

    led = ledger(rates, target_steps_per_hour=3600, prices=Prices(gpu_hour=2.0, cpu_hour=0.1))
    assert led.per_trajectory["sandbox_s"] == pytest.approx(4.0 / 1.3)  # wall / 1.3 (the seed)
    step = led.per_step
    assert step["trajectories"] == 2
    assert step["inference_gpu_s"] == 2 * 8 / 32 == 0.5  # B x G / C
    assert step["sandbox_s"] == pytest.approx(2 * 4.0 / 1.3)
    assert (step["env_s"], step["reward_s"], step["trainer_gpu_s"]) == (2 * 1.75, 2 * 0.5, 2.0)
    # as run: rollout 3600 x 0.5 / 2 = 900, reward 3600 x 2 / 2 = 3600, trainer 3600 / 2 = 1800 steps/hour
    assert led.as_run["steps_per_hour"] == {"rollout": 900, "reward": 3600, "trainer": 1800}
    assert led.as_run["bottleneck"] == "rollout" and led.as_run["rollout_waits_on"] == "inference"  # 2.25 > 1.75
    # one GPU: 32 / 8 = 4 trajectories/s; in flight 4 x 4.0 = 16; sandboxes 16 / 1.3; env 4 x 1.75; reward 4 x 0.5
    assert led.balance == pytest.approx({"trajectories_per_s_per_gpu": 4, "in_flight_per_gpu": 16,
                                         "sandboxes_per_gpu": 16 / 1.3, "env_cores_per_gpu": 7,
                                         "reward_workers_per_gpu": 2})
    # 3600 steps/hour: 1 step/s x 2 = 2 trajectories/s; in flight 2 x 4.0 = 8; sandboxes ceil(8 / 1.3) = 7;
    # inference ceil(2 x 8 / 32) = 1; trainer ceil(1 x 2.0) = 2; reward ceil(2 x 0.5) = 1; env cores 2 x 1.75
    target = led.target
    assert (target["trajectories_per_s"], target["in_flight"], target["sandboxes"], target["inference_gpus"],
            target["trainer_gpus"], target["reward_workers"], target["env_cores"]) == (2, 8, 7, 1, 2, 1, 3.5)
    # $/hour: 3 GPUs x 2.0 + (7 sandboxes + 1 reward worker) x 0.1 = 6.8; per step 6.8 / 3600
    assert target["cost_per_hour"] == pytest.approx(6.8)
    assert target["cost_per_step"] == pytest.approx(6.8 / 3600)
    assert target["cost_per_1k_trajectories"] == pytest.approx(1000 * 6.8 / 3600 / 2)
    # busy: GPU-s 0.5 + 2.0 = 2.5 at 2.0/h; CPU-s 2 x 4 / 1.3 + 1.0 at 0.1/h
    cpu_s = 2 * 4.0 / 1.3 + 1.0
    assert led.cost["gpu_s_per_step"] == 2.5 and led.cost["cpu_s_per_step"] == pytest.approx(cpu_s)
    assert led.cost["per_step"] == pytest.approx(2.5 * 2.0 / 3600 + cpu_s * 0.1 / 3600)
    assert led.cost["per_1k_trajectories"] == pytest.approx(1000 * led.cost["per_step"] / 2)


def test_json_shape_and_table(run):
    result = runner.invoke(app, ["plan", str(run), "--target-steps-per-hour", "3600", "--gpu-hour-price", "2",
                                 "--cpu-hour-price", "0.1", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == {"run", "per_trajectory", "per_step", "as_run", "balance", "target", "cost", "rates",
                         "sources", "not_recorded", "uses_sandbox"}
    assert data["target"]["inference_gpus"] == 1 and data["target"]["sandboxes"] == 7
    assert math.isclose(data["cost"]["per_step"], 2.5 * 2.0 / 3600 + (2 * 4.0 / 1.3 + 1.0) * 0.1 / 3600)
    # A rate given on the command line replaces the measured one: 4x the engine, a quarter of the GPU-seconds.
    fast = json.loads(runner.invoke(app, ["plan", str(run), "--inference-tok-s", "128", "--json"]).stdout)
    assert fast["per_step"]["inference_gpu_s"] == 2 * 8 / 128 and fast["target"] is None
    assert fast["sources"]["engine_tok_s"] == "given on the command line"

    table = runner.invoke(app, ["plan", str(run), "--target-steps-per-hour", "3600"])
    assert table.exit_code == 0, table.output
    for text in ("per trajectory", "bottleneck", "rollout", "sandboxes", "not recorded", "inference GPUs"):
        assert text in table.output


def test_what_is_not_recorded_is_said(tmp_path):
    run = tmp_path / "bare"
    write_shard(rows_to_table([row(10, [(4, 0)], wall=1.0, gen=1.0, env=0.0)]),
                str(run / "rollouts" / "part-1.parquet"), Lineage(stage="rollout"))
    data = json.loads(runner.invoke(app, ["plan", str(run), "--target-steps-per-hour", "10", "--json"]).stdout)
    assert data["per_step"]["trajectories"] is None and data["target"]["trainer_gpus"] is None
    assert data["as_run"]["bottleneck"] is None
    notes = " ".join(data["not_recorded"])
    assert "no train metrics rows" in notes and "no reward metrics rows" in notes and "no rollout metrics" in notes


def test_an_empty_run_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    result = runner.invoke(app, ["plan", str(tmp_path / "empty")])
    assert result.exit_code == 2
    assert "no trajectories to calibrate from" in result.output
    assert runner.invoke(app, ["plan", str(tmp_path / "missing")]).exit_code == 2


def _sandbox_lines(output: str) -> list[str]:
    """The table's sandbox rows ("  sandbox" / "  sandboxes" in the quantity column)."""
    return [line for line in output.splitlines() if line.count("│") == 4
            and line.split("│")[1].strip() in ("sandbox", "sandboxes")]


def test_a_run_of_a_sandbox_free_env_prints_none_on_its_sandbox_lines(tmp_path, run):
    # swe (the fixture) holds a sandbox: every sandbox line has a figure (the arithmetic is checked above).
    table = runner.invoke(app, ["plan", str(run), "--target-steps-per-hour", "3600"])
    assert table.exit_code == 0, table.output
    lines = _sandbox_lines(table.output)
    assert len(lines) == 4 and not any("none" in line for line in lines), lines  # trajectory, step, GPU, target
    swe = json.loads(runner.invoke(app, ["plan", str(run), "--json"]).stdout)
    assert swe["uses_sandbox"] is True and swe["per_trajectory"]["sandbox_s"] == pytest.approx(4.0 / 1.3)

    # The same two trajectories from math, which holds no sandbox: "none" on the same four lines, 0 sandboxes.
    bare = tmp_path / "math"
    rows = [row(10, [(4, 6), (2, 0)], wall=5.0, gen=2.0, env=3.0, env_name="math"),
            row(20, [(10, 0)], wall=3.0, gen=2.5, env=0.5, env_name="math")]
    write_shard(rows_to_table(rows), str(bare / "rollouts" / "part-1.parquet"), Lineage(stage="rollout"))
    args = ["plan", str(bare), "--target-steps-per-hour", "3600", "--rows-per-step", "2"]
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    lines = _sandbox_lines(table.output)
    assert len(lines) == 4 and all("none" in line for line in lines), lines
    assert "env math holds no sandbox" in table.output
    data = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert data["uses_sandbox"] is False and data["sources"]["sandboxes"] == "env math holds no sandbox"
    assert data["per_trajectory"]["sandbox_s"] == 0 and data["per_step"]["sandbox_s"] == 0
    assert data["balance"]["sandboxes_per_gpu"] == 0 and data["target"]["sandboxes"] == 0
    assert not any(n.startswith("sandbox-seconds") for n in data["not_recorded"])


def test_a_mixed_run_sizes_sandboxes_for_its_sandboxed_trajectories_only():
    rates = Rates(trajectories=2, generated_tokens=8, prefill_tokens=25, prefill_tokens_cached=18, turns=1.5,
                  wall_s=4.0, gen_s=2.25, env_s=1.75, rows_per_step=2, sandbox_envs=("swe",), sandbox_wall_s=2.5)
    led = ledger(rates, target_steps_per_hour=3600)
    # a swe trajectory of wall 5.0 and a math one of wall 3.0: (5.0 + 0) / 2 = 2.5 sandboxed wall-seconds each
    assert led.uses_sandbox and led.per_trajectory["sandbox_s"] == pytest.approx(2.5 / 1.3)
    # 2 trajectories/s x 2.5 s / 1.3 = 3.85 -> 4 sandboxes (all-swe would need ceil(2 x 4.0 / 1.3) = 7)
    assert led.target["sandboxes"] == 4 and led.target["in_flight"] == 8
