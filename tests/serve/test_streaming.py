"""`stream: true` on a real `arlctl serve` process, driven by the official `openai` client over 127.0.0.1.

Checks: a streamed multi-turn tool session records the same exact trajectory as the same session
unstreamed (tiny model, same seeds; both re-scored token for token), the chunks carry what the plain
reply carries (content, usage, token ids), tool calls stream as `delta.tool_calls` the way OpenAI clients
rebuild them (scripted tool-calling policy), streamed /v1/completions chunks carry the recorded token ids
and log-probs, a client that disconnects mid-stream leaves its turn recorded and the session usable, and
a prompt that cannot fit is a 400 before the stream opens.
"""

from __future__ import annotations

import http.client
import json
import time

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

from arlctl.inference.chat import ChatCodec
from arlctl.models import tiny_model_dir
from arlctl.serve.app import SESSION_HEADER

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """The tiny model and the scripted tool-calling policy, started together (startup dominates)."""
    model = ServeProcess.start(tmp_path_factory.mktemp("model") / "rec", "--max-tokens", "24")
    scripted = ServeProcess.start(tmp_path_factory.mktemp("scripted") / "rec", replies=(TOOL_REPLY, FINAL_REPLY))
    try:
        yield model.ready(), scripted.ready()
    finally:
        model.stop()
        scripted.stop()


@pytest.fixture(scope="module")
def model_server(servers):
    return servers[0]


@pytest.fixture(scope="module")
def scripted_server(servers):
    return servers[1]


@pytest.fixture(scope="module")
def reference_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir(), local_files_only=True,
                                                dtype=torch.float32).eval()


def client(server: ServeProcess, session: str | None = None):
    headers = {SESSION_HEADER: session} if session else None
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", default_headers=headers, max_retries=0)


def streamed_reply(api, **kwargs) -> dict:
    """One streamed chat reply rebuilt as a client does: content joined, tool calls assembled by index."""
    content, calls, finish, usage, extension, roles = "", {}, None, None, None, []
    for chunk in api.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            roles += [delta.role] if delta.role else []
            content += delta.content or ""
            for part in delta.tool_calls or []:
                call = calls.setdefault(part.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = part.id or call["id"]
                call["name"] += (part.function.name or "") if part.function else ""
                call["arguments"] += (part.function.arguments or "") if part.function else ""
            if choice.finish_reason:
                finish, extension = choice.finish_reason, chunk.model_extra["arlctl"]
    assert roles == ["assistant"] and usage is not None
    return {"content": content or None, "tool_calls": [calls[i] for i in sorted(calls)], "finish": finish,
            "usage": (usage.prompt_tokens, usage.completion_tokens), "token_ids": extension["token_ids"]}


def plain_reply(api, **kwargs) -> dict:
    reply = api.chat.completions.create(**kwargs)
    message = reply.choices[0].message
    calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
             for c in message.tool_calls or []]
    return {"content": message.content, "tool_calls": calls, "finish": reply.choices[0].finish_reason,
            "usage": (reply.usage.prompt_tokens, reply.usage.completion_tokens),
            "token_ids": reply.model_extra["arlctl"]["token_ids"]}


def tool_session(api, stream: bool, turns: int, **kwargs) -> list[dict]:
    """A multi-turn tool-using conversation: each reply echoed back, then a tool result for it."""
    messages = [{"role": "system", "content": "You can use a calculator."},
                {"role": "user", "content": "What is 6 * 7?"}]
    replies = []
    for turn in range(turns):
        reply = (streamed_reply if stream else plain_reply)(api, model="tiny", messages=messages, tools=[CALCULATOR],
                                                            seed=turn, temperature=1.0, **kwargs)
        replies.append(reply)
        assistant = {"role": "assistant", "content": reply["content"]}
        if reply["tool_calls"]:
            assistant["tool_calls"] = [{"id": c["id"], "type": "function",
                                        "function": {"name": c["name"], "arguments": c["arguments"]}}
                                       for c in reply["tool_calls"]]
        messages += [assistant, {"role": "tool", "tool_call_id": "call_0", "content": f"result {turn}"}]
    return replies


@pytest.mark.slow
def test_streamed_session_records_the_same_exact_trajectory_as_unstreamed(model_server, reference_model):
    plain = tool_session(client(model_server, "plain"), stream=False, turns=3)
    streamed = tool_session(client(model_server, "streamed"), stream=True, turns=3)
    assert streamed == plain  # same seeds, same prompts: the same tokens, text, usage and finish reasons
    assert model_server.end("plain")["rows"] == model_server.end("streamed")["rows"] == 1
    rows = rows_by_session(model_server.record)
    (plain_row,), (streamed_row,) = rows["plain"], rows["streamed"]
    assert token_record(streamed_row) == token_record(plain_row)
    assert streamed_row["num_turns"] == 3 and [t["obs_len"] > 0 for t in streamed_row["turns"]] == [True, True, False]
    for row in (plain_row, streamed_row):
        assert_contiguous(row)
        assert_token_exact(reference_model, row)
    # What the client was sent is what was recorded: each turn's ids are its mask-1 span.
    for reply, turn in zip(streamed, streamed_row["turns"], strict=True):
        assert streamed_row["response_ids"][turn["gen_start"]:turn["gen_start"] + turn["gen_len"]] == reply["token_ids"]


