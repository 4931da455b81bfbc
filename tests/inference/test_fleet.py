"""The elastic fleet of the openai backend, against real `arlctl serve` engines on 127.0.0.1.

Engines are the real serve app over the tiny model: in threads (tapped, so a test can see which engine
served which request and exactly which ids it was sent) and one `arlctl serve` process (for SIGKILL and a
second policy version). Shown here: an engine added mid-run takes first turns; a removed engine keeps
its own trajectories and takes no new ones; a trajectory whose engine disappears moves with its full
token prefix and comes out identical to the same trajectory run without moving; a killed engine fails
over with no trajectory lost; each turn records the version of the engine that served it; the metrics
row carries per-engine columns, the prefix-cache hit rate "not reported" where there is no /metrics.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pyarrow.parquet as pq
import pytest
from fleet_helpers import ProcessEngine, ThreadEngine, TurnsEnv, turn_requests, versioned_tiny
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.errors import TerminalError, UsageError
from arlctl.inference.base import SamplingParams
from arlctl.inference.fleet import (
    CacheCounters,
    Fleet,
    edit_fleet,
    fleet_path,
    parse_prometheus,
    parse_servers,
    read_servers_file,
)
from arlctl.inference.openai import OpenAIPolicy
from arlctl.models import tiny_model_dir
from arlctl.stages.agent_loop import RolloutConfig
from arlctl.stages.rollout import rollout

PROC_VERSION = 5


@pytest.fixture(scope="module")
def proc_engine(tmp_path_factory):
    """`arlctl serve` on a version-5 copy of the tiny model, started first: it boots while other tests run."""
    root = tmp_path_factory.mktemp("proc")
    engine = ProcessEngine(str(versioned_tiny(root / "policy-v5", PROC_VERSION)), root / "serve.log")
    yield engine
    engine.kill()


@pytest.fixture(autouse=True, scope="module")
def _boot_early(proc_engine):
    yield


@pytest.fixture(scope="module")
def engines():
    made: list[ThreadEngine] = []

    def make(version: int = 0) -> ThreadEngine:
        made.append(ThreadEngine(version=version))
        return made[-1]

    yield make
    for engine in made:
        engine.stop()

# Every trajectory ran its 3 turns: the last reply hits max_new_tokens=5, so a row is ok or truncated
# (issue 27 item 4), never aborted or failed by the engine moves.
_COMPLETED = {"ok", "truncated"}


def _policy(servers=(), servers_file=None, **opts) -> OpenAIPolicy:
    defaults = {"poll_s": 0.05, "backoff_s": 0.05, "down_s": 0.2, "metrics_every_s": 0.2}
    return OpenAIPolicy(list(servers), str(tiny_model_dir()), name="tiny", servers_file=servers_file,
                        **{**defaults, **opts})


async def _seen(condition, timeout_s: float = 60.0) -> None:
    """Wait (in the rollout's own event loop) until `condition()` holds; fail instead of hanging."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the rollout ended or stalled before the fleet changed"
        await asyncio.sleep(0.01)


def _state(policy: OpenAIPolicy, engine) -> str | None:
    found = policy.fleet.get(engine.base)
    return None if found is None else found.state


async def _until(policy: OpenAIPolicy, done, timeout_s: float = 20.0) -> None:
    """Run fleet upkeep until `done()` holds (a membership change seen, a probe answered)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "the fleet did not settle"
        await policy.refresh()
        await asyncio.sleep(0.05)


# ----------------------------------------------------------------------------------------- the fleet file


def test_fleet_file_formats_and_concurrent_edits(tmp_path):
    assert parse_servers(b'{"servers": ["http://a:1/v1", "http://a:1", "https://b:2/"]}', "f") == \
        ["http://a:1", "https://b:2"]
    assert parse_servers(b"# engines\nhttp://a:1\n\nhttp://b:2  # the new one\n", "f") == ["http://a:1", "http://b:2"]
    assert parse_servers(b'[{"url": "http://c:3"}]', "f") == ["http://c:3"]
    with pytest.raises(TerminalError, match="not valid JSON"):
        parse_servers(b'{"servers": [', "f")
    with pytest.raises(UsageError, match="not an http"):
        parse_servers(b"ftp://x\n", "f")
    run = str(tmp_path / "run")
    assert read_servers_file(fleet_path(run)) == []
    # Eight writers at once, each adding its own engine: the lock keeps every one of them.
    urls = [f"http://10.0.0.{i}:8000" for i in range(8)]
    threads = [threading.Thread(target=edit_fleet, args=(run,), kwargs={"add": [u]}) for u in urls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(read_servers_file(fleet_path(run))) == sorted(urls)
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.endswith(".tmp")]  # nothing half-written


def test_fleet_cli_add_remove_list(tmp_path):
    runner = CliRunner()
    run = str(tmp_path / "run")
    out = runner.invoke(app, ["fleet", "add", run, "http://127.0.0.1:9/v1", "http://127.0.0.1:10", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["added"] == ["http://127.0.0.1:9", "http://127.0.0.1:10"]
    out = runner.invoke(app, ["fleet", "remove", run, "http://127.0.0.1:9", "--dry-run", "--json"])
    assert json.loads(out.stdout)["removed"] == ["http://127.0.0.1:9"]
    assert read_servers_file(fleet_path(run)) == ["http://127.0.0.1:9", "http://127.0.0.1:10"]  # dry run
    assert runner.invoke(app, ["fleet", "remove", run, "http://127.0.0.1:9"]).exit_code == 0
    out = runner.invoke(app, ["fleet", "list", run, "--probe", "--json"])
    (row,) = json.loads(out.stdout)["servers"]
    assert row["url"] == "http://127.0.0.1:10" and row["healthy"].startswith("no")  # nothing listens there
    assert runner.invoke(app, ["fleet", "add", run, "not-a-url"]).exit_code == 2


# ----------------------------------------------------------------------------------------- states, parsing


def test_fleet_states_drain_and_backoff(tmp_path):
    path = tmp_path / "fleet.json"
    path.write_text('{"servers": ["http://a:1", "http://b:2"]}')
    fleet = Fleet(["http://pinned:3"], str(path), down_s=1.0, down_max_s=3.0)
    a, b, pinned = fleet.get("http://a:1"), fleet.get("http://b:2"), fleet.get("http://pinned:3")
    assert (a.state, b.state, pinned.state) == ("joining", "joining", "active")
    fleet.probed(a, True, 0.0)
    fleet.apply(["http://b:2"])  # a (active) drains, b (still joining, serving nothing) stays
    assert (a.state, b.state, pinned.state) == ("draining", "joining", "active")
    fleet.apply([])  # b was never active: retired at once; the pinned engine is not the file's to remove
    assert (b.state, pinned.state) == ("gone", "active")
    # Ejection backoff doubles per consecutive failure, capped: 1, 2, 3 (cap), 3 seconds.
    downs = []
    for _ in range(4):
        fleet.fail(pinned, "HTTP 503", now=100.0)
        downs.append(pinned.down_until - 100.0)
    assert downs == [1.0, 2.0, 3.0, 3.0] and pinned.ejections == 4
    assert fleet.due_probes(102.0) == [] and fleet.due_probes(103.0) == [pinned]
    fleet.fail(a, "connection refused", now=5.0)  # a draining engine that fails is gone, not ejected
    assert a.state == "gone" and a.ejections == 0
    fleet.apply(["http://a:1"])  # listed again: joins afresh
    assert a.state == "joining"


VLLM_METRICS = """# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="policy"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="policy"} 200.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="policy"} 600.0
vllm:prefix_cache_hits_total{engine="1",model_name="policy"} 0.0
vllm:num_requests_running{engine="0",model_name="policy, with a } in a label"} 3.0
"""


def test_prefix_cache_hit_rate_from_prometheus_text():
    samples = parse_prometheus(VLLM_METRICS)
    assert samples["vllm:prefix_cache_queries_total"] == 1200.0  # summed over the two engine labels
    assert samples["vllm:num_requests_running"] == 3.0
    cache = CacheCounters()
    assert cache.update(samples) and cache.hit_rate() is None  # the window starts at the first scrape
    later = VLLM_METRICS.replace("} 1000.0", "} 1400.0").replace("} 600.0", "} 900.0")
    assert cache.update(parse_prometheus(later))
    assert cache.hit_rate() == pytest.approx((900 - 600) / (1600 - 1200))  # 300 hit of 400 queried = 0.75
    assert CacheCounters().update({"sglang:cache_hit_rate": 0.4})
    assert not CacheCounters().update({"vllm:num_requests_running": 1.0})  # no cache metric: not reported


# ----------------------------------------------------------------------------------------- against engines


async def _turn(policy: OpenAIPolicy, ids: list[int], turn: int) -> tuple[list[int], object]:
    """One turn: generate from the exact ids so far, then append an observation segment (mask-0 ids)."""
    gen = await policy.generate(ids, SamplingParams(max_new_tokens=5, seed=100 + turn))
    return ids + gen.ids + [198, 30, 198], gen


@pytest.mark.slow
def test_join_drain_and_move_keep_every_token(tmp_path, engines):
    a, b = engines(), engines()
    run = str(tmp_path / "run")
    edit_fleet(run, add=[a.base])
    policy = _policy(servers_file=fleet_path(run), drain_idle_s=60)

    async def go():
        await _until(policy, lambda: _state(policy, a) == "active")
        t1, g = await _turn(policy, [1, 2, 3], 0)
        assert (g.info["server"], g.info["route"]) == (a.base, "new")
        t2, _ = await _turn(policy, [1, 2, 4], 0)
        # b joins: the next first turn goes to it (nothing in flight anywhere; it has served least)
        edit_fleet(run, add=[b.base])
        await _until(policy, lambda: _state(policy, b) == "active")
        _, g = await _turn(policy, [1, 2, 5], 0)
        assert (g.info["server"], g.info["route"]) == (b.base, "new")
        # two first turns at once: the least loaded by requests in flight, so one each
        both = await asyncio.gather(_turn(policy, [7, 1], 0), _turn(policy, [7, 2], 0))
        assert {g.info["server"] for _, g in both} == {a.base, b.base}
        t1, g = await _turn(policy, t1, 1)
        assert (g.info["server"], g.info["route"]) == (a.base, "sticky")
        # a is removed: it drains; its own trajectories stay, new ones never go there
        edit_fleet(run, remove=[a.base])
        await _until(policy, lambda: _state(policy, a) == "draining")
        t1, g = await _turn(policy, t1, 2)
        assert (g.info["server"], g.info["route"]) == (a.base, "sticky")
        for i in range(3):
            _, g = await _turn(policy, [9, i], 0)
            assert g.info["server"] == b.base
        # a goes away: t2's next turn fails there and moves to b with its whole prefix
        a.stop()
        t2, g = await _turn(policy, t2, 1)
        assert (g.info["server"], g.info["route"]) == (b.base, "moved")
        assert policy.fleet.get(a.base).state == "gone" and policy.stats["moves"] == 1
        t2, g = await _turn(policy, t2, 2)
        assert (g.info["server"], g.info["route"]) == (b.base, "sticky")
        await policy.close()
        return t2

    moved = asyncio.run(go())
    # The same trajectory built on one engine that never went away: identical, token for token.
    alone = _policy([b.base])

    async def reference():
        ids = [1, 2, 4]
        for turn in range(3):
            ids, _ = await _turn(alone, ids, turn)
        await alone.close()
        return ids

    assert moved == asyncio.run(reference())
    # b was sent the moved trajectory's complete prefix: the turn-1 request starts with turn 0's ids
    assert any(prompt == moved[:len(prompt)] and len(prompt) > 3 for prompt, _ in b.served())


@pytest.mark.slow
def test_ejected_engine_backs_off_and_comes_back(engines):
    c, d = engines(), engines()
    policy = _policy([c.base, d.base], down_s=0.3, notify_on_reload=False)

    async def go():
        ids, g = await _turn(policy, [4, 4, 4], 0)
        assert g.info["server"] == c.base  # a tie on load: the first listed
        c.stop()
        ids, g = await _turn(policy, ids, 1)  # fails on c, served by d: the trajectory moves
        assert (g.info["server"], g.info["route"]) == (d.base, "moved")
        engine = policy.fleet.get(c.base)
        assert engine.state == "ejected" and engine.ejections == 1 and policy.stats["failovers"] == 1
        await policy.refresh()  # backoff not over (or c still down): it stays out
        assert engine.state == "ejected"
        engines_back = ThreadEngine(port=c.port)  # the same address answers again
        try:
            await _until(policy, lambda: engine.state == "active")
            assert policy.fleet.events["revived"] == 1
            _, g = await _turn(policy, [5, 5], 0)
            assert g.info["server"] == c.base  # back in the rotation for first turns
            # The rollout moves to v9 (as if `sync --notify` had told the engines); these engines still
            # say they serve v0, and the turn records what the engine says, not what the rollout assumes.
            await policy.reload("/unused", 9)
            _, g = await _turn(policy, [6, 6], 0)
            assert policy.version == 9 and g.version == 0
        finally:
            await policy.close()
            await asyncio.to_thread(engines_back.stop)

    asyncio.run(go())


def _rows_sink(rows_out: list):
    async def sink(rows):
        rows_out.extend(r.to_arrow() for r in rows)
    return sink


@pytest.mark.slow
def test_mixed_versions_and_a_killed_engine(proc_engine, engines):
    """Two engines serving different policy versions; the process engine is SIGKILLed mid-run."""
    local = engines(version=0)
    proc_engine.wait_ready()
    policy = _policy([local.base, proc_engine.base])
    cfg = RolloutConfig(env="fleet-turns", group_size=2, concurrency=8, max_turns=4, max_new_tokens=5,
                        max_tokens=400, seed=3, retries=3, retry_backoff=0.05)
    tasks = [{"task_id": f"t{i}", "prompt": f"Count to {i}.", "turns": 3} for i in range(4)]
    async def kill_once_it_has_served() -> None:
        # Called before every turn. Once proc has answered two requests, at least one trajectory that
        # began there still has turns to go (each has 3): killing it now forces a move mid-trajectory.
        if policy.fleet.get(proc_engine.base).requests >= 2:
            proc_engine.kill()

    rows: list = []
    asyncio.run(rollout(tasks, policy, lambda: TurnsEnv(delay_s=0.1), cfg, _rows_sink(rows),
                        turn_hook=kill_once_it_has_served))
    assert len(rows) == 8 and {r["status"] for r in rows} <= _COMPLETED and all(r["num_turns"] == 3 for r in rows)
    served_here = [(p, o) for p, o in local.served()]
    moved = 0
    for row in rows:
        versions = []
        for (prompt, out), turn in zip(turn_requests(row), row["turns"]):
            here = (prompt, out) in served_here
            versions.append(turn["policy_version"])
            assert turn["policy_version"] == (0 if here else PROC_VERSION)  # the serving engine's version
        assert row["policy_version"] == versions[0] and row["policy_version_last"] == versions[-1]
        moved += versions[0] == PROC_VERSION and versions[-1] == 0
    assert moved >= 1  # trajectories that began on the killed engine finished on the other, all turns intact
    assert any(r["policy_version"] == PROC_VERSION for r in rows) and any(r["policy_version"] == 0 for r in rows)
    proc = policy.fleet.get(proc_engine.base)
    assert proc.state == "ejected" and proc.ejections >= 1 and policy.stats["failovers"] >= 1
    # Every turn the local engine served was sent exactly the row's prefix (no re-tokenization on moves).
    expected = [req for row in rows for req in turn_requests(row)]
    assert all(req in expected for req in served_here)


@pytest.mark.slow
def test_engine_joins_a_running_rollout_and_the_metrics_row(tmp_path, engines):
    """The rollout stage end to end (run_rollout): b is added to RUN/fleet.json while trajectories run,
    then a is removed; every row is whole and every request either engine served is one turn of a row."""
    from arlctl.envs.registry import register_env
    from arlctl.stages.rollout_job import EnvPicker, RolloutJob, run_rollout

    register_env("fleet-turns", lambda **_: TurnsEnv(delay_s=0.05), version=TurnsEnv.version)
    a, b = engines(), engines()
    run = tmp_path / "run"
    edit_fleet(str(run), add=[a.base])
    policy = _policy(servers_file=fleet_path(str(run)))
    tasks = [{"task_id": f"j{i}", "env": "fleet-turns", "prompt": f"Name {i} colours.", "turns": 3} for i in range(8)]
    picker = EnvPicker({})
    picker.check(tasks, "fleet-turns")
    cfg = RolloutConfig(env="fleet-turns", group_size=2, concurrency=4, max_turns=4, max_new_tokens=5,
                        max_tokens=400, seed=1)
    job = RolloutJob(cfg=cfg, tasks=tasks, envs=picker, out=str(run / "rollouts"), run=str(run), backend="openai")

    at_drain: dict[str, int] = {}

    async def add_b_then_remove_a() -> None:
        await _seen(lambda: policy.stats["requests"] >= 6)
        edit_fleet(str(run), add=[b.base])
        await _seen(lambda: getattr(policy.fleet.get(b.base), "first_turns", 0) >= 2)
        edit_fleet(str(run), remove=[a.base])
        # first_turns counts answered first turns: once nothing is in flight on the draining engine,
        # no first turn routed there before the drain can still land
        await _seen(lambda: policy.fleet.get(a.base).state == "draining" and policy.fleet.get(a.base).in_flight == 0)
        at_drain["first_turns"] = policy.fleet.get(a.base).first_turns

    async def go():
        editor = asyncio.ensure_future(add_b_then_remove_a())
        result = await run_rollout(job, policy, asyncio.Event(), log=lambda _: None)
        await editor
        return result

    result = asyncio.run(go())
    rows = pq.read_table(str(run / "rollouts")).to_pylist()
    assert len(rows) == 16 and {r["status"] for r in rows} <= _COMPLETED and all(r["num_turns"] == 3 for r in rows)
    first_turns = {tuple(r["prompt_ids"]) for r in rows}
    on_b = [p for p, _ in b.served() if tuple(p) in first_turns]
    assert on_b, "the engine that joined mid-run took no first turns"
    assert any(tuple(p) in first_turns for p, _ in a.served())  # a took the first turns before b joined
    servers = result.backend_metrics["servers"]
    # once a drained, it started no trajectory; the ones it had finished there (a stayed up: nothing moved)
    assert servers[a.base]["first_turns"] == at_drain["first_turns"] and servers[a.base]["state"] == "draining"
    assert result.backend_metrics["moves"] == 0
    # Every request either engine served is exactly one turn of a written row.
    expected = [req for row in rows for req in turn_requests(row)]
    served = a.served() + b.served()
    assert sorted(map(str, served)) == sorted(map(str, expected))
    # The metrics row: one set of columns per engine; no /metrics on arlctl serve, so no hit rate at all.
    metrics = pq.read_table(str(run / "metrics")).to_pylist()[-1]
    for engine in (a, b):
        col = f"backend_engine[{engine.base.split('://')[1]}]."
        assert metrics[col + "requests"] == len(engine.served()) > 0
        assert metrics[col + "generated_tokens"] == sum(len(o) for _, o in engine.served())
        assert metrics[col + "errors"] == 0 and metrics[col + "ejections"] == 0
        assert metrics[col + "prefix_cache_reported"] == 0.0
        assert col + "prefix_cache_hit_rate" not in metrics  # not reported, never 0
    assert {s["prefix_cache_hit_rate"] for s in servers.values()} == {"not reported"}
    assert metrics["backend_fleet_joined"] == 2.0  # a at start, b mid-run


@pytest.mark.slow
def test_many_first_turns_at_once_describe_the_engine_once(engines):
    """Hundreds of trajectories starting together send one GET /v1/models to a new engine, not one each (each
    its own request would queue on the connection pool, time out and eject an engine that answers)."""
    engine = engines()
    policy = _policy([engine.base])
    described = []
    real_describe = policy._describe

    async def counted(server):
        described.append(server.url)
        await real_describe(server)

    policy._describe = counted

    async def main():
        try:
            ids = policy.tokenizer("hello there", add_special_tokens=False)["input_ids"]
            return await asyncio.gather(*(policy.generate(ids, SamplingParams(max_new_tokens=2, seed=k))
                                          for k in range(200)))
        finally:
            await policy.close()

    results = asyncio.run(main())
    assert len(results) == 200 and all(len(g.ids) >= 1 for g in results)
    assert described == [engine.base]
    assert policy.stats["failovers"] == 0
