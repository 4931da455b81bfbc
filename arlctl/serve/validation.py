"""Every field of a serve request checked before anything acts on it: a typed request, or a UsageError (400).

`arlctl serve` listens to clients it does not control. Before this check a `true` in a token-id prompt
reached the recorder and made the session's shard unwritable (which killed the idle reaper), a string
`temperature: "nan"` sampled NaN log-probs into training data, and a list where an object belongs was a
500 with a traceback. So the body is parsed strictly (UTF-8, no NaN/Infinity constants, no non-finite
numbers, bounded nesting, no lone surrogates anywhere) and each known field of the OpenAI chat and
completions APIs is type- and range-checked; sampling values go through the same check every backend
applies (arlctl.inference.sampling_check). Fields this server cannot honour (n > 1, penalties, logit
bias, echo, ...) are refused rather than silently ignored, because the recorded log-probs would then
describe a different sampling than the client asked for. Unknown fields are ignored: clients send many.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from arlctl.errors import UsageError
from arlctl.inference.base import SamplingParams
from arlctl.inference.sampling_check import (
    MAX_NEW_TOKENS,
    check_int,
    check_seed,
    check_temperature,
    check_top_p,
    finite_number,
    is_int,
    sampling_params,
)

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024  # ~1M tokens of text: more than any context window holds
MAX_DEPTH = 64  # chat messages nest ~6 deep; tool schemas a few more
MAX_STOP = 16
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
SESSION_ID = re.compile(r"[A-Za-z0-9._:@+=-]{1,128}")


class BodyTooLarge(UsageError):
    """The request body exceeds --max-body-bytes (answered with 413)."""


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    sampling: SamplingParams
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage


@dataclass(frozen=True)
class CompletionRequest:
    prompt: str | list[int]
    sampling: SamplingParams
    logprobs: bool
    stream: bool = False
    include_usage: bool = False


# ---- the body ----

def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object in `raw`, strictly parsed and walked once for depth and valid Unicode."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"the body is not valid UTF-8 (byte {err.start})") from None
    try:
        body = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise UsageError(f"the body is nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as err:  # JSONDecodeError, and ints past Python's digit limit
        raise UsageError(f"the body is not JSON: {str(err)[:200]}") from None
    if not isinstance(body, dict):
        raise UsageError("the body must be a JSON object")
    check_tree(body)
    return body


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {literal[:40]} overflows a double")
    return value


def check_tree(body: Any) -> None:
    """At most MAX_DEPTH levels of nesting; every string and key encodable as UTF-8.

    JSON's \\ud800 escapes decode to lone surrogates, which tokenizers reject and Parquet cannot store:
    refused here, once, for every field. Iterative, so a deep body cannot exhaust the stack.
    """
    stack: list[tuple[Any, int, Any]] = [(body, 1, ("body",))]
    while stack:
        value, depth, where = stack.pop()
        if depth > MAX_DEPTH:
            raise UsageError(f"the body is nested more than {MAX_DEPTH} levels deep (at {_path(where)})")
        if isinstance(value, str):
            _check_text(value, where)
        elif isinstance(value, dict):
            for key, item in value.items():
                _check_text(key, where)
                stack.append((item, depth + 1, (where, key)))
        elif isinstance(value, list):
            stack.extend((item, depth + 1, (where, index)) for index, item in enumerate(value))


def _check_text(text: str, where: Any) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise UsageError(f"{_path(where)} holds a lone surrogate (U+{ord(text[err.start]):04X}): "
                         "not valid Unicode") from None


def _path(where: Any) -> str:
    parts: list[str] = []
    while len(where) == 2:
        where, key = where
        parts.append(f"[{key}]" if isinstance(key, int) else f".{str(key)[:40]}")
    return where[0] + "".join(reversed(parts))


def check_session_id(session_id: str) -> str:
    if not SESSION_ID.fullmatch(session_id):
        raise UsageError(f"session ids are 1-128 characters of [A-Za-z0-9._:@+=-], got {session_id[:60]!r}")
    return session_id


# ---- the requests ----

FLOAT32_MAX = 3.4028234663852886e38  # the reward column is float32: 1e39 would land as inf


@dataclass(frozen=True)
class SessionReward:
    reward: float
    info: dict[str, Any]


def session_reward(body: dict[str, Any]) -> SessionReward:
    """POST /v1/sessions/{id}/reward: {"reward": finite number, "info": optional JSON object}."""
    if "reward" not in body:
        raise UsageError("`reward` is required: the session's outcome as a number")
    reward = finite_number("reward", body["reward"])
    if abs(reward) > FLOAT32_MAX:
        raise UsageError(f"reward must fit a float32 (|reward| <= {FLOAT32_MAX:g}), got {reward:g}")
    info = body.get("info", {})
    if not isinstance(info, dict):
        raise UsageError(f"info must be a JSON object, got {type(info).__name__}")
    return SessionReward(reward, info)


def chat_request(body: dict[str, Any], default_max_tokens: int) -> ChatRequest:
    """A checked /v1/chat/completions request."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise UsageError("messages must be a non-empty list of message objects")
    for index, message in enumerate(messages):
        _check_message(f"messages[{index}]", message)
    tools = _optional(body, "tools", list) or []
    for index, tool in enumerate(tools):
        _check_tool(f"tools[{index}]", tool)
    _optional(body, "tool_choice", (str, dict))
    _optional(body, "parallel_tool_calls", bool)
    _optional(body, "response_format", dict)
    _optional(body, "logprobs", bool)
    if body.get("top_logprobs") is not None:
        check_int("top_logprobs", body["top_logprobs"], 0, 20)
    stream, include_usage = _stream(body)
    return ChatRequest(messages, tools, _sampling(body, default_max_tokens), stream, include_usage)


