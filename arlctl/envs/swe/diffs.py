"""Unified diffs for swe grading: split into per-file sections and drop what the agent may not touch.

The agent's diff is data it wrote; the grader keeps only edits to ordinary source files. Sections that
touch tests, pytest configuration, import hooks (sitecustomize, usercustomize, *.pth), git metadata,
binary files, symlinks or paths outside the repository are dropped, and each is reported as a tamper
flag so reward_info shows what was attempted.
"""

from __future__ import annotations

import posixpath
import re
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
    tamper: list[dict[str, str]] = field(default_factory=list)


def _strip_prefix(path: str) -> str | None:
    path = path.strip().split("\t")[0]
    if path == "/dev/null":
        return None
    if path.startswith(("a/", "b/")):
        path = path[2:]
    return path


def split_sections(diff: str) -> list[FileSection]:
    """Split a git-style or plain unified diff into one section per file."""
    lines = diff.splitlines(keepends=True)
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
            old = line.split(" ", 2)[2].strip()
        elif line.startswith(("rename to ", "copy to ")):
            new = line.split(" ", 2)[2].strip()
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


def filter_diff(diff: str) -> FilteredDiff:
    """Keep sections that edit ordinary source files; flag every other one."""
    result = FilteredDiff(diff="")
    kept_text = []
    if diff.strip() and not split_sections(diff):
        result.tamper.append({"path": "", "reason": "unparseable_diff"})
        return result
    for section in split_sections(diff):
        paths = [p for p in (section.old_path, section.new_path) if p]
        reasons = [r for r in (protected_reason(p) for p in paths) if r]
        if section.binary:
            reasons.append("binary")
        if section.symlink:
            reasons.append("symlink")
        if not paths:
            reasons.append("unparseable_diff")
        if reasons:
            result.tamper.append({"path": paths[-1] if paths else "", "reason": reasons[0]})
            continue
        kept_text.append(section.text)
        result.kept.append(paths[-1])
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
