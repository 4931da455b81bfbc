"""Shards are data, never code; hostile values are refused or dropped, never trained (issue 12, classes 3-4).

Class 3: a shard planted in batches/ whose lineage carries a `--where` with `COPY ... TO` must run no SQL
and (unless its hashes recompute) mark nothing consumed; a consistent forgery marks its inputs consumed
by the documented rule, runs nothing and reads nothing outside --in. File names that glob (`*.parquet`,
`x[1].parquet`) and hidden in-progress names (`.x`, `_x`) are never read by query, inspect, validate or
filter. Class 4 (data path): every bad value class below is refused by `arlctl validate` (exit 1, file and
rule named) and dropped by `arlctl filter` under the counted rule invalid_values; a poison row in
`arlctl reward` gets a null reward with its cause instead of failing every retry.
Everything goes through the real CLI (typer's CliRunner over arlctl.cli.main.app).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.envs import registry
from arlctl.io.shards import (
    LINEAGE_KEY,
    Lineage,
    config_hash,
    read_shard,
    scan,
    write_shard,
    write_table_atomic,
)
from arlctl.schemas.rows import TrajectoryRow, Turn
from arlctl.schemas.trajectory import SCHEMA_METADATA, TRAJECTORY_SCHEMA
from arlctl.stages.configs import FilterConfig
from arlctl.synthetic import synthetic_table

runner = CliRunner()
INF, NAN = math.inf, math.nan


def cli(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def last_json(result) -> dict:
    return json.loads(result.stdout.strip().splitlines()[-1])


def plant(rows: list[dict] | pa.Table, path, lineage: Lineage | None = None) -> str:
    """Write a shard the way a hostile or broken writer would: right metadata, no validation."""
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA)
    meta = dict(SCHEMA_METADATA)
    meta[LINEAGE_KEY] = (lineage or Lineage(stage="test")).to_json().encode()
    return write_table_atomic(table, str(path), meta)


def good_row(group: str, idx: int, reward: float) -> dict:
    """A valid rewarded row: 3 response tokens (2 sampled, 1 environment), one turn covering them."""
    return TrajectoryRow(group_id=group, sample_index=idx, task_id=group, env="math", env_version="math-1",
                         task={"task_id": group, "question": "1+1?", "answer": "2"}, policy="p", prompt_text="p",
                         prompt_ids=[1, 2], response_ids=[3, 4, 5], response_mask=[1, 1, 0],
                         response_logprobs=[-0.1, -0.2, 0.0], turns=[Turn(0, 0, 2, 1, "t", observation="o")],
                         final_state="2", reward=reward, trajectory_id=f"{group}-{idx}").to_arrow()


def rewarded_rows() -> list[dict]:
    """Group a (2 rows) and group b (3 rows): dropping b's third row leaves both groups trainable."""
    return [good_row("a", 0, 1.0), good_row("a", 1, 0.0), good_row("b", 0, 1.0), good_row("b", 1, 0.0),
            good_row("b", 2, 1.0)]


# ------------------------------------------------------------------------------- class 3: code from data


def evil_where(target) -> str:
    return f"1=1) ; COPY (SELECT 42 AS pwned) TO '{target}' ; SELECT (1"


def filter_lineage(inputs: list[str], config: dict, *, consistent: bool, version: int = 0) -> Lineage:
    """An interrupted invocation's record: part 1 of 2 is "written", so a resume would write part 0."""
    invocation = config_hash({"inputs": sorted(os.path.basename(i) for i in inputs), "cfg": config,
                              "version": version})
    return Lineage(stage="filter", inputs=inputs, config_hash=config_hash(config) if consistent else "forged",
                   extra={"invocation": invocation if consistent else "inv-planted", "part": 1, "parts": 2,
                          "config": config, "current_version": version})


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "run"
    write_shard(synthetic_table(6, 4, seed=11), str(run / "rewarded" / "part-real.parquet"), Lineage("reward"))
    return run


def test_planted_lineage_with_copy_to_runs_no_sql_and_consumes_nothing(run_dir, tmp_path):
    pwned = tmp_path / "pwned.csv"
    config = {**asdict(FilterConfig()), "where": evil_where(pwned)}
    real = str(run_dir / "rewarded" / "part-real.parquet")
    plant(synthetic_table(2, 2, seed=1), run_dir / "batches" / "batch-evil.parquet",
          filter_lineage([real], config, consistent=False))

    result = cli("filter", "--run", run_dir, "--current-version", 0, "--json")
    assert result.exit_code == 0, result.output
    assert not pwned.exists(), "SQL from a shard's lineage ran"
    summary = last_json(result)
    assert summary["inputs"] == ["part-real.parquet"], "a planted shard marked a real input consumed"
    assert summary["batches"] and any("batch-evil.parquet" in u for u in summary["untrusted"])
    assert "lineage not trusted" in result.output


