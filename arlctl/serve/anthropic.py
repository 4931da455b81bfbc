"""Anthropic's Messages API (POST /v1/messages) on `arlctl serve`, recorded by the same recorder as chat.

A request is checked field by field (a 400 naming the field, in Anthropic's error shape), then mapped to
the chat form the recorder already keeps: `system` becomes the first system message; a user message's
`tool_result` blocks become tool messages (in order) and its text blocks user messages; an assistant
message's text blocks become its content and its `tool_use` blocks its tool calls; `tools` (name,
description, input_schema) become function tools. So a session is identified exactly as for
/v1/chat/completions (the X-Arlctl-Session header, else the open session whose record the conversation
extends), the prompt is rendered once through the chat template, later turns append only the new
messages, and the reply's hermes tool calls come back as `tool_use` blocks (ids `toolu_...`, recorded with
the turn). stop_reason: tool_use when the reply calls a tool, max_tokens when cut, else end_turn.

`stream: true` sends Anthropic's events: message_start as soon as the prompt is tokenized (before
generation), then, once the turn is generated and recorded, content_block_start/delta/stop per block
(text_delta; input_json_delta for tool input), message_delta (stop_reason, output usage), message_stop.
What cannot be honoured is refused, not ignored: non-text content (images, documents), extended thinking,
server tools, tool_choice any/tool. stop_sequences are accepted and ignored, as `stop` is on chat. An
extra `seed` field (arlctl's, as on chat) makes a sample reproducible. POST /v1/messages/count_tokens
answers the rendered prompt's token count (Claude Code asks for it).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from arlctl.errors import UsageError
from arlctl.inference.base import SamplingParams
from arlctl.inference.sampling_check import MAX_NEW_TOKENS, check_int
from arlctl.serve.app import (
    SESSION_HEADER,
    STATE,
    ChatTurn,
    ServeState,
    anthropic_error,
    chat_session,
    chat_turn,
    check_fits,
    read_body,
    reply_pieces,
    stream_done,
    stream_failed,
)
from arlctl.serve.recorder import Session, template_message
from arlctl.serve.sse import EventStream, string_pieces
from arlctl.serve.validation import MAX_STOP, optional_field, sampling_fields

ROLES = ("user", "assistant")


@dataclass(frozen=True)
class MessagesRequest:
    messages: list[dict[str, Any]]  # in chat form (what the recorder keeps)
    tools: list[dict[str, Any]]  # OpenAI function tools
    sampling: SamplingParams
    stream: bool


# ---- the request: checked, then in chat form ----

def messages_request(body: dict[str, Any]) -> MessagesRequest:
    """A checked /v1/messages request, mapped to chat messages and function tools."""
    if body.get("max_tokens") is None:
        raise UsageError("max_tokens is required: the most tokens the reply may have")
    max_tokens = check_int("max_tokens", body["max_tokens"], 1, MAX_NEW_TOKENS)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise UsageError("messages must be a non-empty list of message objects")
    chat = _system(body.get("system"))
    for index, message in enumerate(messages):
        chat.extend(_message(f"messages[{index}]", message))
    tools = [_tool(f"tools[{index}]", tool) for index, tool in enumerate(optional_field(body, "tools", list) or [])]
    _tool_choice(optional_field(body, "tool_choice", dict))
    stops = optional_field(body, "stop_sequences", list)
    if stops is not None and (len(stops) > MAX_STOP or not all(isinstance(s, str) for s in stops)):
        raise UsageError(f"stop_sequences must be a list of at most {MAX_STOP} strings")
    optional_field(body, "metadata", dict)
    thinking = optional_field(body, "thinking", dict)
    if thinking and thinking.get("type") != "disabled":
        raise UsageError("thinking is not supported by arlctl serve (only {'type': 'disabled'})")
    stream = bool(optional_field(body, "stream", bool))
    # `seed` is arlctl's (not Anthropic's): a reproducible sample, as on /v1/chat/completions
    openai_names = {k: body[k] for k in ("temperature", "top_p", "top_k", "model", "seed") if k in body}
    sampling = sampling_fields(openai_names, max_tokens)
    return MessagesRequest(chat, tools, sampling, stream)


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    if isinstance(system, list):
        text = "".join(_text_block(f"system[{index}]", block) for index, block in enumerate(system))
        return [{"role": "system", "content": text}] if text else []
    raise UsageError(f"system must be a string or a list of text blocks, got {type(system).__name__}")


def _message(where: str, message: Any) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages (a user message with tool results becomes several)."""
    if not isinstance(message, dict):
        raise UsageError(f"{where} must be an object with a role and content, got {type(message).__name__}")
    role = message.get("role")
    if role not in ROLES:
        raise UsageError(f"{where}.role must be user or assistant, got {role!r:.40}")
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list) or not content:
        raise UsageError(f"{where}.content must be a string or a non-empty list of content blocks")
    if role == "assistant":
        return [_assistant(where, content)]
    out: list[dict[str, Any]] = []
    for index, block in enumerate(content):
        at = f"{where}.content[{index}]"
        if isinstance(block, dict) and block.get("type") == "tool_result":
            out.append(_tool_result(at, block))
        elif out and out[-1]["role"] == "user":
            out[-1]["content"] += _text_block(at, block)
        else:
            out.append({"role": "user", "content": _text_block(at, block)})
    return out


