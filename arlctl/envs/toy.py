"""Toy environments whose reward depends only on the first generated token of each turn.

`first-token`: one turn. It exists to prove that the whole loop learns: with a random tiny model about half
of the first tokens begin with a space, and reinforcing those is something a few dozen GRPO steps can do.
Reward 1 when the reply's first character is a space (the byte-level BPE "Ġ" tokens), else 0.

`two-first-tokens`: two turns, each with its own rule for its first character (a class from
FIRST_CHAR_RULES: space then letter unless the task's `rules` say otherwise), a step reward of 1 per turn
that follows its rule and an outcome of 1 only when both do: the test bed of turn-level credit
(`filter --adv turn`, docs/learning/turn_credit.md). `builtin:two-first-tokens?rules=upper,lower_or_space`
picks the rules.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from arlctl.envs.base import Action, EnvReset, StepResult
from arlctl.envs.registry import register_env, register_reward
from arlctl.envs.tasks import int_option, register_task_source, reject_unknown_options
from arlctl.errors import UsageError

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


# The first-character classes a turn's rule can ask for (task option `rules=`). The tiny random model
# (arlctl/models.py make_tiny) ignores its context and starts a reply with a space 65% of the time, a lower-case
# ASCII letter 24%, an upper-case one 8% (docs/learning/turn_credit.md has the measurement).
FIRST_CHAR_RULES: dict[str, Callable[[str], bool]] = {
    "space": lambda c: c == " ",
    "letter": lambda c: c.isascii() and c.isalpha(),
    "upper": lambda c: c.isascii() and c.isupper(),
    "lower": lambda c: c.isascii() and c.islower(),
    "lower_or_space": lambda c: c == " " or (c.isascii() and c.islower()),
    "a_to_m": lambda c: c.isascii() and "a" <= c.lower() <= "m",
    "n_to_z": lambda c: c.isascii() and "n" <= c.lower() <= "z",
}
# The default rules, one per turn: a space, then a letter (the model hits each a third of the time or more).
DEFAULT_RULES: tuple[str, ...] = ("space", "letter")


def _rules_of(task: dict[str, Any]) -> tuple[str, ...]:
    """The task's rule names, one per turn (task["rules"]: a list or "A,B"; else DEFAULT_RULES); an unknown
    one raises."""
    raw = task.get("rules") or DEFAULT_RULES
    rules = tuple(raw.split(",") if isinstance(raw, str) else raw)
    unknown = [r for r in rules if r not in FIRST_CHAR_RULES]
    if unknown or len(rules) < 2 or len(set(rules)) != len(rules):
        raise ValueError(f"{TWO_ENV_NAME}: rules {list(rules)} must be two or more distinct names from "
                         f"{', '.join(FIRST_CHAR_RULES)}")
    return rules


def follows(rule: str, text: str) -> bool:
    """Whether `text` starts with a character of the class `rule` names."""
    return bool(text) and FIRST_CHAR_RULES[rule](text[0])


# The default rules as (component name, test of a reply) pairs, one per turn.
TURN_RULES: tuple[tuple[str, Callable[[str], bool]], ...] = tuple(
    (f"{rule}_first", lambda text, rule=rule: follows(rule, text)) for rule in DEFAULT_RULES)


class TwoFirstTokensEnv:
    """`two-first-tokens`: two turns, each with its own correct first character (the task's rules).

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
        self.rules: tuple[str, ...] = DEFAULT_RULES

    def parse_action(self, text: str) -> Action:
        return Action(text=text)

    async def reset(self, task: dict[str, Any]) -> EnvReset:
        self.replies = []
        self.rules = _rules_of(task)
        return EnvReset(messages=[{"role": "user", "content": task.get("prompt", "Say something.")}], tools=[])

    async def step(self, action: Action) -> StepResult:
        turn = len(self.replies)
        if turn >= len(self.rules):
            raise RuntimeError(f"{TWO_ENV_NAME} has {len(self.rules)} turns; step called after the last")
        self.replies.append(action.text)
        hit = float(follows(self.rules[turn], action.text))
        if turn + 1 < len(self.rules):
            return StepResult(observations=[{"role": "user", "content": SECOND_PROMPT}], done=False, reward_step=hit)
        return StepResult(observations=[], done=True, final_state=json.dumps(self.replies), reward_step=hit,
                          finish_reason="submit")

    async def final_state(self) -> str | None:
        return json.dumps(self.replies)  # ended by a bound: the replies so far (scored 0: not every turn)

    async def close(self) -> None:
        pass


def score_two(final_state: str | None, task: dict[str, Any], response_text: str) -> tuple[float, dict, dict]:
    """1 when every turn's reply starts right, else 0; components (RULE_first) say which turns did."""
    replies = json.loads(final_state) if final_state else []
    if not (isinstance(replies, list) and all(isinstance(r, str) for r in replies)):
        raise ValueError("final_state is not a JSON list of replies")
    hits = {f"{rule}_first": float(i < len(replies) and follows(rule, replies[i]))
            for i, rule in enumerate(_rules_of(task))}
    return float(all(hits.values())), hits, {"first_chars": [r[:8] for r in replies]}


@register_task_source(TWO_ENV_NAME)
def _builtin_two(options: dict[str, str]) -> list[dict[str, Any]]:
    """`builtin:two-first-tokens?n=&seed=&rules=A,B`: the word prompts, each carrying the turns' rules."""
    raw = options.pop("rules", None)
    try:
        rules = _rules_of({"rules": raw})  # checked here, before any rollout
    except ValueError as err:
        raise UsageError(f"builtin:{TWO_ENV_NAME}: option rules={raw!r}: {err}") from None
    tasks = _word_tasks(TWO_ENV_NAME, "tft", options)
    if raw is None:
        return tasks  # the default rules: the tasks are exactly what they were before the option existed
    return [{**task, "task_id": f"{task['task_id']}-{'-'.join(rules)}", "rules": list(rules)} for task in tasks]


register_env(TWO_ENV_NAME, TwoFirstTokensEnv, version=TWO_ENV_VERSION)
register_reward(TWO_ENV_NAME, score_two, TWO_REWARD_VERSION)
