"""POST /v1/sessions/{id}/reward on a real `arlctl serve --policy tiny` process: a black-box harness attaches
its outcome to a recorded session, and the session's rows are written with it (reward_version
"session-api"); bad values are 400, an unknown session 404, a second different outcome or a late one 409."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from arlctl.io.shards import list_shards, read_shard

ARLCTL = [sys.executable, "-m", "arlctl.cli.main"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def request(method: str, url: str, body: bytes | None = None, session: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({"X-Arlctl-Session": session} if session else {})}
    req = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=120) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture
def serve(tmp_path):
    port = free_port()
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115 (lives as long as the process)
    proc = subprocess.Popen([*ARLCTL, "serve", "--policy", "tiny", "--port", str(port), "--record",
                             str(tmp_path / "record"), "--max-tokens", "8"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"arlctl serve did not come up: {(tmp_path / 'serve.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=1):
                break
        except OSError:
            time.sleep(0.3)
    yield proc, base
    if proc.poll() is None:
        proc.kill()


def chat(base: str, session: str) -> None:
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8})
    status, reply = request("POST", base + "/v1/chat/completions", body.encode(), session)
    assert status == 200, reply


def post_reward(base: str, session: str, payload: dict | bytes) -> tuple[int, dict]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return request("POST", f"{base}/v1/sessions/{session}/reward", body)


@pytest.mark.slow
def test_a_posted_outcome_becomes_the_sessions_reward(serve, tmp_path):
    proc, base = serve
    chat(base, "s1")
    chat(base, "s2")
    status, reply = post_reward(base, "s1", {"reward": 0.75, "info": {"tests": "3/4"}})
    assert status == 200 and reply == {"session": "s1", "reward": 0.75}
    assert post_reward(base, "s1", {"reward": 0.75, "info": {"tests": "3/4"}})[0] == 200  # a retry is fine
    status, reply = post_reward(base, "s1", {"reward": 1.0})
    assert status == 409 and "already has reward 0.75" in reply["error"]["message"]
    for bad in ({"reward": "0.5"}, {"reward": True}, {"reward": 1e39}, {}, {"reward": 1, "info": [1]},
                b'{"reward": NaN}', b'{"reward": Infinity}'):
        status, reply = post_reward(base, "s2", bad)
        assert status == 400, (bad, reply)
    status, reply = post_reward(base, "nobody", {"reward": 1.0})
    assert status == 404 and "no open session" in reply["error"]["message"]

    status, reply = request("POST", f"{base}/v1/sessions/s1/end", b"{}")
    assert status == 200 and reply["rows"] == 1
    status, reply = post_reward(base, "s1", {"reward": 0.5})  # its rows are written: too late
    assert status == 409 and "before" in reply["error"]["message"]
    _, health = request("GET", base + "/health")
    assert health["sessions_rewarded"] == 1

    proc.send_signal(signal.SIGINT)  # writes s2, which got no outcome
    assert proc.wait(60) == 0
    rows = {r["group_id"]: r for shard in list_shards(str(tmp_path / "record")) for r in read_shard(shard).to_pylist()}
    assert set(rows) == {"s1", "s2"}
    assert rows["s1"]["reward"] == 0.75 and rows["s1"]["reward_version"] == "session-api"
    assert json.loads(rows["s1"]["reward_info"]) == {"tests": "3/4"} and rows["s1"]["reward_components"] == []
    assert rows["s2"]["reward"] is None and rows["s2"]["reward_version"] is None
