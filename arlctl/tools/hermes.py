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

from arlctl.tools.calls import ParseError, ToolCall
from arlctl.tools.schema import checked_call, decode_call_object

__all__ = ["parse_hermes", "strip_tool_calls", "OPEN_TAG", "CLOSE_TAG"]

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
_TAG_RE = re.compile(r"</?tool_call>")
_FENCE_RE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
_EXAMPLE = '<tool_call>\n{"name": "TOOL_NAME", "arguments": {"ARG": "VALUE"}}\n</tool_call>'

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
    return decode_call_object(payload, _EXAMPLE)


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
        checked = checked_call(ToolCall(name=decoded[0], arguments=decoded[1], id=f"call_{len(calls)}"), raw, tools)
        if isinstance(checked, ParseError):
            errors.append(checked)
        else:
            calls.append(checked)
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
