"""Docker sandboxes over several engines: placement by free capacity, an engine dying under running
sandboxes (ejected, its sandboxes replaced on the others, no result ever read from a dead one), the
engine coming back (readmitted after its backoff), a trajectory whose engine dies mid-episode (env_error,
then a from-scratch top-up on the live engine), and `arlctl sandbox prefetch` over both engines.

The placement rules themselves are checked without docker, on the real EngineSet with a hand-driven clock.
The docker tests run two real engines: the main one from .ci/docker_setup.sh and a second dockerd that
tests/sandbox/docker_engines.py starts on its own socket; stopping that dockerd is the failure.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from docker_engines import IMAGE, MAIN_URL
from sandbox_helpers import LIMITS, run
from typer.testing import CliRunner

from arlctl.errors import UsageError
from arlctl.sandbox import SandboxError, make_pool
from arlctl.sandbox.docker_engines import DockerEngines, parse_hosts
from arlctl.sandbox.pool import EngineSet, EnginesUnavailable

# Engine b has one socket and one data root: this module's tests run on one pytest-xdist worker, in turn.
pytestmark = pytest.mark.xdist_group("engine-b")

ONLY_MAIN = "arlctl/only-on-main:1"  # a tag on the main engine alone


# ---- placement rules (no engine needed) -----------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_placement_prefers_free_capacity_then_the_least_loaded():
    engines = EngineSet([("a", 3), ("b", 1)], clock=Clock())
    # free a=3, b=1 -> a; a=2, b=1 -> a; a=1, b=1: a tie, b holds fewer (0 < 2) -> b; then only a is free.
    picks = [engines.reserve() for _ in range(4)]
    assert picks == ["a", "a", "b", "a"]
    with pytest.raises(EnginesUnavailable, match=r"a: at its limit \(3/3\); b: at its limit \(1/1\)"):
        engines.reserve()
    engines.release("a")
    assert engines.reserve() == "a"
    unlimited = EngineSet([("x", None), ("y", None)], clock=Clock())
    # No limits: every engine has the same (infinite) free capacity, so the least loaded wins, in turn.
    assert [unlimited.reserve() for _ in range(4)] == ["x", "y", "x", "y"]


def test_an_ejected_engine_is_retried_after_a_doubling_backoff():
    clock = Clock()
    engines = EngineSet([("a", None), ("b", None)], backoff_s=1.0, max_backoff_s=3.0, clock=clock)
    engines.eject("b", "connection refused")
    engines.eject("b", "connection refused")  # a second report of the same outage changes nothing
    assert [engines.reserve() for _ in range(3)] == ["a", "a", "a"]
    clock.now += 1.0  # backoff 1s has passed: b gets one trial placement, no more until it proves itself
    assert engines.reserve() == "b"
    assert engines.reserve() == "a"
    engines.eject("b", "still refused")  # the trial failed: out again, for 2s this time
    clock.now += 1.5
    assert engines.reserve() == "a"
    clock.now += 0.5
    assert engines.reserve() == "b"
    engines.eject("b", "refused")  # 4s would exceed the cap: 3s
    clock.now += 2.9
    assert engines.reserve() == "a"
    clock.now += 0.1
    assert engines.reserve() == "b"
    engines.confirm("b")  # the trial sandbox runs: b is back, with its backoff reset
    assert engines.is_up("b")
    [stats_b] = [s for s in engines.stats() if s["engine"] == "b"]
    assert stats_b["ejections"] == 3 and stats_b["up"] and stats_b["last_error"] == "refused"
    engines.eject("b", "again")
    with pytest.raises(EnginesUnavailable, match="b: unreachable, retried in 1.0s"):
        engines.reserve(exclude=["a"])


def test_host_entries_files_and_environment(tmp_path, monkeypatch):
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text("# engines of rack 2\nunix:///c.sock max=8\n\ntcp://10.0.0.5:2375  # remote\n")
    assert parse_hosts(f"unix:///a.sock, unix:///b.sock max=4,{hosts_file},unix:///a.sock", 16) == [
        ("unix:///a.sock", 16),
        ("unix:///b.sock", 4),
        ("unix:///c.sock", 8),
        ("tcp://10.0.0.5:2375", 16),
    ]
    assert parse_hosts(["unix:///a.sock", "unix:///b.sock max=2"]) == [
        ("unix:///a.sock", None),
        ("unix:///b.sock", 2),
    ]
    with pytest.raises(UsageError, match="bad docker host entry"):
        parse_hosts("unix:///a.sock max=zero")
    with pytest.raises(UsageError, match="cannot read docker hosts file"):
        parse_hosts(str(tmp_path / "missing"))
    from arlctl.sandbox.docker import default_url
    from arlctl.sandbox.docker_engines import hosts_from

    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setenv("ARLCTL_DOCKER_HOSTS", "unix:///x.sock,unix:///y.sock max=3")
    assert hosts_from() == [("unix:///x.sock", None), ("unix:///y.sock", 3)]
    assert hosts_from("unix:///z.sock") == [("unix:///z.sock", None)]  # the option wins over the environment
    assert default_url() == "unix:///x.sock"  # a lone client (image lookups) talks to the first engine


def test_a_pool_whose_start_partly_fails_creates_the_rest_in_the_background(snapshot, tmp_path):
    """One of two real bwrap sandboxes cannot start (its snapshot is missing): the pool starts with the
    other and creates the second in the background, counted; when none starts, start() raises."""
    from arlctl.sandbox import SandboxPool, make_sandbox
    from arlctl.sandbox.bwrap import bwrap_available

    if not bwrap_available():
        pytest.skip("bubblewrap is not installed")
    calls = []

    async def factory():
        calls.append(1)
        source = tmp_path / "missing" if len(calls) == 1 else snapshot  # the first start fails for real
        return await make_sandbox("bwrap", str(source), **LIMITS)

    async def scenario():
        async with SandboxPool(factory, size=2, max_wait_s=60) as pool:
            await pool.drain()
            assert pool.stats().create_failures == 1 and pool.stats().idle == 2
            async with pool.acquire() as sb, pool.acquire() as other:
                assert (await sb.exec("cat README")).stdout == (await other.exec("cat README")).stdout
        with pytest.raises(SandboxError, match="could not start 1 of 1 sandboxes"):
            await SandboxPool(
                lambda: make_sandbox("bwrap", str(tmp_path / "missing"), **LIMITS), size=1
            ).start()

    run(scenario())


# ---- two real engines -----------------------------------------------------------------------------




@pytest.fixture
def engines(engine_b):
    engine_b.start()  # back up if an earlier test stopped it
    return DockerEngines([(MAIN_URL, None), (engine_b.url, None)], backoff_s=0.5, max_backoff_s=2.0)


def _counts(engines: DockerEngines) -> dict[str, int]:
    return {s["engine"]: s["count"] for s in engines.stats()}


@pytest.mark.docker
def test_pool_spreads_over_engines_and_replaces_the_sandboxes_of_a_dead_one(engine_b, engines, snapshot):
    async def scenario():
        pool = make_pool("docker", str(snapshot), size=4, max_wait_s=60, engines=engines, **LIMITS)
        async with pool:
            assert _counts(engines) == {MAIN_URL: 2, engine_b.url: 2}  # least loaded first: 2 and 2
            leases = [pool.acquire() for _ in range(4)]
            held = [await lease.__aenter__() for lease in leases]
            assert sorted(sb.placement()["engine"] for sb in held) == sorted(
                [MAIN_URL] * 2 + [engine_b.url] * 2
            )
            for sb in held:
                assert (await sb.exec("cat README")).stdout == "pristine\n"

            engine_b.stop()  # the engine dies under two leased, running sandboxes
            for sb in held:
                if sb.engine == engine_b.url:
                    # Never an exit code from a dead sandbox: an infrastructure error naming the engine.
                    with pytest.raises(SandboxError, match=f"docker engine {engine_b.url} is unreachable"):
                        await sb.exec("cat README")
                    assert sb.taint_reason == "engine_unreachable"
                else:
                    assert (await sb.exec("echo alive")).stdout == "alive\n"
            assert not engines.placement.is_up(engine_b.url)
            for lease in leases:
                await lease.__aexit__(None, None, None)
            await pool.drain()
            stats = pool.stats()
            assert stats.replacements == 2 and stats.replacement_causes == {"engine_unreachable": 2}, stats
            assert _counts(engines) == {MAIN_URL: 4, engine_b.url: 0}  # replaced on the live engine
            async with pool.acquire() as sb:
                assert sb.engine == MAIN_URL and (await sb.exec("cat README")).stdout == "pristine\n"

            engine_b.start()  # back: after its backoff, the next sandbox placed there is its trial
            await asyncio.sleep(
                max(0.0, engines.placement.engines[engine_b.url].ejected_until - time.monotonic())
            )
            more = make_pool("docker", str(snapshot), size=2, max_wait_s=60, engines=engines, **LIMITS)
            async with more:
                assert engines.placement.is_up(engine_b.url)
                assert _counts(engines) == {MAIN_URL: 5, engine_b.url: 1}
                async with more.acquire() as sb:
                    assert (await sb.exec("cat README")).stdout == "pristine\n"
        assert _counts(engines) == {MAIN_URL: 0, engine_b.url: 0}  # every close released its slot

    run(scenario())


@pytest.mark.docker
def test_a_sandbox_placed_on_a_dead_engine_starts_on_another(engine_b, engines, snapshot):
    async def scenario():
        engine_b.stop()  # dead before anyone noticed: creation there fails, the engine is ejected
        async with make_pool(
            "docker", str(snapshot), size=3, max_wait_s=60, engines=engines, **LIMITS
        ) as pool:
            assert _counts(engines) == {MAIN_URL: 3, engine_b.url: 0}
            [stats_b] = [s for s in engines.stats() if s["engine"] == engine_b.url]
            assert not stats_b["up"] and stats_b["ejections"] == 1
            async with pool.acquire() as sb:
                assert (await sb.exec("echo fine")).stdout == "fine\n"
        only_b = DockerEngines([(engine_b.url, None)], backoff_s=0.5)
        # Its image lookup finds it dead (ejected) before a start is staked on it: the error says so.
        with pytest.raises(SandboxError, match=f"{engine_b.url}: unreachable, retried in"):
            await make_pool("docker", str(snapshot), size=1, engines=only_b, **LIMITS).start()

        engine_b.start()  # up, but without this image: the sandboxes start on the engine that has it
        import docker

        client = docker.DockerClient(base_url=MAIN_URL, timeout=60)
        client.images.get(IMAGE).tag(ONLY_MAIN)
        fresh = DockerEngines([(engine_b.url, None), (MAIN_URL, None)], backoff_s=0.5)
        try:
            async with make_pool(
                "docker", str(snapshot), size=2, engines=fresh, image=ONLY_MAIN, **LIMITS
            ) as pool:
                assert _counts(fresh) == {engine_b.url: 0, MAIN_URL: 2}
                assert all(s["up"] for s in fresh.stats())  # b answers: not ejected, only not used here
        finally:
            client.images.remove(ONLY_MAIN)
            client.close()

    run(scenario())


@pytest.fixture(scope="module")
def tokenizer():
    from arlctl.inference.loader import load_policy

    policy = load_policy("tiny", progress=False)
    yield policy.tokenizer
    asyncio.run(policy.close())


def _bash(command: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'bash', 'arguments': {'command': command}})}\n</tool_call>"


@pytest.mark.docker
@pytest.mark.parametrize("top_up", [0, 1])
def test_engine_dying_mid_trajectory_is_env_error_never_graded(
    engine_b, tokenizer, tmp_path, monkeypatch, top_up
):
    """The real loop, a real swe task, a scripted agent: between its first and second command the engine
    under its sandbox dies. The trajectory ends env_error (no final state to grade); with --top-up the
    member is rerun from scratch and its sandbox lands on the live engine."""
    from arlctl.envs.swe.env import SweEnv
    from arlctl.envs.swe.tasks import load_suite_task
    from arlctl.inference.scripted import ScriptedPolicy
    from arlctl.stages.agent_loop import RolloutConfig, Stats
    from arlctl.stages.rollout import rollout

    monkeypatch.setenv("ARLCTL_HOME", str(tmp_path / "home"))
    engine_b.start()
    # Engine b first (no limits, nothing placed yet: the tie goes to the first engine listed).
    engines = DockerEngines([(engine_b.url, None), (MAIN_URL, None)], backoff_s=30.0)
    killed = []

    def script(prompt: str) -> str:
        turn = prompt.count("<|im_start|>assistant") - 1
        if turn == 1 and not killed:
            killed.append(True)
            engine_b.stop()
        return [
            _bash("echo one > mark.txt"),
            _bash("cat mark.txt"),
            "<tool_call>\n" + json.dumps({"name": "submit", "arguments": {}}) + "\n</tool_call>",
        ][min(turn, 2)]

    policy = ScriptedPolicy(tokenizer, "scripted", script)
    cfg = RolloutConfig(
        env="swe",
        group_size=1,
        concurrency=1,
        max_turns=4,
        max_new_tokens=200,
        step_timeout=60,
        max_top_up=top_up,
    )
    rows: list = []

    async def sink(group):
        rows.extend(group)

    async def main():
        stats = Stats()
        await rollout(
            [load_suite_task("stockroom-001")],
            policy,
            lambda: SweEnv(sandbox="docker", sandboxes=1, engines=engines, **LIMITS),
            cfg,
            sink,
            stats,
        )
        return stats

    stats = asyncio.run(main())
    [row] = rows
    placed = {s["engine"]: s["placed"] for s in engines.stats()}
    assert stats.causes.get("infra:env_failure") == 1, stats.causes
    if top_up == 0:
        assert row.status == "env_error" and row.finish_reason == "error"
        assert row.final_state is None  # nothing a grader could score
        assert f"docker engine {engine_b.url} is unreachable" in row.turns[-1].error
        assert placed[engine_b.url] == 1
        # env_info (schema v3): the engine it ran on, and that the sandbox broke under it
        assert row.env_info["engine"] == engine_b.url and row.env_info["taint_reason"] == "engine_unreachable"
    else:
        last_error = row.turns[-1].error
        assert stats.top_ups == 1 and row.status == "ok" and row.finish_reason == "submit", last_error
        assert placed[MAIN_URL] >= 1 and not engines.placement.is_up(engine_b.url)
        # the final engine, and the attempt it replaced on the engine that died
        assert row.env_info["engine"] == MAIN_URL and "taint_reason" not in row.env_info
        [moved] = row.env_info["replaced_from"]
        assert (moved["engine"], moved["cause"], moved["attempt"]) == (engine_b.url, "env_error", 0)
        assert (
            moved["taint_reason"] == "engine_unreachable" and moved["container"] != row.env_info["container"]
        )


@pytest.mark.docker
def test_rows_name_the_engine_and_container_each_trajectory_ran_on(
    engine_b, engines, tokenizer, tmp_path, monkeypatch
):
    """Four swe trajectories over a pool of two sandboxes, one per engine. Each agent prints its
    container's hostname (docker sets it to the container's short id); every row's env_info must name
    that container, and the engine that really holds it (asked of both engines while the pool is up)."""
    import docker

    from arlctl.envs.swe.env import SweEnvFactory
    from arlctl.envs.swe.tasks import load_suite_task
    from arlctl.inference.scripted import ScriptedPolicy
    from arlctl.io.shards import Lineage, read_shard, shard_name, write_shard
    from arlctl.schemas.rows import rows_to_table
    from arlctl.stages.agent_loop import RolloutConfig, Stats
    from arlctl.stages.rollout import rollout

    monkeypatch.setenv("ARLCTL_HOME", str(tmp_path / "home"))

    def script(prompt: str) -> str:
        turn = prompt.count("<|im_start|>assistant") - 1
        if turn == 0:
            return _bash("cat /etc/hostname")
        return "<tool_call>\n" + json.dumps({"name": "submit", "arguments": {}}) + "\n</tool_call>"

    factory = SweEnvFactory(sandbox="docker", sandboxes=2, engines=engines, **LIMITS)
    cfg = RolloutConfig(
        env="swe", group_size=4, concurrency=4, max_turns=3, max_new_tokens=200, step_timeout=60
    )
    rows: list = []

    async def sink(group):
        rows.extend(group)

    def containers_by_engine() -> dict[str, str]:
        where = {}
        for url in (MAIN_URL, engine_b.url):
            client = docker.DockerClient(base_url=url, timeout=30)
            try:
                for c in client.containers.list(filters={"label": "arlctl.sandbox=1"}):
                    where[c.id[:12]] = url
            finally:
                client.close()
        return where

    async def main():
        try:
            await rollout(
                [load_suite_task("stockroom-001")],
                ScriptedPolicy(tokenizer, "scripted", script),
                factory,
                cfg,
                sink,
                Stats(),
            )
            return await asyncio.to_thread(containers_by_engine)  # the pool's containers still run
        finally:
            await factory.aclose()

    engine_of = asyncio.run(main())
    assert [r.status for r in rows] == ["ok"] * 4
    for row in rows:
        info = row.env_info
        assert info["sandbox"] == "docker" and info["image"] == IMAGE
        assert info["container"] in row.turns[0].observation  # the container the agent's command ran in
        assert engine_of[info["container"]] == info["engine"]  # ... held by the engine the row names
    assert {r.env_info["engine"] for r in rows} == {MAIN_URL, engine_b.url}  # placed one per engine
    path = write_shard(rows_to_table(rows), str(tmp_path / shard_name("rollout")), Lineage("rollout"))
    stored = [json.loads(text) for text in read_shard(path).column("env_info").to_pylist()]
    assert [s["engine"] for s in stored] == [r.env_info["engine"] for r in rows]


# ---- arlctl sandbox prefetch --------------------------------------------------------------------


@pytest.mark.docker
def test_prefetch_checks_every_image_on_every_engine(engine_b, tmp_path):
    from arlctl.cli.main import app

    engine_b.start()
    only_main = "arlctl/prefetch-only-main:1"
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        json.dumps({"task_id": "t1", "env": "swe", "image": IMAGE, "problem_statement": "x"})
        + "\n"
        + json.dumps({"task_id": "t2", "env": "swe", "image": only_main, "problem_statement": "y"})
        + "\n"
    )
    import docker

    client = docker.DockerClient(base_url=MAIN_URL, timeout=60)
    client.images.get(IMAGE).tag(only_main)
    runner = CliRunner()
    try:
        base = [
            "sandbox",
            "prefetch",
            "--tasks",
            str(tasks),
            "--docker-host",
            MAIN_URL,
            "--docker-host",
            engine_b.url,
            "--parallel",
            "2",
            "--no-pull",
            "--json",
        ]
        result = runner.invoke(app, base)
        assert result.exit_code == 1, result.output
        report = json.loads(result.stdout)
        statuses = {(c["engine"], c["image"]): c["status"] for c in report["checks"]}
        assert statuses == {
            (MAIN_URL, IMAGE): "present",
            (engine_b.url, IMAGE): "present",
            (MAIN_URL, only_main): "present",
            (engine_b.url, only_main): "missing",
        }
        assert report["ok"] is False and report["unavailable"] == 1

        client.images.remove(only_main)
        tasks.write_text(
            json.dumps({"task_id": "t1", "env": "swe", "image": IMAGE, "problem_statement": "x"}) + "\n"
        )
        ok = runner.invoke(app, base)
        assert ok.exit_code == 0, ok.output
        assert json.loads(ok.stdout)["ok"] is True

        dead = "unix:///run/arlctl-docker-nobody.sock"
        down = runner.invoke(app, [*base, "--docker-host", dead])
        assert down.exit_code == 1
        assert {c["status"] for c in json.loads(down.stdout)["checks"] if c["engine"] == dead} == {
            "unreachable"
        }
    finally:
        try:
            client.images.remove(only_main)
        except Exception:
            pass
        client.close()
