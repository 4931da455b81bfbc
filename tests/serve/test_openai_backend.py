"""The openai backend against real OpenAI-compatible servers: two `arlctl serve` apps on 127.0.0.1.

`arlctl serve` answers /v1/completions with token-id prompts, `token_ids` and `token_id:N` log-prob
tokens like vLLM, so routing, failover and exactness are tested here in the default tier; the same
tests against real `vllm serve` processes live in tests/vllm/.
"""

from __future__ import annotations

import asyncio

import pytest
from serve_helpers import Server

from arlctl.errors import TransientError
from arlctl.inference.base import SamplingParams, route_key
from arlctl.inference.fleet import Server as Endpoint
from arlctl.inference.openai import OpenAIPolicy, StickyRouter, prefix_hashes
from arlctl.models import tiny_model_dir


def test_prefix_hashes_are_prefix_consistent():
    a, b = prefix_hashes([5, 6, 7]), prefix_hashes([5, 6, 7, 8])
    assert a == b[:4] and a[0] == 0 and len(set(b)) == 5
    assert prefix_hashes([1, 2])[2] != prefix_hashes([2, 1])[2]


def test_router_sticks_by_prefix_and_key_and_balances_first_turns():
    s1, s2 = Endpoint("http://a"), Endpoint("http://b")
    router = StickyRouter([s1, s2])
    assert router.pick([1, 2, 3], None) is s1
    s1.in_flight = 1  # a trajectory is running there: the next new one goes to the idle server
    assert router.pick([9, 9], None) is s2
    router.remember(s1, [1, 2, 3], [4, 5], None)
    assert router.pick([1, 2, 3, 4, 5, 6, 7], None) is s1  # the next turn extends prompt + generated ids
    assert router.pick([1, 2, 3, 4, 6], None) is s2  # not an extension: least loaded
    router.remember(s2, [7], [8], "traj-1")
    assert router.pick([0], "traj-1") is s2
    s2.healthy = False
    assert router.pick([0], "traj-1") is s1  # its server died: fail over
    s1.healthy = False
    with pytest.raises(TransientError):
        router.pick([0], None)


@pytest.fixture(scope="module")
def fleet():
    servers = [Server(None), Server(None)]
    yield servers
    for srv in servers:
        if srv.thread.is_alive():
            srv.stop()


async def _trajectory(policy: OpenAIPolicy, prompt: list[int], turns: int) -> tuple[list[str], list[int]]:
    ids, seen = list(prompt), []
    for turn in range(turns):
        gen = await policy.generate(ids, SamplingParams(max_new_tokens=4, seed=turn))
        assert len(gen.ids) == len(gen.logprobs) > 0
        seen.append(gen.info["server"])
        ids += gen.ids + [13, 42]  # an observation segment, then the next turn
    return seen, ids


@pytest.mark.slow
def test_sticky_routing_and_failover(fleet):
    urls = [srv.url for srv in fleet]  # .../v1; the backend strips it
    policy = OpenAIPolicy(urls, str(tiny_model_dir()), name="tiny", backoff_s=0.05, down_s=60)

    async def go():
        prompts = [[1, 2, 3 + i] for i in range(4)]
        results = await asyncio.gather(*(_trajectory(policy, p, 3) for p in prompts))
        routes = [r[0] for r in results]
        for seen in routes:
            assert len(set(seen)) == 1  # every turn of a trajectory on one server
        assert {r[0] for r in routes} == {_base(u) for u in urls}  # first turns spread over both

        async def keyed():
            route_key.set("traj-x")
            return [(await policy.generate([7, 7, 7 + i], SamplingParams(max_new_tokens=2))).info["server"]
                    for i in range(3)]

        assert len(set(await keyed())) == 1  # explicit key: sticky although the prompts differ
        # Kill the server of trajectory 0; its next turn fails over to the other one.
        victim = routes[0][0]
        dead = next(s for s in fleet if _base(s.url) == victim)
        await asyncio.to_thread(dead.stop)
        gen = await policy.generate(results[0][1], SamplingParams(max_new_tokens=4))  # its 4th turn
        assert gen.info["server"] != victim and len(gen.ids) > 0
        assert policy.stats["failovers"] == 1
        assert not next(s for s in policy.servers if s.url == victim).healthy
        await policy.close()

    asyncio.run(go())


def _base(url: str) -> str:
    return url[:-3]
