"""swe tasks: the built-in suite (`builtin:swe`), SWE-bench style JSONL, and repository snapshots.

    builtin:swe                 the 42 built-in tasks
    builtin:swe?n=5&start=10    a slice of them
    builtin:swe?ids=a,b         named instances
    tasks.jsonl                 SWE-bench fields + `repo_snapshot` (a directory or .tar/.tar.gz) or `image`

A snapshot is what the policy's sandbox starts from: the task's files at the buggy state in a git
repository with exactly one commit, so there is no history to mine (no future commits, no gold patch,
no hidden tests). `prepare_snapshot` builds it once per content hash under $ARLCTL_HOME/swe/snapshots.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from arlctl.envs.tasks import int_option, register_task_source, reject_unknown_options
from arlctl.errors import TerminalError, UsageError

SUITE_DIR = Path(__file__).with_name("suite")
ENV_NAME = "swe"
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "arlctl", "GIT_AUTHOR_EMAIL": "snapshot@arlctl", "GIT_COMMITTER_NAME": "arlctl",
    "GIT_COMMITTER_EMAIL": "snapshot@arlctl", "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
    "PATH": "/usr/bin:/bin",
}
_SKIP_NAMES = {".git", "__pycache__", ".pytest_cache"}


def suite_ids() -> list[str]:
    return sorted(p.name for p in SUITE_DIR.iterdir() if (p / "task.json").is_file())


def load_suite_task(instance_id: str) -> dict[str, Any]:
    folder = SUITE_DIR / instance_id
    if not (folder / "task.json").is_file():
        raise UsageError(f"no built-in swe task {instance_id!r}", hint="see `builtin:swe` for the list")
    task = json.loads((folder / "task.json").read_text(encoding="utf-8"))
    task.update(task_id=task["instance_id"], env=ENV_NAME, repo_snapshot=f"builtin:{instance_id}")
    return task


@register_task_source("swe")
def builtin_swe(options: dict[str, str]) -> list[dict[str, Any]]:
    source = "builtin:swe"
    ids = suite_ids()
    wanted = [i for i in options.pop("ids", "").split(",") if i]
    start = int_option(options, "start", 0, source)
    n = int_option(options, "n", len(ids), source)
    reject_unknown_options(options, source, ["n", "start", "ids"])
    if wanted:
        unknown = sorted(set(wanted) - set(ids))
        if unknown:
            raise UsageError(f"{source}: unknown ids {', '.join(unknown)}")
        ids = [i for i in ids if i in wanted]
    return [load_suite_task(i) for i in ids[start : start + n]]


def _source_dir(task: dict[str, Any], scratch: Path) -> Path:
    """The directory holding the task's buggy files (a tarball is unpacked into scratch)."""
    ref = task.get("repo_snapshot")
    if not ref:
        raise UsageError(f"swe task {task.get('task_id')!r} has no repo_snapshot",
                         hint="give a directory or tarball path, or use the docker sandbox with `image`")
    if str(ref).startswith("builtin:"):
        return SUITE_DIR / str(ref)[len("builtin:") :] / "repo"
    path = Path(ref).expanduser()
    if path.is_dir():
        return path
    if path.is_file() and tarfile.is_tarfile(path):
        with tarfile.open(path) as archive:
            archive.extractall(scratch, filter="data")  # 'data' refuses absolute paths, links out, devices
        entries = [p for p in scratch.iterdir()]
        return entries[0] if len(entries) == 1 and entries[0].is_dir() else scratch
    raise UsageError(f"repo_snapshot {ref} is neither a directory nor a tarball")


def _copy_tree(src: Path, dst: Path) -> None:
    for root, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_NAMES)
        rel = Path(root).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in sorted(files):
            if not name.endswith((".pyc", ".pyo")):
                shutil.copy2(Path(root) / name, dst / rel / name, follow_symlinks=False)


def _tree_hash(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not _SKIP_NAMES & set(p.parts)):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def snapshot_root() -> Path:
    home = os.environ.get("ARLCTL_HOME") or os.path.expanduser("~/.cache/arlctl")
    return Path(home) / "swe" / "snapshots"


def prepare_snapshot(task: dict[str, Any]) -> str:
    """Path of the task's one-commit git snapshot, built once (atomically) per content hash."""
    with tempfile.TemporaryDirectory() as scratch:
        src = _source_dir(task, Path(scratch))
        name = f"{task.get('instance_id') or task.get('task_id')}-{_tree_hash(src)}".replace("/", "_")
        target = snapshot_root() / name
        if (target / ".git" / "HEAD").is_file():
            return str(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=target.parent))
        try:
            _copy_tree(src, building)
            for args in (["init", "-q", "-b", "main"], ["add", "-A", "-f"], ["commit", "-q", "-m", "snapshot"]):
                result = subprocess.run(["git", "-C", str(building), *args], env=_GIT_ENV, capture_output=True,
                                        text=True)
                if result.returncode != 0:
                    raise TerminalError(f"could not build snapshot {name}: git {args[0]}: {result.stderr.strip()}")
            os.chmod(building, 0o755)
            try:
                os.replace(building, target)
            except OSError:  # another process built it first
                shutil.rmtree(building, ignore_errors=True)
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise
    return str(target)


def test_files(task: dict[str, Any]) -> list[str]:
    """The files holding the FAIL_TO_PASS and PASS_TO_PASS tests."""
    ids = test_ids(task, "FAIL_TO_PASS") + test_ids(task, "PASS_TO_PASS")
    return sorted({i.split("::")[0] for i in ids})


def _as_list(value: Any) -> list[str]:
    # SWE-bench files store FAIL_TO_PASS as a JSON string holding a list.
    if isinstance(value, str):
        return list(json.loads(value))
    return list(value)


def test_ids(task: dict[str, Any], key: str) -> list[str]:
    return _as_list(task.get(key) or [])
