"""`first-token`: a one-turn environment whose reward depends only on the first generated token.

It exists to prove that the whole loop learns: with a random tiny model about half of the first tokens
begin with a space, and reinforcing those is something a few dozen GRPO steps can do. Reward 1 when the
reply's first character is a space (the byte-level BPE "Ġ" tokens), else 0.
"""

from __future__ import annotations

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


@register_task_source(ENV_NAME)
def _builtin(options: dict[str, str]) -> list[dict[str, Any]]:
    source = f"builtin:{ENV_NAME}"
    n = int_option(options, "n", 64, source)
    seed = int_option(options, "seed", 0, source)
    reject_unknown_options(options, source, ["n", "seed"])
    words = ["apple", "river", "stone", "cloud", "lamp", "tiger", "paper", "music"]
    return [{"task_id": f"ft-{seed}-{i}", "env": ENV_NAME,
             "prompt": f"Write a word after {words[(seed * 7 + i) % len(words)]} number {i}."} for i in range(n)]


register_env(ENV_NAME, FirstTokenEnv, version=ENV_VERSION)
register_reward(ENV_NAME, score, REWARD_VERSION)
