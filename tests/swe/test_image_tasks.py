"""swe tasks given only by a docker image (SWE-bench per-instance images), on a real engine.

The fixture builds per-instance images locally from arlctl/sandbox-base:1, as SWE-bench's are: the
repository at /testbed with a real git history in which the gold fix is a *future* commit (on a branch,
a tag, in the reflog, packed, plus a dangling commit), then reset to the base commit. The tests show the
grader's gold -> 1 / empty -> 0, that the policy's workspace cannot reach any future object, and the
real CLI: `arlctl rollout --tasks image_tasks.jsonl --policy oracle:gold --sandbox docker` then
`arlctl reward --reward swe` gives 1.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from swe_helpers import run

from arlctl.envs.swe.env import SweEnv
from arlctl.envs.swe.grader import sandbox_factory, score, self_check
from arlctl.envs.swe.tasks import SUITE_DIR, prepare_snapshot
from arlctl.errors import UsageError

# The shared model cache (read before conftest's session fixture points ARLCTL_HOME elsewhere).
MODEL_HOME = os.environ.get("ARLCTL_HOME") or os.path.expanduser("~/.cache/arlctl")
BASE_IMAGE = "arlctl/sandbox-base:1"
INSTANCES = ["stockroom-001", "verscmp-027"]
FUTURE_MESSAGE = "Fix the bug upstream (future commit)"
_GIT = "git -c user.name=dev -c user.email=dev@example.com"


def _client():
    from arlctl.sandbox.docker import docker_client

    try:
        client = docker_client(timeout=120)
        client.images.get(BASE_IMAGE)
    except Exception as e:
        pytest.skip(f"no docker engine with {BASE_IMAGE} ({e}); run .ci/docker_setup.sh")
    return client


def _repo_tar(instance_id: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(SUITE_DIR / instance_id / "repo", arcname="testbed",
                filter=lambda info: None if "__pycache__" in info.name else info)
    return buf.getvalue()


def _sh(container, script: str) -> str:
    code, out = container.exec_run(["/bin/sh", "-ec", script], workdir="/testbed", user="0:0")
    assert code == 0, out.decode()
    return out.decode()


def build_instance_image(client, task: dict) -> tuple[str, str, str]:
    """A SWE-bench style image for one built-in task: (image tag, base sha, future sha)."""
    container = client.containers.create(BASE_IMAGE, ["sleep", "infinity"], user="0:0", network_mode="none")
    try:
        container.start()
        container.put_archive("/", _repo_tar(task["instance_id"]))
        container.put_archive("/tmp", _tar_of({"gold.diff": task["patch"], "tests.diff": task["test_patch"]}))
        base = _sh(container, f"git init -q -b main . && git add -A && {_GIT} commit -q -m 'base state' && "
                              "git rev-parse HEAD").strip()
        future = _sh(container, f"git apply /tmp/gold.diff /tmp/tests.diff && git add -A && "
                                f"{_GIT} commit -q -m '{FUTURE_MESSAGE}' && git branch fix-upstream && "
                                "git tag v-next && git rev-parse HEAD").strip()
        # A second future commit left dangling (only the reflog names it), as amended work leaves.
        _sh(container, f"echo later >> README.later && git add -A && {_GIT} commit -q -m 'later work' && "
                       "git reset -q --hard HEAD~1")
        # Packed history and refs, like a cloned repository; then back to the base commit.
        _sh(container, f"git repack -q -a -d && git pack-refs --all && git reset -q --hard {base} && "
                       "rm -f /tmp/gold.diff /tmp/tests.diff")
        tag = f"arlctl-test/swe-{task['instance_id']}:{os.getpid()}"
        repository, _, version = tag.partition(":")
        container.commit(repository=repository, tag=version, changes=["WORKDIR /testbed"])
        return tag, base, future
    finally:
        container.remove(force=True)


def _tar_of(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def image_task(instance_id: str, image: str, base: str) -> dict:
    """A SWE-bench JSONL row: the suite's fields, the image, no snapshot."""
    task = json.loads((SUITE_DIR / instance_id / "task.json").read_text())
    task.update(task_id=task["instance_id"], base_commit=base, image=image, env="swe")
    task.pop("repo_snapshot", None)
    return task


