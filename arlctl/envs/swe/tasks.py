"""swe tasks: the built-in suite (`builtin:swe`), SWE-bench style JSONL, and repository snapshots.

    builtin:swe                 the 42 built-in tasks
    builtin:swe?n=5&start=10    a slice of them
    builtin:swe?ids=a,b         named instances
    tasks.jsonl|.parquet        SWE-bench / SWE-Gym rows + `repo_snapshot` (a directory or .tar/.tar.gz),
                                `repo_path` (a git repository, exported at `base_commit`) or `image`

A SWE-bench row (instance_id, repo, base_commit, problem_statement, patch, test_patch, FAIL_TO_PASS,
PASS_TO_PASS; the two lists as JSON strings, as the datasets store them, or as lists) needs nothing
more: the grader applies test_patch in its own sandbox and runs the files of the listed pytest ids.
`check_task` refuses a row it could not grade (BadTaskRow, naming the row) before anything is built.

A snapshot is what the policy's sandbox starts from: the task's files at the buggy state in a git
repository with exactly one commit, so there is no history to mine (no future commits, no gold patch,
no hidden tests). `prepare_snapshot` builds it once per content hash under $ARLCTL_HOME/swe/snapshots.

A task file may be hostile, so `repo_snapshot` and `repo_path` are read only from allowed bases: a
built-in task's `repo/`, the snapshot cache, and directories the user lists in $ARLCTL_SNAPSHOT_BASES
(separated by `:`). The path is resolved (every symlink followed) before it is checked, so a link out of a base is
refused like any other path; links inside a snapshot are copied as links, never read through. A refusal
is a `SnapshotRefused` (a TerminalError of that row): one line, raised before anything at that path
is opened. A `repo_path` is confined through every git indirection too (`confined_object_dirs`: a `.git`
file or link, commondir, objects or a pack as a link, chained alternates), and git reads only its
object directories, through a git directory of ours with our environment and config alone, so the
repository's config (include.path, a partial clone's promisor remote), refs, grafts and shallow file
are never read.

Image tasks (SWE-bench per-instance images: `image`, optional `repo_dir`, default /testbed, and no
`repo_snapshot`) run only on the docker backend, in a container of that image with the workspace at
`repo_dir`, because the image carries the environment the repository needs. The repository inside the
image has its full history, so it is never shown as it is: its working tree (build outputs included,
.git left out) is exported once per image id into a one-commit snapshot like any other, and that
snapshot, mounted over `repo_dir`, is what both the policy's and the grader's containers start from.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from arlctl.envs.swe import official
from arlctl.envs.tasks import int_option, register_task_source, reject_unknown_options
from arlctl.errors import TerminalError, UsageError

SUITE_DIR = Path(__file__).with_name("suite")
ENV_NAME = "swe"
DEFAULT_REPO_DIR = "/testbed"  # where SWE-bench images keep the repository
Hosts = str | list[str] | None  # the docker backend's `docker_hosts` option: a list or "url,url"
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "arlctl", "GIT_AUTHOR_EMAIL": "snapshot@arlctl", "GIT_COMMITTER_NAME": "arlctl",
    "GIT_COMMITTER_EMAIL": "snapshot@arlctl", "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
    "PATH": "/usr/bin:/bin",
    # No automatic gc: after committing a large tree (django's ~6,900 files) git packs the loose objects in
    # the background, deleting files while the snapshot is being copied into a sandbox.
    "GIT_CONFIG_COUNT": "2", "GIT_CONFIG_KEY_0": "gc.auto", "GIT_CONFIG_VALUE_0": "0",
    "GIT_CONFIG_KEY_1": "maintenance.auto", "GIT_CONFIG_VALUE_1": "false",
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


class SnapshotRefused(TerminalError):
    """A task's repo_snapshot is missing, unusable or outside the allowed bases. It is the row's own
    fault, not the command's: a rollout records the row as env_error and reward scores it null with
    this cause (a UsageError would stop the whole stage on one hostile row)."""


SNAPSHOT_BASES_ENV = "ARLCTL_SNAPSHOT_BASES"


def snapshot_bases() -> list[Path]:
    """Resolved directories a repo_snapshot may lie in, besides a built-in task's repo/: the snapshot
    cache and each entry of $ARLCTL_SNAPSHOT_BASES."""
    listed = [p for p in os.environ.get(SNAPSHOT_BASES_ENV, "").split(os.pathsep) if p.strip()]
    return [Path(os.path.realpath(os.path.expanduser(p))) for p in [snapshot_root(), *listed]]


def _within(path: str, base: Path) -> bool:
    return path == str(base) or path.startswith(str(base).rstrip("/") + "/")


def _in_builtin_repo(path: str) -> bool:
    """Inside SUITE_DIR/<task>/repo (not the task folders themselves: they hold gold patches)."""
    suite = os.path.realpath(SUITE_DIR)
    if not _within(path, Path(suite)):
        return False
    parts = Path(path).relative_to(suite).parts
    return len(parts) >= 2 and parts[1] == "repo"


def resolve_snapshot_ref(task: dict[str, Any], field: str = "repo_snapshot") -> Path:
    """The allowed, resolved path a task's repo_snapshot (or repo_path) names; SnapshotRefused for any other."""
    ref, task_id = task.get(field), task.get("task_id") or task.get("instance_id")
    if not ref:
        raise SnapshotRefused(f"swe task {task_id!r} has no repo_snapshot",
                              hint="give a directory or tarball path, a git repository as repo_path with "
                                   "base_commit, or use the docker sandbox with `image`")
    if not isinstance(ref, str) or "\0" in ref:
        raise SnapshotRefused(f"swe task {task_id!r}: {field} must be a path string")
    if ref.startswith("builtin:") and field == "repo_snapshot":
        name = ref[len("builtin:") :]
        if name not in suite_ids():
            raise SnapshotRefused(f"swe task {task_id!r}: no built-in snapshot {name!r}")
        return SUITE_DIR / name / "repo"
    path = os.path.realpath(os.path.expanduser(ref))  # follows every link, so escapes are seen here
    if _in_builtin_repo(path) or any(_within(path, base) for base in snapshot_bases()):
        return Path(path)
    shown = ref if path == ref else f"{ref} (resolving to {path})"
    raise SnapshotRefused(
        f"swe task {task_id!r}: {field} {shown} is outside the allowed snapshot bases",
        hint=f"add its directory to ${SNAPSHOT_BASES_ENV} (':'-separated) if the task file is trusted")


