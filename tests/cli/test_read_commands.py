"""query / inspect / show / validate through Typer's CliRunner, with --json parsed and checked."""

from __future__ import annotations

import json
import os

import pyarrow.compute as pc
import pytest
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.io.shards import Lineage, write_shard
from arlctl.synthetic import synthetic_table

runner = CliRunner()


@pytest.fixture
def shards(tmp_path):
    d = tmp_path / "rewarded"
    tables = [synthetic_table(6, 4, seed=1), synthetic_table(4, 4, seed=2, policy_version=3)]
    for i, t in enumerate(tables):
        write_shard(t, str(d / f"part-{i}.parquet"), Lineage(stage="test"))
    return d, tables


def run(*args):
    result = runner.invoke(app, list(args))
    return result


def test_version_and_help_list_commands():
    result = run("--version")
    assert result.exit_code == 0 and result.stdout.startswith("arlctl ")
    result = run("--help")
    for command in ("query", "inspect", "show", "validate"):
        assert command in result.stdout


def test_query_json_rows_and_list_struct_columns(shards):
    d, tables = shards
    result = run("query", "select env, count(*) as n, avg(reward) as r from trajectories group by 1 order by 1",
                 str(d), "--json")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    both = tables[0].to_pylist() + tables[1].to_pylist()
    expected = {}
    for r in both:
        expected.setdefault(r["env"], []).append(r["reward"])
    assert [r["env"] for r in rows] == sorted(expected)
    for r in rows:
        assert r["n"] == len(expected[r["env"]])
        assert r["r"] == pytest.approx(sum(expected[r["env"]]) / len(expected[r["env"]]), rel=1e-5)

    result = run("query", "select sum(len(response_ids)) as toks, count(*) as turns from trajectories, unnest(turns) as u(t)",
                 str(d), "--json")
    got = json.loads(result.stdout)
    assert got["turns"] == sum(r["num_turns"] for r in both)
    assert result.exit_code == 0


def test_query_csv(shards):
    d, _ = shards
    result = run("query", "select status, count(*) as n from trajectories group by 1 order by 1", str(d), "--csv")
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "status,n" and len(lines) >= 2


def test_query_sql_error_is_one_line_and_exit_1(shards):
    d, _ = shards
    result = run("query", "select nonexistent_column from trajectories", str(d))
    assert result.exit_code == 1
    error_lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and "nonexistent_column" in error_lines[0]
    assert "Traceback" not in result.output


def test_no_shards_says_so_and_exits_1(tmp_path):
    (tmp_path / "empty").mkdir()
    for command in (["query", "select 1 from trajectories"], ["inspect"], ["validate"]):
        result = run(*command, str(tmp_path / "empty"))
        assert result.exit_code == 1
        assert "no shards found" in result.output


def test_stray_file_is_reported_not_crashed_on(shards):
    d, tables = shards
    (d / "README.txt").write_text("not a shard")
    result = run("query", "select count(*) as n from trajectories", str(d), "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["n"] == sum(t.num_rows for t in tables)
    assert "README.txt" in result.stderr


def test_inspect_json(shards):
    d, tables = shards
    result = run("inspect", str(d), "--json")
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)
    rows = tables[0].to_pylist() + tables[1].to_pylist()
    assert stats["rows"] == 40 and stats["groups"] == 10 and stats["shards"] == 2
    assert sum(stats["status"].values()) == 40
    assert stats["status"]["ok"] == sum(r["status"] == "ok" for r in rows)
    assert stats["reward"]["mean"] == pytest.approx(sum(r["reward"] for r in rows) / 40, abs=1e-4)
    assert stats["policy_versions"]["max_version"] == 3 and stats["policy_versions"]["max_lag"] == 3
    gen = sum(r["generated_tokens"] for r in rows)
    resp = sum(r["response_tokens"] for r in rows)
    assert stats["tokens"]["mask1_fraction"] == pytest.approx(gen / resp, abs=1e-4)
    assert stats["time"]["gen_s"] == pytest.approx(sum(r["gen_time_s"] for r in rows), rel=1e-3)
    assert {e["env"] for e in stats["per_env"]} == {r["env"] for r in rows}


def test_inspect_human_output(shards):
    d, _ = shards
    result = run("inspect", str(d))
    assert result.exit_code == 0
    assert "per env" in result.stderr and "mask1_fraction" in result.stderr


def test_show_by_prefix_json_and_human(shards):
    d, tables = shards
    target = tables[1].to_pylist()[5]
    result = run("show", target["trajectory_id"][:13], str(d), "--json")
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert got["trajectory_id"] == target["trajectory_id"]
    assert got["response_ids"] == target["response_ids"]
    spans = got["mask_spans"]
    assert sum(n for _, n in spans) == target["response_tokens"]
    assert sum(n for m, n in spans if m == 1) == target["generated_tokens"]

    result = run("show", target["trajectory_id"], str(d))
    assert result.exit_code == 0
    assert "mask 1" in result.stderr and "mask 0" in result.stderr
    assert f"turn {target['num_turns'] - 1}" in result.stderr


def test_show_unknown_id(shards):
    d, _ = shards
    result = run("show", "ffffffff-not-there", str(d))
    assert result.exit_code == 1 and "no trajectory" in result.output


def test_validate_reports_bad_shards_and_quarantines(shards):
    d, _ = shards
    (d / "part-9.parquet").write_bytes(b"PAR1 this is not parquet")
    result = run("validate", str(d), "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["ok"] == 2 and len(report["bad"]) == 1
    assert report["bad"][0]["shard"].endswith("part-9.parquet")
    bad_lines = [line for line in result.stderr.splitlines() if line.startswith("bad ")]
    assert len(bad_lines) == 1 and "part-9.parquet" in bad_lines[0]

    result = run("validate", str(d), "--quarantine")
    assert result.exit_code == 1
    assert os.listdir(d / "_quarantine") == ["part-9.parquet"]
    result = run("validate", str(d))
    assert result.exit_code == 0


def test_filter_columns_via_pyarrow_agree_with_query(shards):
    d, tables = shards
    result = run("query", "select count(*) as n from trajectories where status = 'ok'", str(d), "--json")
    ok = sum(pc.sum(pc.equal(t.column("status"), "ok")).as_py() for t in tables)
    assert json.loads(result.stdout)["n"] == ok
