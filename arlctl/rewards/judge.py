"""`--reward judge`: a language model grades each trajectory against a rubric (LLM-as-judge).

Where the judge runs (`--reward-opt`):
  server=URL model=NAME   any OpenAI-compatible /v1/chat/completions endpoint (vLLM, SGLang, `arlctl serve`);
                          URL may be the server's root, its /v1, or the full chat completions URL
  judge=default|tiny|PATH a policy loaded in this process with the hf backend (once per process, behind a
                          lock): slow, but offline. With neither option the judge is `judge=default`.
Every request is greedy (temperature 0), so a judge that is itself deterministic gives the same verdict twice.

Other options: rubric=NAME|FILE (default `default`; arlctl/rewards/rubrics/ says what a rubric holds),
concurrency (judge requests in flight per process, default 8), timeout (seconds per request, 120),
retries (2) with exponential backoff (backoff=0.5 s, doubled each time), max_tokens (the rubric's by
default), steps=1 (also grade every assistant turn, below). Only transient failures are retried: a refused
or dropped connection, a timeout, HTTP 5xx or 429. Any other answer (a 4xx, a body that is not a chat
completion) fails at once.

Result: reward = the rubric's score of the last verdict in the judge's reply, in [0, 1]; components
{"judge": reward}; reward_info holds the raw verdict, the judge's reply as the rationale, the judge model,
the rubric (name@content hash), attempts and seconds. A reply with no readable verdict, a failed request, a
timeout or a dead server gives reward None with reward_info.error naming the cause — never a 0 that
would enter a GRPO group (request failures also set reward_info.infra: the grader's failure, not the
policy's). reward_version carries the rubric's content hash and the judge model (`version_suffix`).

Per-turn (process) rewards: with steps=1 each assistant turn is also graded with the rubric's
`step_template`, and reward_info.step_rewards is the list of step scores in turn order (None where that
step could not be graded; reward_info.step_errors names why). The turns come from the reward stage as the
`turns` keyword (the text of each turn); without them no step is graded and reward_info.step_error says so.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from arlctl.envs.registry import register_reward
from arlctl.errors import UsageError
from arlctl.rewards import rubrics

VERSION = "judge-1"
NAME = "judge"
MAX_RATIONALE_CHARS = 2000


@dataclass(frozen=True)
class Endpoint:
    """Where judge requests go, and how patiently. Hashable: it keys the per-loop request slots."""

    url: str | None  # the chat completions URL (server mode)
    model: str  # the model name sent (server) or the policy spec loaded (in process)
    local: bool
    timeout: float
    retries: int
    backoff: float
    concurrency: int

    @property
    def label(self) -> str:
        """The judge model as reward_version and reward_info name it."""
        if not self.local:
            return self.model
        from arlctl import models

        return "hf:" + (models.DEFAULT_MODEL if self.model == "default" else self.model)


def endpoint(server: str | None = None, model: str | None = None, judge: str | None = None,
             timeout: float = 120.0, retries: int = 2, backoff: float = 0.5, concurrency: int = 8) -> Endpoint:
    """The checked judge endpoint of a reward's options (a UsageError says what is wrong)."""
    if server is not None and judge is not None:
        raise UsageError("the judge is either server=URL (with model=NAME) or judge=default|tiny|PATH, not both")
    if not (isinstance(timeout, int | float) and 0 < timeout < float("inf")):
        raise UsageError(f"judge timeout must be a positive number of seconds, got {timeout!r}")
    if not (isinstance(backoff, int | float) and 0 <= backoff < float("inf")):
        raise UsageError(f"judge backoff must be a number of seconds >= 0, got {backoff!r}")
    for name, value, low in (("retries", retries, 0), ("concurrency", concurrency, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise UsageError(f"judge {name} must be an integer >= {low}, got {value!r}")
    common = {"timeout": float(timeout), "retries": retries, "backoff": float(backoff), "concurrency": concurrency}
    if server is None:
        if model is not None:
            raise UsageError("model=NAME goes with server=URL; an in-process judge is named by judge=SPEC")
        return Endpoint(url=None, model=str(judge or "default"), local=True, **common)
    parts = urlsplit(str(server))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"judge server must be an http(s) URL, got {server!r}")
    if not model:
        raise UsageError("judge server=URL needs model=NAME (the judge model; it is part of reward_version)")
    return Endpoint(url=chat_url(str(server)), model=str(model), local=False, **common)


def chat_url(server: str) -> str:
    """The chat completions URL of a server given as its root, its /v1 or the full URL."""
    base = server.rstrip("/")
    if base.endswith("/chat/completions"):
        return base
    return base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")


class JudgeFailure(Exception):
    """One judge request that gave no reply; `transient` failures are retried."""

    def __init__(self, cause: str, transient: bool):
        super().__init__(cause)
        self.cause, self.transient = cause, transient


@dataclass
class Reply:
    text: str
    finish_reason: str | None
    attempts: int
    seconds: float


# ---- asking the judge ---------------------------------------------------------------------------------

# The reward stage runs each shard in its own event loop: request slots are per loop and per endpoint.
_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Endpoint, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary())