def test_consistent_forgery_still_runs_no_sql_and_is_reported(run_dir, tmp_path):
    """The documented rule: hashes that recompute mark inputs consumed (integrity, not authentication),
    but the recorded --where is never run: another config is not resumed, and that is said out loud."""
    pwned = tmp_path / "pwned.csv"
    config = {**asdict(FilterConfig()), "where": evil_where(pwned)}
    real = str(run_dir / "rewarded" / "part-real.parquet")
    plant(synthetic_table(2, 2, seed=1), run_dir / "batches" / "batch-evil.parquet",
          filter_lineage([real], config, consistent=True))

    result = cli("filter", "--run", run_dir, "--current-version", 0, "--json")
    assert result.exit_code == 0, result.output
    assert not pwned.exists(), "SQL from a shard's lineage ran"
    summary = last_json(result)
    assert summary["inputs"] == [] and summary["batches"] == []  # consumed by the (forged) record, as documented
    assert len(summary["unresumed"]) == 1 and "another configuration" in summary["unresumed"][0]
    assert "another configuration" in result.output


def test_forged_lineage_cannot_pull_in_a_shard_from_outside_in(run_dir, tmp_path):
    """A consistent record with this run's own config, naming a shard in another directory: resuming it
    resolves the name inside --in only, so the other run's rows are never read into a batch."""
    other = tmp_path / "other"
    write_shard(synthetic_table(6, 4, seed=99), str(other / "part-other.parquet"), Lineage("reward"))
    outsiders = set(read_shard(str(other / "part-other.parquet")).column("trajectory_id").to_pylist())
    config = asdict(FilterConfig())
    plant(synthetic_table(2, 2, seed=1), run_dir / "batches" / "batch-evil.parquet",
          filter_lineage([str(other / "part-other.parquet")], config, consistent=True))

    result = cli("filter", "--run", run_dir, "--current-version", 0, "--json")
    assert result.exit_code == 0, result.output
    trained = {t for s in scan(str(run_dir / "batches")).shards for t in read_shard(s).column("trajectory_id").to_pylist()}
    assert not trained & outsiders
    assert "cannot be resumed" in last_json(result)["unresumed"][0]


@pytest.mark.slow
def test_user_where_cannot_touch_files(run_dir, tmp_path):
    pwned = tmp_path / "pwned.csv"
    result = cli("filter", "--run", run_dir, "--current-version", 0, "--where", evil_where(pwned))
    assert result.exit_code == 2 and "--where predicate failed" in result.output
    assert not pwned.exists()


def test_absurd_latest_version_is_refused(run_dir):
    (run_dir / "policy").mkdir()
    (run_dir / "policy" / "LATEST").write_text("v99999999999999999999\n")
    result = cli("filter", "--run", run_dir)
    assert result.exit_code == 1 and "beyond any real run" in result.output


GLOB_AND_HIDDEN = ["*.parquet", "x[1].parquet", "x?.parquet", "{a,b}.parquet", ".hidden.parquet", "_tmp.parquet"]


@pytest.fixture
def globby(tmp_path):
    d = tmp_path / "rewarded"
    write_shard(synthetic_table(2, 2, seed=1), str(d / "a.parquet"), Lineage("reward"))
    for i, name in enumerate(GLOB_AND_HIDDEN):  # each a valid shard that must still never be read
        write_shard(synthetic_table(5, 2, seed=20 + i), str(d / name), Lineage("reward"))
    write_shard(synthetic_table(5, 2, seed=40), str(d / "x1.parquet"), Lineage("reward"))  # what x[1] / x? match
    os.rename(d / "x1.parquet", d / "_x1.parquet")  # hidden: only a glob would reach it
    return d


