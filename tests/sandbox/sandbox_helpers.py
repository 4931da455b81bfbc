"""Helpers shared by the sandbox tests (imported by name: tests/ is not a package)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path

# Small limits so the attacks hit them fast.
LIMITS = {"memory_mb": 256, "pids": 64, "disk_mb": 64}


def run(coro):
    return asyncio.run(coro)


def tree_digest(root: Path) -> str:
    """A digest of every path, mode and content under root (what 'unchanged' means for a directory)."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        h.update(f"{path.relative_to(root)}:{st.st_mode}".encode())
        if path.is_file() and not path.is_symlink():
            h.update(path.read_bytes())
    return h.hexdigest()


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains marker (the host's view, not the sandbox's)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def wait_no_processes(marker: str, within_s: float = 5.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while (left := processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left
