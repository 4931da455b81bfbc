"""Parser for Mistral tool calls, which follow the `[TOOL_CALLS]` control token.

Two generations of the format exist and both are read:
- v3 (Mistral-7B-Instruct-v0.3, Nemo, Small 3.0): `[TOOL_CALLS]` then one JSON array of call objects,
  `[{"name": ..., "arguments": {...}, "id": "abc123XYZ"}, ...]` (a single bare object is accepted too).
- v11+ (Small 3.1/3.2, Magistral, Devstral): `[TOOL_CALLS]name[ARGS]{...}` per call, the marker repeated for
  each call, optionally `[CALL_ID]id` between the name and `[ARGS]`.
Text before the first `[TOOL_CALLS]` is content; without the marker the turn has no calls. Each
`[TOOL_CALLS]` segment, and each element of a v3 array, is decoded on its own, so one bad call never hides
a good one. Mistral templates refuse call ids that are not 9 alphanumeric characters, so a missing or
unusable id is replaced by one derived from the turn text and the call's position: parsing the same turn
again gives the same ids, which keeps rollouts reproducible from their seed.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from typing import Any

from arlctl.tools.calls import ParseError, ToolCall
from arlctl.tools.schema import checked_call, decode_call_object

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
_EOS = "</s>"
_ID_ALPHABET = string.ascii_letters + string.digits
_ID_RE = re.compile(r"^[A-Za-z0-9]{9}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")
_EXAMPLE = '[TOOL_CALLS][{"name": "TOOL_NAME", "arguments": {"ARG": "VALUE"}}]'
_EXAMPLE_V11 = '[TOOL_CALLS]TOOL_NAME[ARGS]{"ARG": "VALUE"}'


def mistral_call_id(seed: str) -> str:
    """A 9-character alphanumeric id determined by `seed` (the form Mistral templates require)."""
    number = int.from_bytes(hashlib.sha256(seed.encode("utf-8", "surrogatepass")).digest()[:8], "big")
    chars = []
    for _ in range(9):
        number, digit = divmod(number, len(_ID_ALPHABET))
        chars.append(_ID_ALPHABET[digit])
    return "".join(chars)


def _segments(text: str) -> list[str]:
    """What follows each `[TOOL_CALLS]` marker, with a trailing end-of-sequence token removed."""
    body = text.rstrip()
    if body.endswith(_EOS):
        body = body[: -len(_EOS)]
    return body.split(TOOL_CALLS)[1:]


def _json_prefix(text: str) -> tuple[Any, str | json.JSONDecodeError]:
    """(the JSON value the stripped text starts with, the stripped text after it) or (None, the error)."""
    body = text.strip()
    try:
        value, end = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError as exc:
        return None, exc
    return value, body[end:].strip()


def _where(exc: json.JSONDecodeError) -> str:
    return f"{exc.msg} (line {exc.lineno}, column {exc.colno})"


def _decode_array(segment: str) -> list[tuple[Any, str]] | str:
    """The v3 form: (call object, its raw text) per element, or an error message."""
    payload, trailing = _json_prefix(segment)
    if isinstance(trailing, json.JSONDecodeError):
        return (f"invalid JSON after {TOOL_CALLS}: {_where(trailing)}; "
                f"write calls as a JSON array, for example:\n{_EXAMPLE}")
    if trailing:
        return (f"unexpected text after the {TOOL_CALLS} array: {trailing[:40]!r}; "
                f"put every call inside one array, for example:\n{_EXAMPLE}")
    items = payload if isinstance(payload, list) else [payload]
    if not items:
        return f"empty {TOOL_CALLS} array; write calls as:\n{_EXAMPLE}"
    return [(item, json.dumps(item, ensure_ascii=False)) for item in items]


def _decode_named(segment: str) -> tuple[Any, str] | str:
    """The v11+ form `name[CALL_ID]id[ARGS]{...}`: a call object built from it, or an error message."""
    if ARGS not in segment:
        return f"a call after {TOOL_CALLS} needs {ARGS} before its JSON arguments; write calls as:\n{_EXAMPLE_V11}"
    head, args_text = segment.split(ARGS, 1)
    name, _, call_id = head.partition(CALL_ID)
    name = name.strip()
    if not _NAME_RE.match(name):
        return f"a call after {TOOL_CALLS} must start with the tool name, got {name[:40]!r}; write calls as:\n{_EXAMPLE_V11}"
    arguments, trailing = _json_prefix(args_text)
    if isinstance(trailing, json.JSONDecodeError):
        return f"invalid JSON in the arguments of {name!r}: {_where(trailing)}; write calls as:\n{_EXAMPLE_V11}"
    if trailing:
        return (f"unexpected text after the arguments of {name!r}: {trailing[:40]!r}; start each "
                f"further call with {TOOL_CALLS}, for example:\n{_EXAMPLE_V11}{_EXAMPLE_V11}")
    return {"name": name, "arguments": arguments, "id": call_id.strip()}, TOOL_CALLS + segment


def parse_mistral(
    text: str, tools: list[dict[str, Any]] | None = None
) -> tuple[list[ToolCall], list[ParseError]]:
    """Parse one Mistral assistant turn; returns (calls, errors) in order of appearance."""
    calls: list[ToolCall] = []
    errors: list[ParseError] = []
    for number, segment in enumerate(_segments(text)):
        stripped = segment.strip()
        if not stripped:
            errors.append(ParseError(raw=TOOL_CALLS, message=f"{TOOL_CALLS} with no call after it; write calls as:\n{_EXAMPLE}"))
            continue
        decoded = _decode_array(segment) if stripped[0] in "[{" else _decode_named(segment)
        if isinstance(decoded, str):
            errors.append(ParseError(raw=TOOL_CALLS + segment, message=decoded))
            continue
        for position, (payload, raw) in enumerate(decoded if isinstance(decoded, list) else [decoded]):
            named = decode_call_object(payload, _EXAMPLE)
            if isinstance(named, str):
                errors.append(ParseError(raw=raw, message=named))
                continue
            given = payload.get("id")
            call_id = given if isinstance(given, str) and _ID_RE.match(given) else mistral_call_id(f"{text}\0{number}\0{position}")
            checked = checked_call(ToolCall(name=named[0], arguments=named[1], id=call_id), raw, tools)
            if isinstance(checked, ParseError):
                errors.append(checked)
            else:
                calls.append(checked)
    return calls, errors