@pytest.mark.slow
def test_glob_and_hidden_names_are_never_read_by_query_inspect_validate(globby):
    query = cli("query", "select count(*) as n, count(distinct filename) as files from trajectories", globby, "--json")
    assert query.exit_code == 0, query.output
    assert last_json(query) == {"n": 4, "files": 1}
    inspect = cli("inspect", globby, "--json")
    assert inspect.exit_code == 0 and last_json(inspect)["rows"] == 4 and last_json(inspect)["shards"] == 1
    validate = cli("validate", globby, "--json")
    assert validate.exit_code == 0 and json.loads(validate.stdout.splitlines()[0])["rows"] == 4
    # Named directly, a globbing file name is refused too: it is not read as the pattern it spells.
    direct = cli("query", "select count(*) as n from trajectories", globby / "*.parquet", "--json")
    assert direct.exit_code == 1 and "no shards found" in direct.output


def test_a_directory_whose_path_globs_is_read_as_itself_not_as_a_pattern(tmp_path):
    """`runs/r[1]` as a raw DuckDB path matches `runs/r1`: the query would silently read the wrong run."""
    write_shard(synthetic_table(2, 2, seed=1), str(tmp_path / "r[1]" / "a.parquet"), Lineage("reward"))
    write_shard(synthetic_table(5, 2, seed=2), str(tmp_path / "r1" / "a.parquet"), Lineage("reward"))
    result = cli("query", "select count(*) as n from trajectories", tmp_path / "r[1]", "--json")
    assert result.exit_code == 0, result.output
    assert last_json(result) == {"n": 4}  # r[1]'s 2 groups of 2, none of r1's 10 rows


@pytest.mark.slow
def test_glob_and_hidden_names_are_never_consumed_by_filter(globby, tmp_path):
    result = cli("filter", "--in", globby, "--out", tmp_path / "batches", "--current-version", 0, "--json")
    assert result.exit_code == 0, result.output
    summary = last_json(result)
    assert summary["inputs"] == ["a.parquet"] and summary["rows_in"] == 4


# ------------------------------------------------------------------------------- class 4: hostile values


def _turn(**change):
    def edit(row):
        row["turns"][0].update(change)
    return edit


def _set(**change):
    def edit(row):
        row.update(change)
    return edit


# (case, edit of one row, column the message names, extra CLI options)
BAD_VALUES = [
    ("prompt_id_negative", _set(prompt_ids=[1, -7]), "prompt_ids", []),
    ("response_id_negative", _set(response_ids=[3, -1, 5]), "response_ids", []),
    ("response_id_int32_min", _set(response_ids=[3, -(2**31), 5]), "response_ids", []),
    ("response_id_beyond_vocab", _set(response_ids=[3, 50_000, 5]), "response_ids", ["--vocab-size", "1000"]),
    ("prompt_id_beyond_vocab", _set(prompt_ids=[1, 1000]), "prompt_ids", ["--vocab-size", "1000"]),
    ("mask_two", _set(response_mask=[1, 2, 0]), "response_mask", []),
    ("mask_minus_one", _set(response_mask=[1, -1, 0]), "response_mask", []),
    ("mask_shorter", _set(response_mask=[1, 1]), "response_mask", []),
    ("logprobs_longer", _set(response_logprobs=[-0.1, -0.2, 0.0, 0.0]), "response_logprobs", []),
    ("logprob_nan", _set(response_logprobs=[-0.1, NAN, 0.0]), "response_logprobs", []),
    ("logprob_minus_inf", _set(response_logprobs=[-INF, -0.2, 0.0]), "response_logprobs", []),
    ("logprob_plus_inf", _set(response_logprobs=[-0.1, INF, 0.0]), "response_logprobs", []),
    ("logprob_positive", _set(response_logprobs=[0.5, -0.2, 0.0]), "response_logprobs", []),
    ("turn_gen_start_negative", _turn(gen_start=-1), "turn 0", []),
    ("turn_past_the_row", _turn(gen_len=10), "turn 0", []),
    ("turn_obs_len_negative", _turn(obs_len=-2), "turn 0", []),
    ("turn_start_huge", _turn(gen_start=2**31 - 1), "turn 0", []),
    ("turn_version_absurd", _turn(policy_version=10**15), "policy_version", []),
    ("policy_version_negative", _set(policy_version=-1), "policy_version", []),
    ("policy_version_absurd", _set(policy_version=10**12, policy_version_last=10**12), "policy_version", []),
    ("reward_plus_inf", _set(reward=INF), "reward", []),
    ("reward_minus_inf", _set(reward=-INF), "reward", []),
    ("reward_nan", _set(reward=NAN), "reward", []),
    ("reward_component_inf", _set(reward_components=[("correct", INF)]), "reward_components", []),
    ("advantage_minus_inf", _set(advantage=-INF), "advantage", []),
    ("weight_nan", _set(weight=NAN), "weight", []),
    ("weight_negative", _set(weight=-1.0), "weight", []),
]


