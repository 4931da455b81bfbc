"""Issue 12, class 6: `arlctl serve` against hostile and careless clients never loses a session.

A real `arlctl serve --policy tiny` process on 127.0.0.1, driven over raw HTTP (the openai client would
refuse to send most of these bodies):

- every malformed field of both endpoints is a 400 with a JSON error and no traceback, and opens no
  session; hostile sampling values (temperature "nan" / NaN / inf / -1, top_p 2, ...) are among them;
- a non-integer (bool) token id in a prompt is a 400, and the idle reaper still writes a later session;
- a body over --max-body-bytes is a 413 (with or without Content-Length) and the server stays up;
- a large-but-allowed body tokenises off the event loop: /health and a small completion are answered
  while it does, and the failed request does not keep its record;
- SIGTERM with an open session writes that session's shard before exit (as SIGINT does);
- (in process) a session whose rows cannot be written is logged and marked, and the reaper goes on.
"""

from __future__ import annotations

import http.client
import json
import random
import signal
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from inprocess import arlctl
from serve_helpers import ServeProcess, Server, free_port, rows_by_session

from arlctl.serve.app import SESSION_HEADER

MAX_BODY = 2_000_000
IDLE_S = 2.0
VOCAB = 49152  # the tiny model's tokenizer


# ---- a real server process and a raw HTTP client ----

class RawServe(ServeProcess):
    """`ServeProcess` (replies capped at 4 tokens) with a raw HTTP client, to send bodies openai would not."""

    def __init__(self, record: Path, *extra: str):
        super().__init__(record, "--max-tokens", "4", *extra)

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
                timeout: float = 300) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            if body is not None and not isinstance(body, (bytes, bytearray)) and not hasattr(body, "__next__"):
                body = json.dumps(body).encode()
            conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        try:
            return response.status, json.loads(raw)
        except ValueError:
            return response.status, raw.decode("utf-8", "replace")

    def post(self, path: str, body: Any, session: str | None = None) -> tuple[int, Any]:
        return self.request("POST", path, body, {SESSION_HEADER: session} if session else None)


def wait_for_group(record: Path, group: str, timeout_s: float = 60) -> list[dict]:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        written = rows_by_session(record)
        if group in written:
            return written[group]
        time.sleep(0.2)
    pytest.fail(f"session {group} was never written to {record}")


CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("hardened")
    proc = RawServe(root / "rec", "--idle-timeout", str(IDLE_S), "--max-body-bytes", str(MAX_BODY),
                    "--flush-seconds", "0.5")
    yield proc
    proc.stop()


# ---- 1. every malformed field: a 400 with a JSON error, no traceback, no session ----

def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": HI, "max_tokens": 2, **fields}


def _completion(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "prompt": "hi", "max_tokens": 2, **fields}