def _source_dir(task: dict[str, Any], scratch: Path) -> Path:
    """The directory holding the task's buggy files (a tarball is unpacked into scratch)."""
    ref = task.get("repo_snapshot")
    path = resolve_snapshot_ref(task)
    if path.is_dir():
        return path
    if path.is_file() and tarfile.is_tarfile(path):
        with tarfile.open(path) as archive:
            archive.extractall(scratch, filter="data")  # 'data' refuses absolute paths, links out, devices
        entries = [p for p in scratch.iterdir()]
        return entries[0] if len(entries) == 1 and entries[0].is_dir() else scratch
    raise SnapshotRefused(f"repo_snapshot {ref} is neither a directory nor a tarball")


def _copy_tree(src: Path, dst: Path) -> None:
    for root, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_NAMES)
        rel = Path(root).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in sorted(files):
            if not name.endswith((".pyc", ".pyo")):
                shutil.copy2(Path(root) / name, dst / rel / name, follow_symlinks=False)


def _tree_hash(root: Path) -> str:
    """Content hash of the tree; a symlink counts by its target text and is never read through."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if not _SKIP_NAMES & set(p.parts)):
        if path.is_symlink():
            content = b"link:" + os.readlink(path).encode()
        elif path.is_file():
            content = path.read_bytes()
        else:
            continue
        digest.update(str(path.relative_to(root)).encode() + b"\0" + content + b"\0")
    return digest.hexdigest()[:16]


def snapshot_root() -> Path:
    home = os.environ.get("ARLCTL_HOME") or os.path.expanduser("~/.cache/arlctl")
    return Path(home) / "swe" / "snapshots"


def prepare_snapshot(task: dict[str, Any], docker_hosts: Hosts = None) -> str:
    """Path of the task's one-commit git snapshot, built once (atomically) per content hash
    (per image id for image tasks, looked up on `docker_hosts` as _engines says; per tree id for repo_path
    tasks). The task is checked first (check_task): a bad row is a BadTaskRow naming it, before anything
    is built."""
    check_task(task)
    if image_of(task):
        return prepare_image_snapshot(task, hosts=docker_hosts)
    if task.get("repo_path") and not task.get("repo_snapshot"):
        return prepare_repo_snapshot(task)
    with tempfile.TemporaryDirectory() as scratch:
        src = _source_dir(task, Path(scratch))
        name = f"{task.get('instance_id') or task.get('task_id')}-{_tree_hash(src)}".replace("/", "_")
        return _build_snapshot(src, name)


def _build_snapshot(src: Path, name: str) -> str:
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
                raise TerminalError(
                    f"could not build snapshot {name}: git {args[0]}: {result.stderr.strip()}")
        os.chmod(building, 0o755)
        try:
            os.replace(building, target)
        except OSError:  # another process built it first
            shutil.rmtree(building, ignore_errors=True)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return str(target)


# ---- repository tasks (SWE-bench rows over a local git repository) --------------------------------------

_GIT_READ = ["git", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "-c", "safe.directory=*"]
_MODES = {"100644": 0o644, "100755": 0o755}
# What git reads of a task's repository, it reads through a git directory of ours (GIT_DIR, with our own
# config, no refs, grafts, shallow or worktrees) whose only link to the repository is an alternates file
# listing its object directories, each resolved and confined first. The environment is ours alone (no
# GIT_* of the caller), with no lazy fetch for a partial clone's missing objects and no replace refs.
_GIT_READ_ENV = {**_GIT_ENV, "GIT_NO_LAZY_FETCH": "1", "GIT_NO_REPLACE_OBJECTS": "1", "GIT_TERMINAL_PROMPT": "0",
                 "GIT_ALLOW_PROTOCOL": "none"}
MAX_ALTERNATE_DEPTH = 5  # as git's own limit on chained alternates
_MAX_POINTER_BYTES = 4096  # a `.git` file, `commondir` or `alternates` larger than this is refused


def _git_read(git_dir: Path, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*_GIT_READ, *args], env={**_GIT_READ_ENV, "GIT_DIR": str(git_dir)}, input=stdin,
                          capture_output=True, cwd=git_dir)


def prepare_repo_snapshot(task: dict[str, Any]) -> str:
    """A one-commit snapshot of `repo_path` (a git repository in an allowed base) at `base_commit`.

    Only the base commit's tree is exported, blob by blob (`git cat-file`, so no filter, attribute or
    hook of the repository runs and nothing of the working tree, the index or other commits is read): the
    policy sees the buggy files and no history, so neither the fix nor test_patch's tests, even when the
    repository holds them in later commits. Built once per tree id.

    git never opens the repository itself: `confined_object_dirs` resolves every indirection of it (a
    `.git` file, `commondir`, `objects` and anything in it as a link, chained alternates) and refuses any
    that lands outside the allowed bases; git then reads only those object directories, through a git
    directory of ours, so the repository's config (include.path, core.worktree, ...), refs, grafts,
    shallow file and worktrees are never read. base_commit is therefore a commit id (full or abbreviated)."""
    repo = resolve_snapshot_ref(task, "repo_path")
    base = task.get("base_commit")
    if not isinstance(base, str) or not base.strip() or base.startswith("-") or any(c.isspace() for c in base):
        raise BadTaskRow(f"swe task {_row_name(task)} has repo_path but no usable base_commit ({base!r})",
                         hint="base_commit names the commit the task starts from (a sha)")
    objects = confined_object_dirs(repo, task)
    with tempfile.TemporaryDirectory() as scratch:
        git_dir = _reader_git_dir(Path(scratch) / "git", objects)
        tree = _git_read(git_dir, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{base}^{{tree}}")
        if tree.returncode != 0:
            raise BadTaskRow(f"swe task {_row_name(task)}: repo_path {repo} has no commit {base!r}",
                             hint="fetch the commit into the repository, or fix base_commit (a commit id)")
        tree_id = tree.stdout.decode().strip()
        name = f"{task.get('instance_id') or task.get('task_id')}-git-{tree_id[:16]}".replace("/", "_")
        if (snapshot_root() / name / ".git" / "HEAD").is_file():
            return str(snapshot_root() / name)
        (Path(scratch) / "tree").mkdir()
        _export_tree(git_dir, tree_id, Path(scratch) / "tree", _row_name(task))
        return _build_snapshot(Path(scratch) / "tree", name)


def _reader_git_dir(git_dir: Path, objects: list[Path]) -> Path:
    """A bare git directory of ours whose objects are the given (confined) object directories."""
    (git_dir / "objects" / "info").mkdir(parents=True)
    (git_dir / "refs").mkdir()
    (git_dir / "HEAD").write_text("ref: refs/heads/main\n")
    (git_dir / "config").write_text("[core]\n\trepositoryformatversion = 0\n\tbare = true\n")
    (git_dir / "objects" / "info" / "alternates").write_text("".join(f"{p}\n" for p in objects))
    return git_dir


def _allowed(path: str) -> bool:
    return _in_builtin_repo(path) or any(_within(path, base) for base in snapshot_bases())


def _confine(path: str, what: str, repo: Path, task: dict[str, Any]) -> Path:
    """`path` resolved (every link followed); SnapshotRefused naming `what` when it lies outside the bases."""
    real = os.path.realpath(path)
    if _allowed(real):
        return Path(real)
    shown = path if real == path else f"{path} (resolving to {real})"
    raise SnapshotRefused(f"swe task {_row_name(task)}: repo_path {repo}: {what} {shown} is outside the allowed "
                          "snapshot bases", hint=f"every part of the repository must lie in ${SNAPSHOT_BASES_ENV}")


def _pointer(path: Path, repo: Path, task: dict[str, Any]) -> str:
    """The text of a small git pointer file (`.git`, commondir, alternates), read without following it out."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(_MAX_POINTER_BYTES + 1)
    except OSError as err:
        raise BadTaskRow(f"swe task {_row_name(task)}: repo_path {repo}: cannot read {path.name} ({err})") from None
    if len(raw) > _MAX_POINTER_BYTES or b"\0" in raw:
        raise BadTaskRow(f"swe task {_row_name(task)}: repo_path {repo}: {path} is not a git pointer file")
    return raw.decode("utf-8", "surrogateescape")