@pytest.fixture
def poisoned(request, tmp_path):
    case, edit, column, options = request.param
    rows = rewarded_rows()
    edit(rows[4])  # group b, sample 2
    d = tmp_path / "rewarded"
    plant(rows, d / f"part-{case}.parquet")
    return d, f"part-{case}.parquet", column, options


@pytest.mark.parametrize("poisoned", BAD_VALUES, indirect=True, ids=[c[0] for c in BAD_VALUES])
def test_validate_refuses_each_bad_value_naming_file_and_rule(poisoned):
    d, name, column, options = poisoned
    result = cli("validate", d, *options)
    assert result.exit_code == 1, result.output
    line = " ".join(result.output.split())
    assert name in line and "invalid_values" in line and column in line and "b-2" in line


@pytest.mark.parametrize("poisoned", BAD_VALUES, indirect=True, ids=[c[0] for c in BAD_VALUES])
def test_filter_drops_each_bad_value_under_the_counted_rule(poisoned, tmp_path):
    d, name, column, options = poisoned
    out = tmp_path / "batches"
    result = cli("filter", "--in", d, "--out", out, "--current-version", 0, "--json", *options)
    assert result.exit_code == 0, result.output
    summary = last_json(result)
    assert summary["rules"]["invalid_values"] == 1 and summary["dropped"] == 1 and summary["rows_kept"] == 4
    assert summary["invalid"][0].startswith(f"{name} row 4 (trajectory_id 'b-2')") and column in summary["invalid"][0]
    trained = [t for s in scan(str(out)).shards for t in read_shard(s).column("trajectory_id").to_pylist()]
    assert sorted(trained) == ["a-0", "a-1", "b-0", "b-1"]
    audit = pq.read_table(next((tmp_path / "metrics").glob("filter-*.parquet"))).to_pylist()
    assert {(r["trajectory_id"], r["rule"]) for r in audit if r["rule"] != "kept"} == {("b-2", "invalid_values")}


def test_clean_shard_passes_validate_with_a_vocab_bound(tmp_path):
    plant(rewarded_rows(), tmp_path / "rewarded" / "part-ok.parquet")
    result = cli("validate", tmp_path / "rewarded", "--vocab-size", "6")
    assert result.exit_code == 0, result.output
    assert cli("validate", tmp_path / "rewarded", "--vocab-size", "5").exit_code == 1  # id 5 is out of [0, 5)


def test_filter_drops_malformed_tool_calls_when_deduping(tmp_path):
    rows = rewarded_rows()
    rows[4]["turns"][0]["tool_calls"] = "[not json"
    plant(rows, tmp_path / "rewarded" / "part-1.parquet")
    result = cli("filter", "--in", tmp_path / "rewarded", "--out", tmp_path / "batches", "--current-version", 0,
                 "--dedupe-threshold", "0.9", "--json")
    assert result.exit_code == 0, result.output
    summary = last_json(result)
    assert summary["rules"]["invalid_values"] == 1 and "tool_calls" in summary["invalid"][0]


# ------------------------------------------------------------------------------- class 4: poison rows in reward


def rollout_rows() -> list[dict]:
    rows = [good_row("g", i, 0.0) for i in range(6)]
    for r in rows:
        r["reward"] = None
    rows[1]["task"] = "{not json"
    rows[2]["task"] = "[1, 2]"
    rows[3]["task"] = '{"task_id": "g", "question": "1+1?"}'  # valid JSON, no answer: the scorer rejects it
    rows[4]["task"] = "[" * 100_000 + "]" * 100_000  # nesting deep enough to exhaust the parser's recursion
    rows[5]["response_logprobs"] = [NAN, -0.2, 0.0]  # a bad value: passed on to filter, not a reason to stop
    return rows