def _assistant(where: str, content: list[Any]) -> dict[str, Any]:
    text, calls = [], []
    for index, block in enumerate(content):
        at = f"{where}.content[{index}]"
        if isinstance(block, dict) and block.get("type") == "tool_use":
            for name, kind in (("id", str), ("name", str), ("input", dict)):
                if not isinstance(block.get(name), kind):
                    raise UsageError(f"{at}.{name} must be {'an object' if kind is dict else 'a string'}")
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": json.dumps(block["input"])}})
        else:
            text.append(_text_block(at, block))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_result(where: str, block: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(block.get("tool_use_id"), str):
        raise UsageError(f"{where}.tool_use_id must be a string")
    optional_field(block, "is_error", bool, where)
    content = block.get("content")
    if content is None or isinstance(content, str):
        text = content or ""
    elif isinstance(content, list):
        text = "".join(_text_block(f"{where}.content[{index}]", part) for index, part in enumerate(content))
    else:
        raise UsageError(f"{where}.content must be a string or a list of text blocks")
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}


def _text_block(where: str, block: Any) -> str:
    if not isinstance(block, dict) or block.get("type") != "text":
        kind = block.get("type") if isinstance(block, dict) else type(block).__name__
        raise UsageError(f"{where} must be a text block {{'type': 'text', 'text': ...}}, got {kind!r:.40} "
                         "(only text, tool_use and tool_result blocks are supported)")
    if not isinstance(block.get("text"), str):
        raise UsageError(f"{where}.text must be a string")
    return block["text"]


def _tool(where: str, tool: Any) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise UsageError(f"{where} must be an object with a name and an input_schema")
    if tool.get("type") not in (None, "custom"):
        raise UsageError(f"{where}.type {tool['type']!r:.40} is not supported (server tools run at Anthropic); "
                         "only custom tools with an input_schema")
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise UsageError(f"{where}.name must be a non-empty string")
    schema = tool.get("input_schema")
    if not isinstance(schema, dict):
        raise UsageError(f"{where}.input_schema must be an object (a JSON schema)")
    function: dict[str, Any] = {"name": name}  # in OpenAI's key order: tools render into the prompt as JSON
    if optional_field(tool, "description", str, where):
        function["description"] = tool["description"]
    function["parameters"] = schema
    return {"type": "function", "function": function}


def _tool_choice(choice: dict[str, Any] | None) -> None:
    if choice is not None and choice.get("type") not in ("auto", "none"):
        raise UsageError(f"tool_choice.type {choice.get('type')!r:.40} is not supported by arlctl serve "
                         "(only auto or none: the model decides)")


# ---- the reply ----

def _stop_reason(turn: ChatTurn) -> str:
    if turn.tool_calls:
        return "tool_use"
    return "max_tokens" if turn.gen.finish_reason == "length" else "end_turn"


