"""Issue 26 item 6, the low-severity defects, each attacked through the real CLI or the real server.

1. show / query / validate print hostile text (U+E0000 tag characters, bidi overrides, zero-width
   characters, ANSI and C1 escapes, newlines in names) spelled out, never raw: the bytes are inspected.
2. A shard whose name is not a shard name (a newline, a space, non-ASCII, `..`, an escape) is never read,
   is counted in one warning, and never reaches a stage's output or lineage.
3. `arlctl fleet add` refuses malformed URLs with exit 2; a password in one is neither stored nor printed.
4. Recipe numbers (NaN/inf/negative backoffs, 10,000 workers, a cap below the start) and `up --for nan`
   are usage errors naming the key (exit 2).
5. A fleet of engines that are all dead makes `arlctl rollout` exit 75 naming them, with no row marked ok.
6. `arlctl serve` commits ended sessions in batches (one shard per --flush-sessions sessions, or by time),
   each session exactly once, an explicit end durable when answered, and SIGTERM writes every session.

Classes 5 and 6 start real servers and rollouts (30-40 s each on a busy machine): they are marked slow
(`pytest -m slow tests/security/test_low_defects.py`).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import Result
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.io.shards import LINEAGE_KEY, Lineage, read_lineage, write_shard, write_table_atomic
from arlctl.schemas.rows import TrajectoryRow, Turn
from arlctl.schemas.trajectory import SCHEMA_METADATA, TRAJECTORY_SCHEMA
from arlctl.synthetic import synthetic_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))
from serve_helpers import ServeProcess, free_port, read_rows  # noqa: E402

ARLCTL = [sys.executable, "-m", "arlctl.cli.main"]
runner = CliRunner()
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def cli(*args: object) -> Result:
    """The real CLI in this process (for the many small usage-error cases: a process each costs seconds)."""
    return runner.invoke(app, [str(a) for a in args])


def arlctl(*args: object, timeout: float = 300) -> subprocess.CompletedProcess[bytes]:
    """The real CLI in its own process; stdout and stderr kept as bytes (what a terminal would receive)."""
    return subprocess.run([*ARLCTL, *map(str, args)], capture_output=True, timeout=timeout, env=ENV)


# ------------------------------------------------------------------------- 1. hostile text is spelled out

TAG = "\U000e0049\U000e0047\U000e004e"  # "IGN" in the tag block: invisible on a terminal
RLO, ZWSP, ZWJ, BOM = "\u202e", "\u200b", "\u200d", "\ufeff"
ANSI = "\x1b[2J\x1b]0;pwned\x07"  # clear the screen, set the window title
C1_CSI = "\x9b31m"  # the one-byte CSI
RAW = [TAG, RLO, ZWSP, ZWJ, BOM, "\x1b", "\x9b", "\x07", "\u2028"]
SPELLED = ["\\U000e0049", "\\u202e", "\\u200b", "\\u200d", "\\ufeff", "\\x1b[2J", "\\x9b31m", "\\x07"]
HOSTILE = f"ok{TAG}{RLO}evil{ZWSP}{ZWJ}{BOM}{ANSI}{C1_CSI}\u2028end"


def assert_spelled(output: bytes, *, need: list[str] = SPELLED) -> str:
    text = output.decode("utf-8")  # the CLI writes valid UTF-8
    for raw in RAW:
        assert raw not in text, (ascii(raw), text[-3000:])
    for spelled in need:
        assert spelled in text, (spelled, text[-3000:])
    return text


def hostile_row() -> TrajectoryRow:
    return TrajectoryRow(
        group_id="g-hostile", sample_index=0, task_id=f"task\nstatus ok  reward 1.0{HOSTILE}", env="math",
        env_version="math-1", task={"question": HOSTILE}, policy="p", prompt_text=f"prompt {HOSTILE}",
        prompt_ids=[1, 2], response_ids=[3, 4, 5], response_mask=[1, 1, 0], response_logprobs=[-0.1, -0.2, 0.0],
        turns=[Turn(0, 0, 2, 1, f"said {HOSTILE}", observation=f"saw {HOSTILE}")], final_state=HOSTILE,
        reward=0.0, reward_info=json.dumps({"note": HOSTILE}, ensure_ascii=False), trajectory_id="hostile-0001")


@pytest.fixture
def hostile_dir(tmp_path):
    d = tmp_path / "rollouts"
    table = pa.Table.from_pylist([hostile_row().to_arrow()], schema=TRAJECTORY_SCHEMA)
    write_shard(table, str(d / "part-hostile.parquet"), Lineage("rollout"))
    # Strays named with the same payload (no newline here: see test 2 for names with newlines).
    for name in (f"stray{TAG}.parquet", f"stray{ANSI}.parquet", f"stray{RLO}x.parquet"):
        write_shard(synthetic_table(1, 1, seed=3), str(d / name), Lineage("rollout"))
    return d


@pytest.mark.slow
def test_show_spells_out_every_hostile_character_and_names_stay_on_one_line(hostile_dir):
    result = arlctl("show", "hostile-0001", hostile_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    text = assert_spelled(result.stdout + result.stderr)
    # The task id's newline is spelled: no line of the output starts with the forged field.
    assert "task\\nstatus ok  reward 1.0" in text
    assert not any(line.lstrip(" │").startswith("status ok  reward 1.0") for line in text.splitlines())
    assert_spelled(result.stderr, need=["stray\\U000e0049", "stray\\x1b[2J"])  # the stray warnings too


@pytest.mark.slow
def test_query_spells_out_cell_values_and_stray_names(hostile_dir):
    result = arlctl("query", "select final_state from trajectories", hostile_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    # The table (the cell) and the warnings (the stray names) are both on the console, stderr.
    assert_spelled(result.stdout + result.stderr, need=[*SPELLED, "stray\\U000e0049", "stray\\x1b[2J", "stray\\u202ex"])
    assert b"1 rows" in result.stderr  # the three strays were not read


@pytest.mark.slow
def test_validate_counts_strays_in_one_warning_spelled_out(hostile_dir):
    result = arlctl("validate", hostile_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    text = assert_spelled(result.stderr, need=["stray\\U000e0049", "stray\\x1b[2J", "stray\\u202ex"])
    warnings = [line for line in text.splitlines() if "not read" in line]
    assert len(warnings) == 1 and "3 file(s) not read" in warnings[0], text
    assert "1 good shards (1 rows)" in text


# ----------------------------------------------------------------- 2. a stray name is never read or passed on

STRAY_NAMES = ["evil\nok.parquet", "with space.parquet", "ünïcode.parquet", "a..b.parquet", "x\x1b[2J.parquet",
               "tab\t.parquet", "lf\r.parquet", "part.parquet\n"]


def _rewardable(group: str, n: int) -> list[dict]:
    return [TrajectoryRow(group_id=group, sample_index=i, task_id=group, env="math", env_version="math-1",
                          task={"task_id": group, "question": "1+1?", "answer": "2"}, policy="p", prompt_text="p",
                          prompt_ids=[1, 2], response_ids=[3, 4, 5], response_mask=[1, 1, 0],
                          response_logprobs=[-0.1, -0.2, 0.0], turns=[Turn(0, 0, 2, 1, "2", observation="o")],
                          final_state="2", trajectory_id=f"{group}-{i}").to_arrow() for i in range(n)]


@pytest.fixture
def stray_run(tmp_path):
    run = tmp_path / "run"
    rollouts = run / "rollouts"
    write_shard(pa.Table.from_pylist(_rewardable("real", 2), schema=TRAJECTORY_SCHEMA),
                str(rollouts / "part-real.parquet"), Lineage("rollout"))
    for i, name in enumerate(STRAY_NAMES):  # each a valid shard: only its name keeps it out
        table = pa.Table.from_pylist(_rewardable(f"stray{i}", 2), schema=TRAJECTORY_SCHEMA)
        meta = {**SCHEMA_METADATA, LINEAGE_KEY: Lineage("rollout").to_json().encode()}
        write_table_atomic(table, str(rollouts / name), meta)
    assert len(os.listdir(rollouts)) == 1 + len(STRAY_NAMES)
    return run


@pytest.mark.slow
def test_stray_names_are_never_read_and_never_reach_outputs_or_lineage(stray_run):
    rollouts = stray_run / "rollouts"
    validate = arlctl("validate", rollouts)
    assert validate.returncode == 0, validate.stderr[-2000:]
    text = validate.stderr.decode()
    warnings = [line for line in text.splitlines() if "not read" in line]
    assert len(warnings) == 1 and f"{len(STRAY_NAMES)} file(s) not read" in warnings[0], text
    assert "evil\\nok.parquet" in warnings[0] and "\x1b" not in text and "\r" not in text
    assert "1 good shards (2 rows)" in text

    reward = arlctl("reward", "--run", stray_run, "--reward", "math", "--json")
    assert reward.returncode == 0, reward.stderr[-3000:]
    outputs = sorted((stray_run / "rewarded").glob("*.parquet"))
    assert outputs
    groups, inputs = set(), []
    for path in outputs:
        groups |= set(pq.read_table(path, columns=["group_id"]).column("group_id").to_pylist())
        inputs += read_lineage(str(path)).inputs
    assert groups == {"real"}  # no stray's rows
    assert inputs and all(os.path.basename(i) == "part-real.parquet" for i in inputs), inputs
    for path in (stray_run / "rewarded").rglob("*"):
        assert "\n" not in path.name and "stray" not in path.name, path
    # The stage's own log names the strays once, each spelled out.
    log = reward.stderr.decode()
    assert "\x1b" not in log and not any(line.startswith("ok.parquet") for line in log.splitlines()), log[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("command", [("query", "select count(*) as n from trajectories"), ("show", "real-0")])
def test_query_and_show_name_newline_strays_in_one_warning(stray_run, command):
    """query and show list the same strays as validate: one counted warning, every name on its one line."""
    result = arlctl(*command, stray_run / "rollouts")
    assert result.returncode == 0, result.stderr[-2000:]
    text = result.stderr.decode()
    warnings = [line for line in text.splitlines() if "not read" in line]
    assert len(warnings) == 1 and f"{len(STRAY_NAMES)} file(s) not read" in warnings[0], text
    for spelled in ("evil\\nok.parquet", "lf\\x0d.parquet", "tab\\t.parquet", "x\\x1b[2J.parquet"):
        assert spelled in warnings[0], (spelled, warnings[0])
    assert not any(line.startswith("ok.parquet") for line in text.splitlines()), text
    assert "\x1b" not in text and "\r" not in text


# ---------------------------------------------------------------------- 3. fleet add: the URL allowlist

PASSWORD = "hunter2-s3cret"
MALFORMED_URLS = [
    "127.0.0.1:8000", "localhost", "ftp://127.0.0.1:8000", "javascript:alert(1)", "file:///etc/passwd",
    "http://exa mple.com:8000", "http://127.0.0.1:0", "http://127.0.0.1:70000", "http://127.0.0.1:99999999",
    "http://", "http://:8000", "http://127.0.0.1:8000?x=1", "http://127.0.0.1:8000#frag",
    "http://127.0.0.1:8000/a b", "http://127.0.0.1\n:8000", "http://ex\x1bample.com", "http://exämple.com",
    "http://300.1.1.1:8000", "http://[::1:8000", "http://-bad-.com", "http://a..b.com",
    "http://127.0.0.1:8000\\@evil.com", "gopher://127.0.0.1:70",
]
CREDENTIAL_URLS = [
    f"http://user:{PASSWORD}@127.0.0.1:1/", f"https://{PASSWORD}@127.0.0.1:8000", f"http://u:{PASSWORD}@[::1]:8000/v1",
    f"http://user:{PASSWORD}@@127.0.0.1:1", f"http://{PASSWORD}:x@127.0.0.1:1",
    f"http://a@b:{PASSWORD}@127.0.0.1:1",
]


@pytest.mark.slow
def test_fleet_add_refuses_malformed_and_credential_urls_and_never_stores_a_password(tmp_path):
    run = tmp_path / "run"
    fleet_file = run / "fleet.json"
    for url in MALFORMED_URLS + CREDENTIAL_URLS:
        result = cli("fleet", "add", run, url)
        shown = result.output
        assert result.exit_code == 2, (url, shown)
        assert PASSWORD not in shown, (url, shown)
        assert "\x1b" not in shown and "\n\u2028" not in shown
        assert not fleet_file.exists() or PASSWORD not in fleet_file.read_text(), url
    result = arlctl("fleet", "add", run, CREDENTIAL_URLS[0], timeout=120)  # one in its own process: exit 2 too
    assert result.returncode == 2 and PASSWORD.encode() not in result.stdout + result.stderr
    assert b"OPENAI_API_KEY" in result.stderr and b"***@" in result.stderr  # the fix, the URL redacted
    # A good URL is stored as its base (the allowlist is not vacuous); the bad ones never joined it.
    good = cli("fleet", "add", run, "http://127.0.0.1:8000/v1/")
    assert good.exit_code == 0, good.output
    assert json.loads(fleet_file.read_text())["servers"] == ["http://127.0.0.1:8000"]
    assert PASSWORD not in "".join(p.read_text(errors="replace") for p in run.rglob("*") if p.is_file())


# ---------------------------------------------------------------------- 4. recipe numbers

def _recipe(tmp_path, **top) -> Path:
    data = {"run": str(tmp_path / "run"), "stages": {"sync": {}}, **top}
    path = tmp_path / f"recipe-{len(list(tmp_path.glob('recipe-*')))}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


BAD_RECIPES = [
    ({"restart": {"backoff_start_s": math.nan}}, "restart.backoff_start_s"),
    ({"restart": {"backoff_start_s": math.inf}}, "restart.backoff_start_s"),
    ({"restart": {"backoff_cap_s": -math.inf}}, "restart.backoff_cap_s"),
    ({"restart": {"backoff_start_s": -1.0}}, "restart.backoff_start_s"),
    ({"restart": {"healthy_after_s": math.nan}}, "restart.healthy_after_s"),
    ({"restart": {"backoff_start_s": 1e300}}, "restart.backoff_start_s"),
    ({"restart": {"backoff_start_s": 10.0, "backoff_cap_s": 1.0}}, "backoff_cap_s"),
    ({"restart": {"backoff_start_s": "soon"}}, "restart.backoff_start_s"),
    ({"stop_grace_s": math.nan}, "stop_grace_s"),
    ({"refresh_s": 0.0}, "refresh_s"),
    ({"stages": {"reward": {"workers": 10_000, "args": {"reward": "math"}}}}, "workers"),
    ({"stages": {"reward": {"workers": -3, "args": {"reward": "math"}}}}, "workers"),
    ({"stages": {"reward": {"workers": 2.5, "args": {"reward": "math"}}}}, "workers"),
    ({"stages": {"reward": {"interval_s": math.inf, "args": {"reward": "math"}}}}, "reward.interval_s"),
]


@pytest.mark.parametrize(("top", "key"), BAD_RECIPES, ids=[f"{k}-{i}" for i, (_t, k) in enumerate(BAD_RECIPES)])
def test_a_bad_recipe_number_is_a_usage_error_naming_its_key(tmp_path, top, key):
    result = cli("up", _recipe(tmp_path, **top), "--check")
    assert result.exit_code == 2, result.output[-2000:]
    assert key in result.output, result.output[-2000:]
    assert not (tmp_path / "run" / "logs").exists()  # nothing started


@pytest.mark.parametrize("for_s", ["nan", "inf", "-5", "0", "1e30"])
def test_up_for_must_be_a_finite_positive_number(tmp_path, for_s):
    result = cli("up", _recipe(tmp_path), "--for", for_s, "--no-dashboard")
    assert result.exit_code == 2 and "--for" in result.output, result.output[-2000:]
    assert not (tmp_path / "run" / "logs").exists()


def test_a_good_recipe_still_checks(tmp_path):
    result = cli("up", _recipe(tmp_path, restart={"backoff_start_s": 1.0, "backoff_cap_s": 30.0}), "--check")
    assert result.exit_code == 0, result.output[-2000:]


# ---------------------------------------------------------------------- 5. an all-dead fleet is transient

@pytest.mark.slow  # real processes: 30-40 s each on a busy machine
def test_an_all_dead_fleet_exits_75_naming_the_engines_and_writes_no_ok_row(tmp_path):
    dead = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]  # nothing listens there
    out = tmp_path / "rollouts"
    result = arlctl("rollout", "--backend", "openai", "--server", dead[0], "--server", dead[1], "--env", "first-token",
                    "--policy", "tiny", "-G", "2", "--limit", "2", "--max-new-tokens", "4", "-q", "--out", out,
                    "--backend-opt", "retries=1", "--backend-opt", "backoff_s=0.01", "--backend-opt", "down_s=0.05")
    log = result.stderr.decode()
    assert result.returncode == 75, log[-3000:]
    assert all(url in log for url in dead) and "no inference server can serve" in log, log[-3000:]
    rows = read_rows(out) if out.exists() else []
    assert not [r for r in rows if r["status"] == "ok"]


# ---------------------------------------------------------------------- 6. serve writes sessions in batches

REPLY = "Done."


def _chat(url: str, sid: str) -> None:
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": f"hi {sid}"}],
                       "max_tokens": 4}).encode()
    request = urllib.request.Request(f"{url}/v1/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json", "X-Arlctl-Session": sid})
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200


def _sessions(record: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in read_rows(record):
        counts[row["group_id"]] = counts.get(row["group_id"], 0) + 1
    return counts


@pytest.mark.slow  # real processes: 30-40 s each on a busy machine
def test_serve_batches_sessions_into_shards_and_sigterm_writes_every_one(tmp_path):
    n, batch, ended = 200, 64, 10
    record = tmp_path / "record"
    served = ServeProcess(record, "--flush-sessions", str(batch), "--flush-seconds", "600", "--idle-timeout", "600",
                          replies=(REPLY,))
    sids = [f"s{i:04d}" for i in range(n)]
    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda sid: _chat(served.url, sid), sids))
        assert served.health()["sessions"] == n
        for sid in sids[:ended]:  # an explicit end answers only once the session's rows are committed
            assert served.end(sid)["rows"] == 1
            assert sid in _sessions(record)
        assert served.health()["shards_written"] == ended and served.health()["sessions_waiting"] == 0
        served.proc.send_signal(signal.SIGTERM)  # 190 sessions still open
        assert served.proc.wait(120) == 0, served.log()[-3000:]
    finally:
        served.stop()
    counts = _sessions(record)
    assert sorted(counts) == sids and set(counts.values()) == {1}  # every session, each exactly once
    shards = sorted(record.glob("*.parquet"))
    # One shard per explicit end (each answered when written), then the 190 left in batches of 64.
    assert len(shards) == ended + math.ceil((n - ended) / batch) == 13
    sizes = sorted(pq.ParquetFile(path).metadata.num_rows for path in shards)
    assert sizes == [1] * ended + [(n - ended) % batch, batch, batch]
    assert f"wrote {n} rows of {n} sessions in {len(shards)} shards" in served.log()


@pytest.mark.slow  # real processes: 30-40 s each on a busy machine
def test_serve_commits_idle_sessions_by_count_and_by_time(tmp_path):
    record = tmp_path / "record"
    served = ServeProcess(record, "--flush-sessions", "4", "--flush-seconds", "1", "--idle-timeout", "0.5",
                          replies=(REPLY,))
    sids = [f"idle{i}" for i in range(6)]
    try:
        for sid in sids:
            _chat(served.url, sid)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(_sessions(record)) < len(sids):
            time.sleep(0.2)
        counts = _sessions(record)  # written while the server runs: 4 by count, the rest by time
        health = served.health()
    finally:
        served.stop()
    assert sorted(counts) == sids and set(counts.values()) == {1}
    assert health["sessions_waiting"] == 0 and 2 <= health["shards_written"] <= len(sids)
    assert len(list(record.glob("*.parquet"))) == health["shards_written"]


def _post_end(url: str, sid: str) -> tuple[int, dict]:
    request = urllib.request.Request(f"{url}/v1/sessions/{sid}/end", data=b"{}", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.slow  # real processes: 30-40 s each on a busy machine
def test_an_explicit_end_whose_write_fails_is_a_503_and_its_retry_writes_it_once(tmp_path):
    """The record directory is a plain file: the write fails. The end is answered 503 (not "written"), the
    rows stay queued; once the path is usable, the client's retry commits them, and shutdown adds no copy."""
    record = tmp_path / "record"
    record.write_text("in the way")
    served = ServeProcess(record, "--flush-seconds", "600", replies=(REPLY,))
    try:
        _chat(served.url, "s-retry")
        status, body = _post_end(served.url, "s-retry")
        assert status == 503 and "not written yet" in body["error"]["message"], body
        assert served.health()["sessions_waiting"] == 1 and served.health()["flush_failures"] >= 1
        record.unlink()
        status, body = _post_end(served.url, "s-retry")
        assert (status, body) == (200, {"session": "s-retry", "rows": 1})
        assert _sessions(record) == {"s-retry": 1}
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(120) == 0, served.log()[-3000:]
    finally:
        served.stop()
    assert _sessions(record) == {"s-retry": 1} and len(list(record.glob("*.parquet"))) == 1
