"""Tests of tool rendering: the system-prompt description round-trips through the hermes parser."""

from __future__ import annotations

import json
import re

from arlctl.envs.math import CALCULATOR_TOOL
from arlctl.tools.calls import ParseError, ToolCall
from arlctl.tools.hermes import parse_hermes
from arlctl.tools.render import (
    assistant_tool_calls,
    format_parse_error,
    format_tool_result,
    tools_system_prompt,
)


def test_system_prompt_lists_schemas_and_its_example_parses():
    prompt = tools_system_prompt([CALCULATOR_TOOL])
    listed = re.search(r"<tools>\n(.*)\n</tools>", prompt, re.DOTALL).group(1)
    assert [json.loads(line) for line in listed.splitlines()] == [CALCULATOR_TOOL]
    # The example in the prompt must itself be a valid call, or we would teach the model a wrong format.
    calls, errors = parse_hermes(prompt, [CALCULATOR_TOOL])
    assert errors == []
    assert calls[0].name == "calculator" and set(calls[0].arguments) == {"expression"}


def test_empty_tool_list_gives_empty_prompt():
    assert tools_system_prompt([]) == ""


def test_tool_messages():
    call = ToolCall(name="calculator", arguments={"expression": "1+1"}, id="call_3")
    assert format_tool_result(call, "2") == {
        "role": "tool",
        "name": "calculator",
        "content": "2",
        "tool_call_id": "call_3",
    }
    assert assistant_tool_calls([call]) == [
        {
            "id": "call_3",
            "type": "function",
            "function": {"name": "calculator", "arguments": '{"expression": "1+1"}'},
        }
    ]
    message = format_parse_error(ParseError(raw="<tool_call>{bad</tool_call>", message="invalid JSON"))
    assert message["role"] == "tool"
    assert message["content"] == "error: invalid JSON\nyour call was: <tool_call>{bad</tool_call>"


def test_example_uses_schema_examples():
    prompt = tools_system_prompt([CALCULATOR_TOOL])
    assert '{"name": "calculator", "arguments": {"expression": "(12 + 7) * 3 / 4"}}' in prompt


def test_with_tools_in_system_appends_or_inserts():
    from arlctl.tools.render import with_tools_in_system

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}]
    merged = with_tools_in_system(messages, [CALCULATOR_TOOL])
    assert merged[0]["content"].startswith("Be brief.\n\n# Tools\n")
    assert merged[1] == messages[1]
    assert messages[0]["content"] == "Be brief."  # the input is not modified
    inserted = with_tools_in_system(messages[1:], [CALCULATOR_TOOL])
    assert inserted[0]["role"] == "system" and inserted[1] == messages[1]
    assert with_tools_in_system(messages, []) == messages


def _tokenizer_with_template(template: str):
    """A real transformers fast tokenizer (word-level, built locally) carrying the given chat template."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    tokenizer.chat_template = template
    return tokenizer


def test_template_renders_tools_detects_support():
    from arlctl.tools.render import template_renders_tools

    ignores = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    uses = "{% if tools %}<tools>{{ tools | tojson }}</tools>\n{% endif %}" + ignores
    assert template_renders_tools(_tokenizer_with_template(ignores)) is False
    assert template_renders_tools(_tokenizer_with_template(uses)) is True
