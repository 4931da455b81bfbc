"""`arlctl report` and `arlctl query` on a run with planted shards (issue 26 item 4): real attacks, real CLI.

A metrics file is data: whoever can write RUN/metrics can name its columns anything. The report once spliced
train-step column names into DuckDB SQL, so a planted name broke out of its quotes and `COPY ... TO` wrote a
file of the attacker's choosing (and a `"` in a name crashed the page). Here one run holds every hostile name
and value at once; one subprocess render of the real CLI must exit 0 with no traceback, write nothing outside
its --out directory, and show every planted name as text (escaped in the HTML, exact in --json).
"""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.synthetic import synthetic_table

ROOT = Path(__file__).resolve().parents[2]


def breakout(target: Path) -> str:
    """A column name that, spliced into `select step, "{c}"::double as "{c}" ... from train_metrics` (the
    report before the fix), ends the select, runs COPY into `target`, and comments out the rest."""
    return f"loss\" from train_metrics; copy (select 42 as pwned) to '{target}' (format csv); --"


def hostile_names(root: Path) -> list[str]:
    return [
        'a"b', "it's", "x; drop table train_metrics; --", "-- just a comment", "new\nline", "tab\tand\rcr",
        breakout(root / "pwned-breakout.csv"),
        f"\") TO '{root / 'pwned-to.csv'}' (format csv); --",
        f"'); copy (select 1) to '{root / 'pwned-single.csv'}'; --",
        "\u201closs\u201d", "\uff02fullwidth\uff02", "\u02baprime\u02ba", "\u2018single\u2019",
        "L" * 10_000,
        "select", "from", "order", "group", "where", "null", "true",
        "$\\frac{$", "$x$", "<script>alert(1)</script>", "&amp;", "", "n\x00ul", "{gen}", "%s", "$p", "?",
        "\u202egnp.exe", "\x1b[31mred",
    ]


SQL_VALUES = ["'); copy (select 1) to 'pwned-value.csv'; --", "\" or 1=1 --", "x'; attach 'evil.db'; --"]


def planted_values(i: int) -> list[float | None]:
    """Column i's values over the three steps: each way a column reaches the page gets every kind of name
    in turn (a plot of a changing column, the table of unchanged ones, the list of all-null ones)."""
    return [[float(i), float(i) + 1, float(i) + 1], [float(i)] * 3, [None] * 3][i % 3]


def plant_run(root: Path) -> tuple[Path, list[str]]:
    """RUN/metrics with planted train-step, rollout and reward files; RUN/rollouts and RUN/rewarded shards
    whose strings (env, task ids, turn text, error causes) carry SQL."""
    run = root / "run"
    (run / "metrics").mkdir(parents=True)
    names = hostile_names(root)
    steps = [0, 1, 2]
    columns: dict[str, pa.Array] = {"step": pa.array(steps, pa.int64()), "loss": pa.array([1.0, 0.5, 0.25])}
    for i, name in enumerate(names):
        columns[name] = pa.array(planted_values(i), pa.float64())
    columns["note"] = pa.array(SQL_VALUES)  # a text column: not plotted, never read into SQL either
    pq.write_table(pa.table(columns), run / "metrics" / "train-step-000001.parquet")
    causes = json.dumps({value: 1 for value in SQL_VALUES})
    pq.write_table(pa.table({"trajectories": [4], "seconds": [2.0], "generated_tokens": [100],
                             "error_causes": [causes], names[0]: [1.0], names[6]: [2.0]}),
                   run / "metrics" / "rollout-000001.parquet")
    pq.write_table(pa.table({"rows": [4], "error_causes": [causes], names[7]: [3.0]}),
                   run / "metrics" / "reward-000001.parquet")
    table = synthetic_table(2, 2, seed=0)
    table = table.set_column(table.schema.get_field_index("env"), "env",
                             pa.array([SQL_VALUES[0], SQL_VALUES[0], SQL_VALUES[1], SQL_VALUES[2]]))
    table = table.set_column(table.schema.get_field_index("task_id"), "task_id",
                             pa.array([f"{v}-{i}" for i, v in enumerate(SQL_VALUES + SQL_VALUES[:1])]))
    for folder in ("rollouts", "rewarded"):
        (run / folder).mkdir()
        pq.write_table(table, run / folder / "it0000-planted.parquet")
    return run, names


