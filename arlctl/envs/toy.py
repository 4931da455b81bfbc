"""Toy environments whose reward depends only on the first generated token of each turn.

`first-token`: one turn. It exists to prove that the whole loop learns: with a random tiny model about half
of the first tokens begin with a space, and reinforcing those is something a few dozen GRPO steps can do.
Reward 1 when the reply's first character is a space (the byte-level BPE "Ġ" tokens), else 0.

`two-first-tokens`: two turns, each with its own rule for its first character (TURN_RULES), a step reward
of 1 per turn that follows its rule and an outcome of 1 only when both do: the test bed of turn-level
credit (`filter --adv turn`, docs/learning/turn_credit.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from arlctl.envs.base import Action, EnvReset, StepResult
from arlctl.envs.registry import register_env, register_reward
from arlctl.envs.tasks import int_option, register_task_source, reject_unknown_options

ENV_NAME = "first-token"
ENV_VERSION = "first-token-1"
REWARD_VERSION = "first-token-1"


class FirstTokenEnv:
    name = ENV_NAME
    version = ENV_VERSION
    tool_format = None  # no tools: the reply text is the whole action (parse_action), never a parser's
    final_state_truncated = None

    def parse_action(self, text: str) -> Action:
        return Action(text=text)

    async def reset(self, task: dict[str, Any]) -> EnvReset:
        return EnvReset(messages=[{"role": "user", "content": task.get("prompt", "Say something.")}], tools=[])

    async def step(self, action: Action) -> StepResult:
        return StepResult(observations=[], done=True, final_state=action.text, finish_reason="submit")

    async def final_state(self) -> str | None:
        return None  # the episode always ends at its one step, with the reply as the final state

    async def close(self) -> None:
        pass


def score(final_state: str | None, task: dict[str, Any], response_text: str) -> tuple[float, dict, dict]:
    text = final_state if final_state is not None else response_text
    hit = float(bool(text) and text[0] == " ")
    return hit, {"space_first": hit}, {"first_chars": (text or "")[:8]}


def _word_tasks(env: str, prefix: str, options: dict[str, str]) -> list[dict[str, Any]]:
    """`builtin:ENV?n=&seed=`: n short prompts (task ids PREFIX-SEED-I) that any reply can answer."""
    source = f"builtin:{env}"
    n = int_option(options, "n", 64, source)
    seed = int_option(options, "seed", 0, source)
    reject_unknown_options(options, source, ["n", "seed"])
    words = ["apple", "river", "stone", "cloud", "lamp", "tiger", "paper", "music"]
    return [{"task_id": f"{prefix}-{seed}-{i}", "env": env,
             "prompt": f"Write a word after {words[(seed * 7 + i) % len(words)]} number {i}."} for i in range(n)]


@register_task_source(ENV_NAME)
def _builtin(options: dict[str, str]) -> list[dict[str, Any]]:
    return _word_tasks(ENV_NAME, "ft", options)


register_env(ENV_NAME, FirstTokenEnv, version=ENV_VERSION)
register_reward(ENV_NAME, score, REWARD_VERSION)


# ----------------------------------------------------------------------------------------------- two turns

TWO_ENV_NAME = "two-first-tokens"
TWO_ENV_VERSION = "two-first-tokens-1"
TWO_REWARD_VERSION = "two-first-tokens-1"
SECOND_PROMPT = "Now once more."


def _space_first(text: str) -> bool:
    return bool(text) and text[0] == " "


def _letter_first(text: str) -> bool:
    return bool(text) and text[0].isascii() and text[0].isalpha()


# What each turn's reply must start with. Chosen so that the tiny random model (arlctl/models.py make_tiny)
# hits each about half the time or more (docs/learning/turn_credit.md has the measurement).
TURN_RULES: tuple[tuple[str, Callable[[str], bool]], ...] = (("space_first", _space_first),
                                                             ("letter_first", _letter_first))


class TwoFirstTokensEnv:
    """`two-first-tokens`: two turns, each with its own correct first character (TURN_RULES).

    Each turn earns a step reward of 1 when its reply starts right (turns[].reward_step); the outcome reward
    (`score`) is 1 only when both do. It exists to show turn-level credit: with the step rewards a wrong
    second turn does not blame a right first one.
    """

    name = TWO_ENV_NAME
    version = TWO_ENV_VERSION
    tool_format = None  # no tools: the reply text is the whole action
    final_state_truncated = None

    def __init__(self) -> None:
        self.replies: list[str] = []

    def parse_action(self, text: str) -> Action:
        return Action(text=text)

    async def reset(self, task: dict[str, Any]) -> EnvReset:
        self.replies = []
        return EnvReset(messages=[{"role": "user", "content": task.get("prompt", "Say something.")}], tools=[])

    async def step(self, action: Action) -> StepResult:
        turn = len(self.replies)
        if turn >= len(TURN_RULES):
            raise RuntimeError(f"{TWO_ENV_NAME} has {len(TURN_RULES)} turns; step called after the last")
        self.replies.append(action.text)
        hit = float(TURN_RULES[turn][1](action.text))
        if turn + 1 < len(TURN_RULES):
            return StepResult(observations=[{"role": "user", "content": SECOND_PROMPT}], done=False, reward_step=hit)
        return StepResult(observations=[], done=True, final_state=json.dumps(self.replies), reward_step=hit,
                          finish_reason="submit")

    async def final_state(self) -> str | None:
        return json.dumps(self.replies)  # ended by a bound: the replies so far (scored 0: not every turn)

    async def close(self) -> None:
        pass


def score_two(final_state: str | None, task: dict[str, Any], response_text: str) -> tuple[float, dict, dict]:
    """1 when every turn's reply starts right, else 0; components say which turns did."""
    replies = json.loads(final_state) if final_state else []
    if not (isinstance(replies, list) and all(isinstance(r, str) for r in replies)):
        raise ValueError("final_state is not a JSON list of replies")
    hits = {name: float(i < len(replies) and rule(replies[i])) for i, (name, rule) in enumerate(TURN_RULES)}
    return float(all(hits.values())), hits, {"first_chars": [r[:8] for r in replies]}


@register_task_source(TWO_ENV_NAME)
def _builtin_two(options: dict[str, str]) -> list[dict[str, Any]]:
    return _word_tasks(TWO_ENV_NAME, "tft", options)


register_env(TWO_ENV_NAME, TwoFirstTokensEnv, version=TWO_ENV_VERSION)
register_reward(TWO_ENV_NAME, score_two, TWO_REWARD_VERSION)