def _git_dir_of(repo: Path, task: dict[str, Any]) -> Path:
    """The repository's git directory, found as git would in repo_path itself (never in a parent):
    `.git` (a directory, a link, or a `gitdir:` file), or repo_path when it is a bare repository."""
    dot = repo / ".git"
    if dot.is_symlink() or dot.exists():
        real = _confine(str(dot), ".git", repo, task)
        if real.is_dir():
            return real
        text = _pointer(real, repo, task)
        if not text.startswith("gitdir: "):
            raise BadTaskRow(f"swe task {_row_name(task)}: repo_path {repo} is not a usable git repository "
                             "(its .git file is not `gitdir: PATH`)")
        target = text[len("gitdir: "):].strip()
        found = _confine(os.path.join(real.parent, target), ".git's gitdir", repo, task)
        if not found.is_dir():
            raise BadTaskRow(f"swe task {_row_name(task)}: repo_path {repo} is not a usable git repository "
                             f"(its gitdir {target} is not a directory)")
        return found
    if (repo / "HEAD").is_file() and (repo / "objects").is_dir():
        return repo  # a bare repository
    parent = next((p for p in repo.parents if (p / ".git").exists()), None)
    if parent is not None:
        raise BadTaskRow(f"swe task {_row_name(task)}: repo_path {repo} is not a git repository of its own "
                         f"(the repository around it is {parent})", hint="give the repository's top directory")
    raise BadTaskRow(f"swe task {_row_name(task)}: repo_path {repo} is not a usable git repository (no .git)")