def files_under(root: Path, skip: Path) -> set[str]:
    return {str(p) for p in root.rglob("*") if p.is_file() and skip not in p.parents}


def arlctl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "arlctl.cli.main", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=600)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    run, names = plant_run(root)
    out = root / "out"
    before = files_under(root, out)
    result = arlctl("report", str(run), "--out", str(out), "--json", cwd=root)
    after = files_under(root, out)
    return {"root": root, "run": run, "out": out, "names": names, "result": result, "before": before,
            "after": after}


@pytest.mark.slow
def test_the_report_renders(rendered):
    result = rendered["result"]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    assert (rendered["out"] / "report.html").is_file()
    assert (rendered["out"] / "plots" / "trainer_other.png").is_file()


@pytest.mark.slow
def test_no_file_is_written_outside_the_output(rendered):
    root = rendered["root"]
    assert rendered["after"] == rendered["before"]
    for name in ("pwned-breakout.csv", "pwned-to.csv", "pwned-single.csv", "pwned-value.csv", "evil.db"):
        assert not (root / name).exists(), name
        assert not any(p.name == name for p in root.rglob("*")), name


def test_every_planted_name_is_a_column_exactly_as_written(rendered):
    numbers = json.loads(rendered["result"].stdout.strip().splitlines()[-1])
    train = numbers["train"]
    names = rendered["names"]
    assert train["columns"][0] == "loss"  # the key column first, whatever else the file holds
    assert sorted(train["columns"][1:]) == sorted(n for i, n in enumerate(names) if i % 3 != 2)
    assert sorted(train["not_recorded"]) == sorted(n for i, n in enumerate(names) if i % 3 == 2)
    assert sorted(train["constant"]) == sorted(n for i, n in enumerate(names) if i % 3 == 1)
    for i, name in enumerate(names):
        if i % 3 != 2:  # the value of that very column, not of a look-alike
            assert train["last"][name] == planted_values(i)[-1], name
            assert [s[name] for s in train["steps"]] == planted_values(i), name


