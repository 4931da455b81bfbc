"""What every tool-call parser shares once a call's JSON is decoded: reading `name` and `arguments` out of
the object, and checking the call against the tools' OpenAI function schemas.

The parsers differ only in how calls are delimited in the turn (hermes tags, Llama-3 bare JSON, Mistral
`[TOOL_CALLS]`); from the decoded object on, the rules and the messages the model sees are the same, so a
model gets the same feedback whichever family it belongs to.
"""

from __future__ import annotations

import json
from typing import Any

from arlctl.tools.calls import ParseError, ToolCall

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


def decode_call_object(payload: Any, example: str, args_key: str = "arguments") -> tuple[str, dict[str, Any]] | str:
    """(name, arguments) from one decoded call object, or an error message for the model.

    `arguments` and `parameters` are synonyms (Llama 3 writes the latter); either may be a JSON-encoded
    string, as OpenAI's wire format and several templates render it. `example` is a correct call in the
    family's own format, quoted when the model got the shape wrong; `args_key` is the key the family's
    prompt teaches, used in the messages.
    """
    if not isinstance(payload, dict):
        return f'a tool call must be a JSON object with "name" and "{args_key}", got {type(payload).__name__}'
    name = payload.get("name")
    if not isinstance(name, str) or not name.strip():
        return f'a tool call needs a "name" string; write calls as:\n{example}'
    arguments: Any = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return f'the "{args_key}" string of {name!r} is not valid JSON: {exc.msg}'
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return f'"{args_key}" of {name!r} must be a JSON object, got {type(arguments).__name__}'
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


def checked_call(call: ToolCall, raw: str, tools: list[dict[str, Any]] | None) -> ToolCall | ParseError:
    """The call itself when it is valid (or no schemas were given), else a ParseError quoting `raw`."""
    problem = validate_call(call, tools) if tools is not None else None
    return call if problem is None else ParseError(raw=raw, message=problem)
