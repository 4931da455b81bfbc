"""Tests of the hermes <tool_call> parser: valid calls, several calls, and every malformed shape."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tool_schemas import TOOLS

from arlctl.tools.hermes import parse_hermes, strip_tool_calls


def test_single_valid_call():
    text = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
    calls, errors = parse_hermes(text, TOOLS)
    assert errors == []
    assert [(c.name, c.arguments, c.id) for c in calls] == [("calculator", {"expression": "2+3"}, "call_0")]


def test_several_calls_keep_order_and_ids():
    text = (
        '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call> and '
        '<tool_call>  {"name":"lookup","arguments":{"key":"x","limit":3}}  </tool_call>\n'
        '<tool_call>\n\n{"name": "calculator",\n "arguments": {"expression": "9*9"}}\n\n</tool_call>'
    )
    calls, errors = parse_hermes(text, TOOLS)
    assert errors == []
    assert [c.name for c in calls] == ["calculator", "lookup", "calculator"]
    assert [c.id for c in calls] == ["call_0", "call_1", "call_2"]
    assert calls[1].arguments == {"key": "x", "limit": 3}
    assert calls[2].arguments == {"expression": "9*9"}


def test_arguments_as_json_string():
    text = '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"7/2\\"}"}</tool_call>'
    calls, errors = parse_hermes(text, TOOLS)
    assert errors == []
    assert calls[0].arguments == {"expression": "7/2"}


def test_parameters_synonym_and_json_fence():
    text = (
        '<tool_call>\n```json\n{"name": "calculator", "parameters": {"expression": "1"}}\n```\n</tool_call>'
    )
    calls, errors = parse_hermes(text, TOOLS)
    assert errors == []
    assert calls[0].arguments == {"expression": "1"}


def test_malformed_json_is_a_parse_error_and_good_calls_survive():
    text = (
        '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"</tool_call>'
        '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>'
    )
    calls, errors = parse_hermes(text, TOOLS)
    assert [c.arguments["expression"] for c in calls] == ["2+2"]
    assert len(errors) == 1
    assert "invalid JSON" in errors[0].message
    assert '"1+1"' in errors[0].raw


def test_text_after_the_object_is_an_error():
    text = '<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}}</tool_call>'
    calls, errors = parse_hermes(text, TOOLS)
    assert calls == []
    assert "unexpected text after the JSON object" in errors[0].message


def test_unknown_tool_lists_known_tools():
    calls, errors = parse_hermes(
        '<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>', TOOLS
    )
    assert calls == []
    assert errors[0].message == "unknown tool 'python'; available tools: calculator, lookup"


def test_unknown_tool_is_accepted_without_schemas():
    calls, errors = parse_hermes('<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>')
    assert errors == []
    assert calls[0].name == "python"


def test_missing_required_argument():
    calls, errors = parse_hermes(
        '<tool_call>{"name": "lookup", "arguments": {"limit": 2}}</tool_call>', TOOLS
    )
    assert calls == []
    assert errors[0].message == "tool 'lookup' is missing required argument(s): key"


def test_wrong_argument_type():
    text = '<tool_call>{"name": "calculator", "arguments": {"expression": 5}}</tool_call>'
    calls, errors = parse_hermes(text, TOOLS)
    assert calls == []
    assert "must be of type string, got int" in errors[0].message
    # JSON true is not an integer even though Python's bool is an int
    text = '<tool_call>{"name": "lookup", "arguments": {"key": "k", "limit": true}}</tool_call>'
    assert "must be of type integer, got bool" in parse_hermes(text, TOOLS)[1][0].message


def test_missing_name_and_non_object():
    _, errors = parse_hermes('<tool_call>{"arguments": {}}</tool_call><tool_call>[1, 2]</tool_call>', TOOLS)
    assert len(errors) == 2
    assert 'needs a "name"' in errors[0].message
    assert "must be a JSON object" in errors[1].message


def test_unclosed_tag_at_end_of_turn():
    text = '<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}</tool_call>\n<tool_call>{"name": "calc'
    calls, errors = parse_hermes(text, TOOLS)
    assert len(calls) == 1  # the closed one still counts
    assert len(errors) == 1
    assert "unclosed <tool_call>" in errors[0].message
    assert errors[0].raw.startswith('<tool_call>{"name": "calc')


def test_stray_close_tag_and_empty_block():
    _, errors = parse_hermes('{"name": "calculator"}</tool_call> <tool_call>  </tool_call>', TOOLS)
    assert len(errors) == 2
    assert "without a matching <tool_call>" in errors[0].message
    assert "empty <tool_call> block" in errors[1].message


def test_no_calls_no_errors():
    assert parse_hermes("The answer is <answer>4</answer>", TOOLS) == ([], [])


def test_strip_tool_calls_removes_blocks_only():
    text = 'a <tool_call>{"name": "x"}</tool_call> b <tool_call>{"unclosed'
    assert strip_tool_calls(text) == "a  b "


_PIECES = ["<tool_call>", "</tool_call>", "{", "}", '"name"', ":", '"calculator"', ",", '"arguments"',
           '{"expression": "1"}', "[", "]", " ", "\n", "a", '"{}"']  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=40).map("".join))
def test_parser_never_raises_and_accounts_for_every_block(text):
    calls, errors = parse_hermes(text, TOOLS)
    # Each </tool_call> closes a block (a call or an error) or is stray (an error); none is dropped.
    assert len(calls) + len(errors) >= text.count("</tool_call>")
    assert all(call.name == "calculator" and call.arguments == {"expression": "1"} for call in calls)