def _slots(ep: Endpoint) -> asyncio.Semaphore:
    per_loop = _SLOTS.setdefault(asyncio.get_running_loop(), {})
    return per_loop.setdefault(ep, asyncio.Semaphore(ep.concurrency))


async def ask(ep: Endpoint, messages: list[dict[str, str]], max_tokens: int) -> Reply:
    """The judge's reply to one chat; retries transient failures with backoff, else raises JudgeFailure
    whose cause says how many attempts were made."""
    start = time.monotonic()
    for attempt in range(ep.retries + 1):
        try:
            async with _slots(ep):
                text, finish = await (_local_chat(ep, messages, max_tokens) if ep.local
                                      else _server_chat(ep, messages, max_tokens))
            return Reply(text, finish, attempt + 1, time.monotonic() - start)
        except JudgeFailure as failure:
            if not failure.transient or attempt == ep.retries:
                tries = f" (after {attempt + 1} attempts)" if attempt else ""
                raise JudgeFailure(failure.cause + tries, failure.transient) from None
        await asyncio.sleep(ep.backoff * 2**attempt)
    raise AssertionError("unreachable")


async def _server_chat(ep: Endpoint, messages: list[dict[str, str]], max_tokens: int) -> tuple[str, str | None]:
    body = {"model": ep.model, "messages": messages, "temperature": 0, "max_tokens": max_tokens}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=ep.timeout)) as session, \
                session.post(str(ep.url), json=body) as response:
            status, raw = response.status, await response.text()
    except TimeoutError:
        raise JudgeFailure(f"judge request timed out after {ep.timeout:g} s ({ep.url})", transient=True) from None
    except aiohttp.InvalidURL as err:
        raise JudgeFailure(f"judge server URL is invalid: {err}", transient=False) from None
    except aiohttp.ClientError as err:  # refused, reset, dropped mid-body: the server may come back
        raise JudgeFailure(f"judge request failed: {_one_line(err)}", transient=True) from None
    if status != 200:
        raise JudgeFailure(f"judge server answered HTTP {status}: {_error_message(raw)}",
                           transient=status >= 500 or status == 429)
    try:
        choice = json.loads(raw)["choices"][0]
        text = choice["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise JudgeFailure(f"judge server's reply is not a chat completion: {raw[:200]!r}", transient=False) from None
    if not isinstance(text, str):
        raise JudgeFailure("judge server's reply has no text content", transient=False)
    return text, choice.get("finish_reason")


def _error_message(raw: str) -> str:
    try:
        return " ".join(str(json.loads(raw)["error"]["message"]).split())[:300]
    except (ValueError, KeyError, TypeError):
        return " ".join(raw.split())[:300] or "(empty body)"


# In-process judges: loaded once per process (spec -> (policy, codec), or why it could not be loaded).
_LOCAL: dict[str, tuple[Any, Any] | str] = {}
_LOCAL_LOCK = threading.Lock()


def _local_policy(spec: str) -> tuple[Any, Any]:
    with _LOCAL_LOCK:  # concurrent rows wait for the one load instead of loading the model N times
        found = _LOCAL.get(spec)
        if found is None:
            from arlctl.inference.chat import ChatCodec
            from arlctl.inference.loader import load_policy

            try:
                policy = load_policy(spec, backend="hf", progress=False)
                found = (policy, ChatCodec(policy.tokenizer))
            except Exception as err:  # remembered: every row names the same cause without reloading
                found = f"the judge model {spec!r} could not be loaded: {_one_line(err)}"
            _LOCAL[spec] = found
    if isinstance(found, str):
        raise JudgeFailure(found, transient=False)
    return found


async def _local_chat(ep: Endpoint, messages: list[dict[str, str]], max_tokens: int) -> tuple[str, str | None]:
    from arlctl.errors import ArlctlError
    from arlctl.inference.base import SamplingParams

    policy, codec = await asyncio.to_thread(_local_policy, ep.model)
    try:
        prompt = codec.prompt(messages, [])
        generation = await asyncio.wait_for(
            policy.generate(prompt.ids, SamplingParams(temperature=0.0, max_new_tokens=max_tokens)), ep.timeout)
    except TimeoutError:
        raise JudgeFailure(f"judge generation timed out after {ep.timeout:g} s", transient=True) from None
    except ArlctlError as err:  # a prompt longer than the judge's context, a closed policy
        raise JudgeFailure(f"judge generation failed: {_one_line(err)}", transient=False) from None
    text, _glue = codec.split_generation(generation.ids)
    return text, generation.finish_reason


def _one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"[:300]


# ---- grading ------------------------------------------------------------------------------------------

async def verdict(ep: Endpoint, rubric: rubrics.Rubric, messages: list[dict[str, str]],
                  max_tokens: int | None) -> dict[str, Any]:
    """One judged request: {"score", "verdict", "rationale", ...} or {"error", ...} with the cause."""
    try:
        reply = await ask(ep, messages, max_tokens or rubric.max_tokens)
    except JudgeFailure as failure:
        return {"error": f"judge: {failure.cause}", "infra": True}
    out: dict[str, Any] = {"rationale": reply.text[:MAX_RATIONALE_CHARS], "attempts": reply.attempts,
                           "seconds": round(reply.seconds, 3)}
    try:
        out["score"], out["verdict"] = rubric.read_verdict(reply.text)
    except ValueError as err:
        cut = " (the reply was cut at max_tokens)" if reply.finish_reason == "length" else ""
        out["error"] = f"judge: {err}{cut}"
    return out


def _steps_flag(steps: Any) -> bool:
    if steps in (0, 1, True, False):
        return bool(steps)
    raise UsageError(f"judge steps must be 0 or 1, got {steps!r}")


async def score(final_state: str | None, task: dict[str, Any], response_text: str, *, server: str | None = None,
                model: str | None = None, judge: str | None = None, rubric: str = "default",
                concurrency: int = 8, timeout: float = 120.0, retries: int = 2, backoff: float = 0.5,
                max_tokens: int | None = None, steps: int = 0,
                turns: list[str] | None = None) -> tuple[float | None, dict[str, float] | None, dict[str, Any]]:
    """Grade one trajectory (see the module docstring). Returns (reward, components, info)."""
    ep = endpoint(server, model, judge, timeout, retries, backoff, concurrency)
    rb = rubrics.load(rubric, ("judge",))
    info: dict[str, Any] = {"judge_model": ep.label, "rubric": rb.label}
    try:
        shared = rubrics.task_values(task, rb.uses)
    except rubrics.FieldMissing as err:
        return None, None, {**info, "error": f"judge: {err}"}
    values = {**shared, "answer": rubrics.NO_ANSWER if final_state is None else final_state,
              "response": response_text}
    messages, cut = rb.messages(values)
    if cut:
        info["truncated"] = cut
    graded = verdict(ep, rb, messages, max_tokens)
    if _steps_flag(steps):
        main, (step_rewards, step_info) = await asyncio.gather(graded, _grade_steps(ep, rb, shared, turns,
                                                                                   max_tokens))
        info.update(step_info, step_rewards=step_rewards)
    else:
        main = await graded
    info.update({k: v for k, v in main.items() if k != "score"})  # the score is the reward itself
    if "error" in main:
        return None, None, info
    return float(main["score"]), {"judge": float(main["score"])}, info


async def _grade_steps(ep: Endpoint, rb: rubrics.Rubric, shared: dict[str, str], turns: list[str] | None,
                       max_tokens: int | None) -> tuple[list[float | None], dict[str, Any]]:
    """Each assistant turn graded with the step template: (scores in turn order, info about failures)."""
    if turns is None:
        return [], {"step_error": "steps=1: the reward stage passed no turns, so no step was graded"}
    texts = [t.get("text", "") if isinstance(t, dict) else str(t) for t in turns]
    requests = []
    for index, text in enumerate(texts):
        previous = "\n\n".join(f"Step {k + 1}:\n{t}" for k, t in enumerate(texts[:index])) or "(none)"
        messages, _cut = rb.messages({**shared, "step": text, "index": index + 1, "previous": previous}, step=True)
        requests.append(verdict(ep, rb, messages, max_tokens))
    results = await asyncio.gather(*requests)
    errors = {str(i): r["error"] for i, r in enumerate(results) if "error" in r}
    return [r.get("score") if "error" not in r else None for r in results], ({"step_errors": errors} if errors else {})


def version_suffix(*, server: str | None = None, model: str | None = None, judge: str | None = None,
                   rubric: str = "default", concurrency: int = 8, timeout: float = 120.0, retries: int = 2,
                   backoff: float = 0.5, max_tokens: int | None = None, steps: int = 0, **_: Any) -> str:
    """What reward_version adds: the rubric's name and content hash and the judge model. Also checks the
    options now (a UsageError before the first row), e.g. steps=1 with a rubric without a step_template."""
    ep = endpoint(server, model, judge, timeout, retries, backoff, concurrency)
    rb = rubrics.load(rubric, ("judge",))
    if _steps_flag(steps) and not rb.step_template:
        raise UsageError(f"rubric {rb.name!r} has no step_template, which steps=1 needs")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise UsageError(f"judge max_tokens must be a positive integer, got {max_tokens!r}")
    return f"+rubric:{rb.label}+judge:{ep.label}"


score.version_suffix = version_suffix  # type: ignore[attr-defined]
# How the judge is reached, not what it judges (the model is in version_suffix): not part of reward_version.
score.unversioned_options = ("server", "concurrency", "timeout", "retries", "backoff")  # type: ignore[attr-defined]
register_reward(NAME, score, VERSION)
