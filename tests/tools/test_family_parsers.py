"""Tests of the Llama-3 JSON and Mistral tool-call parsers, the shared schema checks, and the choice of
parser from a chat template, including round trips through templates that render calls the way each
family's published template does."""

from __future__ import annotations

import json
import re

import pytest
from tool_schemas import TOOLS

from arlctl.tools import PARSERS, TOOL_CALL_FORMATS, parse_tool_calls, parser_for_template
from arlctl.tools.calls import ToolCall
from arlctl.tools.hermes import parse_hermes
from arlctl.tools.llama3_json import parse_llama3_json
from arlctl.tools.mistral import mistral_call_id, parse_mistral
from arlctl.tools.render import assistant_tool_calls

ALNUM9 = re.compile(r"^[A-Za-z0-9]{9}$")


def _named(calls: list[ToolCall]) -> list[tuple[str, dict]]:
    return [(call.name, call.arguments) for call in calls]


# ---- Llama 3.x JSON ----------------------------------------------------------------------------------


def test_llama3_single_call_with_parameters():
    calls, errors = parse_llama3_json('{"name": "calculator", "parameters": {"expression": "2+3"}}', TOOLS)
    assert errors == []
    assert [(c.name, c.arguments, c.id) for c in calls] == [("calculator", {"expression": "2+3"}, "call_0")]


def test_llama3_python_tag_arguments_synonym_and_end_token():
    text = '\n <|python_tag|> {"name": "lookup", "arguments": {"key": "pi", "limit": 2}}<|eom_id|>'
    calls, errors = parse_llama3_json(text, TOOLS)
    assert errors == []
    assert _named(calls) == [("lookup", {"key": "pi", "limit": 2})]


def test_llama3_several_calls_separated_by_semicolons_and_newlines():
    text = (
        '{"name": "calculator", "parameters": {"expression": "1+1"}}; '
        '{"name": "lookup", "parameters": {"key": "x"}}\n'
        '{"name": "calculator", "parameters": {"expression": "9*9"}}'
    )
    calls, errors = parse_llama3_json(text, TOOLS)
    assert errors == []
    assert _named(calls) == [("calculator", {"expression": "1+1"}), ("lookup", {"key": "x"}),
                             ("calculator", {"expression": "9*9"})]
    assert [c.id for c in calls] == ["call_0", "call_1", "call_2"]


def test_llama3_arguments_as_json_string():
    text = '{"name": "calculator", "parameters": "{\\"expression\\": \\"7/2\\"}"}'
    calls, errors = parse_llama3_json(text, TOOLS)
    assert errors == []
    assert _named(calls) == [("calculator", {"expression": "7/2"})]


@pytest.mark.parametrize("text", [
    "The answer is 4.",
    "",
    "   \n",
    "Sure: {\"name\": \"calculator\", \"parameters\": {}}",  # a call not at the start is prose
    "<|eot_id|>",
])
def test_llama3_plain_content_has_no_calls_and_no_errors(text):
    assert parse_llama3_json(text, TOOLS) == ([], [])


@pytest.mark.parametrize("text", ["<|python_tag|>print('hi')", "<|python_tag|>", " <|python_tag|> x = 1<|eom_id|>"])
def test_llama3_python_tag_without_a_json_call_is_an_error_not_an_answer(text):
    # The tag says "this is a tool call": built-in code-interpreter code is a call to a tool we do not offer.
    calls, errors = parse_llama3_json(text, TOOLS)
    assert calls == [] and len(errors) == 1
    assert ("built-in tools" in errors[0].message or "no tool call" in errors[0].message)
    assert '"parameters"' in errors[0].message


def test_llama3_malformed_json_is_an_error_and_the_next_call_survives():
    text = '{"name": "calculator", "parameters": {"expression": "1+1"}; {"name": "lookup", "parameters": {"key": "k"}}'
    calls, errors = parse_llama3_json(text, TOOLS)
    assert _named(calls) == [("lookup", {"key": "k"})]
    assert len(errors) == 1
    assert errors[0].raw == '{"name": "calculator", "parameters": {"expression": "1+1"}'
    assert "invalid JSON in tool call" in errors[0].message
    # The message shows this family's format, not hermes tags.
    assert '{"name": "TOOL_NAME", "parameters": {"ARG": "VALUE"}}' in errors[0].message
    assert "<tool_call>" not in errors[0].message


