"""Token continuity through a chat template (DESIGN.md §6).

The conversation is never decoded and re-tokenized. The prompt is rendered and tokenized once; after
that, each turn appends the sampled ids as returned (mask 1) and then one new segment (mask 0): the
template's closing of the assistant message, the tool/observation messages, and the next assistant
header. The segment's text is found by rendering a fixed stand-in conversation with and without the new
messages and taking what the template puts after the assistant message, so whatever the template does
around tool messages is respected.

Templates that rewrite history. Some templates render an assistant message differently once it is no
longer the last one (the "think gate" of reasoning models: the last turn gets a `<think>` block, earlier
ones lose theirs). Re-rendering would change tokens the model already conditioned on, so by default the
trajectory stays prefix-consistent: what the model saw and sampled is what is recorded, and only the text
the template puts *after* the assistant message is appended (`rewrites_history` says the template is such
a one). `--history per-turn` is the other choice: each turn's prompt is the template's own rendering of the
conversation so far, one row per turn (`turn_prompt`).

Template options (`enable_thinking=false` and the like) reach every render through `template_kwargs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arlctl.errors import TerminalError
from arlctl.tools.render import tools_system_prompt

_PLACEHOLDER = "\u2063ARLCTL-PLACEHOLDER\u2063"
_PROBE_TOOL_MESSAGE = {"role": "tool", "name": "probe", "tool_call_id": "probe0001", "content": "R"}


@dataclass
class Segment:
    text: str
    ids: list[int]


class ChatCodec:
    """Renders prompts and turn boundaries for one tokenizer's chat template.

    template_kwargs: extra variables for the template (`--chat-template-kwargs`), e.g. enable_thinking.
    """

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise TerminalError("the policy's tokenizer has no chat template", hint="use an instruct model")
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        self.tools_in_template = self._template_renders_tools()
        # A stand-in conversation ending with an assistant message; deltas are taken against it.
        self._base = [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": _PLACEHOLDER},
        ]
        rendered = self._render(self._base)
        at = rendered.rfind(_PLACEHOLDER)
        if at < 0:
            raise TerminalError("the chat template drops assistant content; cannot keep token continuity")
        self._base_text = rendered
        self.closing = rendered[at + len(_PLACEHOLDER):]  # e.g. "<|im_end|>\n"
        self.rewrites_history = False
        # Checked once here, not in the middle of a trajectory: a template whose tool turns cannot be
        # appended is a startup error naming the template, never a per-row surprise.
        self.continuation("", [_PROBE_TOOL_MESSAGE])

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                add_generation_prompt: bool = False) -> str:
        kwargs: dict[str, Any] = {**self.template_kwargs, "tokenize": False,
                                  "add_generation_prompt": add_generation_prompt}
        if tools:
            kwargs["tools"] = tools
        try:
            return self.tokenizer.apply_chat_template(messages, **kwargs)
        except Exception as err:  # jinja's raise_exception(), a missing variable, a bad kwarg
            raise TerminalError(f"the chat template failed to render: {type(err).__name__}: {err}",
                                hint="check --chat-template-kwargs and the template's message rules") from err

    def _template_renders_tools(self) -> bool:
        probe = [{"type": "function", "function": {"name": "zz_probe_tool", "description": "d",
                                                   "parameters": {"type": "object", "properties": {}}}}]
        messages = [{"role": "user", "content": "hi"}]
        try:
            return "zz_probe_tool" in self._render(messages, probe, add_generation_prompt=True)
        except TerminalError:
            return False

    @property
    def chat_template(self) -> str:
        template = self.tokenizer.chat_template
        return template if isinstance(template, str) else str(template)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def prompt_messages(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages as rendered: tool schemas folded into the system message when the template can't."""
        if not tools or self.tools_in_template:
            return messages
        described = tools_system_prompt(tools)
        if messages and messages[0]["role"] == "system":
            return [{**messages[0], "content": messages[0]["content"] + "\n\n" + described}, *messages[1:]]
        return [{"role": "system", "content": described}, *messages]

    def prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Segment:
        msgs = self.prompt_messages(messages, tools)
        text = self._render(msgs, tools if self.tools_in_template else None, add_generation_prompt=True)
        return Segment(text, self.encode(text))

    def split_generation(self, ids: list[int]) -> tuple[str, str]:
        """(assistant content, closing glue still owed) for one turn's sampled ids.

        When the turn ended on the template's own end-of-message token, that token is part of the
        sampled ids and only the rest of the closing (e.g. a newline) is owed; otherwise (a length cut,
        a different EOS) the whole closing is owed.
        """
        if ids:
            last = self.decode(ids[-1:])
            if last and self.closing.startswith(last):
                return self.decode(ids[:-1]), self.closing[len(last):]
        return self.decode(ids), self.closing

    def continuation(self, glue: str, observations: list[dict[str, Any]]) -> Segment:
        """The mask-0 segment after a turn: the owed closing, the observations, the next header.

        Only what the template renders after the assistant message is used. When the template renders
        the messages before it differently once more follow (history rewriting), the recorded tokens
        stay what the model saw (see the module docstring) and `rewrites_history` becomes True.
        """
        full = self._render(self._base + observations, add_generation_prompt=True)
        at = full.rfind(_PLACEHOLDER)
        after = full[at + len(_PLACEHOLDER):] if at >= 0 else None
        if after is None or not after.startswith(self.closing):
            raise TerminalError(
                "the chat template renders an assistant message differently once tool results follow it "
                f"(expected its closing {self.closing!r} after the message)",
                hint="use --history per-turn, which renders every turn's prompt with the template itself")
        if full[:at] != self._base_text[:self._base_text.rfind(_PLACEHOLDER)]:
            self.rewrites_history = True
        text = glue + after[len(self.closing):]
        return Segment(text, self.encode(text))

    def turn_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                    turns: list[tuple[str, list[dict[str, Any]]]]) -> Segment:
        """`--history per-turn`: the template's own rendering of the conversation so far, ready for the
        next assistant turn. turns: (assistant content, observation messages) of the earlier turns."""
        msgs = list(self.prompt_messages(messages, tools))
        for content, observations in turns:
            msgs.append({"role": "assistant", "content": content})
            msgs.extend(observations)
        text = self._render(msgs, tools if self.tools_in_template else None, add_generation_prompt=True)
        return Segment(text, self.encode(text))

    def render_conversation(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                            turns: list[tuple[str, list[dict[str, Any]] | None]]) -> str:
        """What the template renders for a whole recorded conversation (used to check exactness).

        turns: (assistant content, observation messages or None for the last turn).
        """
        msgs = list(self.prompt_messages(messages, tools))
        for content, observations in turns:
            msgs.append({"role": "assistant", "content": content})
            msgs.extend(observations or [])
        ends_open = turns and turns[-1][1]
        return self._render(msgs, tools if self.tools_in_template else None, add_generation_prompt=bool(ends_open))