def confined_object_dirs(repo: Path, task: dict[str, Any]) -> list[Path]:
    """Every object directory git would read for repo_path, resolved, each inside the allowed bases.

    Followed and confined: the git directory (`.git` as a link or a `gitdir:` file), its `commondir`
    (a worktree's shared directory), `objects` as a link, every link inside an object directory (a pack,
    a loose object, commit-graph files), and `objects/info/alternates`, chained up to
    MAX_ALTERNATE_DEPTH. Anything outside is a SnapshotRefused naming it; nothing else of the
    repository is read (see prepare_repo_snapshot)."""
    git_dir = _git_dir_of(repo, task)
    common = git_dir
    if (git_dir / "commondir").is_symlink() or (git_dir / "commondir").exists():
        target = _pointer(_confine(str(git_dir / "commondir"), "commondir", repo, task), repo, task).strip()
        common = _confine(os.path.join(git_dir, target), "commondir", repo, task)
    first = _confine(str(common / "objects"), "the object directory", repo, task)
    if not first.is_dir():
        raise BadTaskRow(f"swe task {_row_name(task)}: repo_path {repo} is not a usable git repository "
                         f"(no object directory at {common / 'objects'})")
    out: list[Path] = []
    todo = [(first, 0)]
    while todo:
        objects, depth = todo.pop(0)
        if objects in out:
            continue
        out.append(objects)
        _confine_links(objects, repo, task)
        alternates = objects / "info" / "alternates"
        if not (alternates.is_symlink() or alternates.exists()):
            continue
        for line in _pointer(alternates, repo, task).splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if depth + 1 > MAX_ALTERNATE_DEPTH or line.startswith('"'):
                raise SnapshotRefused(f"swe task {_row_name(task)}: repo_path {repo}: alternate {line} of "
                                      f"{objects} is {'quoted' if line.startswith(chr(34)) else 'chained too deep'}; "
                                      "refused")
            alternate = _confine(os.path.join(objects, line), f"alternate object directory of {objects}", repo, task)
            if not alternate.is_dir():
                raise BadTaskRow(f"swe task {_row_name(task)}: repo_path {repo}: alternate {line} of {objects} "
                                 "is not a directory")
            todo.append((alternate, depth + 1))
    return out