def test_llama3_unterminated_call_is_an_error():
    calls, errors = parse_llama3_json('{"name": "calculator", "parameters": {"expression": "1+', TOOLS)
    assert calls == []
    assert len(errors) == 1 and "invalid JSON" in errors[0].message


def test_llama3_missing_name_and_wrong_shapes():
    calls, errors = parse_llama3_json('{"parameters": {"expression": "1"}}; {"name": "calculator", "parameters": [1]}')
    assert calls == []
    assert 'needs a "name"' in errors[0].message and '"parameters": {"ARG": "VALUE"}' in errors[0].message
    assert errors[1].message == '"parameters" of \'calculator\' must be a JSON object, got list'


def test_llama3_trailing_text_is_an_error_but_the_call_is_kept():
    text = '{"name": "calculator", "parameters": {"expression": "2*2"}} and then I will explain.'
    calls, errors = parse_llama3_json(text, TOOLS)
    assert _named(calls) == [("calculator", {"expression": "2*2"})]
    assert len(errors) == 1
    assert errors[0].raw == "and then I will explain."
    assert "unexpected text after the tool call(s)" in errors[0].message
    assert "; " in errors[0].message  # shows how several calls are separated


def test_llama3_schema_validation_matches_hermes():
    bad = [
        ('{"name": "python", "parameters": {}}', "unknown tool 'python'; available tools: calculator, lookup"),
        ('{"name": "lookup", "parameters": {"limit": 1}}', "tool 'lookup' is missing required argument(s): key"),
        ('{"name": "lookup", "parameters": {"key": "k", "limit": true}}',
         "argument 'limit' of tool 'lookup' must be of type integer, got bool"),
    ]
    for text, message in bad:
        calls, errors = parse_llama3_json(text, TOOLS)
        assert calls == [] and [e.message for e in errors] == [message]
        # The same call written as hermes gets the very same message.
        payload = json.loads(text)
        hermes_text = f'<tool_call>{json.dumps({"name": payload["name"], "arguments": payload["parameters"]})}</tool_call>'
        assert [e.message for e in parse_hermes(hermes_text, TOOLS)[1]] == [message]
    # Without schemas any name is accepted.
    assert _named(parse_llama3_json('{"name": "python", "parameters": {}}')[0]) == [("python", {})]


# ---- Mistral -----------------------------------------------------------------------------------------


def test_mistral_v3_array_keeps_content_ids_and_order():
    text = ('Let me check.[TOOL_CALLS] [{"name": "calculator", "arguments": {"expression": "1+1"}, "id": "abc123XYZ"}, '
            '{"name": "lookup", "arguments": {"key": "k"}, "id": "Zz9Yy8Xx7"}]</s>')
    calls, errors = parse_mistral(text, TOOLS)
    assert errors == []
    assert [(c.name, c.arguments, c.id) for c in calls] == [
        ("calculator", {"expression": "1+1"}, "abc123XYZ"), ("lookup", {"key": "k"}, "Zz9Yy8Xx7")]


def test_mistral_v3_string_arguments_single_object_and_generated_ids():
    text = '[TOOL_CALLS]{"name": "calculator", "arguments": "{\\"expression\\": \\"3*3\\"}"}'
    calls, errors = parse_mistral(text, TOOLS)
    assert errors == []
    assert _named(calls) == [("calculator", {"expression": "3*3"})]
    assert ALNUM9.match(calls[0].id)
    # Ids are a function of the turn: the same text gives the same ids, another text other ids.
    assert parse_mistral(text, TOOLS)[0][0].id == calls[0].id
    assert parse_mistral(text + " ", TOOLS)[0][0].id != calls[0].id


def test_mistral_unusable_ids_are_replaced():
    text = ('[TOOL_CALLS][{"name": "lookup", "arguments": {"key": "a"}, "id": "call_0"}, '
            '{"name": "lookup", "arguments": {"key": "b"}, "id": 123456789}, {"name": "lookup", "arguments": {"key": "c"}}]')
    calls, errors = parse_mistral(text, TOOLS)
    assert errors == []
    ids = [c.id for c in calls]
    assert all(ALNUM9.match(i) for i in ids) and len(set(ids)) == 3


def test_mistral_v11_named_calls_with_and_without_call_id():
    text = ('[TOOL_CALLS]calculator[ARGS]{"expression": "2+2"}'
            '[TOOL_CALLS]lookup[CALL_ID]k1k2k3k4k[ARGS]{"key": "x", "limit": 5}</s>')
    calls, errors = parse_mistral(text, TOOLS)
    assert errors == []
    assert _named(calls) == [("calculator", {"expression": "2+2"}), ("lookup", {"key": "x", "limit": 5})]
    assert ALNUM9.match(calls[0].id) and calls[1].id == "k1k2k3k4k"


