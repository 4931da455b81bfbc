"""A careless user's mistakes through the real CLI (issue 27): each one is refused, named, and leaves
nothing behind, instead of running on the wrong data.

One small real run (the tiny policy on first-token, rolled out and rewarded in process) is shared by the
module; the commands under test run in process (tests/inprocess.py), the same click objects as `arlctl`.
"""

from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from inprocess import arlctl

from arlctl.io.shards import list_shards, read_shard


def _files(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """RUN/rollouts and RUN/rewarded: 4 first-token tasks x 2 samples from the tiny policy."""
    root = tmp_path_factory.mktemp("careless") / "math-run"
    done = arlctl("rollout", "--run", root, "--env", "first-token", "--tasks", "builtin:first-token?n=4",
                  "--policy", "tiny", "-G", "2", "--max-turns", "1", "--max-new-tokens", "3", "--seed", "0", "-q")
    assert done.returncode == 0, done.stderr
    done = arlctl("reward", "--run", root, "--reward", "first-token", "-q")
    assert done.returncode == 0, done.stderr
    return root


def _rows(directory) -> list[dict]:
    return [row for shard in list_shards(str(directory)) for row in read_shard(shard).to_pylist()]


@pytest.mark.slow
def test_filter_writing_into_its_own_input_is_refused_and_a_rerun_reads_nothing_twice(run, tmp_path):
    before = _files(run)
    for out in (run / "rewarded", run / "rewarded" / "batches", run):
        done = arlctl("filter", "--in", run / "rewarded", "--out", out, "--keep-uniform", "1")
        assert done.returncode == 2 and "overlaps" in done.stderr, (out, done.stderr)
    # With --run, every other stage directory of the run is off limits too.
    for kind in ("rollouts", "policy", "metrics"):
        done = arlctl("filter", "--run", run, "--out", run / kind, "--keep-uniform", "1")
        assert done.returncode == 2 and f"the run's {kind}/" in done.stderr.replace("\n", ""), done.stderr
    assert _files(run) == before  # refused before anything was made
    # What the README promises instead: re-running filter on the same input packs every row once.
    out = tmp_path / "batches"
    for _ in range(3):
        done = arlctl("filter", "--in", run / "rewarded", "--out", out, "--keep-uniform", "1", "--batch-groups", "1")
        assert done.returncode == 0, done.stderr
    ids = [row["trajectory_id"] for row in _rows(out)]
    assert len(ids) == 8 and len(set(ids)) == 8


def test_a_missing_input_is_a_usage_error_that_names_it_and_makes_nothing(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    done = arlctl("reward", "--in", "doesnotexist", "--out", "r1", "--reward", "first-token")
    assert done.returncode == 2 and "--in doesnotexist does not exist" in done.stderr
    assert not (tmp_path / "r1").exists()
    # A typo next to the real directory: the hint names it.
    done = arlctl("reward", "--in", run / "rolouts", "--out", tmp_path / "r2", "--reward", "first-token")
    assert done.returncode == 2 and f"did you mean {run / 'rollouts'}?" in done.stderr.replace("\n", "")
    assert not (tmp_path / "r2").exists()
    done = arlctl("train", "--in", tmp_path / "no-batches", "--out", tmp_path / "ckpt", "--policy", "tiny")
    assert done.returncode == 2 and "does not exist" in done.stderr and not (tmp_path / "ckpt").exists()
    done = arlctl("sync", "--ckpt", tmp_path / "no-ckpt", "--policy-dir", tmp_path / "pol")
    assert done.returncode == 2 and "--ckpt" in done.stderr and not (tmp_path / "pol").exists()


@pytest.mark.parametrize("command", [["train", "--policy", "tiny"], ["filter"], ["reward", "--reward", "first-token"],
                                     ["sync"]])
def test_only_the_producing_stages_start_a_run_directory(run, command):
    """rollout (and eval of a policy) read no stage's output: they may start a run. Every other stage reads
    one, so a --run that does not exist is a typo."""
    typo = run.parent / "math-rnu"
    done = arlctl(command[0], "--run", typo, *command[1:])
    assert done.returncode == 2, done.stderr
    assert f"run directory {typo} does not exist" in done.stderr
    assert f"did you mean {run}?" in done.stderr.replace("\n", "")
    assert not typo.exists()  # no RUN/checkpoints/_locks, no metrics file


def test_an_unknown_env_or_task_source_is_named_with_the_real_choices(tmp_path):
    done = arlctl("rollout", "--env", "first-tokn", "--policy", "tiny", "--out", tmp_path / "o")
    assert done.returncode == 2 and "unknown env 'first-tokn'" in done.stderr
    hint = done.stderr.replace("\n", " ")
    assert "did you mean first-token" in hint and all(name in hint for name in ("math", "swe", "code", "textarena"))
    done = arlctl("rollout", "--tasks", "builtin:mth", "--policy", "tiny", "--out", tmp_path / "o")
    hint = done.stderr.replace("\n", " ")
    assert done.returncode == 2 and "did you mean builtin:math" in hint and "builtin:first-token" in hint
    assert not (tmp_path / "o").exists()


def test_a_missing_policy_is_a_usage_error_before_anything_is_made(tmp_path):
    done = arlctl("rollout", "--env", "first-token", "--policy", tmp_path / "no-model", "--out", tmp_path / "o")
    assert done.returncode == 2 and "not found" in done.stderr
    assert not (tmp_path / "o").exists()


def test_query_never_counts_a_foreign_parquet_file_among_the_trajectories(run, tmp_path):
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shard = list_shards(str(run / "rollouts"))[0]
    shutil.copyfile(shard, mixed / "part-0.parquet")
    pq.write_table(pa.table({"a": list(range(100))}), mixed / "notes.parquet")
    expected = read_shard(shard).num_rows
    done = arlctl("query", "select count(*) as n from trajectories", mixed, "--json")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f'{{"n": {expected}}}'
    assert "1 Parquet file(s) not read" in done.stderr and "notes.parquet" in done.stderr
    # Only foreign files: read as they are, and said so.
    (mixed / "part-0.parquet").unlink()
    done = arlctl("query", "select count(*) as n from trajectories", mixed, "--json")
    assert done.returncode == 0 and done.stdout.strip() == '{"n": 100}'
    assert "none of the 1 Parquet file(s) is a trajectory shard" in done.stderr.replace("\n", " ")
