"""`arlctl serve` on the hf backend and the tiny model, driven by the real `openai` client over 127.0.0.1.

Checks: multi-turn tool use extends one session's record (one row, prompt tokenized once, observations
mask 0), a rewritten history starts a new segment, recorded rows validate and their log-probs match a
re-scoring of the exact recorded ids, explicit end and idle timeout write rows, /v1/completions with
token-id prompts records exactly, and hermes tool calls come back as OpenAI tool_calls.
"""

from __future__ import annotations

import json
import time

import pyarrow.parquet as pq
import pytest
import torch
from serve_helpers import Server, assert_token_exact

from arlctl.models import tiny_model_dir
from arlctl.schemas.trajectory import validate
from arlctl.serve.app import SESSION_HEADER, split_reply

openai = pytest.importorskip("openai")

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}]


@pytest.fixture(scope="module")
def reference_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir(), local_files_only=True,
                                                dtype=torch.float32).eval()


@pytest.fixture
def server(tmp_path):
    srv = Server(str(tmp_path / "rec"))
    yield srv
    srv.stop()


def client(server: Server, session: str | None = None):
    headers = {SESSION_HEADER: session} if session else None
    return openai.OpenAI(base_url=server.url, api_key="unused", default_headers=headers, max_retries=0)


def read_rows(record_dir) -> list[dict]:
    rows = []
    for path in sorted(record_dir.glob("*.parquet")):
        table = pq.read_table(path)
        validate(table)
        rows.extend(table.to_pylist())
    return rows


@pytest.mark.slow
def test_multi_turn_tool_use_records_one_exact_trajectory(server, tmp_path, reference_model):
    api = client(server, "s-tools")
    messages = [{"role": "system", "content": "You can use a calculator."},
                {"role": "user", "content": "What is 6 * 7?"}]
    for turn in range(3):
        reply = api.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=16 + turn,
                                            temperature=1.0, seed=turn)
        message = reply.choices[0].message
        assert reply.usage.completion_tokens > 0
        assistant = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            assistant["tool_calls"] = [c.model_dump() for c in message.tool_calls]
        messages += [assistant, {"role": "tool", "tool_call_id": "call_0", "content": f"result {turn}"}]
    ended = api.post("/sessions/s-tools/end", cast_to=object, body={})
    assert ended == {"session": "s-tools", "rows": 1}
    rows = read_rows(tmp_path / "rec")
    assert len(rows) == 1
    row = rows[0]
    assert row["group_id"] == "s-tools" and row["env"] == "serve" and row["num_turns"] == 3
    # Two observation segments (after turns 0 and 1), each holding the tool result text.
    turns = row["turns"]
    assert [t["obs_len"] > 0 for t in turns] == [True, True, False]
    assert "result 0" in turns[0]["observation"] and "result 1" in turns[1]["observation"]
    # The prompt was rendered once: tools described, and the first user message in it.
    assert "calculator" in row["prompt_text"] and "6 * 7" in row["prompt_text"]
    assert_token_exact(reference_model, row)
    # The tokens are contiguous: the mask-0 runs are exactly the observation segments.
    for t in turns:
        assert row["response_mask"][t["gen_start"]:t["gen_start"] + t["gen_len"]] == [1] * t["gen_len"]
        obs = row["response_mask"][t["gen_start"] + t["gen_len"]:t["gen_start"] + t["gen_len"] + t["obs_len"]]
        assert obs == [0] * t["obs_len"]


@pytest.mark.slow
def test_prefix_matching_without_header_and_rewrite_starts_segment(server, tmp_path, reference_model):
    api = client(server)
    first = [{"role": "user", "content": "Say hi."}]
    r1 = api.chat.completions.with_raw_response.create(model="tiny", messages=first, max_tokens=8)
    sid = r1.headers[SESSION_HEADER]
    m1 = r1.parse().choices[0].message
    second = first + [{"role": "assistant", "content": m1.content}, {"role": "user", "content": "Again."}]
    r2 = api.chat.completions.with_raw_response.create(model="tiny", messages=second, max_tokens=8)
    assert r2.headers[SESSION_HEADER] == sid  # found by its conversation prefix
    # The harness rewrites history (edits the assistant reply): a new segment of the same session.
    rewritten = first + [{"role": "assistant", "content": "something else"}, {"role": "user", "content": "Again."}]
    r3 = client(server, sid).chat.completions.with_raw_response.create(model="tiny", messages=rewritten,
                                                                      max_tokens=8)
    assert r3.headers[SESSION_HEADER] == sid
    server.end(sid)
    rows = sorted(read_rows(tmp_path / "rec"), key=lambda r: r["sample_index"])
    assert [r["sample_index"] for r in rows] == [0, 1]
    assert [r["num_turns"] for r in rows] == [2, 1]
    assert json.loads(rows[0]["final_state"])["ended_by"] == "rewritten"
    assert "something else" in rows[1]["prompt_text"]  # the rewritten history is the new segment's prompt
    for row in rows:
        assert_token_exact(reference_model, row)


def test_completions_with_token_ids_extend_the_record(server, tmp_path, reference_model):
    api = client(server, "s-raw")
    tok = server.policy.tokenizer
    prompt = tok("The numbers are", add_special_tokens=False)["input_ids"]
    r1 = api.completions.create(model="tiny", prompt=prompt, max_tokens=6, logprobs=0)
    ids1 = r1.choices[0].model_extra["token_ids"]
    assert len(r1.choices[0].logprobs.token_logprobs) == len(ids1) == 6
    extra = tok(" and", add_special_tokens=False)["input_ids"]
    api.completions.create(model="tiny", prompt=prompt + ids1 + extra, max_tokens=5)
    server.end("s-raw")
    (row,) = read_rows(tmp_path / "rec")
    assert row["prompt_ids"] == prompt
    assert row["response_ids"][:6] == ids1 and row["response_ids"][6:6 + len(extra)] == extra
    assert row["response_mask"] == [1] * 6 + [0] * len(extra) + [1] * 5
    assert row["response_logprobs"][:6] == pytest.approx(r1.choices[0].logprobs.token_logprobs)
    assert_token_exact(reference_model, row)


@pytest.mark.slow
def test_idle_timeout_writes_the_session(tmp_path):
    srv = Server(str(tmp_path / "rec"), idle_timeout_s=0.5)
    try:
        client(srv, "s-idle").chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                     max_tokens=4)
        deadline = time.time() + 10
        while time.time() < deadline and not list((tmp_path / "rec").glob("*.parquet")):
            time.sleep(0.1)
        (row,) = read_rows(tmp_path / "rec")
        assert json.loads(row["final_state"]) == {"session": "s-idle", "segment": 0, "ended_by": "idle"}
    finally:
        srv.stop()


@pytest.mark.slow
def test_stop_writes_open_sessions(tmp_path):
    srv = Server(str(tmp_path / "rec"))
    api = client(srv, "s-open")
    api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="does not fit"):  # a typed TerminalError becomes a 400
        client(srv, "s-long").completions.create(model="tiny", prompt=[5] * 5000, max_tokens=2)
    srv.stop()
    (row,) = read_rows(tmp_path / "rec")
    assert json.loads(row["final_state"])["ended_by"] == "server_stopped"


def test_split_reply_parses_hermes_tool_calls():
    text = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'
    content, calls = split_reply(text, TOOLS)
    assert content == "Let me compute."
    assert calls == [{"id": "call_0", "type": "function",
                      "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'}}]
    assert split_reply(text, []) == (text, [])  # without tools nothing is parsed
    bad = '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
    assert split_reply(bad, TOOLS) == (bad, [])  # an unknown tool stays text for the harness to see
