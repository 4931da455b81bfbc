"""`arlctl eval` as a user runs it: one version into RUN/evals (again: a no-op, or --force), --compare on
hand-built evals with known McNemar counts, and the `eval` stage of `arlctl up`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pytest
from inprocess import arlctl
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.errors import UsageError
from arlctl.io.run import RunLayout
from arlctl.io.shards import Lineage, scan, write_shard
from arlctl.supervisor import Supervisor, parse_recipe, stage_argv

TASKS = "builtin:math?n=3&seed=7"
runner = CliRunner()


def test_eval_writes_a_version_once_then_skips_it_unless_forced(tmp_path):
    run = str(tmp_path / "run")
    base = ["eval", "--run", run, "--policy", "tiny", "--tasks", TASKS, "--samples", "2", "--max-turns", "1",
            "--max-new-tokens", "4", "--json"]  # no -q: it reads "already evaluated" on stderr
    first = arlctl(*base)
    assert first.returncode == 0, first.stderr
    summary = json.loads(first.stdout)
    directory = Path(RunLayout(run).eval_version("heldout", 0))
    assert summary["directory"] == str(directory) and not summary["skipped"]
    assert summary["n_rows"] == 6 and summary["n_tasks"] == 3 and set(summary["pass_at_k"]) == {"1", "2"}
    assert json.loads((directory / "summary.json").read_text())["n_rows"] == 6
    shards = scan(str(directory)).shards
    again = arlctl(*base)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["skipped"] and "already evaluated" in again.stderr
    assert scan(str(directory)).shards == shards
    planned = runner.invoke(app, [*base[:-1], "--dry-run"])  # in-process: plans only, loads no model
    assert planned.exit_code == 0 and "0 version(s) to evaluate" in planned.output
    forced = runner.invoke(app, [*base[:-1], "--force", "--dry-run"])
    assert forced.exit_code == 0 and "would evaluate v0" in forced.output, forced.output


def fixture_eval(root: Path, name: str, version: int, solved: list[bool]) -> None:
    """A greedy eval of `version` by hand: one row per task t0.., reward 1 where solved, and its summary."""
    from arlctl.stages.eval import EvalConfig, outcomes, summarize
    from arlctl.synthetic import synthetic_table

    table = synthetic_table(len(solved), group_size=1, seed=version)
    table = table.set_column(table.schema.get_field_index("task_id"), "task_id",
                             [[f"t{i}" for i in range(len(solved))]])
    table = table.set_column(table.schema.get_field_index("status"), "status", [["ok"] * len(solved)])
    table = table.set_column(table.schema.get_field_index("reward"), table.schema.field("reward"),
                             pa.array([1.0 if s else 0.0 for s in solved], pa.float32()))
    directory = root / name / f"v{version:06d}"
    write_shard(table, str(directory / "greedy-x.parquet"), Lineage("eval", extra={"eval": name}))
    summary = {"name": name, "version": version, "tasks": ["fixture"], "correct_at": 1.0,
               **summarize({"greedy": outcomes(table)}, EvalConfig())}
    (directory / "summary.json").write_text(json.dumps(summary))


def test_compare_gives_correct_rates_and_the_exact_mcnemar_test(tmp_path):
    run = tmp_path / "run"
    # 20 tasks: both 4, only v3 5, only v7 1, neither 10  ->  b = 5, c = 1, p = 2 * 7 / 64 = 0.21875
    a = [True] * 4 + [True] * 5 + [False] * 1 + [False] * 10
    b = [True] * 4 + [False] * 5 + [True] * 1 + [False] * 10
    fixture_eval(Path(RunLayout(str(run)).evals), "greedy", 3, a)
    fixture_eval(Path(RunLayout(str(run)).evals), "greedy", 7, b)
    result = runner.invoke(app, ["eval", "--compare", "v3", "v000007", "--run", str(run), "--name", "greedy",
                                 "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout.strip().splitlines()[0])
    greedy = out["modes"]["greedy"]
    assert (out["a"], out["b"]) == (3, 7)
    assert greedy["a"]["correct_rate"] == pytest.approx(9 / 20) and greedy["b"]["correct_rate"] == pytest.approx(5 / 20)
    assert greedy["a"]["correct_se"] == pytest.approx((9 / 20 * 11 / 20 / 20) ** 0.5)
    assert greedy["mcnemar"] == {"tasks": 20, "both": 4, "neither": 10, "only_a": 5, "only_b": 1, "unpaired": 0,
                                 "p_value": pytest.approx(0.21875)}
    missing = runner.invoke(app, ["eval", "--compare", "v3", "v9", "--run", str(run), "--name", "greedy"])
    assert missing.exit_code == 2 and "v9 of eval 'greedy' is not evaluated" in missing.output
    assert "evaluated versions: v3, v7" in missing.output


def test_recipe_accepts_an_eval_stage_and_rejects_what_it_cannot_do(tmp_path):
    run = str(tmp_path / "run")
    recipe = parse_recipe({"run": run, "stages": {"eval": {"args": {"policy": "tiny", "tasks": TASKS, "every": 2,
                                                                    "greedy": True}}, "sync": {}}})
    assert [s.name for s in recipe.stages] == ["sync", "eval"]  # side stages start after the pipeline's
    assert stage_argv(recipe, recipe.stage("eval"), 0)[len(recipe.command):] == [
        "eval", "--run", run, "--watch", "--policy", "tiny", "--tasks", TASKS, "--every", "2", "--greedy"]
    with pytest.raises(UsageError, match="has no --worker"):
        parse_recipe({"run": run, "stages": {"eval": {"workers": 2}}})
    with pytest.raises(UsageError, match="no option --evry") as typo:
        parse_recipe({"run": run, "stages": {"eval": {"args": {"evry": 2}}}})
    assert typo.value.hint == "did you mean --every?"


@pytest.mark.e2e
def test_eval_runs_as_a_stage_of_up(tmp_path):
    """The child `arlctl eval --run RUN --watch ...` starts, follows RUN/policy (nothing published yet: it loads
    no model and waits) and stops cleanly on the supervisor's SIGTERM. (What it evaluates once versions appear:
    tests/stages/test_eval.py, the same `watch`.)"""
    run = str(tmp_path / "run")
    recipe = parse_recipe({"run": run, "stop_grace_s": 20, "stages": {"eval": {"args": {
        "tasks": TASKS, "max-turns": 1, "max-new-tokens": 4, "poll": 0.5, "every": 2}}}})
    sup = Supervisor(recipe)
    log = Path(sup.children[0].log_path)
    sup.start()
    try:
        deadline = time.time() + 60
        while "following" not in log.read_text() and time.time() < deadline:
            sup.tick()
            assert sup.children[0].state == "running", log.read_text()[-2000:]
            time.sleep(0.3)
        assert f"following {RunLayout(run).policy}, every 2 version(s)" in log.read_text(), log.read_text()[-2000:]
        assert (Path(RunLayout(run).eval_dir("heldout")) / "_locks" / "eval.lock").exists()
    finally:
        sup.stop()
    assert sup.children[0].last_exit == "exit 0", log.read_text()[-2000:]  # SIGTERM: the watcher stopped cleanly
