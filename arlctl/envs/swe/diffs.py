"""Unified diffs for swe grading: split into per-file sections and drop what the agent may not touch.

The agent's diff is data it wrote; the grader keeps only edits to ordinary source files. Sections that
touch tests, pytest configuration, import hooks (sitecustomize, usercustomize, *.pth), git metadata,
binary files, symlinks or paths outside the repository are dropped, and each is reported as a tamper
flag so reward_info shows what was attempted.

What a diff touches is decided by git, the program that will apply it: `git apply --numstat` lists the
paths of the whole diff and of each section as this module split it. A diff git cannot parse, or one
where git sees a path our split did not (a second file patch hidden after a junk line inside a hunk,
a patch before the first header), is rejected whole: nothing of it is applied, and nothing is repaired.
"""

from __future__ import annotations

import os
import posixpath
import re
import subprocess
import tempfile
from dataclasses import dataclass, field

# Paths whose edits never count: the tests and everything that configures how they run.
_TEST_DIRS = {"tests", "test", "testing"}
_CONFIG_FILES = {"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", ".pytest.ini",
                 "sitecustomize.py", "usercustomize.py", "noxfile.py"}
_HEADER = re.compile(r"^diff --git a/(.*) b/(.*)$")


@dataclass
class FileSection:
    old_path: str | None  # None for a new file
    new_path: str | None  # None for a deleted file
    text: str  # the section, header included, ending in a newline
    binary: bool = False
    symlink: bool = False


@dataclass
class FilteredDiff:
    diff: str  # what will be applied
    kept: list[str] = field(default_factory=list)
    sections: dict[str, str] = field(default_factory=dict)  # kept path -> its section of `diff`
    tamper: list[dict[str, str]] = field(default_factory=list)


_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def _unquote(path: str) -> str:
    """git's C-style quoted path ("a/t\\303\\251st.py") as the bytes it names, decoded as UTF-8."""
    if not (len(path) >= 2 and path[0] == path[-1] == '"'):
        return path
    out, body, index = bytearray(), path[1:-1], 0
    while index < len(body):
        char = body[index]
        if char == "\\" and index + 1 < len(body):
            nxt = body[index + 1]
            if nxt in "01234567" and body[index + 1 : index + 4].isdigit():
                out.append(int(body[index + 1 : index + 4], 8) & 0xFF)
                index += 4
                continue
            out.append(_ESCAPES.get(nxt, ord(nxt) if ord(nxt) < 128 else 63))
            index += 2
            continue
        out.extend(char.encode("utf-8"))
        index += 1
    return out.decode("utf-8", "replace")


_NO_FILE = "/dev/null"  # the side of a ---/+++ header that names no file (a creation or a deletion)


def _strip_prefix(path: str) -> str | None:
    """The repository path a ---/+++ header names, or None for the side that names no file."""
    path = path.strip()
    path = _unquote(path) if path.startswith('"') else path.split("\t")[0]
    if path == _NO_FILE:
        return None
    if path.startswith(("a/", "b/")):
        path = path[2:]
    return path