def _confine_links(objects: Path, repo: Path, task: dict[str, Any]) -> None:
    """Every link inside an object directory (a pack, a loose object, an info file) resolves inside the bases."""
    for root, dirs, files in os.walk(objects):
        for name in dirs + files:
            path = os.path.join(root, name)
            if os.path.islink(path):
                _confine(path, "a link in the object directory", repo, task)


def _export_tree(git_dir: Path, tree_id: str, dst: Path, row: str) -> None:
    """Write the files of one tree into dst: exact blob bytes, executable bits, links as links."""
    listing = _git_read(git_dir, "ls-tree", "-r", "-z", "--full-tree", tree_id)
    if listing.returncode != 0:
        raise BadTaskRow(f"swe task {row}: cannot list tree {tree_id[:12]}: {listing.stderr.decode()[-300:]}")
    entries = []
    for entry in listing.stdout.split(b"\0"):
        if not entry:
            continue
        meta, _, raw_path = entry.partition(b"\t")
        mode, kind, sha = meta.decode().split()
        path = raw_path.decode("utf-8", "surrogateescape")
        parts = path.split("/")
        # A crafted tree may name "..", ".git" or an absolute path; git would refuse to check it out.
        if path.startswith("/") or any(p in ("", ".", "..") or p.lower() == ".git" for p in parts):
            raise BadTaskRow(f"swe task {row}: the base commit holds an unsafe path {path!r}")
        if kind == "blob":
            entries.append((mode, sha, path))
        elif kind == "commit":  # a submodule: its files are not in this repository; leave it empty
            (dst / path).mkdir(parents=True, exist_ok=True)
    blobs = _git_read(git_dir, "cat-file", "--batch", stdin="".join(f"{sha}\n" for _, sha, _ in entries).encode())
    if blobs.returncode != 0:
        raise BadTaskRow(f"swe task {row}: cannot read blobs: {blobs.stderr.decode()[-300:]}")
    out, offset = blobs.stdout, 0
    for mode, sha, path in entries:
        header_end = out.index(b"\n", offset)
        header = out[offset:header_end].decode().split()  # "<sha> blob <size>"
        if header[:2] != [sha, "blob"]:
            raise BadTaskRow(f"swe task {row}: blob {sha[:12]} of {path!r} cannot be read ({' '.join(header)})")
        size = int(header[2])
        content = out[header_end + 1 : header_end + 1 + size]
        offset = header_end + 1 + size + 1  # the content is followed by one newline
        target = dst / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if mode == "120000":
            os.symlink(os.fsdecode(content), target)
        else:
            target.write_bytes(content)
            os.chmod(target, _MODES.get(mode, 0o644))


# ---- image tasks (docker only) -------------------------------------------------------------------------