def test_bad_task_json_gives_null_reward_with_a_cause_not_an_endless_failure(tmp_path):
    plant(rollout_rows(), tmp_path / "rollouts" / "part-1.parquet", Lineage("rollout"))
    args = ("reward", "--in", tmp_path / "rollouts", "--out", tmp_path / "rewarded", "--reward", "math", "--json",
            "--max-error-frac", "1")  # 4 of 6 rows fail on purpose; the default 0.5 would (rightly) exit 1
    result = cli(*args)
    assert result.exit_code == 0, result.output
    summary = last_json(result)
    assert len(summary["written"]) == 1 and len(summary["row_errors"]) == 4
    assert all(e.startswith("part-1.parquet row ") for e in summary["row_errors"])
    assert "no reward" in result.output and "part-1.parquet" in result.output
    out = read_shard(str(tmp_path / "rewarded" / "part-1.parquet"), bad_values="keep").to_pylist()
    assert [r["reward"] for r in out] == [1.0, None, None, None, None, 1.0]
    errors = [json.loads(r["reward_info"]).get("error") for r in out]
    assert "not valid JSON" in errors[1] and "not an object" in errors[2] and "answer" in errors[3]
    assert "not valid JSON" in errors[4] and errors[0] is None
    again = cli(*args)  # the shard is consumed: nothing is retried forever
    assert again.exit_code == 0 and last_json(again)["skipped_consumed"] == 1


@pytest.mark.parametrize("score", [(NAN, {}), (1.0, {"judge": INF}), (1e39, {})], ids=["nan", "inf_part", "f32_overflow"])
def test_a_non_finite_score_is_a_null_reward_with_a_cause(tmp_path, monkeypatch, score):
    """A judge that answers NaN, inf, or more than float32 holds (a broken endpoint): no reward, and why.
    When it answers so for every row, nothing got a reward: the command fails (exit 1), rows still written."""
    def judge(final_state, task, text):
        return (*score, {}) if task.get("bad", True) else (1.0, {}, {})

    monkeypatch.setitem(registry.REWARDS, "bad-judge", (judge, "bad-judge-1"))
    fine = good_row("g", 1, 0.0)
    fine["task"] = json.dumps({"bad": False})
    plant([good_row("g", 0, 0.0), fine], tmp_path / "rollouts" / "part-1.parquet", Lineage("rollout"))
    result = cli("reward", "--in", tmp_path / "rollouts", "--out", tmp_path / "rewarded", "--reward", "bad-judge",
                 "--json")
    assert result.exit_code == 0, result.output
    row, good = read_shard(str(tmp_path / "rewarded" / "part-1.parquet")).to_pylist()
    assert row["reward"] is None and "non-finite" in json.loads(row["reward_info"])["error"]
    assert good["reward"] == 1.0
    plant([good_row("h", 0, 0.0)], tmp_path / "rollouts" / "part-2.parquet", Lineage("rollout"))
    alone = cli("reward", "--in", tmp_path / "rollouts", "--out", tmp_path / "rewarded", "--reward", "bad-judge")
    assert alone.exit_code == 1 and "no row got a reward" in alone.output
    assert (tmp_path / "rewarded" / "part-2.parquet").is_file()


def test_an_unreadable_shard_does_not_hold_back_the_others(tmp_path):
    rollouts = tmp_path / "rollouts"
    rollouts.mkdir()
    (rollouts / "part-1.parquet").write_bytes(b"PAR1 truncated")
    plant([good_row("g", 0, 0.0)], rollouts / "part-2.parquet", Lineage("rollout"))
    args = ("reward", "--in", rollouts, "--out", tmp_path / "rewarded", "--reward", "math")
    result = cli(*args)
    assert result.exit_code == 1 and "part-1.parquet" in result.output
    assert (tmp_path / "rewarded" / "part-2.parquet").is_file(), "the good shard waited on the bad one"
    moved = cli(*args, "--quarantine")
    assert moved.exit_code == 0 and (rollouts / "_quarantine" / "part-1.parquet").is_file()


def test_a_planted_rewarded_shard_cannot_mark_another_input_consumed(tmp_path):
    plant([good_row("g", 0, 0.0)], tmp_path / "rollouts" / "part-1.parquet", Lineage("rollout"))
    plant([good_row("x", 0, 0.0)], tmp_path / "rewarded" / "evil.parquet",
          Lineage(stage="reward", inputs=[str(tmp_path / "rollouts" / "part-1.parquet")]))
    result = cli("reward", "--in", tmp_path / "rollouts", "--out", tmp_path / "rewarded", "--reward", "math", "--json")
    assert result.exit_code == 0, result.output
    assert last_json(result)["skipped_consumed"] == 0 and (tmp_path / "rewarded" / "part-1.parquet").is_file()
