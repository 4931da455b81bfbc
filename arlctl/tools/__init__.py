"""Tool-call parsers (hermes `<tool_call>` JSON, Llama-3 JSON, Mistral `[TOOL_CALLS]`, fenced bash blocks),
the choice of parser for a chat template, and tool message rendering."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from arlctl.tools.bash_blocks import parse_bash_blocks
from arlctl.tools.calls import ParseError, ToolCall
from arlctl.tools.hermes import parse_hermes
from arlctl.tools.llama3_json import parse_llama3_json
from arlctl.tools.mistral import parse_mistral

Parser = Callable[..., tuple[list[ToolCall], list[ParseError]]]

# Name -> parser; `--tool-format` values. Each takes (text, tools) and returns (calls, errors).
PARSERS: dict[str, Parser] = {
    "hermes": parse_hermes,
    "llama3-json": parse_llama3_json,
    "mistral": parse_mistral,
    "bash": lambda text, tools=None: parse_bash_blocks(text),
}

# The formats that read JSON tool calls and check them against the tools' schemas ("bash" reads neither).
TOOL_CALL_FORMATS = ("hermes", "llama3-json", "mistral")


def parser_for_template(chat_template: str | None) -> str:
    """The tool-call format a chat template teaches its model, judged from the template text.

    Mistral templates render calls after `[TOOL_CALLS]`; Llama-3 templates frame every message with
    `<|start_header_id|>` and take JSON calls; anything else (ChatML, Qwen, Hermes, no template) gets hermes,
    the most common convention. Mistral is tested first: a template naming both is a Mistral one.
    """
    text = chat_template or ""
    if "[TOOL_CALLS]" in text:
        return "mistral"
    if "<|start_header_id|>" in text:
        return "llama3-json"
    return "hermes"


def get_parser(name: str) -> Parser:
    from arlctl.errors import UsageError

    if name not in PARSERS:
        raise UsageError(f"unknown tool-call format {name!r}", hint=f"choose one of: {', '.join(PARSERS)}")
    return PARSERS[name]


def parse_tool_calls(text: str, fmt: str = "hermes", tools: list[dict[str, Any]] | None = None):
    """Parse one assistant turn in the named format; returns (calls, errors)."""
    return get_parser(fmt)(text, tools)
