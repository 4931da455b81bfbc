"""One run's swe envs come from one factory that owns their sandbox pools (no process-global state);
an env made on its own owns a private pool. The swe oracle is a full Policy."""

from __future__ import annotations

import pytest
from swe_helpers import run

from arlctl.envs import registry
from arlctl.envs.base import Env, EnvFactory
from arlctl.envs.swe.tasks import load_suite_task
from arlctl.errors import UsageError
from arlctl.inference.base import Policy, as_policy

TASK = "stockroom-001"


def test_a_factorys_envs_share_its_warm_pool_and_aclose_closes_it(bwrap):
    async def go():
        factory = registry.env_factory("swe", sandboxes=2)
        assert isinstance(factory, EnvFactory) and factory.name == "swe"
        task = load_suite_task(TASK)
        first, second = factory(), factory()
        assert isinstance(first, Env) and first is not second
        await first.reset(task)
        await second.reset(task)
        held = {first.sandbox, second.sandbox}
        await first.close()
        third = factory()
        await third.reset(task)  # the pool's other sandbox, or first's once reset: never a new pool
        reused = third.sandbox in held
        await second.close()
        await third.close()
        await factory.aclose()
        closed = [await sb.health(2.0) for sb in held]
        # usable again after aclose: a fresh pool
        fourth = factory()
        await fourth.reset(task)
        fresh = fourth.sandbox not in held
        await fourth.close()
        await factory.aclose()
        return len(held), reused, closed, fresh

    distinct, reused, closed, fresh = run(go())
    assert distinct == 2 and reused  # pool size 2: the third env got one of the pool's two
    assert closed == [False, False] and fresh  # aclose closed the pool's sandboxes


def test_an_env_made_on_its_own_closes_its_private_pool(bwrap):
    async def go():
        env = registry.make_env("swe")
        await env.reset(load_suite_task(TASK))
        sandbox = env.sandbox
        alive = await sandbox.health(2.0)
        await env.close()
        return alive, await sandbox.health(2.0)

    assert run(go()) == (True, False)


def test_a_bad_swe_option_fails_when_the_factory_is_made():
    with pytest.raises(UsageError, match="swe mode must be"):
        registry.env_factory("swe", mode="chat")


def test_the_oracle_is_a_full_policy(tokenizer):
    from arlctl.envs.swe.oracle import OraclePolicy

    oracle = OraclePolicy(tokenizer)
    assert isinstance(oracle, Policy) and as_policy(oracle) is oracle
    assert (oracle.vocab_size, oracle.max_context, oracle.metrics()) == (len(tokenizer), None, {})
