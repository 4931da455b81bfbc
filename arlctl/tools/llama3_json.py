"""Parser for Llama 3.1/3.2 JSON tool calls: the whole assistant turn is the call.

With custom (JSON) tools, Llama 3.x answers a tool-using turn with nothing but a JSON object
`{"name": ..., "parameters": {...}}`, sometimes after the `<|python_tag|>` token, and several calls as
objects separated by `;` or newlines. A turn that does not open with `{` or the tag (after whitespace) is
ordinary content: no calls and no errors, because Llama has no other marker that says "this was meant to
be a call". The tag is such a marker: a tagged turn that is not JSON (Llama's built-in code interpreter,
`<|python_tag|>print(1)`) calls a tool no arlctl env offers, so it is a ParseError that says so, never
an answer. A turn that does open with `{` was meant as a call, so anything wrong in it (malformed JSON, no
name, text after the calls) is a ParseError the model sees, with a correct example in this format.

Tolerated: `arguments` as a synonym of `parameters`, either given as a JSON-encoded string, and an end-of-turn
token (`<|eot_id|>`, `<|eom_id|>`) left at the end of the text. Calls are checked against the tool schemas
by the same rules as every other family (arlctl.tools.schema).
"""

from __future__ import annotations

import json
import re
from typing import Any

from arlctl.tools.calls import ParseError, ToolCall
from arlctl.tools.schema import checked_call, decode_call_object

PYTHON_TAG = "<|python_tag|>"
_END_TOKENS = ("<|eot_id|>", "<|eom_id|>")
_EXAMPLE = '{"name": "TOOL_NAME", "parameters": {"ARG": "VALUE"}}'
_EXAMPLE_SEVERAL = f"{_EXAMPLE}; {_EXAMPLE}"
# Where the next call may start after a malformed one: a `;` or a newline, then `{`.
_NEXT_CALL_RE = re.compile(r"[;\n]\s*(?=\{)")
_SEPARATORS = " \t\r\n;"


def _call_body(text: str) -> tuple[str, int] | None:
    """The part of the turn that holds the calls and its offset in `text`, or None for plain content."""
    body = text
    for token in _END_TOKENS:
        if body.rstrip().endswith(token):
            body = body.rstrip()[: -len(token)]
    start = len(body) - len(body.lstrip())
    tagged = body.startswith(PYTHON_TAG, start)
    if tagged:
        start += len(PYTHON_TAG)
        start += len(body[start:]) - len(body[start:].lstrip())
    if not body.startswith("{", start) and not tagged:
        return None
    return body, start


def _skip_separators(body: str, pos: int) -> int:
    while pos < len(body) and body[pos] in _SEPARATORS:
        pos += 1
    return pos


def _malformed(body: str, pos: int, exc: json.JSONDecodeError) -> tuple[ParseError, int]:
    """The error for a call whose JSON does not parse, and where to look for the next call."""
    resume = _NEXT_CALL_RE.search(body, max(exc.pos, pos + 1))
    end = resume.start() if resume else len(body)
    message = (
        f"invalid JSON in tool call: {exc.msg} (line {exc.lineno}, column {exc.colno}); "
        f"reply with only the JSON call(s), several separated by ';', for example:\n{_EXAMPLE_SEVERAL}"
    )
    return ParseError(raw=body[pos:end], message=message), end


def parse_llama3_json(
    text: str, tools: list[dict[str, Any]] | None = None
) -> tuple[list[ToolCall], list[ParseError]]:
    """Parse one Llama-3 assistant turn; returns (calls, errors).

    Calls get ids `call_0`, `call_1`, ... in order of appearance. A malformed call does not hide the calls
    after it when a `;` or newline followed by `{` shows where the next one starts.
    """
    found = _call_body(text)
    if found is None:
        return [], []
    body, pos = found
    calls: list[ToolCall] = []
    errors: list[ParseError] = []
    if pos == len(body):  # the tag and nothing after it
        return [], [ParseError(raw=body, message=f"<|python_tag|> with no tool call after it; for example:\n{_EXAMPLE}")]
    decoder = json.JSONDecoder()
    while pos < len(body):
        if body[pos] != "{" and not calls and not errors:  # right after the tag: built-in tool code
            errors.append(ParseError(
                raw=body[pos:],
                message="<|python_tag|> must be followed by JSON tool calls: built-in tools (the code interpreter) "
                f"are not available here; call one of the listed tools, for example:\n{_EXAMPLE}",
            ))
            break
        if body[pos] != "{":
            errors.append(ParseError(
                raw=body[pos:],
                message=f"unexpected text after the tool call(s): {body[pos:].strip()[:40]!r}; a reply that "
                f"calls tools must hold only the JSON calls, separated by ';', for example:\n{_EXAMPLE_SEVERAL}",
            ))
            break
        try:
            payload, end = decoder.raw_decode(body, pos)
        except json.JSONDecodeError as exc:
            error, pos = _malformed(body, pos, exc)
            errors.append(error)
            pos = _skip_separators(body, pos)
            continue
        raw = body[pos:end]
        decoded = decode_call_object(payload, _EXAMPLE, args_key="parameters")
        if isinstance(decoded, str):
            errors.append(ParseError(raw=raw, message=decoded))
        else:
            checked = checked_call(ToolCall(name=decoded[0], arguments=decoded[1], id=f"call_{len(calls)}"), raw, tools)
            if isinstance(checked, ParseError):
                errors.append(checked)
            else:
                calls.append(checked)
        pos = _skip_separators(body, end)
    return calls, errors
