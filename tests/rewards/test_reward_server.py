"""`arlctl reward-serve` as a real process on 127.0.0.1, and `--reward http://HOST:PORT/NAME` against it.

The same rows scored locally and through the server give identical rewards, components, info and
versions (a plain reward, a composite of remote parts, a group reward); 200 rows scored with the stage's
concurrency 200 against a server with --concurrency 4 are all scored, never more than 4 at once (counted
inside the reward itself, in the server process); a body over the limit is a 413 and the client halves its
requests; an unknown name is a 404 listing the served ones; a server that is down is a TransientError.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from test_composite import math_row
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.errors import TransientError
from arlctl.io.shards import Lineage, list_shards, write_shard
from arlctl.rewards.composite import build_reward
from arlctl.rewards.server import RemoteReward
from arlctl.schemas.rows import rows_to_table
from arlctl.stages.reward import reward_dir, reward_table

HERE = Path(__file__).resolve().parent
SPEC = Path(__file__).stem  # the server imports this file as a top-level module (PYTHONPATH=HERE)
ARLCTL = [sys.executable, "-m", "arlctl.cli.main"]
MAX_REQUEST_BYTES = 200_000

_active = 0


async def slow_len(final_state, task, response_text):
    """The response's length, after 50 ms; writes the most calls it saw at once to $CONCURRENCY_FILE."""
    global _active
    _active += 1
    try:
        path = os.environ.get("CONCURRENCY_FILE")
        if path:
            seen = int(Path(path).read_text() or 0) if Path(path).exists() else 0
            Path(path).write_text(str(max(seen, _active)))
        await asyncio.sleep(0.05)
        return float(len(response_text)), {"chars": float(len(response_text))}, {"task_id": task["task_id"]}
    finally:
        _active -= 1