def image_of(task: dict[str, Any]) -> str | None:
    """The docker image a task is given by, when it has no snapshot (or repository) of its own."""
    return None if task.get("repo_snapshot") or task.get("repo_path") else (task.get("image") or None)


def repo_dir(task: dict[str, Any]) -> str:
    path = str(task.get("repo_dir") or DEFAULT_REPO_DIR)
    if not path.startswith("/") or path.rstrip("/") in ("", "/tmp") or ".." in path.split("/"):
        raise UsageError(
            f"swe task {task.get('task_id')!r}: repo_dir must be an absolute path such as /testbed")
    return path.rstrip("/")


def sandbox_options(task: dict[str, Any], kind: str, docker_hosts: Hosts = None) -> dict[str, Any]:
    """Backend options a task needs besides its snapshot: the image and workspace path of image tasks
    (the image's PATH read from the first of _engines(docker_hosts) that holds it).

    Raises UsageError for an image task on a backend other than docker: the image holds the
    environment (interpreter, dependencies, build outputs) the repository's tests need.
    """
    image = image_of(task)
    if not image:
        return {}
    if kind != "docker":
        raise UsageError(f"swe task {task.get('task_id')!r} is given by the docker image {image} "
                         f"and cannot run in a {kind} sandbox",
                         hint="use --sandbox docker (and --reward-opt sandbox=docker if you set one)")
    return {"image": image, "workdir": repo_dir(task), "env": {"PATH": _image_path(image, docker_hosts)}}


_IMAGE_PATHS: dict[str, str] = {}


class ImageMissing(TerminalError):
    """A task's image is on none of the engines looked at: that row's failure (env_error in a rollout, a null
    reward with this cause in `arlctl reward`), never a usage error that stops the whole stage."""


def _engines(docker_hosts: Hosts = None) -> list[str | None]:
    """The engines an image is looked up on: the default ($DOCKER_HOST), then every engine the sandboxes
    are placed on (`docker_hosts`, the backend option, else $ARLCTL_DOCKER_HOSTS). A bad `docker_hosts`
    is the caller's usage error (the backend refuses it too); a bad environment variable is skipped here."""
    from arlctl.sandbox.docker_engines import hosts_from

    try:
        listed = [url for url, _ in hosts_from(docker_hosts)]
    except UsageError:
        if docker_hosts:
            raise
        listed = []
    return [None, *[url for url in listed if url != os.environ.get("DOCKER_HOST")]]


def _find_image(image: str, engines: list[str | None]) -> tuple[Any, Any]:
    """(client, image) from the first engine holding `image`; the caller closes the client."""
    from arlctl.sandbox.docker import docker_client

    tried: list[str] = []
    for host in engines:
        try:
            client = docker_client(host)
        except Exception as e:
            tried.append(f"{host or 'default'}: {type(e).__name__}: {e}")
            continue
        try:
            return client, client.images.get(image)
        except Exception as e:
            tried.append(f"{host or os.environ.get('DOCKER_HOST') or 'default'}: {type(e).__name__}")
            client.close()
    raise ImageMissing(f"docker image {image} is on no engine looked at ({'; '.join(tried)})",
                       hint="build or pull it there first; `arlctl sandbox prefetch --tasks FILE` lists what is missing")


def _image_path(image: str, docker_hosts: Hosts = None) -> str:
    """The image's own PATH (a SWE-bench image's conda env), so its python3 and pytest are found."""
    if image not in _IMAGE_PATHS:
        client, found = _find_image(image, _engines(docker_hosts))
        try:
            env = found.attrs.get("Config", {}).get("Env") or []
        finally:
            client.close()
        paths = [e.partition("=")[2] for e in env if e.startswith("PATH=")]
        _IMAGE_PATHS[image] = paths[0] if paths else "/usr/local/bin:/usr/bin:/bin"
    return _IMAGE_PATHS[image]