@pytest.mark.slow
def test_streamed_completions_carry_the_recorded_token_ids_and_logprobs(model_server):
    tok_ids = list(range(300, 310))
    api = client(model_server, "raw-stream")
    texts, ids, logprobs, usage = [], [], [], None
    for chunk in api.completions.create(model="tiny", prompt=tok_ids, max_tokens=12, logprobs=0, seed=5, stream=True,
                                        stream_options={"include_usage": True}):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts.append(choice.text)
            ids += choice.model_extra["token_ids"]
            logprobs += choice.logprobs.token_logprobs if choice.logprobs else []
    plain = client(model_server, "raw-plain").completions.create(model="tiny", prompt=tok_ids, max_tokens=12, seed=5)
    assert "".join(texts) == plain.choices[0].text and ids == plain.choices[0].model_extra["token_ids"]
    assert usage.completion_tokens == len(ids) and usage.prompt_tokens == len(tok_ids)
    model_server.end("raw-stream")
    (row,) = rows_by_session(model_server.record)["raw-stream"]
    assert row["prompt_ids"] == tok_ids and row["response_ids"] == ids
    assert row["response_logprobs"] == pytest.approx(logprobs, abs=1e-6)


@pytest.mark.slow
def test_streamed_tool_calls_are_openai_deltas_and_record_like_unstreamed(scripted_server):
    plain = tool_session(client(scripted_server, "tools-plain"), stream=False, turns=2)
    streamed = tool_session(client(scripted_server, "tools-streamed"), stream=True, turns=2)
    assert streamed == plain
    first, second = streamed
    assert first["finish"] == "tool_calls" and first["content"] is None
    assert first["tool_calls"] == [{"id": "call_0", "name": "calculator", "arguments": '{"expression": "6*7"}'}]
    assert second == {**second, "finish": "stop", "content": FINAL_REPLY, "tool_calls": []}
    for sid in ("tools-plain", "tools-streamed"):
        scripted_server.end(sid)
    rows = rows_by_session(scripted_server.record)
    (plain_row,), (row,) = rows["tools-plain"], rows["tools-streamed"]
    assert token_record(row) == token_record(plain_row)
    assert_contiguous(row)
    assert row["num_tool_calls"] == 1 and json.loads(row["turns"][0]["tool_calls"])[0]["id"] == "call_0"
    # Token-exact: the recorded ids are the chat template's rendering of the conversation the model saw.
    from transformers import AutoTokenizer

    codec = ChatCodec(AutoTokenizer.from_pretrained(tiny_model_dir(), local_files_only=True))
    system, user = {"role": "system", "content": "You can use a calculator."}, {"role": "user", "content": "What is 6 * 7?"}
    rendered = codec.render_conversation(
        [system, user], [CALCULATOR],
        [(TOOL_REPLY, [{"role": "tool", "content": "result 0"}]), (FINAL_REPLY, None)])
    recorded = codec.decode(row["prompt_ids"] + row["response_ids"])
    assert rendered == recorded + codec.closing[len(codec.decode(row["response_ids"][-1:])):]


def _open_stream(server: ServeProcess, session: str, body: dict) -> tuple[http.client.HTTPConnection, bytes]:
    """POST a streaming request and read up to the first event; the connection is left open."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                 headers={"Content-Type": "application/json", SESSION_HEADER: session})
    response = conn.getresponse()
    assert response.status == 200 and response.headers["Content-Type"].startswith("text/event-stream")
    first = response.readline() + response.readline()
    return conn, first


@pytest.mark.slow
def test_client_disconnect_mid_stream_keeps_the_turn_and_the_session(model_server, reference_model):
    before = model_server.health()["streams_disconnected"]
    question = [{"role": "user", "content": "Count to a thousand."}]
    conn, first = _open_stream(model_server, "gone", {"model": "tiny", "messages": question, "stream": True,
                                                      "max_tokens": 200, "seed": 1})
    assert json.loads(first.removeprefix(b"data: "))["choices"][0]["delta"]["role"] == "assistant"
    conn.sock.close()  # the client goes away while the reply is being generated
    conn.close()
    deadline = time.time() + 60
    while model_server.health()["streams_disconnected"] == before and time.time() < deadline:
        time.sleep(0.1)
    assert model_server.health()["streams_disconnected"] == before + 1
    # The client retries (it never saw the reply): the session goes on, the lost turn stays recorded.
    retry = client(model_server, "gone").chat.completions.create(model="tiny", messages=question, max_tokens=8)
    assert retry.choices[0].message.content is not None
    assert model_server.end("gone")["rows"] == 2
    rows = sorted(rows_by_session(model_server.record)["gone"], key=lambda r: r["sample_index"])
    assert [r["num_turns"] for r in rows] == [1, 1]
    assert json.loads(rows[0]["final_state"])["ended_by"] == "rewritten"
    assert rows[0]["generated_tokens"] > 8  # the whole sampled reply, not a cut-off part of it
    for row in rows:
        assert_token_exact(reference_model, row)


@pytest.mark.slow
def test_prompt_that_cannot_fit_is_a_400_before_the_stream_opens(model_server):
    api = client(model_server, "too-long")
    with pytest.raises(openai.BadRequestError, match="does not fit"):
        api.completions.create(model="tiny", prompt=[5] * 9000, max_tokens=2, stream=True)
    with pytest.raises(openai.BadRequestError, match="stream_options.include_usage"):
        api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True,
                                    stream_options={"include_usage": "yes"})
    assert "too-long" not in json.dumps(model_server.health())
