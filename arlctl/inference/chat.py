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

Per-turn cost. `continuation` runs once per turn of every trajectory in flight, so it skips the general
entry points where that is exactly equivalent: it renders with the template transformers compiled (the
same sandboxed environment, filters and variables apply_chat_template passes) when every message is plain
JSON data that apply_chat_template would pass through unchanged, and it encodes with the fast tokenizer's
Rust backend when the Python wrapper would call that backend with the same settings. Both shortcuts are
checked against the general path on probe inputs when the codec is built and are off if any differs;
`ChatCodec(tokenizer, fast=False)` always takes the general path (the reference the tests compare with).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arlctl.errors import TerminalError
from arlctl.tools.render import tools_system_prompt

_PLACEHOLDER = "\u2063ARLCTL-PLACEHOLDER\u2063"
_PROBE_TOOL_MESSAGE = {"role": "tool", "name": "probe", "tool_call_id": "probe0001", "content": "R"}
# Keys apply_chat_template copies into other keys before rendering (transformers 5 aliases reasoning
# fields); a message carrying one takes the general path.
_ALIASED_KEYS = frozenset({"reasoning_content", "thinking", "reasoning"})
_PLAIN_SCALARS = (str, int, float, bool)
# The classes of transformers whose decode and _decode only call the Rust backend (4.x and 5.x names).
_BASE_TOKENIZERS = frozenset({"PreTrainedTokenizerBase", "PreTrainedTokenizerFast", "TokenizersBackend"})


@dataclass
class Segment:
    text: str
    ids: list[int]