def test_every_planted_name_is_shown_escaped_in_the_page(rendered):
    page = (rendered["out"] / "report.html").read_bytes().decode("utf-8")
    assert "<script>alert(1)</script>" not in page
    for i, name in enumerate(rendered["names"]):
        if i % 3 == 1:  # the table of unchanged columns: one row per name, its text escaped
            assert f"<tr><th>{html.escape(name)}</th>" in page, name[:60]
        elif i % 3 == 2:  # the list of columns never recorded
            assert html.escape(name) in page, name[:60]
    data = page.split('<script type="application/json" id="report-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in data and ">" not in data  # no shard text can end the data element
    assert sorted(json.loads(data)["train"]["columns"]) == sorted(
        ["loss", *(n for i, n in enumerate(rendered["names"]) if i % 3 != 2)])
    for value in SQL_VALUES:  # an env name and an error cause carrying SQL: shown as text
        assert html.escape(value) in page, value


def test_the_breakout_is_a_real_one_against_spliced_sql(tmp_path):
    """The planted name really does write a file when spliced as the report once did (so the tests above
    would fail on that code): the same shard, an ordinary DuckDB connection, the old select list."""
    run, names = plant_run(tmp_path)
    target = tmp_path / "pwned-breakout.csv"
    con = duckdb.connect()
    shard = str(run / "metrics" / "train-step-000001.parquet").replace("'", "''")
    con.execute(f"create view train_metrics as select * from read_parquet('{shard}')")
    select = ", ".join(f'"{c}"::double as "{c}"' for c in ["loss", breakout(target)])
    con.execute(f"select step, {select} from train_metrics order by step")
    assert target.read_text().split() == ["pwned", "42"]


@pytest.mark.slow
def test_a_planted_filename_column_is_a_clear_error(tmp_path):
    """The reader adds `filename` itself; a shard that brings its own is refused by name, not mixed in."""
    run = tmp_path / "run"
    (run / "metrics").mkdir(parents=True)
    pq.write_table(pa.table({"step": [0], "loss": [1.0], "filename": ["/etc/passwd"]}),
                   run / "metrics" / "train-step-000001.parquet")
    result = arlctl("report", str(run), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout
    assert "filename" in result.stderr + result.stdout
    assert not (tmp_path / "out" / "report.html").exists()


# ------------------------------------------------------------------------------------------- arlctl query


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("query")
    run, _ = plant_run(root)
    return root, str(run / "rollouts")


def query(sql: str, path: str):
    return CliRunner().invoke(app, ["query", sql, path, "--json"])


def test_query_runs_the_users_own_sql(shards):
    _, path = shards
    result = query("select env, count(*) as n from trajectories group by 1 order by 1", path)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert sorted(r["env"] for r in rows) == sorted(set(SQL_VALUES))
    assert sum(r["n"] for r in rows) == 4


def _attacks(root: Path) -> dict[str, str]:
    return {
        "copy to a file": f"copy (select * from trajectories) to '{root / 'q-copy.csv'}' (format csv)",
        "copy a table to a file": f"copy trajectories to '{root / 'q-copy2.parquet'}' (format parquet)",
        "read_csv of a host file": "select * from read_csv('/etc/passwd')",
        "read_text of a host file": "select * from read_text('/etc/hostname')",
        "read_parquet beside the shards": f"select count(*) from read_parquet('{root}/run/rewarded/*.parquet')",
        "attach a database": f"attach '{root / 'q-evil.db'}' as evil",
        "install an extension": "install httpfs",
        "load an extension": "load httpfs",
        "turn file access back on": "set enable_external_access = true",
        "unlock the configuration": "set lock_configuration = false",
        "export the database": f"export database '{root / 'q-export'}'",
        "a second statement copies": f"select 1; copy (select 1) to '{root / 'q-second.csv'}'",
        "list host files": "select * from glob('/etc/*')",
        "read a host file as a blob": "select * from read_blob('/etc/hostname')",
        "sniff a host file": "select * from sniff_csv('/etc/passwd')",
        "fetch a URL": "select * from read_text('https://example.com/')",
        "copy to a device": "copy (select 1) to '/dev/stdout'",
        "widen the allowed directories": "set allowed_directories = ['/']",
        "move the temp directory": f"set temp_directory = '{root / 'q-tmp'}'",
        "store a secret": "create persistent secret s (type s3, key_id 'k', secret 's')",
    }


@pytest.mark.parametrize("attack", sorted(_attacks(Path("/x"))))
def test_query_has_no_file_access_whatever_the_sql(shards, attack):
    root, path = shards
    before = files_under(root, root / "nothing")
    result = query(_attacks(root)[attack], path)
    assert result.exit_code != 0, f"{attack}: {result.output}"
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "SQL error" in result.output, result.output
    assert files_under(root, root / "nothing") == before


def test_the_report_connection_reaches_no_file(tmp_path):
    """The connection the report queries through is sealed like `arlctl query`'s: what was registered is
    all it reads, and no statement turns that back on."""
    from arlctl.report.sources import RunViews, list_run

    run, _ = plant_run(tmp_path)
    views = RunViews(list_run(str(run)))
    try:
        assert views.rows("select count(*) as n from train_metrics") == [{"n": 3}]
        for sql in (f"copy train_metrics to '{tmp_path / 'r-copy.csv'}' (format csv)",
                    f"select * from read_parquet('{run}/metrics/*.parquet')", "select * from read_csv('/etc/passwd')",
                    f"attach '{tmp_path / 'r-evil.db'}'", "install httpfs", "load httpfs",
                    "set enable_external_access = true", "reset enable_external_access",
                    "set lock_configuration = false"):
            with pytest.raises(duckdb.Error):
                views.rows(sql)
    finally:
        views.close()
    assert not (tmp_path / "r-copy.csv").exists() and not (tmp_path / "r-evil.db").exists()