@pytest.mark.parametrize("text", ["Hello there.", "", "I would call [TOOL] but no."])
def test_mistral_plain_content(text):
    assert parse_mistral(text, TOOLS) == ([], [])


def test_mistral_malformed_segments_do_not_hide_good_ones():
    text = ('[TOOL_CALLS]calculator[ARGS]{"expression": "1+1"'      # unterminated JSON
            '[TOOL_CALLS]lookup{"key": "x"}'                         # no [ARGS]
            '[TOOL_CALLS]'                                           # nothing after the marker
            '[TOOL_CALLS]lookup[ARGS]{"key": "ok"} trailing'         # text after the arguments
            '[TOOL_CALLS]calculator[ARGS]{"expression": "5-1"}')     # good
    calls, errors = parse_mistral(text, TOOLS)
    assert _named(calls) == [("calculator", {"expression": "5-1"})]
    messages = [e.message for e in errors]
    assert len(messages) == 4
    assert messages[0].startswith("invalid JSON in the arguments of 'calculator'")
    assert "needs [ARGS]" in messages[1]
    assert "no call after it" in messages[2]
    assert "unexpected text after the arguments of 'lookup'" in messages[3]
    assert all("[TOOL_CALLS]" in m for m in messages)  # every message shows the family's format
    assert errors[1].raw == '[TOOL_CALLS]lookup{"key": "x"}'


def test_mistral_v3_bad_array_and_bad_elements():
    calls, errors = parse_mistral('[TOOL_CALLS][{"name": "calculator", "arguments": {', TOOLS)
    assert calls == [] and "invalid JSON after [TOOL_CALLS]" in errors[0].message
    assert '[TOOL_CALLS][{"name": "TOOL_NAME"' in errors[0].message
    calls, errors = parse_mistral('[TOOL_CALLS][{"arguments": {}}, "x", {"name": "lookup", "arguments": {"key": "k"}}]', TOOLS)
    assert _named(calls) == [("lookup", {"key": "k"})]
    assert 'needs a "name"' in errors[0].message and "got str" in errors[1].message
    calls, errors = parse_mistral('[TOOL_CALLS][{"name": "lookup", "arguments": {"key": "k"}}] more', TOOLS)
    assert calls == [] and "unexpected text after the [TOOL_CALLS] array" in errors[0].message
    assert parse_mistral("[TOOL_CALLS][]", TOOLS)[1][0].message.startswith("empty [TOOL_CALLS] array")


def test_mistral_schema_validation():
    calls, errors = parse_mistral('[TOOL_CALLS]lookup[ARGS]{"key": 3}[TOOL_CALLS]shell[ARGS]{}', TOOLS)
    assert calls == []
    assert [e.message for e in errors] == [
        "argument 'key' of tool 'lookup' must be of type string, got int",
        "unknown tool 'shell'; available tools: calculator, lookup",
    ]


def test_mistral_call_id_shape():
    ids = {mistral_call_id(str(n)) for n in range(200)}
    assert len(ids) == 200 and all(ALNUM9.match(i) for i in ids)


# ---- registry and template detection -----------------------------------------------------------------


def test_registry_names():
    assert TOOL_CALL_FORMATS == ("hermes", "llama3-json", "mistral")
    assert set(PARSERS) == {"hermes", "llama3-json", "mistral", "bash"}
    text = '{"name": "lookup", "parameters": {"key": "k"}}'
    assert _named(parse_tool_calls(text, "llama3-json", TOOLS)[0]) == [("lookup", {"key": "k"})]
    assert _named(parse_tool_calls("[TOOL_CALLS]lookup[ARGS]" + '{"key": "k"}', "mistral", TOOLS)[0]) == [
        ("lookup", {"key": "k"})]


# Small templates of each family, in the shape of the published ones (only the parts detection looks at).
CHATML_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
LLAMA3_TEMPLATE = (
    "{{- bos_token }}{% for m in messages %}"
    "{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' }}{% endfor %}"
)
MISTRAL_V3_TEMPLATE = (
    "{{- bos_token }}{% for m in messages %}{% if m.role == 'user' %}{{- '[INST]' + m.content + '[/INST]' }}"
    "{% elif m.tool_calls %}{{- '[TOOL_CALLS]' + (m.tool_calls | tojson) + eos_token }}"
    "{% else %}{{- m.content + eos_token }}{% endif %}{% endfor %}"
)


