"""A task's `repo_path` may not reach outside the allowed bases through any git indirection (issue 26 item 5d).

Each attack is a repository inside the allowed base whose git layout points at a repository outside it
(holding SECRET), with base_commit naming the outside commit: had git followed the indirection, the
snapshot would hold the outside repository's files. Through `prepare_snapshot` (what a rollout and the
swe grader call), every one is refused with a cause naming the indirection, or (for what is never read:
config, refs, grafts, shallow, the caller's GIT_* variables) finds no such commit; no file under
ARLCTL_HOME ever holds SECRET. Controls: a plain repository, a bare one, a linked worktree and a
repository with an alternate object directory, all inside the base, export exactly their base tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from arlctl.envs.swe.tasks import BadTaskRow, SnapshotRefused, prepare_snapshot

SECRET = "OUTSIDE_SECRET_7f3a9c"
GIT_ENV = {"PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True, text=True).stdout


def make_repo(path: Path, files: dict[str, str], bare: bool = False) -> str:
    """A repository at `path` with one commit of `files`; returns the commit id."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "c")
    return git(path, "rev-parse", "HEAD").strip()


def task(repo: Path, base: str, name: str) -> dict:
    return {"instance_id": name, "repo_path": str(repo), "base_commit": base, "problem_statement": "fix it",
            "FAIL_TO_PASS": '["tests/test_a.py::test_a"]', "PASS_TO_PASS": "[]", "patch": "", "test_patch": ""}


def files_of(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(root).parts}


@pytest.fixture
def world(tmp_path, monkeypatch):
    """(base, outside, outside commit, home): base is the only allowed snapshot base."""
    base, outside, home = tmp_path / "base", tmp_path / "outside", tmp_path / "home"
    base.mkdir()
    monkeypatch.setenv("ARLCTL_SNAPSHOT_BASES", str(base))
    monkeypatch.setenv("ARLCTL_HOME", str(home))
    secret_commit = make_repo(outside / "secret", {"secret.py": f"KEY = '{SECRET}'\n"})
    return base, outside / "secret", secret_commit, home


def inside_repo(world, name: str) -> tuple[Path, str]:
    base = world[0]
    return base / name, make_repo(base / name, {"app.py": "x = 1\n", "tests/test_a.py": "def test_a(): pass\n"})


def assert_no_secret(home: Path) -> None:
    """Nothing under ARLCTL_HOME (snapshots, their objects) holds the outside repository's content."""
    if not home.exists():
        return
    for path in home.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert SECRET.encode() not in path.read_bytes(), path
    for snapshot in (home / "swe" / "snapshots").glob("*") if (home / "swe" / "snapshots").exists() else []:
        objects = subprocess.run(["git", "-C", str(snapshot), "cat-file", "--batch-all-objects", "--batch"],
                                 env=GIT_ENV, capture_output=True).stdout
        assert SECRET.encode() not in objects


# ---- attacks: each builds an in-base repository that points outside, and the cause it must be refused with


def gitdir_file(world):
    repo = world[0] / "gitfile"
    repo.mkdir()
    (repo / ".git").write_text(f"gitdir: {world[1] / '.git'}\n")
    return repo, ".git's gitdir"


def gitdir_file_relative(world):
    repo = world[0] / "gitfile-rel"
    repo.mkdir()
    (repo / ".git").write_text(f"gitdir: {os.path.relpath(world[1] / '.git', repo)}\n")
    return repo, ".git's gitdir"


def dot_git_link(world):
    repo = world[0] / "gitlink"
    repo.mkdir()
    (repo / ".git").symlink_to(world[1] / ".git")
    return repo, "repo_path .* .git .* is outside the allowed"


def commondir(world):
    repo, _ = inside_repo(world, "commondir")
    (repo / ".git" / "commondir").write_text(os.path.relpath(world[1] / ".git", repo / ".git") + "\n")
    return repo, "commondir"


def commondir_link(world):
    repo, _ = inside_repo(world, "commondir-link")
    target = world[1].parent / "commondir.txt"
    target.write_text(str(world[1] / ".git") + "\n")
    (repo / ".git" / "commondir").symlink_to(target)
    return repo, "commondir"


def alternates(world):
    repo, _ = inside_repo(world, "alternates")
    (repo / ".git" / "objects" / "info" / "alternates").write_text(str(world[1] / ".git" / "objects") + "\n")
    return repo, "alternate object directory"


def alternates_relative(world):
    repo, _ = inside_repo(world, "alternates-rel")
    objects = repo / ".git" / "objects"
    (objects / "info" / "alternates").write_text(os.path.relpath(world[1] / ".git" / "objects", objects) + "\n")
    return repo, "alternate object directory"


