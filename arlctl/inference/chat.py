"""Token continuity through a chat template (DESIGN.md §6).

The conversation is never decoded and re-tokenized. The prompt is rendered and tokenized once; after
that, each turn appends the sampled ids as returned (mask 1) and then one new segment (mask 0): the
template's closing of the assistant message, the tool/observation messages, and the next assistant
header. The segment's text is found by rendering a fixed stand-in conversation with and without the new
messages and taking the difference, so whatever the template does around tool messages is respected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arlctl.errors import TerminalError
from arlctl.tools.render import tools_system_prompt

_PLACEHOLDER = "\u2063ARLCTL-PLACEHOLDER\u2063"


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
            add_generation_prompt: bool = False) -> str:
    kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
    if tools:
        kwargs["tools"] = tools
    return tokenizer.apply_chat_template(messages, **kwargs)


@dataclass
class Segment:
    text: str
    ids: list[int]


class ChatCodec:
    """Renders prompts and turn boundaries for one tokenizer's chat template."""

    def __init__(self, tokenizer: Any):
        if not getattr(tokenizer, "chat_template", None):
            raise TerminalError("the policy's tokenizer has no chat template", hint="use an instruct model")
        self.tokenizer = tokenizer
        self.tools_in_template = self._template_renders_tools()
        # A stand-in conversation ending with an assistant message; deltas are taken against it.
        self._base = [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": _PLACEHOLDER},
        ]
        rendered = _render(tokenizer, self._base)
        at = rendered.rfind(_PLACEHOLDER)
        if at < 0:
            raise TerminalError("the chat template drops assistant content; cannot keep token continuity")
        self._base_text = rendered
        self.closing = rendered[at + len(_PLACEHOLDER):]  # e.g. "<|im_end|>\n"

    def _template_renders_tools(self) -> bool:
        probe = [{"type": "function", "function": {"name": "zz_probe_tool", "description": "d",
                                                   "parameters": {"type": "object", "properties": {}}}}]
        messages = [{"role": "user", "content": "hi"}]
        try:
            return "zz_probe_tool" in _render(self.tokenizer, messages, probe, add_generation_prompt=True)
        except Exception:
            return False

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
        text = _render(self.tokenizer, msgs, tools if self.tools_in_template else None, add_generation_prompt=True)
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
        """The mask-0 segment after a turn: the owed closing, the observations, the next header."""
        full = _render(self.tokenizer, self._base + observations, add_generation_prompt=True)
        if not full.startswith(self._base_text):
            raise TerminalError("the chat template re-renders earlier messages when tool results are added")
        text = glue + full[len(self._base_text):]
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
        return _render(self.tokenizer, msgs, tools if self.tools_in_template else None,
                       add_generation_prompt=bool(ends_open))
