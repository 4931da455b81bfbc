"""The `--reward http://HOST:PORT/NAME` client against a hostile reward server (issue 26 items 5c and 6).

The server is real (http.server on 127.0.0.1, in a thread of the test) and so is the client: `arlctl
reward` through its CLI (in process, or as a subprocess where a signal is sent). What the server does,
per reward name in the URL:

- drips its answer one byte every 0.5 s, in the headers or in the body: the command ends at its total
  deadline ($ARLCTL_REWARD_TIMEOUT_S, 1 s here), exit 75 naming the server; with the default deadline
  (900 s) a SIGTERM during the drip ends the process at once, exit 75, the shard scored before it written
  and complete, the one in flight not written at all;
- answers 200 with a JSON list, a string, a number, invalid JSON, HTML, or a body over the answer cap:
  exit 75 naming the server (a transient error: the shard stays pending), never a traceback;
- answers rewards "1.0", true, a string component, NaN, Infinity, 1e999: those rows get reward null with a
  cause (naming the server for the non-numbers); only JSON numbers are rewards.

The test never measures time: a small deadline and the right exit code, or a process that ends within a
wait far shorter than the deadline it would otherwise have used.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.io.shards import Lineage, list_shards, read_shard, write_shard
from arlctl.schemas.rows import TrajectoryRow, Turn, rows_to_table

VERSION = "hostile-1"
DRIP_S = 0.5
ANSWER_CAP = 100_000  # $ARLCTL_MAX_REWARD_ANSWER_BYTES for these tests


def row(i: int) -> TrajectoryRow:
    return TrajectoryRow(group_id=f"g{i}", sample_index=0, task_id=f"t{i}", env="math", env_version="math-1",
                         task={"task_id": f"t{i}", "question": "1+1?", "answer": "2"}, policy="p",
                         prompt_text="p", prompt_ids=[1, 2], response_ids=[3, 4], response_mask=[1, 1],
                         response_logprobs=[-0.1, -0.2], turns=[Turn(0, 0, 2, 0, "<answer>2</answer>")],
                         final_state="2", trajectory_id=f"id-{i}")


def results(rows: list, reward: object, components: object = None) -> bytes:
    """An answer giving every row `reward` (raw JSON text), with `components` (default: {"r": reward})."""
    parts = components if components is not None else f'{{"r": {reward}}}'
    one = f'{{"reward": {reward}, "components": {parts}, "info": {{}}}}'
    return f'{{"name": "x", "version": "{VERSION}", "results": [{", ".join([one] * len(rows))}]}}'.encode()


BAD_BODIES = {  # name -> (a 200 body, what the error says)
    "list": (b"[1, 2, 3]", "JSON list"),
    "string": (b'"all good"', "JSON str"),
    "number": (b"1.0", "JSON float"),
    "invalid": (b'{"version": "hostile-1", "results": [', "not JSON"),
    "html": (b"<html><body>502 Bad Gateway</body></html>", "not JSON"),
    "deep": (b"[" * 100_000, "not JSON"),  # RecursionError in the parser, never a traceback
}
BAD_REWARDS = {  # name -> (reward JSON, components JSON or None, what reward_info.error says)
    "string-reward": ('"1.0"', None, "str '1.0' is not a number"),
    "bool-reward": ("true", "{}", "bool 'True' is not a number"),
    "string-component": ("1.0", '{"r": "1.0"}', "str '1.0' is not a number"),
    "list-reward": ("[1]", "{}", "list '[1]' is not a number"),
    "nan-reward": ("NaN", "{}", "non-finite"),
    "inf-reward": ("Infinity", "{}", "non-finite"),
    "overflow-reward": ("1e999", "{}", "non-finite"),
}


class Hostile(BaseHTTPRequestHandler):
    """POST /score/MODE: the version request (no rows) is answered properly, except in describe-* modes;
    rows are answered as MODE says. MODE drip-after-first answers its first scoring request properly."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        mode = self.path.rsplit("/", 1)[-1]
        rows = body["rows"]
        if not rows and not mode.startswith("describe-"):
            return self.send(200, results(rows, 1.0))
        self.server.scoring_requests += 1
        self.server.scoring.set()
        if mode == "drip-after-first" and self.server.scoring_requests == 1:
            return self.send(200, results(rows, 1.0))
        if mode in ("drip-headers", "drip-after-first", "describe-drip"):
            return self.drip(b"HTTP/1.1 200 OK\r\nX-Drip: " + b"a" * 100_000)
        if mode == "drip-body":
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
            self.wfile.write(head)
            return self.drip(results(rows, 1.0)[:-1] + b" " * 100_000)
        if mode == "huge":  # no Content-Length: the cap must hold while streaming
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
            try:
                for _ in range(40):
                    self.wfile.write(b" " * 65536)
            except OSError:
                pass
            self.close_connection = True
            return None
        if mode == "huge-declared":
            return self.send(200, b" " * (ANSWER_CAP + 1))
        if mode.startswith("describe-"):
            return self.send(200, BAD_BODIES[mode[len("describe-"):]][0])
        if mode in BAD_BODIES:
            return self.send(200, BAD_BODIES[mode][0])
        reward, components, _ = BAD_REWARDS[mode]
        return self.send(200, results(rows, reward, components))

    def send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def drip(self, data: bytes) -> None:
        """One byte every DRIP_S until the client hangs up (or the server stops)."""
        for i in range(len(data)):
            if self.server.stopping.is_set():
                break
            try:
                self.wfile.write(data[i : i + 1])
                self.wfile.flush()
            except OSError:
                break
            time.sleep(DRIP_S)
        self.close_connection = True