def prepare_image_snapshot(task: dict[str, Any], docker_host: str | None = None, hosts: Hosts = None) -> str:
    """Export `repo_dir` of the task's image into a one-commit snapshot, once per image id (from `docker_host`,
    else the first engine of _engines(hosts) that holds the image)."""
    image_ref, where = image_of(task), repo_dir(task)
    client, image = _find_image(str(image_ref), [docker_host] if docker_host else _engines(hosts))
    try:
        tag = image.id.split(":")[-1][:16]
        if where != DEFAULT_REPO_DIR:
            tag += "-" + hashlib.sha256(where.encode()).hexdigest()[:8]
        name = f"{task.get('instance_id') or task.get('task_id')}-image-{tag}".replace("/", "_")
        if (snapshot_root() / name / ".git" / "HEAD").is_file():
            return str(snapshot_root() / name)
        with tempfile.TemporaryDirectory() as scratch:
            src = _export(client, image.id, where, Path(scratch))
            _check_base_commit(task, src)
            return _build_snapshot(src, name)
    finally:
        client.close()


def _export(client: Any, image_id: str, where: str, scratch: Path) -> Path:
    """Copy `where` out of the image (a created, never started container) into scratch."""
    container = client.containers.create(image_id, ["true"], network_disabled=True,
                                         labels={"arlctl.export": "1"})
    try:
        stream, _stat = container.get_archive(where)
        archive_path = scratch / "repo.tar"
        with open(archive_path, "wb") as out:
            for chunk in stream:
                out.write(chunk)
    except Exception as e:
        raise UsageError(f"could not copy {where} out of image {image_id[:19]}: {e}",
                         hint="set repo_dir to where the image keeps the repository") from e
    finally:
        container.remove(force=True)
    unpacked = scratch / "unpacked"
    with tarfile.open(archive_path) as archive:
        for member in archive:
            try:  # 'data' refuses absolute paths, links out of the tree and devices: skip such members
                archive.extract(member, unpacked, filter="data")
            except tarfile.FilterError:
                continue
    root = unpacked / posixpath.basename(where)
    if not root.is_dir():
        raise UsageError(f"{where} in image {image_id[:19]} is not a directory")
    return root


def _check_base_commit(task: dict[str, Any], src: Path) -> None:
    """The image's HEAD must be the task's base_commit, when both are known."""
    base = str(task.get("base_commit") or "")
    if not (src / ".git").exists() or len(base) < 7 or any(c not in "0123456789abcdef" for c in base):
        return
    head = subprocess.run(["git", "-c", "core.fsmonitor=false", "-c", "safe.directory=*", "-C", str(src),
                           "rev-parse", "HEAD"], env=_GIT_READ_ENV, capture_output=True, text=True).stdout.strip()
    if head and not head.startswith(base):
        raise UsageError(f"swe task {task.get('task_id')!r}: the image's repository is at {head[:12]}, "
                         f"not at base_commit {base[:12]}", hint="check the task's image and base_commit")


def test_files(task: dict[str, Any]) -> list[str]:
    """The files holding the FAIL_TO_PASS and PASS_TO_PASS tests."""
    ids = test_ids(task, "FAIL_TO_PASS") + test_ids(task, "PASS_TO_PASS")
    return sorted({i.split("::")[0] for i in ids})


class BadTaskRow(TerminalError):
    """A swe task row that cannot be run or graded as written (FAIL_TO_PASS that is not JSON, a test id
    pytest cannot be given, a base_commit the repository lacks). Like SnapshotRefused it is the row's own
    fault: the rollout ends that row as env_error and the reward stage scores it null with this cause."""


def test_ids(task: dict[str, Any], key: str) -> list[str]:
    """FAIL_TO_PASS or PASS_TO_PASS as a list: SWE-bench files store it as a JSON string holding a list,
    the `datasets` library as that string too, hand-written files as a list."""
    value = task.get(key)
    if value is None or value == "":
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as err:
            raise BadTaskRow(f"swe task {_row_name(task)}: {key} is not valid JSON ({err})",
                             hint=f'{key} is a list of pytest ids, or a JSON string of one: \'["tests/t.py::test_x"]\'') from None
    if not isinstance(value, list) or not all(isinstance(i, str) for i in value):
        raise BadTaskRow(f"swe task {_row_name(task)}: {key} must be a list of test id strings, "
                         f"got {json.dumps(value)[:80]}")
    return list(value)


def _row_name(task: dict[str, Any]) -> str:
    return repr(task.get("task_id") or task.get("instance_id") or "<no id>")


def _pytest_node_id(node: str) -> bool:
    path = node.split("::")[0]
    return ("::" in node and path.endswith(".py") and not path.startswith(("-", "/")) and "\0" not in node
            and not any(part in ("", ".", "..") for part in path.split("/")))


