"""Task files at scale, each row naming its own docker image, over several engines.

`arlctl sandbox prefetch` on a generated file of 2,000 rows naming 10 images (some on engine a only, some
on b only, some on no engine) checks each image once per engine and names what each engine lacks;
placement starts a sandbox on an engine that already holds its image (capacity deciding among those, an
engine without it only when none has room), asks each engine once per image and corrects itself when a
start finds an image gone; an image on no engine is an error that names it and every engine tried, and
in a real `arlctl rollout` that row ends env_error with the image in its cause while the others finish.

The placement rules are checked without docker first. The docker tests run two real engines: the main
one from .ci/docker_setup.sh and a second dockerd (tests/sandbox/docker_engines.py), with tiny images
built on each from arlctl/sandbox-base:1 (`docker build` of a LABEL: no registry is reachable, so
nothing can be pulled and a pull fails at once).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from docker_engines import IMAGE, MAIN_URL
from sandbox_helpers import LIMITS, run
from test_multi_docker import Clock
from typer.testing import CliRunner

from arlctl.sandbox import SandboxError, make_pool, make_sandbox
from arlctl.sandbox.docker import ImageUnavailable
from arlctl.sandbox.docker_engines import DockerEngines
from arlctl.sandbox.pool import EngineSet, EnginesUnavailable

# Engine b has one socket and one data root: the same group as test_multi_docker.py, one worker in turn.
pytestmark = pytest.mark.xdist_group("engine-b")

# The shared model cache (the oracle policy's tokenizer), read before conftest points ARLCTL_HOME elsewhere.
MODEL_HOME = os.environ.get("ARLCTL_HOME") or os.path.expanduser("~/.cache/arlctl")
TAG = f"arlctl-test/locality-{{}}:{os.getpid()}"
BOTH = [IMAGE, TAG.format("both-1"), TAG.format("both-2")]
A_ONLY = [TAG.format(f"a-{i}") for i in range(1, 4)]
B_ONLY = [TAG.format(f"b-{i}") for i in range(1, 3)]
NOWHERE = [TAG.format(f"nowhere-{i}") for i in range(1, 3)]


# ---- placement rules (no engine needed) -----------------------------------------------------------


def test_engines_that_hold_the_image_come_first_then_capacity():
    engines = EngineSet([("a", 2), ("b", 2), ("c", None)], clock=Clock())
    # Only b holds the image: b while it has room, though a and c have more; then the most free (c).
    assert [engines.reserve(holding=["b"]) for _ in range(3)] == ["b", "b", "c"]
    # Held by a and c: capacity decides between them (c is unlimited), never b.
    assert [engines.reserve(holding=["a", "c"]) for _ in range(2)] == ["c", "c"]
    # Held nowhere (or unknown): capacity alone, as without the argument; a miss.
    assert engines.reserve(holding=[]) == "c"
    assert engines.reserve() == "c"  # no image named: no hit or miss counted
    assert all(s["image_hits"] == s["image_misses"] == 0 for s in engines.stats())  # counted by starts
    engines.image_placed("b", local=True)
    engines.image_placed("c", local=False)
    stats = {s["engine"]: (s["image_hits"], s["image_misses"]) for s in engines.stats()}
    assert stats == {"a": (0, 0), "b": (1, 0), "c": (0, 1)}
    # An ejected holder is skipped like any ejected engine; a trial after its backoff goes to a holder.
    clock = Clock()
    engines = EngineSet([("a", None), ("b", None)], backoff_s=1.0, clock=clock)
    engines.eject("b", "refused")
    assert engines.placeable() == ["a"]
    assert engines.reserve(holding=["b"]) == "a"  # the only holder is out: a, a miss
    clock.now += 1.0
    assert engines.placeable() == ["a", "b"]
    assert engines.reserve(holding=["b"]) == "b"  # its trial
    assert engines.placeable() == ["a"]  # one trial at a time
    with pytest.raises(EnginesUnavailable):
        engines.reserve(exclude=["a"], holding=["b"])


def test_image_presence_is_looked_up_once_per_engine_and_image(monkeypatch):
    """However many sandboxes start at once, each (engine, image) pair is asked of its engine once;
    what a start finds out afterwards replaces the answer; an engine that cannot be asked is not cached."""
    from arlctl.sandbox import docker_engines

    asked: list[tuple[str, str]] = []
    answers = {("a", "img"): True, ("b", "img"): False, ("a", "other"): True, ("b", "other"): None}

    def fake_present(url, image, timeout):
        asked.append((url, image))
        time.sleep(0.01)  # long enough for every concurrent caller to queue behind the first
        held = answers[(url, image)]
        return held, "" if held is not None else "refused"

    monkeypatch.setattr(docker_engines, "image_present", fake_present)
    monkeypatch.setattr(docker_engines, "ping", lambda url, timeout: None)  # both answer a ping
    engines = DockerEngines([("a", None), ("b", None)])

    async def many(image: str, n: int) -> list[list[str]]:
        return list(await asyncio.gather(*(engines.holders(image) for _ in range(n))))

    assert run(many("img", 50)) == [["a"]] * 50
    assert sorted(asked) == [("a", "img"), ("b", "img")] and engines.image_lookups == 2
    engines.note_image("a", "img", False)  # a start on a found it gone
    engines.note_image("b", "img", True)  # and one on b ran
    assert run(engines.holders("img")) == ["b"] and engines.image_lookups == 2
    assert run(engines.holders("other")) == ["a"]
    assert run(engines.holders("other")) == ["a"]
    assert asked.count(("b", "other")) == 2  # b could not say: asked again next time, never remembered


# ---- two real engines -----------------------------------------------------------------------------


def _docker(url: str, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker", "-H", url, *args],
        input=stdin,
        capture_output=True,
        timeout=120,
        env={**os.environ, "DOCKER_BUILDKIT": "0"},  # the classic builder: no buildx plugin needed
    )


def build_image(url: str, tag: str) -> None:
    """A tiny image of its own (a LABEL over the base image) on the engine at `url`."""
    dockerfile = f"FROM {IMAGE}\nLABEL arlctl.test.image={tag}\n".encode()
    built = _docker(url, "build", "-q", "-t", tag, "-", stdin=dockerfile)
    assert built.returncode == 0, built.stderr.decode()[-500:]


@pytest.fixture(scope="module")
def images(engine_b):
    """The 10 images of the task file: BOTH on both engines, A_ONLY on the main engine (a), B_ONLY on
    engine b, NOWHERE on neither. Removed afterwards."""
    started = time.monotonic()
    placed = [(MAIN_URL, tag) for tag in BOTH[1:] + A_ONLY] + [(engine_b.url, tag) for tag in BOTH[1:] + B_ONLY]
    try:
        for url, tag in placed:
            build_image(url, tag)
        print(f"\nbuilt {len(placed)} images in {time.monotonic() - started:.1f}s", file=sys.stderr)
        yield {"a": MAIN_URL, "b": engine_b.url}
    finally:
        for url, tag in placed:
            _docker(url, "rmi", "-f", tag)


def _task_file(path: Path, n_rows: int, names: list[str]) -> Path:
    """n_rows swe rows, each naming one of `names` in turn (so every image is named on many rows)."""
    with path.open("w") as f:
        for i in range(n_rows):
            row = {"task_id": f"t{i:05d}", "env": "swe", "image": names[i % len(names)], "problem_statement": "x"}
            f.write(json.dumps(row) + "\n")
    return path


@pytest.mark.docker
@pytest.mark.slow
def test_prefetch_of_a_large_task_file_names_what_each_engine_lacks(images, tmp_path):
    from arlctl.cli.main import app

    a, b = images["a"], images["b"]
    every = BOTH + A_ONLY + B_ONLY + NOWHERE
    assert len(every) == 10
    tasks = _task_file(tmp_path / "tasks.jsonl", 2000, every)
    base = ["sandbox", "prefetch", "--tasks", str(tasks), "--docker-host", a, "--docker-host", b, "--json"]
    runner = CliRunner()

    started = time.monotonic()
    result = runner.invoke(app, [*base, "--no-pull"])
    seconds = time.monotonic() - started
    print(f"\nprefetch --no-pull of 2000 rows (10 images, 2 engines): {seconds:.2f}s", file=sys.stderr)
    assert result.exit_code == 1, result.output  # two images are on no engine
    report = json.loads(result.stdout)
    assert report["rows"] == 2000 and report["images"] == every
    # Each distinct image asked once per engine: 20 checks for 2,000 rows.
    assert sorted((c["engine"], c["image"]) for c in report["checks"]) == sorted(
        (e, i) for e in (a, b) for i in every
    )
    assert report["missing"] == {a: B_ONLY + NOWHERE, b: A_ONLY + NOWHERE}
    assert report["missing_count"] == {a: 4, b: 5}
    assert report["nowhere"] == NOWHERE and report["partial"] is True
    assert report["unavailable"] == 9 and report["ok"] is False and report["exit_code"] == 1
    # --allow-partial accepts images on some engines only, never an image on none.
    assert runner.invoke(app, [*base, "--no-pull", "--allow-partial"]).exit_code == 1

    # Pulling: no registry answers, so each pull of a missing image fails (fast), and says why.
    started = time.monotonic()
    pulled = runner.invoke(app, base)
    print(f"prefetch with pulls of 2000 rows: {time.monotonic() - started:.2f}s", file=sys.stderr)
    assert pulled.exit_code == 1
    failed = [c for c in json.loads(pulled.stdout)["checks"] if not c["ok"]]
    assert len(failed) == 9 and all("pull failed" in c["detail"] for c in failed), failed

    # Without the rows of the missing images: every image is somewhere, so --allow-partial exits 0;
    # strict (the default) still exits 1, since b lacks A_ONLY and a lacks B_ONLY.
    runnable = _task_file(tmp_path / "runnable.jsonl", 2000, BOTH + A_ONLY + B_ONLY)
    strict = ["sandbox", "prefetch", "--tasks", str(runnable), "--docker-host", a, "--docker-host", b, "--no-pull"]
    assert runner.invoke(app, [*strict, "--json"]).exit_code == 1
    partial = runner.invoke(app, [*strict, "--json", "--allow-partial"])
    assert partial.exit_code == 0, partial.output
    assert json.loads(partial.stdout)["nowhere"] == [] and json.loads(partial.stdout)["ok"] is False
    # The text summary: one line per engine with what it lacks, then the images on no engine.
    text = runner.invoke(app, ["sandbox", "prefetch", "--tasks", str(tasks), "--docker-host", a,
                               "--docker-host", b, "--no-pull"])
    assert text.exit_code == 1
    shown = " ".join(text.output.split())  # however wide the console, and wherever it wraps
    assert "10 image(s) of 2000 task row(s), on 2 engine(s)" in shown
    assert f"2 image(s) on no engine: {NOWHERE[0]}, {NOWHERE[1]}" in shown


def _counts(engines: DockerEngines) -> dict[str, int]:
    return {s["engine"]: s["count"] for s in engines.stats()}


def _image_stats(engines: DockerEngines) -> dict[str, tuple[int, int]]:
    return {s["engine"]: (s["image_hits"], s["image_misses"]) for s in engines.stats()}


async def _start(engines: DockerEngines, snapshot: Path, image: str, n: int) -> list:
    return list(
        await asyncio.gather(
            *(make_sandbox("docker", str(snapshot), engines=engines, image=image, **LIMITS) for _ in range(n))
        )
    )


async def _close(sandboxes: list) -> None:
    await asyncio.gather(*(sb.close() for sb in sandboxes))


@pytest.mark.docker
@pytest.mark.slow
def test_sandboxes_land_on_the_engines_that_hold_their_image(images, snapshot):
    a, b = images["a"], images["b"]

    async def scenario():
        # a listed first: by capacity alone the first pick of every tie would be a, which lacks B_ONLY.
        engines = DockerEngines([(a, 4), (b, 6)], backoff_s=0.5)
        held = await _start(engines, snapshot, B_ONLY[0], 4)
        try:
            assert {sb.engine for sb in held} == {b}
            assert [s["placed"] for s in engines.stats()] == [0, 4]  # not one start tried on a
            assert _image_stats(engines) == {a: (0, 0), b: (4, 0)}  # each found its image there
            # On both engines: free capacity decides, a 4 free and b 2 -> a, a, then a tie (2 and 2, b
            # holding more) -> a, then b.
            both = await _start(engines, snapshot, BOTH[1], 1)
            for _ in range(3):
                both += await _start(engines, snapshot, BOTH[1], 1)
            held += both
            assert [sb.engine for sb in both] == [a, a, a, b]
            assert _counts(engines) == {a: 3, b: 5}
            for sb in held:
                assert (await sb.exec("cat README")).stdout == "pristine\n"
            # One lookup per (engine, image), however many sandboxes: 2 images x 2 engines.
            assert engines.image_lookups == 4
            # a is the only holder of A_ONLY; with a full, b has room but not the image: the start there
            # fails and, no holder having room, the error names the image and both engines.
            held += await _start(engines, snapshot, A_ONLY[0], 1)
            assert held[-1].engine == a and _counts(engines) == {a: 4, b: 5}
            with pytest.raises(ImageUnavailable) as caught:
                await make_sandbox("docker", str(snapshot), engines=engines, image=A_ONLY[0], **LIMITS)
            message = str(caught.value)
            assert A_ONLY[0] in message and f"{b}: image not on the engine" in message, message
            assert f"not tried: {a}: at its limit (4/4)" in message, message
            assert caught.value.tried == {b: "image not on the engine"}
            assert _image_stats(engines) == {a: (4, 0), b: (5, 1)}  # the start on b: a miss
            assert _counts(engines) == {a: 4, b: 5}  # the failed start released its slot
            assert all(s["up"] for s in engines.stats())  # b answered: a missing image is no outage
        finally:
            await _close(held)
        assert _counts(engines) == {a: 0, b: 0}

    run(scenario())


@pytest.mark.docker
def test_an_image_on_no_engine_is_an_error_naming_it_and_every_engine(images, snapshot):
    a, b = images["a"], images["b"]

    async def scenario():
        engines = DockerEngines([(a, None), (b, None)], backoff_s=0.5)
        with pytest.raises(ImageUnavailable) as caught:
            await make_sandbox("docker", str(snapshot), engines=engines, image=NOWHERE[0], **LIMITS)
        err = caught.value
        assert err.image == NOWHERE[0] and set(err.tried) == {a, b}
        assert str(err).startswith(f"docker sandbox from image {NOWHERE[0]} could not start on any engine")
        assert "arlctl sandbox prefetch" in err.hint
        assert _counts(engines) == {a: 0, b: 0} and all(s["up"] for s in engines.stats())
        # Through a pool (what an env uses): its start fails with that cause, a SandboxError.
        with pytest.raises(SandboxError, match=f"could not start 1 of 1 sandboxes: docker sandbox from image "
                                               f"{NOWHERE[0]} could not start on any engine; tried {a}"):
            await make_pool("docker", str(snapshot), size=1, engines=engines, image=NOWHERE[0], **LIMITS).start()
        # One engine, no engine set: the error still names the image and the engine.
        with pytest.raises(SandboxError, match=f"docker image {NOWHERE[0]} is not on engine {b}"):
            await make_sandbox("docker", str(snapshot), docker_host=b, image=NOWHERE[0], **LIMITS)

    run(scenario())


@pytest.mark.docker
def test_a_start_that_finds_the_image_gone_corrects_placement(engine_b, images, snapshot):
    """Placement was told b holds the image; it was removed from b since. The start there fails with
    image-not-found, the sandbox starts on a (which holds it), and later sandboxes go to a directly."""
    a, b = images["a"], images["b"]
    gone = TAG.format("gone")

    async def scenario():
        engines = DockerEngines([(b, None), (a, None)], backoff_s=0.5)
        assert await engines.holders(gone) == [b, a]
        assert _docker(b, "rmi", gone).returncode == 0  # behind placement's back
        first = await _start(engines, snapshot, gone, 1)
        try:
            assert first[0].engine == a
            assert [s["placed"] for s in engines.stats()] == [1, 1]  # b tried once, then a
            more = await _start(engines, snapshot, gone, 2)
            first += more
            assert [sb.engine for sb in more] == [a, a] and [s["placed"] for s in engines.stats()] == [1, 3]
            assert engines.image_lookups == 2  # corrected by the failed start, not asked again
            assert _image_stats(engines) == {b: (0, 1), a: (3, 0)}  # b's start found the image missing
        finally:
            await _close(first)

    for url in (a, b):
        build_image(url, gone)
    try:
        run(scenario())
    finally:
        for url in (a, b):
            _docker(url, "rmi", "-f", gone)


@pytest.mark.docker
@pytest.mark.slow
def test_share_of_placements_that_found_their_image_locally(images, snapshot):
    """A mixed workload, measured (printed, not asserted): sandboxes of the images on one engine or both,
    started in waves over two engines of 4 sandboxes each; the share that started where their image was,
    against what placement by capacity alone would have picked first for the same sequence."""
    a, b = images["a"], images["b"]
    on = {image: {a, b} for image in BOTH} | {i: {a} for i in A_ONLY} | {i: {b} for i in B_ONLY}
    sequence = [[BOTH[0], A_ONLY[0], B_ONLY[0], BOTH[1]], [A_ONLY[1], B_ONLY[1], BOTH[2], A_ONLY[2]],
                [B_ONLY[0], BOTH[1], A_ONLY[0], B_ONLY[1]]]

    async def scenario():
        engines = DockerEngines([(a, 4), (b, 4)], backoff_s=0.5)
        blind = EngineSet([(a, 4), (b, 4)])  # the same engines, by capacity alone
        blind_hits = total = 0
        for wave in sequence:
            held = []
            try:
                for image in wave:
                    held.append(
                        await make_sandbox("docker", str(snapshot), engines=engines, image=image, **LIMITS)
                    )
                    assert held[-1].engine in on[image]  # never a sandbox on an engine without its image
                    first_pick = blind.reserve()
                    blind_hits += first_pick in on[image]
                    total += 1
            finally:
                await _close(held)
                blind = EngineSet([(a, 4), (b, 4)])  # every wave starts on empty engines, as the real one
        stats = _image_stats(engines)
        hits = sum(h for h, _ in stats.values())
        misses = sum(m for _, m in stats.values())
        print(
            f"\nimage-local placements: {hits}/{hits + misses} = {hits / (hits + misses):.2f} with locality; "
            f"by capacity alone the first pick would have held the image {blind_hits}/{total} = "
            f"{blind_hits / total:.2f} (each miss a failed start, or a pull); lookups {engines.image_lookups}",
            file=sys.stderr,
        )

    run(scenario())


# ---- a rollout over task rows with their own images ---------------------------------------------------


def build_repo_image(url: str, tag: str, instance_id: str) -> None:
    """A SWE-bench style image of a built-in task: its repository at /testbed (no history: the row then
    gives no base_commit to check) over the base image."""
    from arlctl.envs.swe.tasks import SUITE_DIR

    buf = io.BytesIO()
    dockerfile = f"FROM {IMAGE}\nCOPY --chown=1000:1000 testbed /testbed\nWORKDIR /testbed\n".encode()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
        tar.add(SUITE_DIR / instance_id / "repo", arcname="testbed",
                filter=lambda member: None if "__pycache__" in member.name else member)
    built = _docker(url, "build", "-q", "-t", tag, "-", stdin=buf.getvalue())
    assert built.returncode == 0, built.stderr.decode()[-500:]


def image_row(instance_id: str, image: str, task_id: str | None = None) -> dict:
    from arlctl.envs.swe.tasks import SUITE_DIR

    task = json.loads((SUITE_DIR / instance_id / "task.json").read_text())
    task.update(task_id=task_id or instance_id, instance_id=task_id or instance_id, image=image, env="swe")
    task.pop("base_commit")
    return task


@pytest.mark.docker
@pytest.mark.slow
def test_rollout_row_whose_image_is_nowhere_is_env_error_and_the_others_finish(images, tmp_path):
    """The real CLI, `--policy oracle:gold`, over both engines (b listed first): one row's image is on
    both engines, one on the main engine only, one on none. The last ends env_error, its cause naming the
    image (the run's summary; a row with no sandbox has no turn to carry it); the others submit the gold
    patch, each in a sandbox on an engine that holds its image."""
    if not (Path(MODEL_HOME) / "models").is_dir():
        pytest.skip(f"no model cache at {MODEL_HOME} (the oracle's tokenizer)")
    a, b = images["a"], images["b"]
    on_both, on_main = TAG.format("repo-stockroom"), TAG.format("repo-verscmp")
    missing = TAG.format("repo-missing")
    built = [(a, on_both), (b, on_both), (a, on_main)]
    for url, tag in built:
        build_repo_image(url, tag, "stockroom-001" if tag == on_both else "verscmp-027")
    rows = [image_row("stockroom-001", on_both), image_row("verscmp-027", on_main),
            image_row("stockroom-001", missing, task_id="stockroom-missing-image")]
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(Path(MODEL_HOME) / "models")
    env = {**os.environ, "ARLCTL_HOME": str(home), "DOCKER_HOST": a}  # image lookups: the main engine
    arlctl = [str(Path(sys.executable).with_name("arlctl"))]
    try:
        started = time.monotonic()
        rollout = subprocess.run(
            [*arlctl, "rollout", "--env", "swe", "--tasks", str(tasks_file), "--policy", "oracle:gold",
             "--sandbox", "docker", "--sandboxes", "2", "--group-size", "1", "--docker-host", b,
             "--docker-host", a, "--run", str(tmp_path / "run"), "--quiet", "--json"],
            env=env, capture_output=True, text=True, timeout=600)
        print(f"\nrollout of 3 image rows over 2 engines: {time.monotonic() - started:.1f}s", file=sys.stderr)
    finally:
        for url, tag in built:
            _docker(url, "rmi", "-f", tag)
    # One row in three failed: within --max-error-frac (0.5), so the run itself succeeds.
    assert rollout.returncode == 0, rollout.stderr[-3000:]
    summary = json.loads(rollout.stdout)
    assert summary["status"] == {"ok": 2, "env_error": 1}, summary
    assert summary["error_causes"] == {"reset_error": 1}
    assert missing in summary["last_error"] and "on no engine" in summary["last_error"]

    from arlctl.io.shards import read_shard

    [shard] = sorted((tmp_path / "run" / "rollouts").glob("*.parquet"))
    by_task = {r["task_id"]: r for r in read_shard(str(shard)).to_pylist()}
    bad = by_task["stockroom-missing-image"]
    assert bad["status"] == "env_error" and bad["finish_reason"] == "error" and bad["env_errors"] == 1
    assert bad["final_state"] is None and bad["reward"] is None  # nothing a grader could score
    cause = json.loads(bad["env_info"])  # no turn to carry the cause: the row's env_info does
    assert cause["error"] == "reset_error" and missing in cause["reset_error"], cause
    for task_id, image, engines in (("stockroom-001", on_both, {a, b}), ("verscmp-027", on_main, {a})):
        row = by_task[task_id]
        info = json.loads(row["env_info"])
        assert row["status"] == "ok" and row["finish_reason"] == "submit", row["turns"]
        assert info["image"] == image and info["engine"] in engines, info
        assert "replaced_from" not in info
    # Placed where each image was: no start failed first (the backend logs each such retry).
    assert "trying another engine" not in rollout.stderr, rollout.stderr[-2000:]
    # Grading the run now that the images are gone: each row's reward is null with the cause naming its
    # image, never a 0, and the stage does not stop as if its options were wrong (exit 2).
    reward = subprocess.run([*arlctl, "reward", "--run", str(tmp_path / "run"), "--reward", "swe",
                             "--reward-opt", "sandbox=docker", "--quiet"], env=env, capture_output=True, text=True,
                            timeout=600)
    assert reward.returncode == 1, reward.stderr[-2000:]  # every row failed: a terminal error, not usage
    graded = [r for path in sorted((tmp_path / "run" / "rewarded").glob("*.parquet"))
              for r in read_shard(str(path)).to_pylist()]
    ok_rows = [r for r in graded if r["status"] == "ok"]
    assert len(ok_rows) == 2 and all(r["reward"] is None for r in ok_rows)
    for row in ok_rows:
        cause = json.loads(row["reward_info"])
        assert "on no engine" in json.dumps(cause) and json.loads(row["env_info"])["image"] in json.dumps(cause)


@pytest.mark.docker
@pytest.mark.slow
def test_an_image_only_on_the_sandbox_engines_is_found_there_for_the_env_and_the_grader(images, monkeypatch):
    """A row's image lives only on engine b, which the user names as the sandboxes' engine (the backend's
    docker_hosts: `--docker-host`, `--reward-opt docker_hosts=`), while $DOCKER_HOST is the main engine and
    $ARLCTL_DOCKER_HOSTS is unset. Looking only at the environment the image is missing (ImageMissing);
    given the engines, the env's options and snapshot come from b, and the grader scores the gold patch 1.0
    and the empty one 0.0 in sandboxes on b."""
    from arlctl.envs.swe.grader import score
    from arlctl.envs.swe.tasks import ImageMissing, prepare_snapshot, sandbox_options

    a, b = images["a"], images["b"]
    only_b = TAG.format("repo-only-b")
    build_repo_image(b, only_b, "stockroom-001")
    monkeypatch.setenv("DOCKER_HOST", a)
    monkeypatch.delenv("ARLCTL_DOCKER_HOSTS", raising=False)
    row = image_row("stockroom-001", only_b)
    try:
        with pytest.raises(ImageMissing, match=f"docker image {only_b} is on no engine"):
            sandbox_options(row, "docker")
        options = sandbox_options(row, "docker", [b])
        assert options["image"] == only_b and options["workdir"] == "/testbed" and options["env"]["PATH"]
        snapshot = Path(prepare_snapshot(row, b))
        assert (snapshot / ".git" / "HEAD").is_file() and (snapshot / "stockroom").is_dir()
        gold, _, info = asyncio.run(score(row["patch"], row, sandbox="docker", docker_hosts=b))
        assert gold == 1.0, info
        empty, _, info = asyncio.run(score("", row, sandbox="docker", docker_hosts=b))
        assert empty == 0.0, info
        with pytest.raises(Exception, match="docker_hosts needs sandbox=docker"):
            asyncio.run(score("", row, sandbox="bwrap", docker_hosts=b))
    finally:
        _docker(b, "rmi", "-f", only_b)
