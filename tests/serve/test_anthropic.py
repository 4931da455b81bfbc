"""Anthropic's Messages API (/v1/messages) on a real `arlctl serve` process, driven by the official
`anthropic` client over 127.0.0.1.

Checks: a tool-using session (tool_use blocks out, tool_result blocks back, a top-level system) records
one exact trajectory, the same tokens whether it is sent plainly, as a raw event stream or through the
client's stream helper, and the same tokens as the same conversation over /v1/chat/completions; the
events come in Anthropic's order; stop_reason is tool_use / end_turn / max_tokens; the session is found
by prefix without the header; count_tokens counts what the first turn is given; a real model's multi-turn session streamed and unstreamed records the same
re-scored tokens; hostile bodies are 400s in Anthropic's error shape naming the field and open no session.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
import torch
from serve_helpers import (
    CALCULATOR,
    FINAL_REPLY,
    TOOL_REPLY,
    ServeProcess,
    assert_contiguous,
    assert_token_exact,
    rows_by_session,
    token_record,
)

from arlctl.models import tiny_model_dir
from arlctl.serve.app import SESSION_HEADER

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

SYSTEM = "You can use a calculator."
QUESTION = {"role": "user", "content": "What is 6 * 7?"}
TOOLS = [{"name": "calculator", "description": CALCULATOR["function"]["description"],
          "input_schema": CALCULATOR["function"]["parameters"]}]
MAX_BODY = 200_000


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """The scripted tool-calling policy and the tiny model, started together (startup dominates)."""
    scripted = ServeProcess.start(tmp_path_factory.mktemp("scripted") / "rec", "--max-body-bytes", str(MAX_BODY),
                                  replies=(TOOL_REPLY, FINAL_REPLY))
    model = ServeProcess.start(tmp_path_factory.mktemp("model") / "rec", "--max-tokens", "16")
    try:
        yield scripted.ready(), model.ready()
    finally:
        scripted.stop()
        model.stop()


def client(server: ServeProcess, session: str | None = None):
    headers = {SESSION_HEADER: session} if session else None
    return anthropic.Anthropic(base_url=server.url, api_key="unused", default_headers=headers, max_retries=0)


def plain(api, **kwargs):
    message = api.messages.create(**kwargs)
    return message.content, message.stop_reason, message.usage, []


def raw_events(api, **kwargs):
    """create(stream=True): the raw events, folded into content blocks as a client without helpers would."""
    blocks, names, stop, usage = [], [], None, None
    for event in api.messages.create(stream=True, **kwargs):
        names.append(event.type)
        if event.type == "content_block_start":
            blocks.append({**event.content_block.model_dump(exclude_none=True), "json": ""})
        elif event.type == "content_block_delta" and event.delta.type == "text_delta":
            blocks[event.index]["text"] += event.delta.text
        elif event.type == "content_block_delta":
            blocks[event.index]["json"] += event.delta.partial_json
        elif event.type == "message_delta":
            stop, usage = event.delta.stop_reason, event.usage
    content = []
    for block in blocks:
        if block["type"] == "tool_use":
            content.append(anthropic.types.ToolUseBlock(type="tool_use", id=block["id"], name=block["name"],
                                                        input=json.loads(block["json"])))
        else:
            content.append(anthropic.types.TextBlock(type="text", text=block["text"]))
    return content, stop, usage, names


def helper_stream(api, **kwargs):
    with api.messages.stream(**kwargs) as stream:
        names = [event.type for event in stream]
        message = stream.get_final_message()
    return message.content, message.stop_reason, message.usage, names


def tool_session(api, send, turns: int = 2, **kwargs) -> list[tuple]:
    messages: list[dict] = [QUESTION]
    replies = []
    for turn in range(turns):
        content, stop, usage, names = send(api, model="tiny", max_tokens=64, system=SYSTEM, tools=TOOLS,
                                           messages=messages, **kwargs)
        replies.append((content, stop, usage, names))
        messages.append({"role": "assistant", "content": content})
        results = [{"type": "tool_result", "tool_use_id": b.id, "content": [{"type": "text", "text": f"result {turn}"}]}
                   for b in content if b.type == "tool_use"]
        messages.append({"role": "user", "content": results or f"result {turn}"})
    return replies


@pytest.mark.slow
def test_tool_use_session_records_one_exact_trajectory_plain_or_streamed(servers):
    scripted, _model = servers
    sessions = {"a-plain": plain, "a-events": raw_events, "a-helper": helper_stream}
    results = {sid: tool_session(client(scripted, sid), send) for sid, send in sessions.items()}
    for sid, ((content, stop, usage, _names), (content2, stop2, _usage2, _names2)) in results.items():
        assert stop == "tool_use" and stop2 == "end_turn", sid
        assert [b.type for b in content] == ["tool_use"] and content[0].name == "calculator"
        assert content[0].input == {"expression": "6*7"} and content[0].id.startswith("toolu_")
        assert [(b.type, b.text) for b in content2] == [("text", FINAL_REPLY)]
        assert usage.output_tokens > 0
    assert results["a-events"][0][3] == ["message_start", "content_block_start", "content_block_delta",
                                         "content_block_stop", "message_delta", "message_stop"]
    text_events = results["a-events"][1][3]
    assert text_events[:2] == ["message_start", "content_block_start"] and text_events.count("content_block_delta") > 1
    # The same conversation over the OpenAI API, for comparison.
    api = openai.OpenAI(base_url=f"{scripted.url}/v1", api_key="unused", max_retries=0,
                        default_headers={SESSION_HEADER: "o-plain"})
    messages = [{"role": "system", "content": SYSTEM}, QUESTION]
    first = api.chat.completions.create(model="tiny", messages=messages, tools=[CALCULATOR]).choices[0].message
    messages += [{"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in first.tool_calls]},
                 {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "result 0"}]
    api.chat.completions.create(model="tiny", messages=messages, tools=[CALCULATOR])
    for sid in [*sessions, "o-plain"]:
        assert scripted.end(sid)["rows"] == 1
    rows = rows_by_session(scripted.record)
    records = {sid: token_record(rows[sid][0]) for sid in [*sessions, "o-plain"]}
    assert len(set(map(repr, records.values()))) == 1, "every API and mode records the same tokens"
    row = rows["a-helper"][0]
    assert_contiguous(row)
    assert row["num_turns"] == 2 and SYSTEM in row["prompt_text"] and "calculator" in row["prompt_text"]
    assert "result 0" in row["turns"][0]["observation"]
    recorded_id = json.loads(row["turns"][0]["tool_calls"])[0]["id"]
    assert recorded_id == results["a-helper"][0][0][0].id  # the id the client was given is the one recorded


@pytest.mark.slow
def test_session_found_by_prefix_and_max_tokens_stop(servers):
    scripted, _model = servers
    api = client(scripted)
    first = api.messages.with_raw_response.create(model="tiny", max_tokens=64, tools=TOOLS, messages=[QUESTION])
    sid = first.headers[SESSION_HEADER]
    message = first.parse()
    counted = api.messages.count_tokens(model="tiny", tools=TOOLS, messages=[QUESTION])
    assert counted.input_tokens == message.usage.input_tokens > 0  # the same rendering, nothing recorded
    follow = [QUESTION, {"role": "assistant", "content": message.content},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": message.content[0].id,
                                            "content": "42", "is_error": False}]}]
    second = api.messages.with_raw_response.create(model="tiny", max_tokens=3, tools=TOOLS, messages=follow)
    assert second.headers[SESSION_HEADER] == sid  # joined by its conversation prefix
    cut = second.parse()
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    scripted.end(sid)
    (row,) = rows_by_session(scripted.record)[sid]
    assert row["num_turns"] == 2 and row["status"] == "truncated" and row["finish_reason"] == "length"


@pytest.mark.slow
def test_real_model_session_streamed_and_plain_record_the_same_exact_tokens(servers):
    _scripted, model = servers
    reference = AutoModel()
    for sid, send in (("m-plain", plain), ("m-stream", helper_stream)):
        api = client(model, sid)
        messages: list[dict] = []
        for turn in range(3):
            messages.append({"role": "user", "content": f"Tell me fact number {turn}."})
            content, stop, usage, _names = send(api, model="tiny", max_tokens=10 + turn, messages=messages,
                                                system="Be brief.", extra_body={"seed": turn})
            assert stop in ("end_turn", "max_tokens") and usage.output_tokens > 0
            messages.append({"role": "assistant", "content": content})
        assert model.end(sid)["rows"] == 1
    rows = rows_by_session(model.record)
    assert token_record(rows["m-plain"][0]) == token_record(rows["m-stream"][0])
    for sid in ("m-plain", "m-stream"):
        row = rows[sid][0]
        assert row["num_turns"] == 3
        assert_contiguous(row)
        assert_token_exact(reference, row)


def AutoModel():  # noqa: N802 (reads like the transformers class it loads)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir(), local_files_only=True, dtype=torch.float32).eval()


def _body(**fields):
    return {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **fields}


def _assistant_blocks(*blocks):
    return _body(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": list(blocks)},
                           {"role": "user", "content": "more"}])


# (body, the field the 400 must name)
HOSTILE = [
    ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
    (_body(max_tokens="8"), "max_tokens"), (_body(max_tokens=0), "max_tokens"), (_body(max_tokens=10**9), "max_tokens"),
    (_body(messages=[]), "messages"), (_body(messages={"role": "user"}), "messages"),
    (_body(messages=[{"role": "system", "content": "x"}]), "messages[0].role"),
    (_body(messages=["hi"]), "messages[0]"), (_body(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
    (_body(messages=[{"role": "user", "content": []}]), "messages[0].content"),
    (_body(messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]), "messages[0].content[0]"),
    (_body(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}]), "messages[0].content[0].text"),
    (_body(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": 5}]}]),
     "messages[0].content[0].tool_use_id"),
    (_body(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 5}]}]),
     "messages[0].content[0].content"),
    (_body(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": "no"}]}]),
     "is_error"),
    (_assistant_blocks({"type": "tool_use", "id": "t", "name": "calculator"}), "messages[1].content[0].input"),
    (_assistant_blocks({"type": "tool_use", "id": 7, "name": "calculator", "input": {}}), "messages[1].content[0].id"),
    (_assistant_blocks({"type": "thinking", "thinking": "hm"}), "messages[1].content[0]"),
    (_body(system=5), "system"), (_body(system=[{"type": "image"}]), "system[0]"),
    (_body(tools={"name": "x"}), "tools"), (_body(tools=[{"name": "calculator"}]), "tools[0].input_schema"),
    (_body(tools=[{"name": "", "input_schema": {}}]), "tools[0].name"),
    (_body(tools=[{"type": "bash_20250124", "name": "bash"}]), "tools[0].type"),
    (_body(tools=[{"name": "c", "input_schema": {}, "description": 3}]), "tools[0].description"),
    (_body(tool_choice={"type": "any"}), "tool_choice"), (_body(tool_choice="auto"), "tool_choice"),
    (_body(thinking={"type": "enabled", "budget_tokens": 1024}), "thinking"),
    (_body(stop_sequences=[1]), "stop_sequences"), (_body(stop_sequences="x"), "stop_sequences"),
    (_body(temperature="nan"), "temperature"), (_body(temperature=-1), "temperature"), (_body(top_p=2), "top_p"),
    (_body(top_k=40), "top_k"), (_body(stream="yes"), "stream"), (_body(metadata=[1]), "metadata"),
    (_body(seed=-1), "seed"),
]


def _post(server: ServeProcess, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(f"{server.url}/v1/messages", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.slow
def test_hostile_bodies_are_400s_naming_the_field_in_anthropics_shape(servers):
    scripted, _model = servers
    before = scripted.health()["sessions"]
    for body, field in HOSTILE:
        status, answer = _post(scripted, json.dumps(body).encode())
        assert status == 400, (body, answer)
        assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error", answer
        assert field in answer["error"]["message"], (field, answer)
    for raw in (b"not json", b"[1]", b'{"max_tokens": 8, "messages": [{"role": "user", "content": "\\ud800"}]}',
                b'{"max_tokens": 8, "x": ' + b"[" * 100 + b"]" * 100 + b"}"):
        status, answer = _post(scripted, raw)
        assert status == 400 and answer["type"] == "error", raw
    status, answer = _post(scripted, json.dumps(_body(system="x" * (MAX_BODY + 1))).encode())
    assert status == 413 and answer["error"]["type"] == "request_too_large"
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):  # the official client sees a typed error
        client(scripted).messages.create(model="tiny", max_tokens=0, messages=[QUESTION])
    assert scripted.health()["sessions"] == before  # nothing hostile opened a session