MALFORMED_CHAT = [
    {"model": "tiny"}, _chat(messages="hi"), _chat(messages=[]), _chat(messages=[1]), _chat(messages=[["user"]]),
    _chat(messages=[{"content": "x"}]), _chat(messages=[{"role": "wizard", "content": "x"}]),
    _chat(messages=[{"role": 1, "content": "x"}]), _chat(messages=[{"role": "user", "content": 5}]),
    _chat(messages=[{"role": "user", "content": {"text": "x"}}]),
    _chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
    _chat(messages=[{"role": "user", "content": [{"type": "text", "text": 3}]}]),
    _chat(messages=[{"role": "user", "content": "x", "name": 7}]),
    _chat(messages=[{"role": "tool", "content": "x", "tool_call_id": ["a"]}]),
    _chat(messages=[{"role": "assistant", "content": None, "tool_calls": "calc"}]),
    _chat(messages=[{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": 3}}]}]),
    _chat(messages=[{"role": "assistant", "content": None,
                     "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}]),
    _chat(tools="calculator"), _chat(tools=[{"type": "function", "function": {"name": ""}}]),
    _chat(tools=[{"type": "function", "function": "calculator"}]), _chat(tools=[{"type": "retrieval"}]),
    _chat(tools=[{"type": "function", "function": {"name": "f", "parameters": "any"}}]),
    _chat(tool_choice=5), _chat(logprobs="yes"), _chat(top_logprobs=99), _chat(response_format="json"),
    _chat(model=5), _chat(user=["u"]), _chat(parallel_tool_calls="no"),
]
MALFORMED_COMPLETION = [
    {"model": "tiny"}, _completion(prompt=""), _completion(prompt=[]), _completion(prompt=5),
    _completion(prompt={"text": "hi"}), _completion(prompt=[1.5, 2]), _completion(prompt=[True, 2]),
    _completion(prompt=["1", 2]), _completion(prompt=[-1]), _completion(prompt=[VOCAB]), _completion(prompt=[10**30]),
    _completion(prompt=[[1, 2], [3]]), _completion(prompt=["a", "b"]), _completion(prompt=[None]),
    _completion(logprobs="x"), _completion(logprobs=99), _completion(echo=True), _completion(echo="no"),
    _completion(suffix="tail"), _completion(best_of=3),
]
# Shared fields, sent to both endpoints: wrong types, negatives, absurd sizes, unsupported controls.
MALFORMED_SHARED = [
    {"max_tokens": "8"}, {"max_tokens": -5}, {"max_tokens": 0}, {"max_tokens": 2.5}, {"max_tokens": True},
    {"max_tokens": 10**9}, {"max_completion_tokens": [4]}, {"n": 0}, {"n": 1_000_000}, {"n": "2"}, {"n": -1},
    {"stop": 5}, {"stop": [1]}, {"stop": ["x"] * 100}, {"seed": "abc"}, {"seed": -1}, {"seed": 1.5},
    {"seed": 2**64}, {"stream": "yes"}, {"stream_options": {"include_usage": "yes"}}, {"stream_options": [1]},
    {"presence_penalty": 0.5}, {"frequency_penalty": "0"},
    {"repetition_penalty": 1.3}, {"min_p": 0.1}, {"top_k": 40}, {"top_k": -5}, {"top_k": "x"},
    {"logit_bias": {"1": 5}}, {"logit_bias": [1]},
]
# Hostile sampling values (class 4): each would have sampled NaN log-probs or crashed the generator.
HOSTILE_SAMPLING = [
    {"temperature": "nan"}, {"temperature": "inf"}, {"temperature": -1}, {"temperature": "0.7"},
    {"temperature": True}, {"temperature": 1e-30}, {"top_p": 2}, {"top_p": 0}, {"top_p": -0.1},
    {"top_p": "nan"},
]
# Bodies that are not a valid JSON object of valid Unicode.
MALFORMED_RAW = [
    b"not json", b"[1, 2]", b'"hi"', b"", b'{"prompt": "hi", "temperature": NaN}',
    b'{"prompt": "hi", "temperature": Infinity}', b'{"prompt": "hi", "top_p": -Infinity}',
    b'{"prompt": "hi", "temperature": 1e999}', b'{"prompt": "hi\xff\xfe"}', b'{"prompt": "\\ud800 hi"}',
    b'{"prompt": "hi", "user": "\\udfff"}', b'{"prompt": "hi", "x": {"\\ud83d": 1}}',
    b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}",  # past Python's int digit limit
    b'{"prompt": "hi", "x": ' + b"[" * 100 + b"]" * 100 + b"}",  # deeper than the limit, within json's
    b'{"prompt": "hi", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # past the decoder's recursion
]


def _assert_rejected(status: int, body: Any, what: Any, code: int = 400) -> None:
    assert status == code, f"{what!r:.300} -> {status} {body!r:.300}"
    assert isinstance(body, dict) and isinstance(body["error"]["message"], str), f"{what!r:.200}: {body!r:.300}"
    assert "Traceback" not in body["error"]["message"]


@pytest.mark.slow
def test_malformed_requests_are_400_with_a_json_error_and_open_no_session(served):
    probes = ([(CHAT, b) for b in MALFORMED_CHAT] + [(COMPLETIONS, b) for b in MALFORMED_COMPLETION]
              + [(path, make(**extra)) for extra in MALFORMED_SHARED + HOSTILE_SAMPLING
                 for path, make in ((CHAT, _chat), (COMPLETIONS, _completion))]
              + [(path, raw) for raw in MALFORMED_RAW for path in (CHAT, COMPLETIONS)]
              + [(CHAT, _chat(messages=[{"role": "user", "content": "a lone \ud800 surrogate"}]))])
    for index, (path, body) in enumerate(probes):
        status, answer = served.post(path, body, session=f"s-bad-{index}")
        _assert_rejected(status, answer, body)
    # Session ids are checked too: in the header and in the end route.
    for sid in ("has space", "x" * 500, "semi;colon", "new\tline"):
        _assert_rejected(*served.post(CHAT, _chat(), session=sid), sid)
    _assert_rejected(*served.post("/v1/sessions/bad%20id/end", {}), "end route")
    assert len(probes) > 150
    health = served.health()
    assert health["sessions"] == 0 and health["requests"] == 0  # nothing reached the recorder or the model
    assert "Traceback" not in served.log()  # not even in the server's own log


@pytest.mark.slow
def test_hostile_sampling_values_are_refused_by_name(served):
    for path, make in ((CHAT, _chat), (COMPLETIONS, _completion)):
        for extra, field in (({"temperature": "nan"}, "temperature"), ({"temperature": "inf"}, "temperature"),
                             ({"temperature": -1}, "temperature"), ({"top_p": 2}, "top_p"),
                             ({"n": 10**6}, "n"), ({"max_tokens": 10**9}, "max_tokens")):
            status, body = served.post(path, make(**extra))
            _assert_rejected(status, body, extra)
            assert body["error"]["message"].startswith(field), body


# ---- 2. a non-integer prompt id no longer kills the reaper ----

@pytest.mark.slow
def test_non_integer_prompt_id_is_400_and_the_reaper_still_writes_later_sessions(served):
    for prompt in ([True, 2, 3], [1, 2.0], [[True]], [1, "2"]):
        status, body = served.post(COMPLETIONS, _completion(prompt=prompt), session="s-bool")
        _assert_rejected(status, body, prompt)
    # A valid session that extends its record once, then goes idle: the reaper must write it.
    status, first = served.post(COMPLETIONS, _completion(prompt=[1, 2, 3]), session="s-after")
    assert status == 200, first
    ids = [1, 2, 3] + first["choices"][0]["token_ids"]
    status, body = served.post(COMPLETIONS, _completion(prompt=[*ids, True]), session="s-after")
    _assert_rejected(status, body, "bool in an extension")
    # An extension that passes validation but fails in the model (past the 4096-token context): the
    # observation it appended is rolled back, so the retry below still extends the same record.
    status, body = served.post(COMPLETIONS, _completion(prompt=[*ids] + [42] * 5000), session="s-after")
    _assert_rejected(status, body, "too long")
    assert "does not fit" in body["error"]["message"]
    status, second = served.post(COMPLETIONS, _completion(prompt=[*ids, 42]), session="s-after")
    assert status == 200, second
    (row,) = wait_for_group(served.record, "s-after", timeout_s=30 * IDLE_S)
    assert json.loads(row["final_state"])["ended_by"] == "idle"
    # The rejected extension left nothing behind: the record is prompt, reply, the observation 42, reply.
    assert row["prompt_ids"] == [1, 2, 3]
    assert row["response_ids"] == first["choices"][0]["token_ids"] + [42] + second["choices"][0]["token_ids"]
    assert all(type(t) is int for t in row["prompt_ids"] + row["response_ids"])
    written = rows_by_session(served.record)
    assert "s-bool" not in written and not any(g.startswith("s-bad") for g in written)
    assert served.health()["sessions_failed"] == 0


# ---- 3. body size: 413, and a large allowed body does not stall the server ----

@pytest.mark.slow
def test_body_over_the_limit_is_413_and_the_server_stays_responsive(served):
    big = json.dumps(_chat(messages=[{"role": "user", "content": "x" * MAX_BODY}])).encode()
    _assert_rejected(*served.post(CHAT, big), "over the limit (Content-Length)", code=413)

    def chunks():  # no Content-Length: aiohttp must stop reading at the limit
        for _ in range(MAX_BODY // 65536 + 2):
            yield b" " * 65536
    _assert_rejected(*served.post(COMPLETIONS, chunks()), "over the limit (chunked)", code=413)
    status, body = served.post(COMPLETIONS, _completion(), session="s-after-413")
    assert status == 200 and body["choices"][0]["token_ids"], body
    assert served.health()["ok"]


@pytest.mark.slow
def test_a_large_allowed_body_tokenises_off_the_event_loop(served):
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(3000)]
    text = " ".join(rng.choice(words) for _ in range(300_000))[: MAX_BODY - 100_000]
    result: dict[str, Any] = {}

    def send_large() -> None:
        result["large"] = served.post(CHAT, _chat(messages=[{"role": "user", "content": text}]), session="s-large")

    sender = threading.Thread(target=send_large)
    sender.start()
    seen_preparing = False
    while sender.is_alive() and not seen_preparing:
        # /health answers while the large prompt is being tokenised: the loop is free.
        seen_preparing = served.health()["preparing"] >= 1
    assert seen_preparing, "the server never answered while the large body was tokenised"
    status, small = served.post(COMPLETIONS, _completion(), session="s-small")  # served meanwhile
    assert status == 200 and small["choices"][0]["token_ids"], small
    sender.join(300)
    status, body = result["large"]
    # ~1M tokens cannot fit the tiny model's 4096-token context: a 400 naming that, and the failed
    # request's record is rolled back, so the session does not hold the prompt until the idle timeout.
    _assert_rejected(status, body, "large body")
    assert "does not fit" in body["error"]["message"]
    assert served.health()["preparing"] == 0
    assert "s-large" not in rows_by_session(served.record)
    assert served.post("/v1/sessions/s-large/end", {})[0] == 404  # not held open: the record was dropped


# ---- 4. SIGTERM writes open sessions ----

@pytest.mark.e2e
def test_sigterm_writes_every_open_session_before_exit(tmp_path):
    proc = RawServe(tmp_path / "rec")
    try:
        status, body = proc.post(CHAT, _chat(), session="s-term")
        assert status == 200, body
        status, body = proc.post(COMPLETIONS, _completion(), session="s-term-2")
        assert status == 200, body
        proc.proc.send_signal(signal.SIGTERM)
        assert proc.proc.wait(120) == 0, proc.log()[-2000:]
    finally:
        proc.stop()
    written = rows_by_session(tmp_path / "rec")
    assert set(written) == {"s-term", "s-term-2"}
    for rows in written.values():
        assert [json.loads(r["final_state"])["ended_by"] for r in rows] == ["server_stopped"]
    assert "wrote 2 rows of 2 sessions in 1 shards" in proc.log()  # batched: one shard for both


# ---- 5. the reaper cannot die (in process: a session poisoned past validation) ----

@pytest.mark.slow
def test_an_unwritable_session_is_marked_and_the_reaper_goes_on(tmp_path):
    """Defence in depth behind validation: a recorded row that Parquet cannot store (a bool token id,
    what the original attack recorded) fails its own write, is logged and marked, and later sessions
    are still written by the same reaper."""
    import openai

    srv = Server(str(tmp_path / "rec"), idle_timeout_s=0.5)
    try:
        def api(sid):
            return openai.OpenAI(base_url=srv.url, api_key="unused", default_headers={SESSION_HEADER: sid},
                                 max_retries=0)

        api("s-poison").chat.completions.create(model="tiny", messages=HI, max_tokens=2)

        async def poison():
            srv.state.recorder.sessions["s-poison"].current.row.prompt_ids[0] = True

        srv.call(poison())
        deadline = time.time() + 60
        while time.time() < deadline and not srv.state.failed:
            time.sleep(0.1)
        assert list(srv.state.failed) == ["s-poison"]
        api("s-good").chat.completions.create(model="tiny", messages=HI, max_tokens=2)
        (row,) = wait_for_group(tmp_path / "rec", "s-good")
        assert json.loads(row["final_state"])["ended_by"] == "idle"
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/health", timeout=10) as response:
            health = json.load(response)
        assert health["sessions_failed"] == 1 and health["failed_sessions"] == ["s-poison"]
    finally:
        srv.stop()
    assert set(rows_by_session(tmp_path / "rec")) == {"s-good"}


# ---- 6. the server's own options ----

@pytest.mark.slow
@pytest.mark.parametrize(("option", "value", "message"), [
    ("--idle-timeout", "nan", "--idle-timeout must be a positive number"),
    ("--idle-timeout", "-1", "--idle-timeout must be a positive number"),
    ("--max-body-bytes", "0", "--max-body-bytes must be in [1,"),
    ("--max-tokens", "0", "--max-tokens must be in [1,"),
    ("--flush-sessions", "0", "--flush-sessions must be in [1,"),
    ("--flush-seconds", "inf", "--flush-seconds must be a positive number"),
    ("--flush-seconds", "0", "--flush-seconds must be a positive number"),
])
def test_serve_refuses_bad_options_with_exit_2(tmp_path, option, value, message):
    """Usage errors, found before the server starts: in process."""
    result = arlctl("serve", "--policy", "tiny", "--port", str(free_port()), "--record", str(tmp_path / "rec"),
                    option, value)
    assert result.returncode == 2, result.stderr
    assert message in " ".join(result.stderr.split()) and "Traceback" not in result.stderr
