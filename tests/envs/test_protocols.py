"""The Env and Policy protocols declare what the loop uses; as_env / as_policy fill in a third party's gaps;
env_factory makes one run's envs."""

from __future__ import annotations

import asyncio

import pytest

from arlctl.envs import registry
from arlctl.envs.base import Action, Env, EnvFactory, EnvReset, StepResult, as_env
from arlctl.envs.math import MathEnv
from arlctl.envs.swe.env import SweEnv
from arlctl.envs.toy import FirstTokenEnv
from arlctl.errors import UsageError
from arlctl.inference.base import Generation, Policy, SamplingParams, as_policy

TASK = {"task_id": "t1", "question": "What is 2 + 3?", "answer": "5", "prompt": "Say hi."}


class MinimalEnv:
    """What the README asks of a plugin env, and nothing more: async reset, step and close."""

    def __init__(self):
        self.closed = False

    async def reset(self, task):
        return EnvReset(messages=[{"role": "user", "content": task["prompt"]}], tools=[])

    async def step(self, action):
        return StepResult(observations=[], done=True, final_state=action.text.upper())

    async def close(self):
        self.closed = True


class CuttingEnv(MinimalEnv):
    """A plugin env with some optional parts of its own: they are used, not replaced by defaults."""

    name, version, tool_format = "cutting", {"rev": 3}, "bash"
    final_state_truncated = None

    def parse_action(self, text):
        return Action(text=text.strip())

    async def final_state(self):
        self.final_state_truncated = "cut at 4 bytes"
        return "abcd"


@pytest.mark.parametrize("make", [MathEnv, FirstTokenEnv, SweEnv])
def test_builtin_envs_are_full_envs_and_pass_through_unwrapped(make):
    env = make()
    assert isinstance(env, Env)
    assert as_env(env) is env


def test_as_env_fills_the_defaults_the_loop_assumes():
    raw = MinimalEnv()
    env = as_env(raw)
    assert isinstance(env, Env) and as_env(env) is env  # wrapping twice is a no-op
    assert (env.name, env.version, env.tool_format, env.final_state_truncated) == ("MinimalEnv", "", None, None)
    assert env.parse_action("<tool_call>{}</tool_call>") is None  # None: the family's parser reads the turn

    async def episode():
        reset = await env.reset(TASK)
        step = await env.step(Action(text="hi"))
        after_bound = await env.final_state()
        await env.close()
        return reset, step, after_bound

    reset, step, after_bound = asyncio.run(episode())
    assert reset.messages == [{"role": "user", "content": "Say hi."}]
    assert step.final_state == "HI" and after_bound is None and raw.closed


def test_as_env_uses_the_optional_parts_an_env_has_and_reads_them_live():
    env = as_env(CuttingEnv())
    assert (env.name, env.version, env.tool_format) == ("cutting", {"rev": 3}, "bash")
    assert env.parse_action("  ls  ").text == "ls"
    assert env.final_state_truncated is None
    assert asyncio.run(env.final_state()) == "abcd"
    assert env.final_state_truncated == "cut at 4 bytes"  # set by the env during final_state(): seen through


def test_as_env_refuses_an_object_without_the_required_methods():
    with pytest.raises(UsageError, match="a str without reset, step, close is not an env"):
        as_env("not an env")


def test_an_env_factory_hands_out_a_plugin_env_as_a_full_env(monkeypatch):
    monkeypatch.setitem(registry.ENVS, "minimal-test", MinimalEnv)
    assert type(registry.make_env("minimal-test")) is MinimalEnv  # make_env: the plugin's own object
    env = registry.env_factory("minimal-test")()
    assert isinstance(env, Env) and env.tool_format is None and env.parse_action("x") is None


def test_a_plain_env_factory_makes_a_fresh_env_per_call_and_checks_options_up_front():
    factory = registry.env_factory("math", on_no_action="end")
    assert isinstance(factory, EnvFactory) and factory.name == "math"
    first, second = factory(), factory()
    assert first is not second and first.on_no_action == "end"
    asyncio.run(factory.aclose())  # nothing shared: a no-op, and the factory still works after it
    assert isinstance(factory(), Env)
    with pytest.raises(UsageError, match="bad option for env 'math'"):
        registry.env_factory("math", colour="red")
    with pytest.raises(UsageError, match="unknown env 'chess'"):
        registry.env_factory("chess")


class BareTokenizer:
    def __len__(self):
        return 100


class BarePolicy:
    """A policy object with only the required members, as a test double or an out-of-tree backend has."""

    name, version, tokenizer = "bare", 0, BareTokenizer()

    async def generate(self, prompt_ids, sampling):
        return Generation(ids=[7], logprobs=[0.0], finish_reason="stop", version=self.version)

    async def reload(self, policy_dir, version):
        self.version = version

    async def close(self):
        pass


def test_as_policy_fills_the_defaults_and_writes_version_through():
    raw = BarePolicy()
    policy = as_policy(raw)
    assert isinstance(policy, Policy) and as_policy(policy) is policy
    assert (policy.vocab_size, policy.max_context, policy.metrics()) == (100, None, {})
    asyncio.run(policy.reload("/nowhere", 4))
    assert raw.version == 4 and policy.version == 4
    assert asyncio.run(policy.generate([1, 2], SamplingParams())).ids == [7]


def test_as_policy_keeps_what_a_policy_reports_and_falls_back_on_an_unknown_vocab_size():
    class Reporting(BarePolicy):
        vocab_size, max_context = None, 2048  # None: does not know; the tokenizer's size is used

    policy = as_policy(Reporting())
    assert (policy.vocab_size, policy.max_context, policy.metrics()) == (100, 2048, {})

    class Full(Reporting):
        vocab_size = 64

        def metrics(self):
            return {"tokens_per_s": 1.5}

    full = Full()
    assert as_policy(full) is full and (full.vocab_size, full.metrics()) == (64, {"tokens_per_s": 1.5})
