"""Helpers for the swe tests (imported by name: pytest puts this directory on sys.path)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest


def run(coro):
    return asyncio.run(coro)


def make_diff(task: dict, edits: dict[str, str | None | Callable[[str], str]]) -> str:
    """A git diff of the task's snapshot after `edits` (path -> new text, a function of the old text,
    or None to delete), made on the host with git as an agent's `git diff` would be."""
    from arlctl.envs.swe.tasks import prepare_snapshot

    snapshot = Path(prepare_snapshot(task))
    work = Path(os.environ["ARLCTL_HOME"]) / "diff-work"
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(snapshot, work, symlinks=True)
    for rel, edit in edits.items():
        target = work / rel
        if edit is None:
            target.unlink()
            continue
        if callable(edit):
            edit = edit(target.read_text())
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(edit)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "-C", str(work), "add", "-A", "-f"], check=True, env=env)
    diff = subprocess.run(["git", "-C", str(work), "diff", "--cached"], check=True, env=env,
                          capture_output=True, text=True).stdout
    shutil.rmtree(work)
    return diff


def grading_factory(kind: str):
    """A grading sandbox factory of `kind` (bwrap or docker), or a skip saying what is missing."""
    from arlctl.envs.swe.grader import sandbox_factory
    from arlctl.sandbox.bwrap import bwrap_available

    if kind == "bwrap" and not bwrap_available():
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    if kind == "docker":
        from arlctl.sandbox.docker import DEFAULT_IMAGE, docker_client

        try:  # the engine and its base image, as the docker tier's other tests check them
            docker_client(timeout=5).images.get(DEFAULT_IMAGE)
        except Exception as err:
            pytest.skip(f"no docker engine with the base image ({err}); run .ci/docker_setup.sh")
    return sandbox_factory(kind)


# The hacking suites run on both grading backends: `bwrap` there is this fixture, parametrised.
BACKENDS = ["bwrap", pytest.param("docker", marks=pytest.mark.docker)]
