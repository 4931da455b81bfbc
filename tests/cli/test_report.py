"""`arlctl report` on a small real run (tests/cli/report_helpers.py): the page, its plots, its numbers.

Every number in a table cell of the page carries its path in the JSON (`data-key`); the tests check that
the cell shows exactly that JSON value, that the JSON embedded in the page is what `--json` prints, and
that the values equal DuckDB queries written here, independently, over the same shards. The page is opened
in a real headless Chromium: the screenshot must be a real picture, and a trajectory whose text carries
`<script>` and an `onerror` image must reach the DOM as text, with the page's title untouched.
"""

from __future__ import annotations

import base64
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import duckdb
import pytest
from report_helpers import HOSTILE, build_run
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.report.page import NOT_RECORDED, fmt
from arlctl.report.plots import PLOTS

pytestmark = pytest.mark.integration
runner = CliRunner()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> str:
    return build_run(tmp_path_factory.mktemp("report"))


@pytest.fixture(scope="module")
def hostile_id(run) -> str:
    """The trajectory whose every turn opens with `<script>...` and an `onerror` image."""
    return duckdb.sql(f"select trajectory_id from read_parquet('{run}/rewarded/*.parquet') "
                      f"where contains(turns[1].text, '{HOSTILE[:20]}') order by 1 limit 1").fetchall()[0][0]


@pytest.fixture(scope="module")
def rendered(run, hostile_id, tmp_path_factory) -> tuple[dict, Path, Path | None]:
    """One render shared by the tests below: (--json numbers, output dir, screenshot or None)."""
    out = tmp_path_factory.mktemp("rendered")
    shot = out / "shot.png" if shutil.which("chromium") else None
    extra = ["--screenshot", str(shot), "--window-size", "1200x2400"] if shot else []
    return report(run, "--out", str(out / "report"), "--sample", hostile_id, *extra), out / "report", shot


