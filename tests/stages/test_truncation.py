"""Cut replies say so (issue 27 item 4): a trajectory that ends on a reply a token budget cut is status
truncated with finish_reason "length", its last turn naming the budget; a cut turn the episode goes on after
is an ordinary turn. Through the real agent loop with scripted policies (the real tokenizer) and small envs.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from arlctl import models
from arlctl.envs.base import Action, EnvReset, StepResult
from arlctl.inference.scripted import ScriptedPolicy
from arlctl.schemas.rows import rows_to_table
from arlctl.schemas.trajectory import validate
from arlctl.stages.agent_loop import RolloutConfig
from arlctl.stages.rollout import rollout

LONG = " word" * 40  # 40 tokens: longer than every --max-new-tokens below
SHORT = " ok"


class OneTurnEnv:
    """Ends the episode at its first step with the reply as the answer (as the math and code envs do)."""

    name, version, tool_format, final_state_truncated = "one-turn", "1", None, None

    def parse_action(self, text: str) -> Action:
        return Action(text=text)

    async def reset(self, task: dict[str, Any]) -> EnvReset:
        return EnvReset(messages=[{"role": "user", "content": "Say something."}], tools=[])

    async def step(self, action: Action) -> StepResult:
        return StepResult(observations=[], done=True, final_state=action.text, finish_reason="submit")

    async def final_state(self) -> str | None:
        return None

    async def close(self) -> None:
        pass


class UntilDoneEnv(OneTurnEnv):
    """Goes on (observation "next N") until a reply says DONE."""

    name = "until-done"

    def __init__(self) -> None:
        self.steps = 0

    async def step(self, action: Action) -> StepResult:
        self.steps += 1
        if "DONE" in action.text:
            return StepResult(observations=[], done=True, final_state=action.text, finish_reason="submit")
        return StepResult(observations=[{"role": "user", "content": f"next {self.steps}"}], done=False)


def scripted(script) -> ScriptedPolicy:
    return ScriptedPolicy(models.smollm2_tokenizer(), "scripted", script)


def roll(script, env_factory, **settings) -> list:
    cfg = RolloutConfig(group_size=1, concurrency=1, seed=0, **settings)
    rows: list = []

    async def sink(group):
        rows.extend(group)

    asyncio.run(rollout([{"task_id": "t0"}], scripted(script), env_factory, cfg, sink))
    validate(rows_to_table(rows))  # the writers' own check: "length" is in the vocabulary
    return rows


def test_a_reply_longer_than_max_new_tokens_ends_length_truncated():
    (row,) = roll(lambda prompt: LONG, OneTurnEnv, max_new_tokens=8)
    assert (row.status, row.finish_reason) == ("truncated", "length")
    assert row.turns[-1].gen_len == 8
    assert row.turns[-1].error == "length: the reply reached --max-new-tokens (8 tokens); the env ended it (submit)"
    assert row.env_errors == 0  # the cut is not an env error


def test_a_reply_that_fits_is_ok_with_the_envs_reason():
    (row,) = roll(lambda prompt: SHORT, OneTurnEnv, max_new_tokens=8)
    assert (row.status, row.finish_reason, row.turns[-1].error) == ("ok", "submit", None)


def test_a_cut_turn_the_episode_goes_on_after_is_an_ordinary_turn():
    # Turn 0 is cut (not DONE: the env goes on); turn 1 fits and says DONE: the trajectory ends ok.
    rows = roll(lambda prompt: " DONE" if "next 1" in prompt else LONG, UntilDoneEnv, max_new_tokens=8, max_turns=3)
    (row,) = rows
    assert (row.status, row.finish_reason, len(row.turns)) == ("ok", "submit", 2)
    assert row.turns[0].gen_len == 8 and row.turns[0].error is None


def test_the_last_allowed_turn_cut_is_length_not_max_turns():
    (row,) = roll(lambda prompt: LONG, UntilDoneEnv, max_new_tokens=8, max_turns=2)
    assert (row.status, row.finish_reason, len(row.turns)) == ("truncated", "length", 2)
    assert row.turns[-1].error == "length: the reply reached --max-new-tokens (8 tokens)"


def test_the_trajectory_budget_names_max_tokens():
    # Turn 0: 8 generated + a 14-token observation segment = 22. With --max-tokens 30, turn 1 may generate
    # min(8, 30 - 22) = 8: both budgets bind, and the trajectory's is named (raising --max-new-tokens alone
    # would not help). With --max-tokens 20 nothing is left before turn 1.
    (row,) = roll(lambda prompt: LONG, UntilDoneEnv, max_new_tokens=8, max_tokens=30, max_turns=5)
    assert [(t.gen_len, t.obs_len) for t in row.turns] == [(8, 14), (8, 0)]
    assert (row.status, row.finish_reason) == ("truncated", "length")
    assert row.turns[-1].error == "length: the trajectory reached --max-tokens (30 response tokens)"
    (row,) = roll(lambda prompt: LONG, UntilDoneEnv, max_new_tokens=8, max_tokens=20, max_turns=5)
    assert (row.status, row.finish_reason, len(row.turns)) == ("truncated", "length", 1)
    assert row.turns[-1].error == "length: the trajectory reached --max-tokens (20 response tokens), before turn 1"


def test_the_context_limit_names_the_context():
    (row,) = roll(lambda prompt: LONG, OneTurnEnv, max_new_tokens=64, max_context=40)
    prompt = len(row.prompt_ids)
    assert prompt < 40 and row.turns[-1].gen_len == 40 - prompt  # the context, not --max-new-tokens, bound it
    assert (row.status, row.finish_reason) == ("truncated", "length")
    assert row.turns[-1].error.startswith("length: the context reached the policy's limit (40 tokens)")


@pytest.mark.slow
def test_per_turn_rows_of_a_cut_trajectory_count_no_env_error():
    rows = roll(lambda prompt: LONG, UntilDoneEnv, max_new_tokens=8, max_turns=2, history="per-turn")
    assert [r.finish_reason for r in rows] == ["continued", "length"]
    assert {r.status for r in rows} == {"truncated"}
    assert [r.env_errors for r in rows] == [0, 0]