@pytest.fixture(scope="module")
def images():
    """{instance_id: (task, future sha)} over freshly built per-instance images, removed afterwards."""
    client = _client()
    built, started = {}, time.monotonic()
    try:
        for iid in INSTANCES:
            base_task = json.loads((SUITE_DIR / iid / "task.json").read_text())
            tag, base, future = build_instance_image(client, base_task)
            built[iid] = (image_task(iid, tag, base), future)
        print(f"\nbuilt {len(built)} instance images in {time.monotonic() - started:.1f}s", file=sys.stderr)
        yield built
    finally:
        for task, _ in built.values():
            try:
                client.images.remove(task["image"], force=True)
            except Exception:
                pass
        client.close()


@pytest.mark.docker
def test_fixture_image_really_holds_the_future(images):
    """Sanity: the image itself (what the policy must NOT see) has the future commit in its history."""
    client = _client()
    task, future = images["stockroom-001"]
    script = "git log --all --format=%H%n%s; git rev-parse HEAD"
    out = client.containers.run(task["image"], ["/bin/sh", "-c", script], network_mode="none", remove=True)
    out = out.decode()
    assert future in out and FUTURE_MESSAGE in out
    assert out.strip().splitlines()[-1] == task["base_commit"]


@pytest.mark.docker
def test_gold_is_one_and_empty_is_zero(images):
    tasks = [task for task, _ in images.values()]
    started = time.monotonic()
    rows = run(self_check(tasks, sandbox_factory("docker"), concurrency=1))
    per_grade = (time.monotonic() - started) / (2 * len(tasks))
    print(f"\ndocker grading of image tasks: {per_grade:.2f}s per grade", file=sys.stderr)
    got = [(r["task_id"], r["gold"], r["empty"]) for r in rows]
    assert got == [(t["task_id"], 1.0, 0.0) for t in tasks], rows
    # The registered reward picks docker for image tasks by itself, and refuses other backends.
    task = tasks[0]
    reward, components, info = run(score(task["patch"], task))
    assert reward == 1.0 and components["f2p"] == 1.0, info
    with pytest.raises(UsageError, match="docker image"):
        run(score(task["patch"], task, sandbox="bwrap"))


@pytest.mark.docker
def test_policy_workspace_has_no_future_commits(images):
    task, future = images["stockroom-001"]
    base_text = "".join(p.read_text() for p in (SUITE_DIR / "stockroom-001" / "repo").rglob("*.py"))
    gold_lines = [line[1:] for line in task["patch"].splitlines()
                  if line.startswith("+") and not line.startswith("+++") and line[1:].strip()
                  and line[1:] not in base_text]  # lines only the fix has
    assert gold_lines
    probes = {
        "all_commits": "git rev-list --all --reflog | sort -u",
        "refs": "git for-each-ref --format='%(refname)'; cat .git/packed-refs 2>/dev/null; ls -R .git/refs",
        "reflog": "git reflog --all --format=%H 2>/dev/null; cat .git/logs/HEAD 2>/dev/null",
        "future": f"git cat-file -t {future} 2>&1; git cat-file -t {task['base_commit']} 2>&1",
        "fsck": "git fsck --lost-found --unreachable --dangling --no-reflogs 2>&1; "
                "ls -A .git/lost-found 2>&1",
        "objects": "git count-objects -v; ls .git/objects/pack",
        "blobs": "git cat-file --batch-all-objects --batch",
        "everywhere": f"grep -rlI -D skip -e '{FUTURE_MESSAGE}' -e '{future}' / --exclude-dir=proc "
                      "--exclude-dir=sys --exclude-dir=dev 2>/dev/null; true",
        "repo_dir": "pwd; git log --format=%s",
    }

    async def scenario():
        env = SweEnv(sandbox="docker", sandboxes=1)
        try:
            await env.reset(task)
            assert env.sandbox.kind == "docker" and env.sandbox.workdir == "/testbed"
            seen = {}
            for name, cmd in probes.items():
                result = await env.sandbox.exec(cmd, timeout=60)
                seen[name] = result.stdout + result.stderr
            # The workspace is a working copy: the visible tests pass on the buggy base state.
            tests = await env.sandbox.exec("python3 -m pytest -q -p no:cacheprovider tests", timeout=60)
            return env.base_commit, seen, tests
        finally:
            await env.close()

    head, seen, tests = run(scenario())
    commits = seen["all_commits"].split()
    assert commits == [head], seen["all_commits"]  # exactly one commit anywhere, reflog included
    assert head != task["base_commit"] and head != future  # a fresh history, not the image's
    assert "fix-upstream" not in seen["refs"] and "v-next" not in seen["refs"], seen["refs"]
    assert future not in seen["reflog"] and FUTURE_MESSAGE not in seen["reflog"]
    # Neither the future commit nor the image's own base commit exists in the workspace's repository.
    assert "commit" not in seen["future"] and seen["future"].count("fatal") >= 2, seen["future"]
    assert "unreachable" not in seen["fsck"] and "dangling" not in seen["fsck"], seen["fsck"]
    assert FUTURE_MESSAGE not in seen["blobs"] and "later work" not in seen["blobs"]
    for added in gold_lines:  # no object holds the gold fix's new lines
        assert added not in seen["blobs"], added
    assert seen["everywhere"].strip() == "", seen["everywhere"]
    assert seen["repo_dir"].splitlines() == ["/testbed", "snapshot"]
    assert tests.exit_code == 0, tests.stdout + tests.stderr


