"""The rollout stores where each trajectory's env ran (env_info, schema v3) on every status: the env's
optional env_info(), read after the episode and before close; a topped-up member lists the attempt it
replaced; an env without env_info (math) writes null; a broken env_info() is counted, never fatal.

The envs here are small plugin envs (the README's plugin shape: async reset/step/close) run by the real
loop on the real tiny model.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from arlctl.envs.base import EnvFailure, EnvReset, StepResult, as_env, env_info
from arlctl.envs.registry import make_env
from arlctl.inference.loader import load_policy
from arlctl.schemas.rows import rows_to_table
from arlctl.stages.agent_loop import RolloutConfig, Stats
from arlctl.stages.rollout import rollout

TASK = {"task_id": "t1", "question": "What is 2 + 3?", "answer": "5", "prompt": "Say hi."}


@pytest.fixture(scope="module")
def policy():
    pol = load_policy("tiny", max_batch=8, progress=False)
    yield pol
    asyncio.run(pol.close())


class PlacedEnv:
    """A plugin env that runs 'somewhere': attempt k of the whole run lands on hosts[k]; an attempt whose
    host is in `broken` fails at its first step (EnvFailure: infrastructure), others end at once."""

    made = 0

    def __init__(self, hosts: list[str], broken: set[str] = frozenset(), info_error: bool = False):
        self.host = hosts[PlacedEnv.made % len(hosts)]
        PlacedEnv.made += 1
        self.broken, self.info_error, self.closed = broken, info_error, False

    def env_info(self):
        if self.info_error:
            raise RuntimeError("placement service down")
        assert not self.closed, "env_info must be read before close"
        return {"sandbox": "fake", "host": self.host}

    async def reset(self, task):
        return EnvReset(messages=[{"role": "user", "content": task["prompt"]}], tools=[])

    async def step(self, action):
        if self.host in self.broken:
            raise EnvFailure(f"host {self.host} went away")
        return StepResult(observations=[], done=True, final_state="done")

    async def close(self):
        self.closed = True


def _run(policy, make_env_fn, **cfg_options):
    cfg = RolloutConfig(**{"env": "placed", "group_size": 2, "concurrency": 2, "max_turns": 2,
                           "max_new_tokens": 4, "seed": 1, **cfg_options})
    rows: list = []
    stats = Stats()

    async def sink(group):
        rows.extend(group)

    asyncio.run(rollout([dict(TASK)], policy, make_env_fn, cfg, sink, stats))
    return rows, stats


def test_every_row_records_its_env_info_ok_and_env_error_alike(policy):
    PlacedEnv.made = 0
    rows, _ = _run(policy, lambda: PlacedEnv(["node-a", "node-b"], broken={"node-b"}))
    by_host = {r.env_info["host"]: r for r in rows}
    assert set(by_host) == {"node-a", "node-b"}
    assert by_host["node-a"].status in ("ok", "truncated") and by_host["node-b"].status == "env_error"
    assert all(r.env_info["sandbox"] == "fake" for r in rows)
    stored = rows_to_table(rows).column("env_info").to_pylist()
    assert sorted(json.loads(s)["host"] for s in stored) == ["node-a", "node-b"]


def test_a_topped_up_member_says_which_attempt_it_replaced(policy):
    PlacedEnv.made = 0
    # group of 1: attempt 0 on node-a breaks, the top-up (attempt 1) lands on node-b and finishes
    rows, stats = _run(policy, lambda: PlacedEnv(["node-a", "node-b"], broken={"node-a"}), group_size=1,
                       max_top_up=1)
    [row] = rows
    assert stats.top_ups == 1 and row.status in ("ok", "truncated")  # truncated: a reply the budget cut
    assert row.env_info == {"sandbox": "fake", "host": "node-b",
                            "replaced_from": [{"sandbox": "fake", "host": "node-a", "cause": "env_error",
                                               "attempt": 0}]}


def test_per_turn_rows_all_carry_the_env_info(policy):
    class TwoTurns(PlacedEnv):
        steps = 0

        async def step(self, action):
            self.steps += 1
            return StepResult(observations=[{"role": "user", "content": "more"}], done=self.steps >= 2,
                              final_state="done" if self.steps >= 2 else None)

    PlacedEnv.made = 0
    rows, _ = _run(policy, lambda: TwoTurns(["node-c"]), group_size=1, history="per-turn", max_new_tokens=2)
    assert len(rows) == 2 and [r.finish_reason for r in rows][0] == "continued"
    assert [r.env_info for r in rows] == [{"sandbox": "fake", "host": "node-c"}] * 2


def test_no_env_info_is_null_and_a_broken_one_is_counted(policy):
    math_rows, _ = _run(policy, lambda: make_env("math"), env="math", group_size=1)
    assert [r.env_info for r in math_rows] == [None]
    assert rows_to_table(math_rows).column("env_info").to_pylist() == [None]
    PlacedEnv.made = 0
    rows, stats = _run(policy, lambda: PlacedEnv(["node-a"], info_error=True), group_size=1)
    assert [(r.status in ("ok", "truncated"), r.env_info) for r in rows] == [(True, None)]  # the row survives,
    # its column null (truncated: a reply the budget cut)
    assert stats.causes.get("env_info_error") == 1 and "placement service down" in stats.last_error


def test_env_info_reads_through_as_env_and_refuses_a_non_dict():
    class Plugin:
        async def reset(self, task): ...
        async def step(self, action): ...
        async def close(self): ...

        def env_info(self):
            return {"sandbox": "plugin"}

    wrapped = as_env(Plugin())
    assert wrapped is not None and env_info(wrapped) == {"sandbox": "plugin"}
    assert env_info(make_env("math")) is None  # no env_info member: no sandbox

    class Wrong(Plugin):
        def env_info(self):
            return "node-a"

    with pytest.raises(TypeError, match=r"Wrong.env_info\(\) returned a str, not a dict or None"):
        env_info(Wrong())