def _lines(text: str) -> list[str]:
    """`text` in lines ending at `\\n` only, as git reads a patch (str.splitlines also splits at \\r, \\x0c,
    \\u2028 and more, which would start a "section" inside a hunk line git reads as one line)."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    return lines + [parts[-1]] if parts[-1] else lines


def split_sections(diff: str) -> list[FileSection]:
    """Split a git-style or plain unified diff into one section per file."""
    lines = _lines(diff)
    starts = [i for i, line in enumerate(lines) if line.startswith("diff --git ")]
    if not starts:  # a plain unified diff: sections start at each '--- ' followed by '+++ '
        starts = [i for i, line in enumerate(lines[:-1]) if line.startswith("--- ") and lines[i + 1].startswith("+++ ")]
    sections = []
    for n, start in enumerate(starts):
        chunk = lines[start : starts[n + 1] if n + 1 < len(starts) else len(lines)]
        sections.append(_parse_section(chunk))
    return sections


def _parse_section(chunk: list[str]) -> FileSection:
    old = new = None
    match = _HEADER.match(chunk[0].rstrip("\n"))
    if match:
        old, new = match.group(1), match.group(2)
    binary = symlink = False
    for line in chunk:
        if line.startswith("--- "):
            old = _strip_prefix(line[4:])
        elif line.startswith("+++ "):
            new = _strip_prefix(line[4:])
        elif line.startswith(("new file mode", "deleted file mode", "old mode", "new mode")) and "120000" in line:
            symlink = True
        elif line.startswith(("rename from ", "copy from ")):
            old = _unquote(line.split(" ", 2)[2].strip())
        elif line.startswith(("rename to ", "copy to ")):
            new = _unquote(line.split(" ", 2)[2].strip())
        elif line.startswith(("GIT binary patch", "Binary files ")):
            binary = True
        elif line.startswith("@@"):
            break
    text = "".join(chunk)
    if not text.endswith("\n"):
        text += "\n"
    return FileSection(old_path=old, new_path=new, text=text, binary=binary, symlink=symlink)


def protected_reason(path: str) -> str | None:
    """Why an edit to `path` is not allowed (a tamper flag), or None for an ordinary source file."""
    if path.startswith("/") or "\\" in path:
        return "path_outside_repo"
    norm = posixpath.normpath(path)
    parts = norm.split("/")
    if norm.startswith("..") or ".." in parts:
        return "path_outside_repo"
    name = parts[-1]
    if norm == _NO_FILE.lstrip("/"):
        return "dev_null_path"  # a /dev/null header read as a path: never a file of the repository
    if parts[0] == ".git" or ".git" in parts:
        return "git_metadata"
    if any(p in _TEST_DIRS for p in parts[:-1]) or name in _TEST_DIRS:
        return "test_file"
    if name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")):
        return "test_file"
    if name == "conftest.py":
        return "conftest"
    if name in _CONFIG_FILES:
        return "import_hook" if name.endswith("customize.py") else "pytest_config"
    if name.endswith(".pth"):
        return "import_hook"
    if name.endswith((".pyc", ".pyo")) or "__pycache__" in parts:
        return "bytecode"
    return None


def _numstat(diff: str, reverse: bool) -> list[str] | None:
    """One path per file patch, as `git apply --numstat` names it (None: git rejects the patch).

    Runs in an empty directory with no user or system configuration; --numstat reads the patch and
    applies nothing. For a rename git names the new path; with --reverse, the old one."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": "/dev/null", "LC_ALL": "C"}
    cmd = ["git", "apply", "--numstat", "-z", *(["--reverse"] if reverse else []), "-"]
    with tempfile.TemporaryDirectory(prefix="arlctl-diff-") as empty:
        result = subprocess.run(cmd, input=diff.encode("utf-8", "replace"), cwd=empty, env=env,
                                capture_output=True, check=False)
    if result.returncode != 0:
        return None
    paths: list[str] = []
    fields = result.stdout.decode("utf-8", "replace").split("\0")
    index = 0
    while index < len(fields) and fields[index]:
        parts = fields[index].split("\t", 2)
        if len(parts) != 3:
            return None
        if parts[2]:
            paths.append(parts[2])
            index += 1
        else:  # "added\tdeleted\t\0old\0new\0" where a version of git names both sides
            paths.append(fields[index + 2] if not reverse else fields[index + 1])
            index += 3
    return paths


def git_patches(diff: str) -> list[set[str]] | None:
    """The file patches git finds in `diff`, each as the set of paths it touches (both sides of a rename).

    None when git cannot parse the diff."""
    forward, backward = _numstat(diff, reverse=False), _numstat(diff, reverse=True)
    if forward is None or backward is None or len(forward) != len(backward):
        return None
    return [{new, old} for new, old in zip(forward, backward)]


def _declared(section: FileSection) -> set[str]:
    return {p for p in (section.old_path, section.new_path) if p}


def _reject(result: FilteredDiff, reason: str, path: str = "") -> FilteredDiff:
    result.diff, result.kept, result.sections = "", [], {}
    result.tamper.append({"path": path, "reason": reason})
    return result


def filter_diff(diff: str) -> FilteredDiff:
    """Keep sections that edit ordinary source files; flag every other one.

    The whole diff is rejected (nothing kept, one tamper flag) when git cannot parse it, or when git
    does not find exactly one file patch in each section as split here and nothing outside them, or when
    the paths a section's headers declare are not exactly the ones git will touch."""
    result = FilteredDiff(diff="")
    kept_text = []
    if not diff.strip():
        return result
    sections = split_sections(diff)
    whole = git_patches(diff)
    if not sections or whole is None:
        return _reject(result, "unparseable_diff")
    touched: list[set[str]] = []
    for section in sections:
        patches = git_patches(section.text)
        if patches is None or len(patches) != 1:
            return _reject(result, "smuggled_section", section.new_path or section.old_path or "")
        if _declared(section) != patches[0]:
            # One owner for a section's paths: what its headers declare must be what git will touch. A
            # section whose headers name no file (`--- /dev/null` and `+++ /dev/null`), or name other
            # files than git reads, is not reinterpreted: the whole diff is refused.
            return _reject(result, "undeclared_path", sorted(patches[0])[0] if patches[0] else "")
        touched.append(patches[0])
    if len(whole) != len(sections) or set().union(*whole) != set().union(*touched):
        return _reject(result, "smuggled_section")
    for section, by_git in zip(sections, touched):
        paths = sorted(_declared(section) | by_git, key=lambda p: (p != section.new_path, p))
        reasons = [r for r in (protected_reason(p) for p in paths) if r]
        if section.binary:
            reasons.append("binary")
        if section.symlink:
            reasons.append("symlink")
        if reasons:
            result.tamper.append({"path": section.new_path or paths[0], "reason": reasons[0]})
            continue
        kept_text.append(section.text)
        result.kept.append(section.new_path or paths[0])
        result.sections[section.new_path or paths[0]] = section.text
    result.diff = "".join(kept_text)
    return result


def paths_in(diff: str) -> list[str]:
    """Every file path a diff creates or modifies (the new side; old side for deletions)."""
    out = []
    for section in split_sections(diff):
        path = section.new_path or section.old_path
        if path and path not in out:
            out.append(path)
    return out