@pytest.fixture
def hostile():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    server.daemon_threads = True
    server.scoring, server.stopping, server.scoring_requests = threading.Event(), threading.Event(), 0
    # shutdown() waits for the loop to look again: the default 0.5 s poll was half a second per test
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.stopping.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def rollouts(tmp_path):
    """(in, out): two shards of 4 rows each."""
    for shard in (1, 2):
        rows = [row(shard * 10 + i) for i in range(4)]
        write_shard(rows_to_table(rows), str(tmp_path / "in" / f"part-{shard}.parquet"), Lineage(stage="rollout"))
    return tmp_path / "in", tmp_path / "out"


def reward(rollouts, url: str, monkeypatch, timeout_s: str = "2") -> object:
    monkeypatch.setenv("ARLCTL_REWARD_TIMEOUT_S", timeout_s)
    monkeypatch.setenv("ARLCTL_MAX_REWARD_ANSWER_BYTES", str(ANSWER_CAP))
    src, out = rollouts
    return CliRunner().invoke(app, ["reward", "--in", str(src), "--out", str(out), "--reward", url,
                                      "--concurrency", "1"])


def flat(output: str) -> str:
    return " ".join(output.split())


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["drip-headers", "drip-body", "describe-drip"])
def test_a_dripping_server_is_cut_at_the_total_deadline(hostile, rollouts, monkeypatch, mode):
    """Dripping the headers, the body, or the answer to the version request (describe-drip)."""
    server, base = hostile
    result = reward(rollouts, f"{base}/{mode}", monkeypatch, timeout_s="1")
    assert result.exit_code == 75, result.output
    assert f"reward server {base}/score/{mode} did not answer within 1 s" in flat(result.output)
    assert "Traceback" not in result.output
    assert server.scoring_requests == 1  # the first request hit the deadline; nothing was retried blindly
    assert list_shards(str(rollouts[1])) == []  # the shard stays pending


@pytest.mark.parametrize("mode", sorted(BAD_BODIES))
def test_an_answer_that_is_not_an_object_exits_75_naming_the_server(hostile, rollouts, monkeypatch, mode):
    _, base = hostile
    result = reward(rollouts, f"{base}/{mode}", monkeypatch)
    assert result.exit_code == 75, (mode, result.output)
    assert f"reward server {base}/score/{mode} answered 200 with" in flat(result.output)
    assert BAD_BODIES[mode][1] in flat(result.output)
    assert "Traceback" not in result.output
    assert list_shards(str(rollouts[1])) == []


@pytest.mark.parametrize("what", sorted(BAD_BODIES))
def test_a_version_answer_that_is_not_an_object_exits_75(hostile, rollouts, monkeypatch, what):
    _, base = hostile
    result = reward(rollouts, f"{base}/describe-{what}", monkeypatch)
    assert result.exit_code == 75, (what, result.output)
    assert f"reward server {base}/score/describe-{what} answered 200 with" in flat(result.output)


@pytest.mark.parametrize("mode", ["huge", "huge-declared"])
def test_an_answer_over_the_cap_exits_75(hostile, rollouts, monkeypatch, mode):
    _, base = hostile
    result = reward(rollouts, f"{base}/{mode}", monkeypatch)
    assert result.exit_code == 75, result.output
    assert f"reward server {base}/score/{mode} answered" in flat(result.output)
    assert f"at most {ANSWER_CAP} are read" in flat(result.output)
    assert list_shards(str(rollouts[1])) == []