def alternates_chained(world):
    """An in-base alternate (allowed) whose own alternates file points outside."""
    middle, _ = inside_repo(world, "middle")
    (middle / ".git" / "objects" / "info" / "alternates").write_text(str(world[1] / ".git" / "objects") + "\n")
    repo, _ = inside_repo(world, "alternates-chained")
    (repo / ".git" / "objects" / "info" / "alternates").write_text(str(middle / ".git" / "objects") + "\n")
    return repo, "alternate object directory of .*middle"


def alternates_file_link(world):
    repo, _ = inside_repo(world, "alternates-link")
    target = world[1].parent / "alternates.txt"
    target.write_text(str(world[1] / ".git" / "objects") + "\n")
    (repo / ".git" / "objects" / "info" / "alternates").symlink_to(target)
    return repo, "a link in the object directory"


def objects_link(world):
    repo, _ = inside_repo(world, "objects-link")
    shutil.rmtree(repo / ".git" / "objects")
    (repo / ".git" / "objects").symlink_to(world[1] / ".git" / "objects")
    return repo, "the object directory"


def loose_object_links(world):
    """The outside commit's loose objects linked one by one into the inside object directory."""
    repo, _ = inside_repo(world, "loose-links")
    outside_objects = world[1] / ".git" / "objects"
    for obj in outside_objects.glob("[0-9a-f][0-9a-f]/*"):
        (repo / ".git" / "objects" / obj.parent.name).mkdir(exist_ok=True)
        (repo / ".git" / "objects" / obj.parent.name / obj.name).symlink_to(obj)
    return repo, "a link in the object directory"


def pack_link(world):
    """The outside repository packed, its pack linked into the inside object directory."""
    git(world[1], "repack", "-a", "-d", "-q")
    repo, _ = inside_repo(world, "pack-link")
    for pack in (world[1] / ".git" / "objects" / "pack").iterdir():
        (repo / ".git" / "objects" / "pack" / pack.name).symlink_to(pack)
    return repo, "a link in the object directory"


def pack_dir_link(world):
    git(world[1], "repack", "-a", "-d", "-q")
    repo, _ = inside_repo(world, "pack-dir-link")
    shutil.rmtree(repo / ".git" / "objects" / "pack")
    (repo / ".git" / "objects" / "pack").symlink_to(world[1] / ".git" / "objects" / "pack")
    return repo, "a link in the object directory"


REFUSED = [gitdir_file, gitdir_file_relative, dot_git_link, commondir, commondir_link, alternates,
           alternates_relative, alternates_chained, alternates_file_link, objects_link, loose_object_links,
           pack_link, pack_dir_link]


@pytest.mark.parametrize("attack", REFUSED, ids=lambda f: f.__name__)
def test_an_indirection_out_of_the_base_is_refused(world, attack):
    repo, cause = attack(world)
    with pytest.raises(SnapshotRefused, match=cause) as err:
        prepare_snapshot(task(repo, world[2], attack.__name__))
    assert "outside the allowed snapshot bases" in str(err.value) and "\n" not in str(err.value)
    assert_no_secret(world[3])


# ---- what is never read: config, refs, grafts, shallow, worktrees, the caller's GIT_* environment


def partial_clone_config(repo: Path, world) -> None:
    """A partial clone whose promisor remote is the outside repository: git would lazily fetch from it."""
    git(repo, "config", "core.repositoryformatversion", "1")
    git(repo, "config", "extensions.partialClone", "origin")
    git(repo, "config", "remote.origin.url", str(world[1]))
    git(repo, "config", "remote.origin.promisor", "true")


def test_the_repository_config_is_never_read(world):
    repo, _ = inside_repo(world, "config")
    partial_clone_config(repo, world)
    with pytest.raises(BadTaskRow, match="has no commit"):
        prepare_snapshot(task(repo, world[2], "config-partial-clone"))
    # The same through include.path and includeIf, a core.worktree outside, and an alternates-giving helper.
    evil = world[1].parent / "evil.gitconfig"
    evil.write_text(f"[extensions]\n\tpartialClone = origin\n[remote \"origin\"]\n\turl = {world[1]}\n"
                    "\tpromisor = true\n")
    repo2, _ = inside_repo(world, "config-include")
    git(repo2, "config", "core.repositoryformatversion", "1")
    git(repo2, "config", "include.path", str(evil))
    git(repo2, "config", f"includeIf.gitdir:{repo2}/.path", str(evil))
    git(repo2, "config", "core.worktree", str(world[1]))
    git(repo2, "config", "core.alternateRefsCommand", f"cat {evil}")
    with pytest.raises(BadTaskRow, match="has no commit"):
        prepare_snapshot(task(repo2, world[2], "config-include"))
    assert_no_secret(world[3])


