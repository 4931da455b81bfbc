"""Parser for hermes-style tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

This is the convention of Qwen2.5/Qwen3, Hermes and most open chat templates. A turn may hold several
blocks. Every block becomes either a ToolCall or a ParseError; one bad block never hides the good ones.
A ParseError's message is written for the model: it becomes an error observation in the next turn
(DESIGN.md §6), so it says what was wrong and what a correct call looks like.

Tolerated: whitespace and newlines around the JSON, a ```json fence inside the block, `arguments`
given as a JSON-encoded string, and `parameters` as a synonym of `arguments` (Llama 3 style).
Refused: malformed JSON, a block without a JSON object, text after the object, a missing `name`,
an opening `<tool_call>` never closed before the end of the turn, a `</tool_call>` with no opening tag.
With tool schemas given (OpenAI function format), the name must be a known tool, required arguments must
be present, and arguments must have the declared JSON types.
"""

from __future__ import annotations

import json
import re
from typing import Any

from arlctl.envs.base import ParseError, ToolCall

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
_TAG_RE = re.compile(r"</?tool_call>")
_FENCE_RE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
_EXAMPLE = '<tool_call>\n{"name": "TOOL_NAME", "arguments": {"ARG": "VALUE"}}\n</tool_call>'

# JSON-schema type name -> Python types accepted for it (bool is not a number, though it is an int).
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def tool_function(tool: dict[str, Any]) -> dict[str, Any]:
    """The function part of an OpenAI tool schema; accepts the wrapped and the bare form."""
    return tool["function"] if tool.get("type") == "function" and "function" in tool else tool


def tool_names(tools: list[dict[str, Any]]) -> list[str]:
    return [tool_function(tool)["name"] for tool in tools]


def _block_spans(text: str) -> tuple[list[tuple[int, int, str]], list[ParseError]]:
    """Pair open and close tags in order; return (start, end, inner text) per block and tag errors."""
    blocks: list[tuple[int, int, str]] = []
    errors: list[ParseError] = []
    open_at: int | None = None
    for match in _TAG_RE.finditer(text):
        if match.group() == OPEN_TAG:
            if open_at is not None:
                # Two openings in a row: the first block is never closed.
                errors.append(
                    ParseError(
                        raw=text[open_at : match.start()],
                        message=f"a {OPEN_TAG} was not closed before the next {OPEN_TAG}; "
                        f"close each call with {CLOSE_TAG}",
                    )
                )
            open_at = match.start()
        elif open_at is None:
            errors.append(
                ParseError(
                    raw=text[max(0, match.start() - 200) : match.end()],
                    message=f"found {CLOSE_TAG} without a matching {OPEN_TAG}; write calls as:\n{_EXAMPLE}",
                )
            )
        else:
            blocks.append((open_at, match.end(), text[open_at + len(OPEN_TAG) : match.start()]))
            open_at = None
    if open_at is not None:
        errors.append(
            ParseError(
                raw=text[open_at:],
                message=f"unclosed {OPEN_TAG} at the end of the turn; end each call with {CLOSE_TAG}",
            )
        )
    return blocks, errors


def _decode_block(inner: str) -> tuple[str, dict[str, Any]] | str:
    """Decode one block's JSON into (name, arguments), or return an error message."""
    body = inner.strip()
    fenced = _FENCE_RE.match(body)
    if fenced:
        body = fenced.group(1)
    if not body:
        return f"empty {OPEN_TAG} block; write calls as:\n{_EXAMPLE}"
    try:
        payload, end = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError as exc:
        return f"invalid JSON in tool call: {exc.msg} (line {exc.lineno}, column {exc.colno}); write calls as:\n{_EXAMPLE}"
    if body[end:].strip():
        return f"unexpected text after the JSON object in tool call: {body[end:].strip()[:40]!r}"
    if not isinstance(payload, dict):
        return f'a tool call must be a JSON object with "name" and "arguments", got {type(payload).__name__}'
    name = payload.get("name")
    if not isinstance(name, str) or not name.strip():
        return f'a tool call needs a "name" string; write calls as:\n{_EXAMPLE}'
    arguments: Any = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):
        # Some templates (and OpenAI's own wire format) encode arguments as a JSON string.
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return f'the "arguments" string of {name!r} is not valid JSON: {exc.msg}'
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return f'"arguments" of {name!r} must be a JSON object, got {type(arguments).__name__}'
    return name.strip(), arguments


def validate_call(call: ToolCall, tools: list[dict[str, Any]]) -> str | None:
    """Check a call against OpenAI function schemas; return an error message or None if it is valid."""
    by_name = {tool_function(tool)["name"]: tool_function(tool) for tool in tools}
    if call.name not in by_name:
        known = ", ".join(sorted(by_name)) or "(none)"
        return f"unknown tool {call.name!r}; available tools: {known}"
    parameters = by_name[call.name].get("parameters") or {}
    properties: dict[str, Any] = parameters.get("properties") or {}
    missing = [arg for arg in parameters.get("required", []) if arg not in call.arguments]
    if missing:
        return f"tool {call.name!r} is missing required argument(s): {', '.join(missing)}"
    if parameters.get("additionalProperties") is False:
        extra = sorted(set(call.arguments) - set(properties))
        if extra:
            return f"tool {call.name!r} got unknown argument(s): {', '.join(extra)}; allowed: {', '.join(properties)}"
    for arg, value in call.arguments.items():
        declared = (properties.get(arg) or {}).get("type")
        if declared is None:
            continue
        allowed_names = declared if isinstance(declared, list) else [declared]
        allowed = tuple(t for name in allowed_names for t in _JSON_TYPES.get(name, (object,)))
        if isinstance(value, bool) and bool not in allowed:
            allowed = ()  # True is an int in Python, not an integer in JSON
        if not isinstance(value, allowed):
            return f"argument {arg!r} of tool {call.name!r} must be of type {'/'.join(allowed_names)}, got {type(value).__name__}"
    return None


def parse_hermes(
    text: str, tools: list[dict[str, Any]] | None = None
) -> tuple[list[ToolCall], list[ParseError]]:
    """Parse every <tool_call> block in one assistant turn.

    Returns the calls in order of appearance (ids `call_0`, `call_1`, ... within the turn) and one
    ParseError per block or tag that could not be used. With `tools`, calls are also validated.
    """
    blocks, errors = _block_spans(text)
    calls: list[ToolCall] = []
    for _start, _end, inner in blocks:
        raw = OPEN_TAG + inner + CLOSE_TAG
        decoded = _decode_block(inner)
        if isinstance(decoded, str):
            errors.append(ParseError(raw=raw, message=decoded))
            continue
        call = ToolCall(name=decoded[0], arguments=decoded[1], id=f"call_{len(calls)}")
        problem = validate_call(call, tools) if tools is not None else None
        if problem is not None:
            errors.append(ParseError(raw=raw, message=problem))
            continue
        calls.append(call)
    return calls, errors


def strip_tool_calls(text: str) -> str:
    """The turn's text with every closed <tool_call> block (and a trailing unclosed one) removed."""
    blocks, _errors = _block_spans(text)
    pieces: list[str] = []
    cursor = 0
    for start, end, _inner in blocks:
        pieces.append(text[cursor:start])
        cursor = end
    rest = text[cursor:]
    unclosed = rest.find(OPEN_TAG)
    pieces.append(rest if unclosed < 0 else rest[:unclosed])
    return "".join(pieces)
