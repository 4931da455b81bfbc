"""Where a swe episode ran, recorded in its row (env_info, schema v3), over real bwrap sandboxes: the rollout
stores SweEnv.env_info() on every row; a lease that the pool moved off a dead sandbox says so.
"""

from __future__ import annotations

import asyncio
import json
import socket

from swe_helpers import run

from arlctl.envs.swe.env import SweEnv, SweEnvFactory
from arlctl.envs.swe.sandboxes import PoolProvider
from arlctl.envs.swe.tasks import load_suite_task, prepare_snapshot
from arlctl.inference.scripted import ScriptedPolicy
from arlctl.io.shards import Lineage, read_shard, shard_name, write_shard
from arlctl.schemas.rows import rows_to_table
from arlctl.stages.agent_loop import RolloutConfig, Stats
from arlctl.stages.rollout import rollout

TASK = "stockroom-001"


def _call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_swe_rows_record_the_bwrap_sandbox_they_ran_in(bwrap, tokenizer, tmp_path):
    def script(prompt: str) -> str:
        turn = prompt.count("<|im_start|>assistant") - 1
        return _call("bash", command="echo one > mark.txt") if turn == 0 else _call("submit")

    factory = SweEnvFactory(sandbox="bwrap", sandboxes=2)
    cfg = RolloutConfig(env="swe", group_size=2, concurrency=2, max_turns=3, max_new_tokens=200, step_timeout=60)
    rows: list = []

    async def sink(group):
        rows.extend(group)

    async def main():
        try:
            await rollout([load_suite_task(TASK)], ScriptedPolicy(tokenizer, "scripted", script), factory, cfg,
                          sink, Stats())
            return {sb.id for pool in factory._provider._pools.values() for sb in pool._all}
        finally:
            await factory.aclose()

    pool_ids = run(main())
    assert [r.status for r in rows] == ["ok", "ok"] and all(r.finish_reason == "submit" for r in rows)
    for row in rows:
        assert row.env_info == {"sandbox": "bwrap", "host": socket.gethostname(), "id": row.env_info["id"]}
        assert row.env_info["id"] in pool_ids  # a sandbox of the run's pool, not a made-up name
    assert len({r.env_info["id"] for r in rows}) == 2  # two trajectories in flight: two sandboxes
    # Through a committed shard and back: one JSON object per row.
    path = write_shard(rows_to_table(rows), str(tmp_path / shard_name("rollout")), Lineage("rollout"))
    stored = [json.loads(text) for text in read_shard(path).column("env_info").to_pylist()]
    assert stored == [r.env_info for r in rows]


def test_a_lease_moved_off_a_dead_sandbox_records_where_it_came_from(bwrap):
    """The pool's one idle sandbox dies between episodes (closed under the pool, as a crash looks to the
    health check). The next episode gets its replacement, and env_info names both."""
    task = load_suite_task(TASK)
    snapshot = prepare_snapshot(task)

    async def main():
        provider = PoolProvider("bwrap", sandboxes=1, pool_size=1)
        try:
            first = SweEnv(provider=provider)
            await first.reset(task)
            before = first.env_info()
            await first.close()
            assert first.env_info() == before  # still answerable after close, for the row
            pool = provider._pools[snapshot]
            await pool.drain()  # the released sandbox is reset and idle again
            [dead] = list(pool._all)
            await dead.close()
            second = SweEnv(provider=provider)
            await second.reset(task)
            after = second.env_info()
            await second.close()
            return before, dead.id, after
        finally:
            await provider.close()

    before, dead_id, after = run(main())
    assert before == {"sandbox": "bwrap", "host": socket.gethostname(), "id": dead_id}
    assert after["sandbox"] == "bwrap" and after["id"] != dead_id
    assert after["replaced_from"] == [{**before, "cause": "health_check"}]


def test_a_swe_env_with_no_sandbox_yet_reports_none_and_a_tainted_one_says_why(bwrap):
    async def main():
        env = SweEnv(sandboxes=1)
        nothing = env.env_info()
        try:
            await env.reset(load_suite_task(TASK))
            result = await env.sandbox.exec("sleep 5", timeout=0.5)  # a command that times out taints it
            return nothing, result.timed_out, env.env_info()
        finally:
            await env.close()

    nothing, timed_out, info = asyncio.run(main())
    assert nothing is None
    assert timed_out and info["taint_reason"] == "tainted" and info["sandbox"] == "bwrap"