class ChatCodec:
    """Renders prompts and turn boundaries for one tokenizer's chat template.

    template_kwargs: extra variables for the template (`--chat-template-kwargs`), e.g. enable_thinking.
    fast: take the per-turn shortcuts (module docstring); None reads the class default `shortcuts`, which
    a benchmark turns off to measure the general path inside a whole rollout.
    """

    shortcuts = True

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None, fast: bool | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise TerminalError("the policy's tokenizer has no chat template", hint="use an instruct model")
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        # The shortcuts of the per-turn path (module docstring); None where the general path is taken.
        self._compiled: tuple[str, Any] | None = None  # (template source, its compiled template)
        self._backend: Any = None  # the fast tokenizer's Rust tokenizer, for encode
        self._decoder: Any = None  # the same, for decode
        if self.shortcuts if fast is None else fast:
            self._enable_shortcuts()
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
        self._history_text = rendered[:at]  # what the template renders before the assistant's content
        self.closing = rendered[at + len(_PLACEHOLDER):]  # e.g. "<|im_end|>\n"
        self.rewrites_history = False
        # Checked once here, not in the middle of a trajectory: a template whose tool turns cannot be
        # appended is a startup error naming the template, never a per-row surprise.
        self.continuation("", [_PROBE_TOOL_MESSAGE])

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                add_generation_prompt: bool = False, checked: int = 0) -> str:
        """checked: how many leading messages are already known to be plain JSON data (the stand-in)."""
        try:
            if not tools and self._compiled is not None:
                text = self._render_compiled(messages, add_generation_prompt, checked)
                if text is not None:
                    return text
            return self._render_reference(messages, tools, add_generation_prompt)
        except Exception as err:  # jinja's raise_exception(), a missing variable, a bad kwarg
            raise TerminalError(f"the chat template failed to render: {type(err).__name__}: {err}",
                                hint="check --chat-template-kwargs and the template's message rules") from err

    def _render_reference(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                          add_generation_prompt: bool) -> str:
        kwargs: dict[str, Any] = {**self.template_kwargs, "tokenize": False,
                                  "add_generation_prompt": add_generation_prompt}
        if tools:
            kwargs["tools"] = tools
        return self.tokenizer.apply_chat_template(messages, **kwargs)

    def _render_compiled(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
                         checked: int = 0) -> str | None:
        """apply_chat_template's own render call without its per-call preparation, or None where that
        preparation could change something: a changed template, a message that is not plain JSON data
        (None values are dropped and objects converted there) or one with an aliased key."""
        source, compiled = self._compiled  # type: ignore[misc]
        if self.tokenizer.chat_template is not source:
            return None
        for message in messages[checked:]:
            if type(message) is not dict or not _ALIASED_KEYS.isdisjoint(message) or not _plain(message):
                return None
        return compiled.render(messages=messages, tools=None, documents=None,
                               add_generation_prompt=add_generation_prompt,
                               **{**self.tokenizer.special_tokens_map, **self.template_kwargs})

    def _enable_shortcuts(self) -> None:
        """Turn on each shortcut that gives exactly what the general path gives on probe inputs."""
        source = self.tokenizer.chat_template
        if isinstance(source, str) and _plain(self.template_kwargs):
            compiled = _compile_template(source)
            if compiled is not None:
                self._compiled = (source, compiled)
                probes = _render_probes()
                fast = [_outcome(self._render_compiled, msgs, gen) for msgs, gen in probes]
                if fast != [_outcome(self._render_reference, msgs, None, gen) for msgs, gen in probes]:
                    self._compiled = None
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            self._backend = backend
            texts = _encode_probes(self.tokenizer)
            if [self._encode_backend(text) for text in texts] != [self.encode_reference(text) for text in texts]:
                self._backend = None
            # decode() is the backend's decode where the tokenizer class keeps transformers' own
            # decode and _decode (asked not to clean up spaces, those only call the backend).
            if _defined_by(self.tokenizer, "decode") in _BASE_TOKENIZERS and \
                    _defined_by(self.tokenizer, "_decode") in _BASE_TOKENIZERS:
                probes = _decode_probes(self.tokenizer)
                reference = [self.decode_reference(ids) for ids in probes]
                if [backend.decode(ids, skip_special_tokens=False) for ids in probes] == reference:
                    self._decoder = backend

    @property
    def active_shortcuts(self) -> tuple[str, ...]:
        """Which shortcuts passed their checks: "render", "encode", "decode"."""
        on = (("render", self._compiled), ("encode", self._backend), ("decode", self._decoder))
        return tuple(name for name, value in on if value is not None)

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
        if self._backend is not None:
            ids = self._encode_backend(text)
            if ids is not None:
                return ids
        return self.encode_reference(text)

    def encode_reference(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _encode_backend(self, text: str) -> list[int] | None:
        """The Rust backend's ids, as the wrapper gets them, or None where the wrapper would first change
        the backend's settings: it resets truncation and padding and sets encode_special_tokens from
        split_special_tokens before every call."""
        backend = self._backend
        if backend.truncation is not None or backend.padding is not None:
            return None
        if getattr(backend, "encode_special_tokens", False) != bool(getattr(self.tokenizer, "split_special_tokens",
                                                                              False)):
            return None
        return backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        if self._decoder is not None:
            return self._decoder.decode(ids, skip_special_tokens=False)
        return self.decode_reference(ids)

    def decode_reference(self, ids: list[int]) -> str:
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
        full = self._render(self._base + observations, add_generation_prompt=True, checked=len(self._base))
        at = full.rfind(_PLACEHOLDER)
        after = full[at + len(_PLACEHOLDER):] if at >= 0 else None
        if after is None or not after.startswith(self.closing):
            raise TerminalError(
                "the chat template renders an assistant message differently once tool results follow it "
                f"(expected its closing {self.closing!r} after the message)",
                hint="use --history per-turn, which renders every turn's prompt with the template itself")
        if full[:at] != self._history_text:
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


def _plain(value: Any) -> bool:
    """JSON data of exact built-in types with no None: what apply_chat_template passes on unchanged."""
    kind = type(value)
    if kind in _PLAIN_SCALARS:
        return True
    if kind is dict:
        return all(type(key) is str and _plain(item) for key, item in value.items())
    if kind is list:
        return all(_plain(item) for item in value)
    return False


def _outcome(render: Any, *args: Any) -> str | tuple[str, str]:
    """A render's text, or the error it raised (a template may refuse some probe conversations)."""
    try:
        return render(*args)
    except Exception as err:
        return (type(err).__name__, str(err))


def _defined_by(obj: Any, name: str) -> str | None:
    """The name of the class in obj's MRO that defines attribute `name`."""
    return next((cls.__name__ for cls in type(obj).__mro__ if name in cls.__dict__), None)


def _compile_template(source: str) -> Any:
    """The template as transformers compiles it for apply_chat_template (cached there), or None."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:
        return None
    try:
        return _compile_jinja_template(source)
    except Exception:  # a template that does not compile fails in the general path, with its message
        return None


def _render_probes() -> list[tuple[list[dict[str, Any]], bool]]:
    """Conversations both render paths must agree on: the stand-in and tool turns, odd text included."""
    odd = " lead\tand trail \n\"quoted\" {{ braces }} {% tag %} \\ \u00e9\u4e2d\U0001f600 </think> "
    system, user = {"role": "system", "content": "S"}, {"role": "user", "content": "U"}
    assistant = {"role": "assistant", "content": _PLACEHOLDER}
    tool = {"role": "tool", "name": "probe", "tool_call_id": "probe0001", "content": odd}
    return [([system, user, assistant], False), ([system, user, assistant, _PROBE_TOOL_MESSAGE], True),
            ([system, user, assistant, tool, dict(tool, content="")], True),
            ([system, {"role": "user", "content": odd}], True), ([user, assistant, tool], True)]


def _encode_probes(tokenizer: Any) -> list[str]:
    """Texts both encode paths must agree on: whitespace runs, unicode, and every special token in context."""
    specials = [str(t) for t in getattr(tokenizer, "all_special_tokens", [])]
    return ["", " ", "\n\n", "  two  spaces\t\ttabs\n", "caf\u00e9 \u4e2d\u6587 \U0001f600 \x00",
            "\n".join(f"a{token}b {token} " for token in specials), "".join(specials)]


def _decode_probes(tokenizer: Any) -> list[list[int]]:
    """Id sequences both decode paths must agree on: single ids, runs of ids, the special tokens."""
    size = len(tokenizer)
    ordinary = [list(range(start, min(start + 24, size))) for start in (0, size // 3, size // 2, size - 24)]
    specials = [int(i) for i in getattr(tokenizer, "all_special_ids", []) if 0 <= int(i) < size]
    return [[], *([i] for i in range(min(size, 300))), *ordinary, specials,
            [j for i in specials for j in (i, size // 2, i)]]