slow_len.version = "slow-len-1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(tmp_path, concurrency: int = 4) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
           "CONCURRENCY_FILE": str(tmp_path / "concurrency.txt")}
    log = open(tmp_path / f"reward-serve-{port}.log", "w")  # noqa: SIM115 (lives as long as the process)
    proc = subprocess.Popen([*ARLCTL, "reward-serve", "--port", str(port), "--concurrency", str(concurrency),
                             "--max-request-bytes", str(MAX_REQUEST_BYTES), "--spec", f"{SPEC}:slow_len",
                             "--spec", "test_composite:longest"], stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"reward-serve exited with {proc.returncode}: {(tmp_path / log.name).read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as response:
                if json.load(response)["ok"]:
                    return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    pytest.fail("reward-serve did not come up")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reward-serve")
    proc, url = start_server(tmp)
    yield url, tmp
    proc.terminate()
    proc.wait(30)


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


REWARD_COLUMNS = ["reward", "reward_components", "reward_info", "reward_version"]


@pytest.mark.slow
def test_local_and_remote_scores_are_identical(server):
    url, _ = server
    rows = [math_row("a", "12", "12", "12", group="g1", text="<answer>12</answer> long"),
            math_row("b", "7/2", "3.5", "7/2", group="g1"), math_row("c", "5", "6", "5", group="g2"),
            math_row("d", None, "4", None, group="g2")]
    table = rows_to_table(rows)
    pairs = [("math", f"{url}/math", ["format_weight=0.1"]),
             ("math + 0.5*format", f"{url}/math + 0.5*{url}/format", ["math.format_weight=0.1"]),
             ("test_composite:longest", f"{url}/test_composite:longest", ["scale=3"])]
    for local, remote, options in pairs:
        here = reward_table(table, build_reward(local, options)).select(REWARD_COLUMNS)
        there = reward_table(table, build_reward(remote, options)).select(REWARD_COLUMNS)
        assert there.to_pylist() == here.to_pylist(), local
        assert here.column("reward").null_count == 0
    # the group reward really compared the members: 3 for each group's longest response (g1: b's 34 characters
    # beat a's 24; g2: c's 32 beat d's 9)
    grouped = reward_table(table, build_reward(pairs[2][1], ["scale=3"])).column("reward").to_pylist()
    assert grouped == [0.0, 3.0, 3.0, 0.0]


@pytest.mark.slow
def test_200_concurrent_requests_are_bounded_by_the_server_and_none_is_lost(server, tmp_path):
    url, server_tmp = server
    (server_tmp / "concurrency.txt").unlink(missing_ok=True)
    rows = [math_row(f"r{i:03d}", "1", "1", "1", text="x" * (i + 1)) for i in range(200)]  # 200 groups of 1
    write_shard(rows_to_table(rows), str(tmp_path / "in" / "part-1.parquet"), Lineage(stage="rollout"))
    before = get(url + "/health")
    reward = RemoteReward(f"{url}/{SPEC}:slow_len")
    assert reward.version == "slow-len-1"
    summary = reward_dir(str(tmp_path / "in"), str(tmp_path / "out"), reward, concurrency=200)
    assert summary.rows == 200 and summary.row_errors == []
    from arlctl.io.shards import read_shard

    out = read_shard(summary.written[0]).to_pylist()
    # nothing lost or mixed up: row r{i} has i + 1 characters
    assert [r["reward"] for r in out] == [float(i + 1) for i in range(200)]
    assert all(r["reward_version"] == "slow-len-1" for r in out)
    health = get(url + "/health")
    assert health["requests"] - before["requests"] == 201  # the version request, then one request per row
    most = int((server_tmp / "concurrency.txt").read_text())
    assert 2 <= most <= 4, f"the reward ran {most} at once; the server allows 4"
    assert health["peak_scoring"] <= 4 and health["peak_waiting"] >= 50  # the burst queued at the server


@pytest.mark.slow
def test_protocol_errors(server):
    url, _ = server
    status, body = post(f"{url}/score/nope", b'{"rows": []}')
    assert status == 404 and "math" in body["error"]["known"] and f"{SPEC}:slow_len" in body["error"]["known"]
    # A spec the server was not started with is not served: a client cannot make it import code.
    status, body = post(f"{url}/score/subprocess:call", b'{"rows": []}')
    assert status == 404
    status, body = post(f"{url}/score/math", b"x" * (MAX_REQUEST_BYTES + 1))
    assert status == 413 and str(MAX_REQUEST_BYTES) in body["error"]["message"]
    status, body = post(f"{url}/score/math", json.dumps({"rows": [{"task": [], "response_text": ""}]}).encode())
    assert status == 400 and "rows[0].task" in body["error"]["message"]
    status, body = post(f"{url}/score/math", json.dumps({"rows": [], "options": {"nope": 1}}).encode())
    assert status == 400 and "bad option" in body["error"]["message"]
    status, body = post(f"{url}/score/math", json.dumps({"rows": [], "options": {"format_weight": 0.5}}).encode())
    assert status == 200 and body == {"name": "math", "version": "math-1+format_weight=0.5", "results": []}


def test_client_halves_requests_over_the_size_limit(server):
    url, _ = server
    big = "<answer>1</answer>" + "y" * 60_000  # 4 of these (~240 KB) are over the 200 KB limit, 2 are not
    rows = [math_row(f"b{i}", "1", "1", "1", text=big) for i in range(4)]
    rows.append(math_row("huge", "1", "1", "1", text="z" * (MAX_REQUEST_BYTES + 10)))
    out = reward_table(rows_to_table(rows), RemoteReward(f"{url}/format"), concurrency=1).to_pylist()
    assert [r["reward"] for r in out[:4]] == [1.0] * 4
    assert out[4]["reward"] is None and "answered 413" in json.loads(out[4]["reward_info"])["error"]


@pytest.mark.slow
def test_a_server_that_is_down_is_transient(tmp_path):
    proc, url = start_server(tmp_path, concurrency=1)
    reward = RemoteReward(f"{url}/math")
    write_shard(rows_to_table([math_row("a", "12", "12", "12")]), str(tmp_path / "in" / "part-1.parquet"),
                Lineage(stage="rollout"))
    proc.terminate()
    proc.wait(30)
    with pytest.raises(TransientError, match="reward server"):
        reward_dir(str(tmp_path / "in"), str(tmp_path / "out"), reward)
    assert list_shards(str(tmp_path / "out")) == []  # the shard stays pending
    with pytest.raises(TransientError):
        RemoteReward(f"{url}/math")
    result = CliRunner().invoke(app, ["reward", "--in", str(tmp_path / "in"), "--out", str(tmp_path / "out"),
                                      "--reward", f"{url}/math"])
    assert result.exit_code == 75 and "unreachable" in result.output