def completion_request(body: dict[str, Any], default_max_tokens: int, vocab_size: int) -> CompletionRequest:
    """A checked /v1/completions request; a token-id prompt must lie in [0, vocab_size)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # the OpenAI API allows a batch; one prompt per request here
    if isinstance(prompt, str):
        if not prompt:
            raise UsageError("prompt must not be empty")
    elif isinstance(prompt, list) and prompt:
        for index, token in enumerate(prompt):
            if not is_int(token):
                raise UsageError(f"prompt[{index}] must be an integer token id (or the prompt one string), "
                                 f"got {type(token).__name__} {token!r:.40}")
            if not 0 <= token < vocab_size:
                raise UsageError(f"prompt[{index}] = {token} is not a token id of this model: [0, {vocab_size})")
    else:
        raise UsageError("prompt must be a non-empty string or list of token ids (one prompt per request)")
    if _optional(body, "echo", bool):
        raise UsageError("echo is not supported by arlctl serve")
    if _optional(body, "suffix", str):
        raise UsageError("suffix is not supported by arlctl serve")
    if body.get("best_of") is not None:
        check_int("best_of", body["best_of"], 1, 1)
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        check_int("logprobs", logprobs, 0, 20)
    stream, include_usage = _stream(body)
    return CompletionRequest(prompt, _sampling(body, default_max_tokens), logprobs is not None and logprobs is not False,
                             stream, include_usage)


def _stream(body: dict[str, Any]) -> tuple[bool, bool]:
    """(stream, stream_options.include_usage), both checked booleans."""
    stream = bool(_optional(body, "stream", bool))
    options = _optional(body, "stream_options", dict) or {}
    include_usage = _optional(options, "include_usage", bool, "stream_options")
    return stream, bool(include_usage) and stream


def sampling_fields(body: dict[str, Any], default_max_tokens: int) -> SamplingParams:
    """The sampling fields every endpoint shares; what cannot be honoured is refused."""
    _optional(body, "model", str)
    _optional(body, "user", str)
    if body.get("n") is not None:
        check_int("n", body["n"], 1, 1)  # one choice per request: a session records one continuation
    _check_stop(body.get("stop"))
    _check_unsupported(body)
    max_tokens = default_max_tokens
    for name in ("max_tokens", "max_completion_tokens"):  # the newer name wins when both are sent
        if body.get(name) is not None:
            max_tokens = check_int(name, body[name], 1, MAX_NEW_TOKENS)
    temperature, top_p = body.get("temperature"), body.get("top_p")
    return sampling_params(
        temperature=1.0 if temperature is None else check_temperature(temperature),
        top_p=1.0 if top_p is None else check_top_p(top_p),
        max_new_tokens=max_tokens, seed=check_seed(body.get("seed")))


def _check_unsupported(body: dict[str, Any]) -> None:
    """Sampling controls with a neutral value are accepted; any other value is a 400, never ignored."""
    for name, neutral in (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0),
                          ("min_p", 0.0)):
        if body.get(name) is not None and finite_number(name, body[name]) != neutral:
            raise UsageError(f"{name} is not supported by arlctl serve (only {neutral:g})")
    top_k = body.get("top_k")
    if top_k is not None and check_int("top_k", top_k, -1, 1 << 31) not in (-1, 0):
        raise UsageError("top_k is not supported by arlctl serve (only -1 or 0: off)")
    if _optional(body, "logit_bias", dict):
        raise UsageError("logit_bias is not supported by arlctl serve")


def _check_stop(stop: Any) -> None:
    """stop strings are accepted and ignored (generation stops on EOS or max_tokens); their type is checked."""
    if stop is None or isinstance(stop, str):
        return
    if not isinstance(stop, list) or len(stop) > MAX_STOP or not all(isinstance(s, str) for s in stop):
        raise UsageError(f"stop must be a string or a list of at most {MAX_STOP} strings")


def _check_message(where: str, message: Any) -> None:
    if not isinstance(message, dict):
        raise UsageError(f"{where} must be an object with a role, got {type(message).__name__}")
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise UsageError(f"{where}.role must be one of {', '.join(sorted(ROLES))}, got {role!r:.40}")
    content = message.get("content")
    if isinstance(content, list):
        for index, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise UsageError(f"{where}.content[{index}] must be a text part {{'type': 'text', 'text': ...}} "
                                 "(only text content is supported)")
    elif content is not None and not isinstance(content, str):
        raise UsageError(f"{where}.content must be a string, a list of text parts or null")
    for name in ("name", "tool_call_id"):
        _optional(message, name, str, where)
    for index, call in enumerate(_optional(message, "tool_calls", list, where) or []):
        _check_call(f"{where}.tool_calls[{index}]", call)


def _check_call(where: str, call: Any) -> None:
    if not isinstance(call, dict):
        raise UsageError(f"{where} must be an object")
    _optional(call, "id", str, where)
    _optional(call, "type", str, where)
    function = call.get("function", call)
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise UsageError(f"{where}.function must be an object with a string name")
    _optional(function, "arguments", (str, dict), f"{where}.function")


def _check_tool(where: str, tool: Any) -> None:
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise UsageError(f"{where} must be a function tool {{'type': 'function', 'function': {{...}}}}")
    function = tool.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise UsageError(f"{where}.function must be an object with a non-empty string name")
    _optional(function, "description", str, f"{where}.function")
    _optional(function, "parameters", dict, f"{where}.function")


def optional_field(obj: dict[str, Any], name: str, kind: type | tuple[type, ...], where: str = "") -> Any:
    """obj[name] when absent, null, or of `kind`; else UsageError naming the field."""
    value = obj.get(name)
    if value is not None and not isinstance(value, kind):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        expected = " or ".join(_JSON_NAMES.get(k, k.__name__) for k in kinds)
        raise UsageError(f"{where + '.' if where else ''}{name} must be {expected}, got {type(value).__name__}")
    return value


_optional, _sampling = optional_field, sampling_fields  # the short names used throughout this module
_JSON_NAMES = {str: "a string", bool: "a boolean", list: "a list", dict: "an object"}