def test_refs_grafts_shallow_and_worktrees_are_never_read(world):
    """Links to outside files where git keeps refs, grafts, shallow and worktrees: the export reads none
    of them, and gives the inside base tree exactly."""
    repo, commit = inside_repo(world, "metadata")
    dot = repo / ".git"
    outside_file = world[1] / ".git" / "refs" / "heads" / "main"
    (dot / "info").mkdir(exist_ok=True)
    for name in ("info/grafts", "shallow", "packed-refs", "FETCH_HEAD"):
        (dot / name).symlink_to(outside_file)
    (dot / "refs" / "heads" / "main").unlink()
    (dot / "refs" / "heads" / "main").symlink_to(outside_file)
    (dot / "worktrees").symlink_to(world[1] / ".git")
    snapshot = Path(prepare_snapshot(task(repo, commit, "metadata")))
    assert files_of(snapshot) == {"app.py": "x = 1\n", "tests/test_a.py": "def test_a(): pass\n"}
    assert_no_secret(world[3])


GIT_VARIABLES = {  # the caller's environment, which the git subprocess must not inherit
    "GIT_ALTERNATE_OBJECT_DIRECTORIES": "{objects}",
    "GIT_OBJECT_DIRECTORY": "{objects}",
    "GIT_DIR": "{git_dir}",
    "GIT_COMMON_DIR": "{git_dir}",
    "GIT_CONFIG_PARAMETERS": "'include.path'='{config}'",
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "include.path",
    "GIT_CONFIG_VALUE_0": "{config}",
    "GIT_CONFIG_GLOBAL": "{config}",
    "GIT_CONFIG_SYSTEM": "{config}",
    "HOME": "{home}",
}


def test_the_callers_git_environment_is_not_inherited(world, monkeypatch):
    repo, commit = inside_repo(world, "env")
    evil = world[1].parent / "evil.gitconfig"
    evil.write_text(f"[core]\n\trepositoryformatversion = 1\n[extensions]\n\tpartialClone = origin\n"
                    f"[remote \"origin\"]\n\turl = {world[1]}\n\tpromisor = true\n")
    (world[1].parent / ".gitconfig").write_text(evil.read_text())
    values = {"objects": world[1] / ".git" / "objects", "git_dir": world[1] / ".git", "config": evil,
              "home": world[1].parent}
    for key, value in GIT_VARIABLES.items():
        monkeypatch.setenv(key, value.format(**values))
    with pytest.raises(BadTaskRow, match="has no commit"):
        prepare_snapshot(task(repo, world[2], "env-outside-commit"))
    # ... and the inside commit still exports the inside tree, not the outside one
    snapshot = Path(prepare_snapshot(task(repo, commit, "env-inside-commit")))
    assert files_of(snapshot) == {"app.py": "x = 1\n", "tests/test_a.py": "def test_a(): pass\n"}
    assert_no_secret(world[3])


# ---- controls: layouts that stay inside the base work


def test_controls_inside_the_base_export_their_base_tree(world):
    base = world[0]
    expected = {"app.py": "x = 1\n", "tests/test_a.py": "def test_a(): pass\n"}
    plain, commit = inside_repo(world, "plain")
    assert files_of(Path(prepare_snapshot(task(plain, commit, "plain")))) == expected
    # a repository sharing the objects of another in the base (git clone --shared writes an alternates file)
    git(base, "clone", "-q", "--shared", str(plain), "shared")
    assert (base / "shared" / ".git" / "objects" / "info" / "alternates").is_file()
    assert not list((base / "shared" / ".git" / "objects").glob("[0-9a-f][0-9a-f]"))  # every object is plain's
    assert files_of(Path(prepare_snapshot(task(base / "shared", commit, "shared")))) == expected
    # a bare repository, and a linked worktree (a .git file and a commondir, both inside the base)
    git(base, "clone", "-q", "--bare", str(plain), "bare.git")
    assert files_of(Path(prepare_snapshot(task(base / "bare.git", commit, "bare")))) == expected
    git(plain, "worktree", "add", "-q", str(base / "wt"), commit)
    assert (base / "wt" / ".git").is_file()
    assert files_of(Path(prepare_snapshot(task(base / "wt", commit, "worktree")))) == expected
    assert_no_secret(world[3])
