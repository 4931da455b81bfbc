"""`arlctl rollout --env swe --harness mini-swe-agent`: the installed mini-swe-agent run G times per task, each
run in its own bwrap sandbox, its model calls through the rollout's in-process recording gateway, its rows
grouped per task and graded by the swe reward from the diff it left in the sandbox; then filter and train.

- the scripted `oracle:harness-gold` drives the real harness to the gold fix (one bash action, then the
  package's own submit): one row per run (a two-call session that extends by prefix), reward 1.0; and
  `oracle:harness-empty` submits at once: reward 0.
- the tiny model over 4 built-in tasks x G = 4 (step limit 1): 16 rows in 4 groups, every row valid, its
  mask-1 log-probs equal to a re-scoring of its exact ids, graded; then one filter and one train step.
- with more steps the tiny model's replies are never actions; mini-swe-agent drops each from its history,
  which splits the session: every segment is a row (env_info segment k of n), none is dropped.
- a second harness (tests/serve/harness_plugin.py) is added as module:factory with no loop change.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from serve_helpers import assert_contiguous, assert_token_exact, read_rows

pytestmark = [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("minisweagent") is None,
                                                   reason="mini-swe-agent is not installed (pip install -e '.[dev]')")]
ARLCTL = [sys.executable, "-m", "arlctl.cli.main"]
HERE = Path(__file__).resolve().parent


def cli(*args: str, cwd: Path, check: bool = True, **env: str) -> subprocess.CompletedProcess:
    done = subprocess.run([*ARLCTL, *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "MSWEA_GLOBAL_CONFIG_DIR": str(cwd / ".mswea"), **env})
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


def rows(directory: Path) -> list[dict]:
    return read_rows(directory)  # every shard validated against the schema


def info(row: dict) -> dict:
    value = row["env_info"]
    return value if isinstance(value, dict) else json.loads(value or "{}")


def rollout(tmp_path: Path, name: str, policy: str, tasks: str, group: int, *extra: str) -> list[dict]:
    cli("rollout", "--env", "swe", "--harness", "mini-swe-agent", "--tasks", tasks, "-G", str(group),
        "--policy", policy, "--out", str(tmp_path / name), *extra, cwd=tmp_path)
    cli("reward", "--in", str(tmp_path / name), "--out", str(tmp_path / f"{name}-rewarded"), "--reward", "swe",
        cwd=tmp_path)
    return rows(tmp_path / f"{name}-rewarded")


@pytest.fixture(scope="module")
def reference_model():
    import torch
    from transformers import AutoModelForCausalLM

    from arlctl.models import tiny_model_dir

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir(), local_files_only=True, dtype=torch.float32).eval()


def test_the_gold_oracle_through_mini_swe_agent_is_one_row_per_run_and_solves_the_task(tmp_path):
    got = rollout(tmp_path, "gold", "oracle:harness-gold", "builtin:swe?n=2", 2, "--max-new-tokens", "2048")
    assert len(got) == 4 and len({r["group_id"] for r in got}) == 2
    for group in {r["group_id"] for r in got}:
        members = [r for r in got if r["group_id"] == group]
        assert sorted(r["sample_index"] for r in members) == [0, 1] and len({r["task_id"] for r in members}) == 1
    for row in got:
        meta = info(row)
        assert (row["status"], row["finish_reason"], row["env"]) == ("ok", "submit", "swe")
        assert meta["harness"] == "mini-swe-agent" and meta["harness_status"] == "submitted"
        assert (meta["segment"], meta["segments"], meta["harness_steps"], row["num_turns"]) == (0, 1, 2, 2)
        assert meta["sandbox"] == "bwrap" and row["final_state"].startswith("diff --git")
        assert row["reward"] == 1.0 and json.loads(row["reward_info"])["trusted"] is True
        assert_contiguous(row)
    empty = rollout(tmp_path, "empty", "oracle:harness-empty", "builtin:swe?n=1", 2)
    assert [r["reward"] for r in empty] == [0.0, 0.0] and all(r["final_state"] == "" for r in empty)


def test_the_tiny_model_through_mini_swe_agent_then_filter_and_train(tmp_path, reference_model):
    got = rollout(tmp_path, "tiny", "tiny", "builtin:swe?n=4", 4, "--harness-opt", "step_limit=1",
                  "--max-new-tokens", "48", "--max-error-frac", "1")
    assert len(got) == 16 and len({r["group_id"] for r in got}) == 4 and len({r["task_id"] for r in got}) == 4
    for group in {r["group_id"] for r in got}:
        assert sorted(r["sample_index"] for r in got if r["group_id"] == group) == [0, 1, 2, 3]
    for row in got:
        assert row["policy"] == "tiny" and info(row)["segments"] == 1 and row["generated_tokens"] > 0
        assert row["reward"] is not None and row["reward_version"]  # graded, whatever the diff
        assert_token_exact(reference_model, row)
        assert_contiguous(row)
    cli("filter", "--in", str(tmp_path / "tiny-rewarded"), "--out", str(tmp_path / "batches"), "--truncated",
        "keep", "--keep-uniform", "1", "--adv", "batch", cwd=tmp_path)
    from arlctl.models import tiny_model_dir

    trained = cli("train", "--in", str(tmp_path / "batches"), "--out", str(tmp_path / "ckpt"), "--policy",
                  str(tiny_model_dir()),
                  "--max-steps", "1", cwd=tmp_path)
    assert "trained 1 steps" in trained.stdout + trained.stderr and (tmp_path / "ckpt" / "step-000001").is_dir()


def test_a_session_the_harness_splits_is_every_segment_a_row(tmp_path, reference_model):
    cli("rollout", "--env", "swe", "--harness", "mini-swe-agent", "--harness-opt", "step_limit=3", "--tasks",
        "builtin:swe?n=1", "-G", "1", "--policy", "tiny", "--max-new-tokens", "24", "--max-error-frac", "1",
        "--out", str(tmp_path / "split"), cwd=tmp_path, check=False)
    got = sorted(rows(tmp_path / "split"), key=lambda r: info(r)["segment"])
    steps = info(got[-1])["harness_steps"]
    assert steps >= 2 and len(got) == steps  # each unparseable reply is dropped by the harness: a new segment
    assert [info(r)["segment"] for r in got] == list(range(steps)) and {info(r)["segments"] for r in got} == {steps}
    assert len({r["group_id"] for r in got}) == 1 and len({r["trajectory_id"] for r in got}) == steps
    for row in got:
        assert_token_exact(reference_model, row)
    assert got[-1]["status"] in ("policy_error", "truncated")


def test_a_second_harness_is_a_plug_in(tmp_path):
    done = cli("rollout", "--env", "swe", "--harness", "harness_plugin:make", "--harness-opt", "note=ANSWER.txt",
               "--tasks", "builtin:swe?n=1", "-G", "2", "--policy", "tiny", "--max-new-tokens", "16",
               "--out", str(tmp_path / "plug"), cwd=tmp_path, PYTHONPATH=str(HERE))
    got = rows(tmp_path / "plug")
    assert len(got) == 2 and done.returncode == 0
    for row in got:
        assert info(row)["harness"] == "one-shot" and row["status"] == "ok" and row["num_turns"] == 1
        assert "ANSWER.txt" in row["final_state"]


@pytest.mark.parametrize("args, words", [
    (["--harness", "no-such-harness"], "unknown harness"),
    (["--harness-opt", "step_limit=2"], "needs --harness"),
    (["--harness", "mini-swe-agent", "--harness-opt", "bogus=1"], "bogus"),
    (["--harness", "mini-swe-agent", "--harness-opt", "step_limit=0"], "step_limit"),
])
def test_harness_usage_errors_exit_2_before_anything_runs(tmp_path, args, words):
    done = cli("rollout", "--env", "swe", "--tasks", "builtin:swe?n=1", "--policy", "tiny", "--out",
               str(tmp_path / "x"), *args, cwd=tmp_path, check=False)
    assert done.returncode == 2 and words in done.stderr, done.stderr[-1000:]
    assert not list((tmp_path / "x").glob("*.parquet"))