def content_blocks(turn: ChatTurn) -> list[dict[str, Any]]:
    """The reply as Anthropic content blocks: its text (when there is any, or nothing else), then its calls."""
    blocks: list[dict[str, Any]] = []
    if turn.content or not turn.tool_calls:
        blocks.append({"type": "text", "text": turn.content or ""})
    for call in turn.tool_calls:
        blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                       "input": json.loads(call["function"]["arguments"])})
    return blocks


def _extension(session_id: str, turn: ChatTurn) -> dict[str, Any]:
    return {"session": session_id, "policy_version": turn.gen.version, "token_ids": turn.gen.ids}


def _tool_use_id(_index: int) -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


async def messages(request: web.Request) -> web.StreamResponse:
    state: ServeState = request.app[STATE]
    body = await read_body(request, state)
    req = messages_request(body)
    session = await chat_session(state, request, req.messages, req.tools)
    head = {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
            "model": state.policy.name}
    if req.stream:
        return await _stream(request, state, session, req, head)
    turn = await chat_turn(state, session, req.messages, req.tools, req.sampling, call_id=_tool_use_id)
    payload = {**head, "content": content_blocks(turn), "stop_reason": _stop_reason(turn), "stop_sequence": None,
               "usage": {"input_tokens": len(turn.ids), "output_tokens": len(turn.gen.ids)},
               "arlctl": _extension(session.id, turn)}
    return web.json_response(payload, headers={SESSION_HEADER: session.id})


async def count_tokens(request: web.Request) -> web.Response:
    """POST /v1/messages/count_tokens: the prompt's token count as this server would render it (nothing is
    recorded; a session's later turns cost only their new messages, which this does not know about)."""
    state: ServeState = request.app[STATE]
    body = await read_body(request, state)
    req = messages_request({"max_tokens": 1, **body})
    segment = await state.offload(state.codec.prompt, [template_message(m) for m in req.messages], req.tools)
    return web.json_response({"input_tokens": len(segment.ids)})


def _error_event(status: int, kind: str, message: str) -> tuple[str | None, dict[str, Any]]:
    return "error", anthropic_error(kind, message)


async def _stream(request: web.Request, state: ServeState, session: Session, req: MessagesRequest,
                  head: dict[str, Any]) -> web.StreamResponse:
    session_id = session.id
    stream = EventStream(request, {SESSION_HEADER: session_id})

    async def opened(ids: list[int]) -> None:
        check_fits(state, ids)
        await stream.open()
        start = {**head, "content": [], "stop_reason": None, "stop_sequence": None,
                 "usage": {"input_tokens": len(ids), "output_tokens": 0}}
        await stream.send({"type": "message_start", "message": start}, "message_start")

    try:
        turn = await chat_turn(state, session, req.messages, req.tools, req.sampling, opened, _tool_use_id)
    except Exception as err:
        if not stream.opened:
            raise
        return await stream_failed(state, stream, err, _error_event)
    for index, block in enumerate(content_blocks(turn)):
        if block["type"] == "text":
            parts = [("text_delta", "text", piece) for piece in reply_pieces(state, turn)]
            start = {"type": "text", "text": ""}
        else:
            parts = [("input_json_delta", "partial_json", piece) for piece in string_pieces(json.dumps(block["input"]), 64)]
            start = {**block, "input": {}}
        await stream.send({"type": "content_block_start", "index": index, "content_block": start},
                          "content_block_start")
        for kind, field, piece in parts:
            await stream.send({"type": "content_block_delta", "index": index, "delta": {"type": kind, field: piece}},
                              "content_block_delta")
        await stream.send({"type": "content_block_stop", "index": index}, "content_block_stop")
    await stream.send({"type": "message_delta", "delta": {"stop_reason": _stop_reason(turn), "stop_sequence": None},
                       "usage": {"output_tokens": len(turn.gen.ids)}, "arlctl": _extension(session_id, turn)},
                      "message_delta")
    await stream.send({"type": "message_stop"}, "message_stop")
    return await stream_done(state, stream)
