"""How tools reach the model and how their results come back, as chat messages.

Chat templates that accept `tools=` (Qwen, Llama 3.1, Hermes) render schemas themselves; for the rest
(SmolLM2's template among them) `tools_system_prompt` describes the tools in the system message with the
hermes calling convention that `arlctl.tools.hermes.parse_hermes` reads back. Results go back as
role "tool" messages carrying the tool name and the call id, the OpenAI chat format.
"""

from __future__ import annotations

import json
from typing import Any

from arlctl.tools.calls import ParseError, ToolCall
from arlctl.tools.hermes import CLOSE_TAG, OPEN_TAG
from arlctl.tools.schema import tool_function


def _example_arguments(function: dict[str, Any]) -> dict[str, Any]:
    """Placeholder arguments for the example call, built from the schema's required parameters."""
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties") or {}
    placeholders = {"string": "...", "integer": 1, "number": 1.0, "boolean": True, "array": [], "object": {}}
    names = parameters.get("required") or list(properties)[:1]
    example: dict[str, Any] = {}
    for name in names:
        spec = properties.get(name) or {}
        # JSON Schema's own "examples" keyword gives a realistic value; a placeholder otherwise.
        examples = spec.get("examples")
        example[name] = examples[0] if examples else placeholders.get(spec.get("type", "string"), "...")
    return example


def tools_system_prompt(tools: list[dict[str, Any]]) -> str:
    """A system-prompt section that lists the tools (OpenAI function schemas) and how to call them."""
    if not tools:
        return ""
    lines = [
        "# Tools",
        "",
        "You can call the following tools. Their signatures are JSON schemas inside <tools></tools>:",
        "<tools>",
    ]
    lines += [json.dumps(tool, ensure_ascii=False, sort_keys=False) for tool in tools]
    lines += [
        "</tools>",
        "",
        "To call a tool, write a JSON object with its name and arguments wrapped in tool_call tags,",
        "exactly as in this example. You may make several calls in one reply; the results come back",
        "in the next message.",
    ]
    first = tool_function(tools[0])
    example = {"name": first["name"], "arguments": _example_arguments(first)}
    lines += [OPEN_TAG, json.dumps(example, ensure_ascii=False), CLOSE_TAG]
    return "\n".join(lines)


def assistant_tool_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """The `tool_calls` field of an assistant message in OpenAI format (arguments as a JSON string)."""
    return [
        {
            "id": call.id or f"call_{index}",
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
        }
        for index, call in enumerate(calls)
    ]


def format_tool_result(call: ToolCall, content: str) -> dict[str, Any]:
    """A role "tool" message answering one call."""
    message: dict[str, Any] = {"role": "tool", "name": call.name, "content": content}
    if call.id is not None:
        message["tool_call_id"] = call.id
    return message


def format_parse_error(error: ParseError, max_raw_chars: int = 300) -> dict[str, Any]:
    """A role "tool" message telling the model its call could not be parsed, quoting what it wrote."""
    raw = error.raw if len(error.raw) <= max_raw_chars else error.raw[:max_raw_chars] + "..."
    content = f"error: {error.message}"
    if raw.strip():
        content += f"\nyour call was: {raw.strip()}"
    return {"role": "tool", "name": "parse_error", "content": content}


def with_tools_in_system(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of `messages` whose system message also describes `tools` (for templates without tools=)."""
    section = tools_system_prompt(tools)
    if not section:
        return [dict(message) for message in messages]
    copied = [dict(message) for message in messages]
    if copied and copied[0].get("role") == "system":
        copied[0]["content"] = f"{copied[0]['content']}\n\n{section}"
    else:
        copied.insert(0, {"role": "system", "content": section})
    return copied


def template_renders_tools(tokenizer: Any) -> bool:
    """True if the tokenizer's chat template shows `tools=` to the model.

    Templates that do not use the variable (SmolLM2's among them) ignore it silently, so we render one
    probe conversation with and without a tool and compare, rather than trusting a flag.
    """
    probe = [{"role": "user", "content": "hi"}]
    tool = {"type": "function", "function": {"name": "arlctl_probe_tool", "parameters": {"type": "object"}}}
    try:
        plain = tokenizer.apply_chat_template(probe, tokenize=False)
        with_tools = tokenizer.apply_chat_template(probe, tools=[tool], tokenize=False)
    except Exception:  # a template that fails on tools= cannot be given tools that way
        return False
    return plain != with_tools and "arlctl_probe_tool" in with_tools