@pytest.mark.parametrize("mode", sorted(BAD_REWARDS))
def test_rewards_that_are_not_numbers_are_null_with_a_cause(hostile, rollouts, monkeypatch, mode):
    """Every row gets reward null with its cause (written), and the command exits 1: no row got a reward."""
    _, base = hostile
    result = reward(rollouts, f"{base}/{mode}", monkeypatch)
    assert result.exit_code == 1 and "no row got a reward: all 8 failed" in flat(result.output), result.output
    written = sorted(list_shards(str(rollouts[1])))
    assert len(written) == 2
    for shard in written:
        table = read_shard(shard)
        assert table.column("reward").to_pylist() == [None] * 4
        for info in table.column("reward_info").to_pylist():
            error = json.loads(info)["error"]
            assert BAD_REWARDS[mode][2] in error, error
            if "non-finite" not in BAD_REWARDS[mode][2]:
                assert f"reward server {base}/score/{mode}" in error


def test_a_bad_deadline_is_a_usage_error(hostile, rollouts, monkeypatch):
    _, base = hostile
    for bad in ("nan", "inf", "0", "-1", "soon"):
        result = reward(rollouts, f"{base}/drip-headers", monkeypatch, timeout_s=bad)
        assert result.exit_code == 2 and "ARLCTL_REWARD_TIMEOUT_S" in result.output, (bad, result.output)


@pytest.mark.slow
def test_sigterm_during_a_drip_stops_at_once_and_writes_no_half_shard(hostile, rollouts):
    """The default deadline (900 s) would hold the drip; SIGTERM ends the command instead, exit 75. The
    first shard (answered properly) is written and complete; the second (dripping) is not written."""
    server, base = hostile
    src, out = rollouts
    env = {k: v for k, v in os.environ.items() if k != "ARLCTL_REWARD_TIMEOUT_S"}
    command = [sys.executable, "-m", "arlctl.cli.main", "reward", "--in", str(src), "--out", str(out),
               "--reward", f"{base}/drip-after-first", "--concurrency", "1"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120  # a harness bound (the process start), not a measurement
        while server.scoring_requests < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.scoring_requests == 2, proc.communicate(timeout=5)[0].decode()
        time.sleep(2 * DRIP_S)  # the drip is under way
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)  # far below the 900 s the drip would otherwise take
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = flat(output.decode())
    assert proc.returncode == 75, text
    assert "stopped by a signal while scoring part-2.parquet: not written, it stays pending" in text
    assert "rewarded 4 rows (hostile-1), mean reward 1.0000; wrote 1 shards" in text and "Traceback" not in text
    assert [Path(p).name for p in list_shards(str(out))] == ["part-1.parquet"]
    assert read_shard(str(out / "part-1.parquet")).column("reward").to_pylist() == [1.0] * 4
    leftovers = [p.name for p in out.rglob("*") if p.is_file() and "part-2" in p.name]
    assert leftovers == [], leftovers


CALLS: list[str] = []
STOP = threading.Event()


def stops_on_third(final_state, task, response_text):
    """A synchronous local reward that sets the stage's stop flag (as SIGTERM would) on its third row."""
    CALLS.append(task["task_id"])
    if len(CALLS) == 3:
        STOP.set()
    return 1.0, {"r": 1.0}, {}


stops_on_third.version = "stops-1"


def test_a_stop_mid_shard_stops_at_the_next_row_and_writes_nothing_of_it(tmp_path):
    """The stop flag is looked at before every row, not only between shards: of a 16-row shard, 3 rows are
    scored, the shard is not written, and the summary names it as interrupted (the CLI then exits 75)."""
    from arlctl.envs.registry import get_reward
    from arlctl.stages.reward import reward_dir

    CALLS.clear()
    STOP.clear()
    for shard in (1, 2):
        write_shard(rows_to_table([row(i) for i in range(16)]), str(tmp_path / "in" / f"part-{shard}.parquet"),
                    Lineage(stage="rollout"))
    summary = reward_dir(str(tmp_path / "in"), str(tmp_path / "out"), get_reward(f"{__name__}:stops_on_third"),
                         concurrency=4, stop=STOP)
    assert len(CALLS) == 3
    assert summary.interrupted == "stopped by a signal while scoring part-1.parquet: not written, it stays pending"
    assert summary.written == [] and summary.inputs_seen == 1
    assert list_shards(str(tmp_path / "out")) == []
