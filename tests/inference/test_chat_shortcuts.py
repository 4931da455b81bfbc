"""ChatCodec's per-turn shortcuts give the general path's ids exactly (DESIGN.md §6; issue 19).

The shortcuts (the compiled template rendered directly, the Rust tokenizer called directly) must never
change a token. Every chat-template family of tests/inference/families.py and the SmolLM2 template run
the same inputs through a codec with the shortcuts and one without (`fast=False`: apply_chat_template and
the tokenizer wrapper), and the ids and texts must be equal; then each guard that sends a call back to the
general path is shown to be needed: without it the shortcut would give different ids or text.
"""

from __future__ import annotations

import pytest
from families import FAMILIES, family_tokenizer

from arlctl.inference.chat import ChatCodec
from arlctl.models import smollm2_tokenizer

ODD = " lead\tand trail \n\"quoted\" {{ braces }} \\ caf\u00e9 \u4e2d\u6587 \U0001f600 </think> <|im_end|> [INST] "
TOOLS = [{"type": "function", "function": {"name": "echo", "description": "Echo a text back.",
                                           "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                                                          "required": []}}}]
OBSERVATIONS = [
    [{"role": "tool", "name": "echo", "tool_call_id": "a1b2c3d4e", "content": "ok"}],
    [{"role": "tool", "name": "echo", "tool_call_id": "a1b2c3d4e", "content": ""}],
    [{"role": "tool", "name": "echo", "tool_call_id": "a1b2c3d4e", "content": ODD}],
    [{"role": "tool", "name": "a", "tool_call_id": "a1b2c3d4e", "content": "first\n" * 40},
     {"role": "tool", "name": "b", "tool_call_id": "f5g6h7i8j", "content": "second"}],
    # not plain data: the None is dropped by transformers 5 before rendering, so this takes the general path
    [{"role": "tool", "name": "echo", "tool_call_id": None, "content": "no id"}],
]


@pytest.mark.parametrize("name", ["smollm2", *FAMILIES])
def test_shortcuts_give_the_general_paths_ids(name):
    if name == "smollm2":
        tokenizer, kwargs = smollm2_tokenizer(), {}
    else:
        tokenizer, kwargs = family_tokenizer(FAMILIES[name]), dict(FAMILIES[name].kwargs)
    fast, general = ChatCodec(tokenizer, kwargs), ChatCodec(tokenizer, kwargs, fast=False)
    assert fast.active_shortcuts == ("render", "encode", "decode")  # else this test would compare nothing
    assert general.active_shortcuts == ()
    assert (fast.closing, fast.tools_in_template) == (general.closing, general.tools_in_template)
    for observations in OBSERVATIONS:
        for glue in ("", "\n", fast.closing):
            assert fast.continuation(glue, observations) == general.continuation(glue, observations)
    messages = [{"role": "system", "content": "You echo."}, {"role": "user", "content": ODD}]
    for tools in ([], TOOLS):
        assert fast.prompt(messages, tools) == general.prompt(messages, tools)
        turns = [("called " + ODD, OBSERVATIONS[2]), ("again", OBSERVATIONS[3])]
        assert fast.turn_prompt(messages, tools, turns) == general.turn_prompt(messages, tools, turns)
        ended = [*turns, ("done", None)]
        assert fast.render_conversation(messages, tools, ended) == general.render_conversation(messages, tools, ended)
    eos = tokenizer.convert_tokens_to_ids(FAMILIES[name].eos if name in FAMILIES else "<|im_end|>")
    sampled = fast.encode("Working on it: " + ODD)
    for ids in (sampled, [*sampled, eos], [eos], [], sampled[:1]):
        assert fast.split_generation(ids) == general.split_generation(ids)
        assert fast.decode(ids) == general.decode(ids)
    assert fast.rewrites_history == general.rewrites_history


def test_a_backend_left_truncating_is_asked_through_the_wrapper():
    """The wrapper resets truncation before each call; the backend alone would cut the ids short."""
    tokenizer = smollm2_tokenizer()
    codec = ChatCodec(tokenizer)
    text = "one two three four five six seven eight nine ten"
    full = codec.encode_reference(text)
    tokenizer.backend_tokenizer.enable_truncation(max_length=3)
    assert len(tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids) == 3
    assert codec.encode(text) == full  # the guard sent it to the wrapper, which undid the truncation


def test_split_special_tokens_is_honoured():
    """With split_special_tokens the wrapper encodes '<|im_end|>' in content as text; so must encode()."""
    tokenizer = smollm2_tokenizer()
    codec = ChatCodec(tokenizer)
    as_special = codec.encode("x<|im_end|>")
    tokenizer.split_special_tokens = True
    as_text = codec.encode("x<|im_end|>")
    assert as_text == codec.encode_reference("x<|im_end|>")
    assert as_text != as_special and len(as_text) > len(as_special)


def test_a_changed_template_is_rendered_as_the_general_path_renders_it():
    tokenizer = smollm2_tokenizer()
    codec = ChatCodec(tokenizer)
    messages = [{"role": "user", "content": "hi"}]
    tokenizer.chat_template = FAMILIES["llama3"].template  # after the codec compiled the ChatML one
    rendered = codec._render(messages, add_generation_prompt=True)
    assert rendered == tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "<|start_header_id|>" in rendered


def test_template_kwargs_the_shortcut_would_pass_differently_turn_it_off():
    """`documents` is an apply_chat_template argument, not a template variable: the compiled render would
    get it twice, so the probes disagree and every render takes the general path."""
    tokenizer = smollm2_tokenizer()
    tokenizer.chat_template = "{% for d in documents %}[{{ d.title }}]{% endfor %}" + FAMILIES["chatml"].template
    docs = {"documents": [{"title": "manual", "text": "x"}]}
    codec = ChatCodec(tokenizer, docs)
    assert "render" not in codec.active_shortcuts
    prompt = codec.prompt([{"role": "user", "content": "hi"}], [])
    assert prompt == ChatCodec(tokenizer, docs, fast=False).prompt([{"role": "user", "content": "hi"}], [])
    assert prompt.text.startswith("[manual]")


def test_messages_apply_chat_template_would_change_take_the_general_path():
    """A None value (dropped by transformers 5, else rendered) and a reasoning field (aliased to other
    keys) are left to apply_chat_template; the compiled render declines them."""
    codec = ChatCodec(smollm2_tokenizer())
    with_none = [{"role": "tool", "content": "x", "name": None}]
    with_reasoning = [{"role": "assistant", "content": "x", "reasoning_content": "why"}]
    assert codec._render_compiled(with_none, True) is None
    assert codec._render_compiled(with_reasoning, True) is None
    assert codec._render_compiled([{"role": "tool", "content": "x", "name": "n"}], True) is not None