@pytest.mark.parametrize(("template", "expected"), [
    (CHATML_TEMPLATE, "hermes"),
    (LLAMA3_TEMPLATE, "llama3-json"),
    (MISTRAL_V3_TEMPLATE, "mistral"),
    (None, "hermes"),
    ("", "hermes"),
    # A template that names both belongs to Mistral's family (it only mentions Llama-style tokens).
    ("{# <|start_header_id|> #}" + MISTRAL_V3_TEMPLATE, "mistral"),
])
def test_parser_for_template(template, expected):
    assert parser_for_template(template) == expected


# ---- round trips through templates that render assistant calls as each family does -----------------

# Llama 3.1 JSON: `{"name": "<name>", "parameters": <arguments | tojson>}` then <|eot_id|>; the OpenAI
# message carries arguments as a JSON string, so the template writes a string-encoded object.
LLAMA3_CALLS = (
    "{% for m in messages %}{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' }}"
    "{% if m.tool_calls %}{% set f = m.tool_calls[0].function %}"
    "{{- '{\"name\": \"' + f.name + '\", \"parameters\": ' + (f.arguments | tojson) + '}' }}"
    "{% else %}{{- m.content }}{% endif %}{{- '<|eot_id|>' }}{% endfor %}"
)
# Mistral v3: `[TOOL_CALLS] [` + each function object with its id appended, then `]</s>`.
MISTRAL_V3_CALLS = (
    "{% for m in messages %}{% if m.role == 'user' %}{{- '[INST]' + m.content + '[/INST]' }}"
    "{% else %}{{- '[TOOL_CALLS] [' }}{% for c in m.tool_calls %}{% set out = c.function | tojson %}"
    "{{- out[:-1] + ', \"id\": \"' + c.id + '\"}' }}{% if not loop.last %}{{- ', ' }}{% endif %}{% endfor %}"
    "{{- ']' + eos_token }}{% endif %}{% endfor %}"
)
# Mistral v11+: `[TOOL_CALLS]name[CALL_ID]id[ARGS]<arguments | tojson>` per call, then `</s>`.
MISTRAL_V11_CALLS = (
    "{% for m in messages %}{% if m.role == 'user' %}{{- '[INST]' + m.content + '[/INST]' }}"
    "{% else %}{% for c in m.tool_calls %}"
    "{{- '[TOOL_CALLS]' + c.function.name + '[CALL_ID]' + c.id + '[ARGS]' + (c.function.arguments | tojson) }}"
    "{% endfor %}{{- eos_token }}{% endif %}{% endfor %}"
)


def _render(template: str, calls: list[ToolCall]) -> str:
    """The text a real transformers tokenizer's chat template makes of [user, assistant-with-calls]."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]")),
                                        unk_token="[UNK]", eos_token="</s>", bos_token="<s>")
    tokenizer.chat_template = template
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": "", "tool_calls": assistant_tool_calls(calls)}]
    return tokenizer.apply_chat_template(messages, tokenize=False)


ARGS = {"expression": "10 / (2 + 3) ; {x}", "note": "quote \" and é"}


def test_llama3_round_trip_through_template():
    calls, errors = parse_llama3_json(json.dumps({"name": "calculator", "parameters": ARGS}), TOOLS)
    assert errors == []
    rendered = _render(LLAMA3_CALLS, calls)
    turn = rendered.split("<|start_header_id|>assistant<|end_header_id|>\n\n", 1)[1]
    again, errors = parse_llama3_json(turn, TOOLS)
    assert errors == [] and _named(again) == [("calculator", ARGS)]


@pytest.mark.parametrize("template", [MISTRAL_V3_CALLS, MISTRAL_V11_CALLS])
def test_mistral_round_trip_through_template(template):
    text = ('[TOOL_CALLS][{"name": "calculator", "arguments": ' + json.dumps(ARGS) + '}, '
            '{"name": "lookup", "arguments": {"key": "k", "limit": 3}, "id": "q1w2e3r4t"}]')
    calls, errors = parse_mistral(text, TOOLS)
    assert errors == [] and ALNUM9.match(calls[0].id)  # the generated id is one the template accepts
    rendered = _render(template, calls)
    turn = rendered.split("[/INST]", 1)[1]
    again, errors = parse_mistral(turn, TOOLS)
    assert errors == []
    assert [(c.name, c.arguments, c.id) for c in again] == [(c.name, c.arguments, c.id) for c in calls]