def runner_graded(task: dict[str, Any]) -> bool:
    """True for a row graded from its own test runner's log (grader.py's runner mode), not under arlctl's pytest
    harness: a row that declares `test_cmd`, or one with the SWE-bench 5 `eval_script` whose tests pytest
    cannot be given (ids that are not pytest node ids: django's `test_x (module.Class.test_x)`, sympy's
    `test_x`) or whose log the package reads with a parser that is not one of its pytest parsers."""
    if task.get("test_cmd"):
        return True
    if not task.get("eval_script"):
        return False
    ids = test_ids(task, "FAIL_TO_PASS") + test_ids(task, "PASS_TO_PASS")
    if not all(_pytest_node_id(i) for i in ids):
        return True
    try:
        key = official.parser_for(task)
    except ImportError:
        return True  # check_task says the package is missing
    return key is not None and not key.startswith(official.PREFIX + "pytest")


def _check_runner_row(task: dict[str, Any]) -> None:
    for key in ("test_cmd", "eval_script", "activate"):
        if task.get(key) is not None and not isinstance(task[key], str):
            raise BadTaskRow(f"swe task {_row_name(task)}: {key} must be a string, got {type(task[key]).__name__}")
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        for node in test_ids(task, key):
            if not node.strip() or "\0" in node or "\n" in node:
                raise BadTaskRow(f"swe task {_row_name(task)}: {key} holds an empty or multi-line test id {node!r}")
    try:
        known = official.parser_for(task)
    except ImportError:
        raise BadTaskRow(f"swe task {_row_name(task)} is graded from its runner's log, and "
                         f"{official.MISSING_PACKAGE}") from None
    if known is None and task.get("log_parser") is None:
        raise BadTaskRow(f"swe task {_row_name(task)}: the swebench package knows no log parser for repo "
                         f"{task.get('repo')!r}, so its runner's log cannot be read",
                         hint="name one in the row's log_parser field (`arlctl swe parsers` lists them)")


def check_task(task: dict[str, Any]) -> None:
    """Raise BadTaskRow for a row the grader could not grade: FAIL_TO_PASS / PASS_TO_PASS not lists of
    pytest node ids (`path/to/test_file.py::name`, a relative path: the file becomes a pytest argument,
    so `-p x` or `/etc/x` is refused) unless the row runs its own runner (`runner_graded`: then any one-line
    ids, and a log parser the package has, by `log_parser` or by repo), an empty FAIL_TO_PASS (nothing could
    ever score 1), or a test_patch / patch that is not text. Checked before a snapshot is built and before
    grading."""
    fail_to_pass = test_ids(task, "FAIL_TO_PASS")
    if not fail_to_pass:
        raise BadTaskRow(f"swe task {_row_name(task)} has no FAIL_TO_PASS tests",
                         hint="every row needs the tests its fix must make pass")
    if runner_graded(task):
        _check_runner_row(task)
    else:
        for key, ids in (("FAIL_TO_PASS", fail_to_pass), ("PASS_TO_PASS", test_ids(task, "PASS_TO_PASS"))):
            for node in ids:
                if not _pytest_node_id(node):
                    raise BadTaskRow(f"swe task {_row_name(task)}: {key} id {node!r} is not a pytest node id "
                                     "(relative/path/test_file.py::test_name)",
                                     hint="a row whose tests run under another runner names how to run them: "
                                          "eval_script (SWE-bench 5 rows) or test_cmd, and log_parser")
    if task.get("log_parser") is not None:
        try:
            known = official.parser_key(str(task["log_parser"]))
        except ImportError:
            raise BadTaskRow(f"swe task {_row_name(task)} names log_parser {task['log_parser']!r}, and "
                             f"{official.MISSING_PACKAGE}") from None
        if known is None:
            names = sorted(k.removeprefix(official.PREFIX) for k in official.registry())
            raise BadTaskRow(f"swe task {_row_name(task)}: unknown log_parser {task['log_parser']!r}",
                             hint=f"a parser of the swebench package: {', '.join(names)}")
    for key in ("test_patch", "patch"):
        if key in task and not isinstance(task[key], str):
            raise BadTaskRow(f"swe task {_row_name(task)}: {key} must be a diff string, "
                             f"got {type(task[key]).__name__}")