def report(*args: str) -> dict:
    result = runner.invoke(app, ["report", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


class PageParser(HTMLParser):
    """Number cells (data-key -> shown text), images (id -> src) and the JSON data block of the page."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[tuple[list, str]] = []
        self.images: dict[str, str] = {}
        self.missing_plots: list[str] = []
        self.data_json = ""
        self._key: list | None = None
        self._text = ""
        self._in_data = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "td" and "data-key" in attrs:
            self._key, self._text = json.loads(attrs["data-key"]), ""
        elif tag == "img" and attrs.get("id", "").startswith("plot-"):
            self.images[attrs["id"][5:]] = attrs["src"]
        elif tag == "div" and attrs.get("data-plot") == "missing":
            self.missing_plots.append(attrs["id"][5:])
        elif tag == "script" and attrs.get("id") == "report-data":
            self._in_data = True

    def handle_endtag(self, tag):
        if tag == "td" and self._key is not None:
            self.cells.append((self._key, self._text))
            self._key = None
        elif tag == "script":
            self._in_data = False

    def handle_data(self, data):
        if self._key is not None:
            self._text += data
        if self._in_data:
            self.data_json += data


def parse_page(path: Path) -> PageParser:
    parser = PageParser()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def at(obj, path):
    for part in path:
        obj = obj[part]
    return obj


def close(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)


def sql(con: duckdb.DuckDBPyConnection, query: str) -> list[tuple]:
    return con.execute(query).fetchall()


def independent(run: str) -> dict:
    """The report's numbers recomputed here with DuckDB over the run's files (globs, not the report's lists)."""
    con = duckdb.connect()
    r, w, b, m = (f"read_parquet('{run}/{d}.parquet', union_by_name=true, filename=true)"
                  for d in ("rollouts/*", "rewarded/*", "batches/*", "metrics/train-step-*"))
    ro, rw = (f"read_parquet('{run}/metrics/{k}-*.parquet', union_by_name=true)" for k in ("rollout", "reward"))
    out: dict = {}
    out["rbv"] = {(env, v): (n, mean, corr) for env, v, n, mean, corr in sql(con, f"""
        select env, policy_version, count(*), avg(reward),
               avg(coalesce(reward_components['correct'], case when reward >= 1 then 1.0 else 0.0 end))
        from {w} group by all""")}
    out["statuses"] = dict(sql(con, f"select status, count(*) from {r} group by all"))
    out["turns_hist"] = dict(sql(con, f"select num_turns, count(*) from {r} group by all"))
    turns = f"(select unnest(turns) as t from {r})"
    out["mix"] = dict(sql(con, f"""select c.name, count(*) from {turns},
        unnest(from_json(t.tool_calls, '[{{"name": "VARCHAR"}}]')) as x(c) group by all"""))
    # parse failures: turns that wrote a <tool_call> block and got fewer calls out of it
    out["parse"] = sql(con, f"""select count(*) filter (where opened or called),
        count(*) filter (where n_open > n_calls) from (
            select len(string_split(t.text, '<tool_call>')) - 1 as n_open, json_array_length(t.tool_calls) as n_calls,
                   n_open > 0 as opened, n_calls > 0 as called from {turns})""")[0]
    step_of = dict(sql(con, f"select batch, step from {m}"))
    lags: dict[int, int] = {}
    for filename, version in sql(con, f"select filename, policy_version from {b}"):
        lag = step_of[Path(filename).name] - 1 - version
        lags[lag] = lags.get(lag, 0) + 1
    out["lags"] = lags
    out["throughput"] = sql(con, f"select 60 * sum(trajectories) / sum(seconds), sum(generated_tokens) / sum(seconds) "
                                 f"from {ro}")[0]
    out["time"] = sql(con, f"""select sum(gen_time_s), sum(env_time_s),
        sum(case when wall_time_s > gen_time_s + env_time_s then wall_time_s - gen_time_s - env_time_s else 0 end)
        from {r}""")[0]
    out["stage_s"] = (sql(con, f"select sum(seconds) from {ro}")[0][0], sql(con, f"select sum(seconds) from {rw}")[0][0],
                      sql(con, f"select sum(step_time_s) from {m}")[0][0])
    out["idle"] = sql(con, f"select sum(backend_idle_ratio * seconds) / sum(seconds) from {ro} "
                           "where backend_idle_ratio is not null")[0][0]  # the scripted rollout has no backend
    # In double, as the page computes it: a median of float32 values averages the two middle ones in float32.
    out["latency"] = sql(con, f"""select count(*), avg(t.env_latency_s), median(t.env_latency_s::double),
        max(t.env_latency_s) from {turns}""")[0]
    out["lengths"] = sql(con, f"select count(*), avg(response_tokens), max(response_tokens), avg(num_turns) from {r}")[0]
    out["train_last"] = dict(zip(("loss", "entropy", "grad_norm", "clip_frac_low", "tokens_per_s"), sql(con, f"""
        select loss, entropy, grad_norm, clip_frac_low, tokens_per_s from {m} order by step desc limit 1""")[0]))
    out["steps"] = sql(con, f"select count(*) from {m}")[0][0]
    first, last, rows = sql(con, f"select min(started_at), max(finished_at), count(*) from {r}")[0]
    out["run_minutes"] = (last - first).total_seconds() / 60
    out["per_run_minute"] = rows / out["run_minutes"]
    return out


def test_page_numbers_and_plots_match_duckdb(run, rendered):
    numbers, out, _ = rendered
    page = parse_page(out / "report.html")

    # The JSON block on the page is what --json printed; every number cell shows its JSON value.
    embedded = json.loads(page.data_json)
    assert embedded == {k: v for k, v in numbers.items() if k not in ("plots", "written")}
    assert len(page.cells) > 60
    for key, text in page.cells:
        value = at(numbers, key)
        assert text == fmt(value), (key, text, value)

    # Every plot is on the page, inlined as a PNG, and written beside it; none is missing in this run.
    assert set(numbers["plots"]) == set(PLOTS) and all(numbers["plots"].values()), numbers["plots"]
    assert page.missing_plots == [] and set(page.images) == set(PLOTS)
    for name, src in page.images.items():
        assert src.startswith("data:image/png;base64,")
        png = base64.b64decode(src.split(",", 1)[1])
        assert png.startswith(PNG_MAGIC) and png == (out / "plots" / f"{name}.png").read_bytes()

    # The numbers equal DuckDB queries written here over the same shards.
    ref = independent(run)
    rbv = {(r["env"], r["policy_version"]): r for r in numbers["reward_by_version"]}
    first_published = duckdb.sql(f"select policy_version from read_parquet('{run}/rollouts/it0001-*.parquet') "
                                 "limit 1").fetchall()[0][0]
    assert set(rbv) == set(ref["rbv"]) == {("first-token", 0), ("first-token", first_published), ("math", 0)}
    for key, (rows, mean, correct) in ref["rbv"].items():
        assert rbv[key]["rows"] == rows and close(rbv[key]["mean_reward"], mean)
        assert close(rbv[key]["correct_rate"], correct)
    assert numbers["failures"]["statuses"] == ref["statuses"]
    assert {h["turns"]: h["rows"] for h in numbers["lengths"]["turns_hist"]} == ref["turns_hist"]
    assert {m["name"]: m["calls"] for m in numbers["tools"]["mix"]} == ref["mix"] == {"calculator": 6}
    tools = numbers["tools"]
    assert (tools["call_turns"], tools["parse_failures"]) == ref["parse"] == (12, 6)
    assert tools["parse_failure_rate"] == 0.5
    staleness = numbers["staleness"]
    assert {h["lag"]: h["rows"] for h in staleness["hist"]} == ref["lags"]
    assert staleness["trained_rows"] == numbers["overview"]["batch_rows"] == sum(ref["lags"].values())
    tp = numbers["throughput"]
    assert close(tp["trajectories_per_min"], ref["throughput"][0]) and close(tp["generated_tokens_per_s"], ref["throughput"][1])
    ts = numbers["time_split"]
    for got, want in zip((ts["generation_s"], ts["environment_s"], ts["other_in_trajectory_s"]), ref["time"]):
        assert close(got, want)
    for got, want in zip((ts["rollout_stage_s"], ts["reward_stage_s"], ts["train_stage_s"]), ref["stage_s"]):
        assert close(got, want)
    assert close(numbers["inference"]["idle_ratio"], ref["idle"])
    lat = numbers["env_latency"]
    assert lat["turns"] == ref["latency"][0] and close(lat["mean_s"], ref["latency"][1])
    assert close(lat["p50_s"], ref["latency"][2]) and close(lat["max_s"], ref["latency"][3])
    ln = numbers["lengths"]
    assert (ln["trajectories"], ln["max_response_tokens"]) == (ref["lengths"][0], ref["lengths"][2])
    assert close(ln["mean_response_tokens"], ref["lengths"][1]) and close(ln["mean_turns"], ref["lengths"][3])
    assert numbers["overview"]["train_steps"] == len(numbers["train"]["steps"]) == ref["steps"]
    assert close(numbers["overview"]["run_minutes"], ref["run_minutes"])
    assert close(numbers["overview"]["trajectories_per_run_minute"], ref["per_run_minute"])
    for column, value in ref["train_last"].items():
        assert close(numbers["train"]["last"][column], value), column

    # What the run did not record is said, not zeroed: the hf backend has no prefix cache, no daemon waited.
    assert numbers["inference"]["prefix_cache_hit_rate"] is None and numbers["time_split"]["queue_wait_s"] is None
    shown = dict((tuple(k), t) for k, t in page.cells)
    assert shown[("inference", "prefix_cache_hit_rate")] == NOT_RECORDED
    assert shown[("time_split", "queue_wait_s")] == NOT_RECORDED

    # Evals are shown as their summaries give them.
    latest = int((Path(run) / "policy" / "LATEST").read_text().strip().lstrip("v"))
    for entry, version in zip(numbers["evals"], (0, latest), strict=True):
        summary = json.loads((Path(run) / "evals" / "heldout" / f"v{version:06d}" / "summary.json").read_text())
        assert (entry["name"], entry["version"], entry["rows"], entry["graded"], entry["null_reward"]) == (
            "heldout", version, summary["n_rows"], summary["n_graded"], summary["null_reward"])
        assert (entry["correct_rate"], entry["correct_stderr"], entry["mean_reward"], entry["pass_at_k"]) == (
            summary["correct_rate"], summary["correct_se"], summary["mean_reward"], summary["pass_at_k"])
        rows, mean = duckdb.sql(f"select count(*), avg(reward) from read_parquet('{run}/evals/heldout/"
                                f"v{version:06d}/*.parquet')").fetchall()[0]
        assert entry["shard_rows"] == rows == summary["n_rows"] and close(entry["shard_mean_reward"], mean)


def test_hostile_text_is_escaped_and_the_page_renders_in_chromium(rendered, hostile_id, tmp_path):
    numbers, out, shot = rendered
    if shot is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    from arlctl.report.chromium import browser_command

    assert numbers["samples"][0]["trajectory_id"] == hostile_id  # asked for first, then the automatic picks
    assert len({s["trajectory_id"] for s in numbers["samples"]}) == len(numbers["samples"]) >= 3
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "<script>document.title" not in html and "<img src=x" not in html
    assert "&lt;script&gt;document.title=&quot;pwned&quot;&lt;/script&gt;" in html
    assert html.count("<script") == 1  # only the JSON data block

    # A real picture: the right size, many colours, not one flat colour.
    from PIL import Image

    with Image.open(shot) as image:
        assert image.size == (1200, 2400)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colours is not None and len(colours) > 200
        assert max(count for count, _ in colours) < 0.97 * 1200 * 2400

    # The DOM Chromium built: the title is ours, the hostile text is text, no element came from the shard.
    profile = tmp_path / "profile"
    dom = subprocess.run(browser_command(shutil.which("chromium"), str(profile), "--dump-dom",
                                         (out / "report.html").as_uri()), capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "<title>arlctl report: " in dom.stdout and "pwned</title>" not in dom.stdout
    assert "<img src=\"x\"" not in dom.stdout and 'onerror="alert(1)"' not in dom.stdout
    assert "&lt;script&gt;document.title" in dom.stdout


def test_a_run_without_training_says_not_recorded(run, tmp_path):
    partial = tmp_path / "partial"
    shutil.copytree(Path(run) / "rollouts", partial / "rollouts")
    numbers = report(str(partial), "--out", str(tmp_path / "out"))
    page = parse_page(tmp_path / "out" / "report.html")
    for section in ("train", "staleness", "throughput", "reward_by_version", "evals"):
        assert numbers[section] is None, section
    assert numbers["overview"]["train_steps"] is None and numbers["time_split"]["train_stage_s"] is None
    assert numbers["plots"]["trainer"] is False and "trainer" in page.missing_plots
    shown = dict((tuple(k), t) for k, t in page.cells)
    assert shown[("overview", "train_steps")] == NOT_RECORDED and shown[("time_split", "reward_stage_s")] == NOT_RECORDED
    assert numbers["overview"]["rollout_rows"] == 54 and numbers["plots"]["tools"] is True


def test_report_of_a_run_on_s3(run, rendered, s3_bucket):
    import fsspec

    fs = fsspec.filesystem("s3")
    remote = f"{s3_bucket}/run"
    for sub in ("rollouts", "rewarded", "batches", "metrics", "evals"):
        fs.put(str(Path(run) / sub), f"{remote.removeprefix('s3://')}/{sub}", recursive=True)
    fs.invalidate_cache()
    local = rendered[0]
    remote_numbers = report(remote, "--out", f"{remote}/report", "--samples", "0")
    assert remote_numbers["written"]["html"] == f"{remote}/report/report.html"
    assert fs.cat_file(f"{remote.removeprefix('s3://')}/report/report.html").startswith(b"<!DOCTYPE html>")
    same = ("overview", "reward_by_version", "train", "staleness", "tools", "failures", "lengths", "time_split")
    assert {k: remote_numbers[k] for k in same} == {k: local[k] for k in same}
    assert [e["correct_rate"] for e in remote_numbers["evals"]] == [e["correct_rate"] for e in local["evals"]]


def test_watch_re_renders_while_the_run_grows(run, tmp_path):
    live = tmp_path / "live"
    shutil.copytree(Path(run) / "rollouts", live / "rollouts")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "arlctl.cli.main", "report", str(live), "--watch", "--every", "0.5",
                             "--samples", "0", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        first = json.loads(proc.stdout.readline())
        assert first["overview"]["rollout_rows"] == 54
        page = live / "report" / "report.html"
        assert '<meta http-equiv="refresh" content="1">' in page.read_text(encoding="utf-8")
        # A rollout commits another shard; a later render counts it.
        shard = sorted((live / "rollouts").glob("it0000-*.parquet"))[0]
        shutil.copy(shard, live / "rollouts" / f".{shard.stem}-2.parquet.tmp")
        os.replace(live / "rollouts" / f".{shard.stem}-2.parquet.tmp", live / "rollouts" / f"{shard.stem}-2.parquet")
        deadline = time.time() + 60
        while time.time() < deadline:
            later = json.loads(proc.stdout.readline())
            if later["overview"]["rollout_rows"] == 54 + 24:
                break
        else:
            pytest.fail("no render counted the new shard")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert "stopped after" in err


def test_screenshot_without_a_browser_is_a_clear_usage_error(run, tmp_path, monkeypatch):
    monkeypatch.setenv("ARLCTL_CHROMIUM", str(tmp_path / "no-such-browser"))
    result = runner.invoke(app, ["report", run, "--out", str(tmp_path / "o"), "--screenshot", str(tmp_path / "s.png")])
    assert result.exit_code == 2 and "is not an executable" in result.output
    assert not (tmp_path / "o").exists()  # refused before any work


def test_a_sample_id_that_matches_nothing_is_a_usage_error(run, tmp_path):
    result = runner.invoke(app, ["report", run, "--out", str(tmp_path / "o"), "--sample", "no-such-id"])
    assert result.exit_code == 2 and "no trajectory with that id" in result.output