@pytest.mark.docker
def test_cli_rollout_then_reward_gives_one(images, tmp_path):
    rows = [task for task, _ in images.values()]
    tasks_file = tmp_path / "image_tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(t) + "\n" for t in rows))
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(Path(MODEL_HOME) / "models")  # the tokenizer cache, not its snapshots
    env = {**os.environ, "ARLCTL_HOME": str(home)}
    arlctl = [str(Path(sys.executable).with_name("arlctl"))]
    rollout = subprocess.run(
        [*arlctl, "rollout", "--env", "swe", "--tasks", str(tasks_file), "--policy", "oracle:gold",
         "--sandbox", "docker", "--sandboxes", "2", "--group-size", "1", "--run", str(tmp_path / "run"),
         "--quiet", "--json"], env=env, capture_output=True, text=True, timeout=600)
    assert rollout.returncode == 0, rollout.stderr[-3000:]
    reward = subprocess.run([*arlctl, "reward", "--run", str(tmp_path / "run"), "--reward", "swe", "--json"],
                            env=env, capture_output=True, text=True, timeout=600)
    assert reward.returncode == 0, reward.stderr[-3000:]
    summary = json.loads(reward.stdout)
    assert summary["rows"] == len(rows) and summary["mean_reward"] == 1.0, summary
    # The snapshots were exported from the images into this run's ARLCTL_HOME, once per image.
    exported = sorted(p.name.rsplit("-image-", 1)[0] for p in (home / "swe" / "snapshots").iterdir()
                      if not p.name.startswith("."))
    assert exported == sorted(INSTANCES)


def test_image_task_refused_off_docker():
    """No engine needed: bwrap and subprocess refuse an image task with a message naming the fix."""
    image = "example.org/swe-bench/sweb.eval.x86_64.stockroom-001:latest"  # never pulled: refused first
    task = image_task("stockroom-001", image, "0" * 40)

    async def scenario(kind):
        env = SweEnv(sandbox=kind, sandboxes=1, insecure_sandbox=True)
        try:
            await env.reset(task)
        finally:
            await env.close()

    for kind in ("bwrap", "subprocess"):
        with pytest.raises(UsageError, match=f"cannot run in a {kind} sandbox"):
            run(scenario(kind))
    with pytest.raises(UsageError, match="docker image"):
        run(score("", task, sandbox="bwrap"))
    # A task with a snapshot of its own keeps using it, whatever `image` says.
    with_snapshot = {**task, "repo_snapshot": str(SUITE_DIR / "stockroom-001" / "repo")}
    assert Path(prepare_snapshot(with_snapshot), ".git").is_dir()
