"""Child cgroups that cap a sandbox's memory and process count, on cgroup v1, v2 or a hybrid of both.

A sandbox gets one cgroup per controller it needs (memory, pids). On v1 each controller is its own
hierarchy and a child is created under the cgroup this process already sits in. On v2 one unified
directory carries both, created beside (or under) this process's cgroup where the "no internal processes"
rule allows enabling controllers. When neither is writable, `SandboxCgroup.create` returns None and
warns once; backends then fall back to rlimits.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import warnings
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

_BASE_NAME = "arlctl-sandboxes"
_warned = False


def cgroup_mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount point, root within the hierarchy, fstype, super options) of this process's cgroup mounts."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, _source, super_opts = (right.split() + ["", "", ""])[:3]
            if fstype in ("cgroup", "cgroup2"):
                fields = left.split()
                out.append((fields[4], fields[3], fstype, set(super_opts.split(","))))
    return out


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fstype, super options) for every cgroup/cgroup2 mount of this process."""
    return [(mount, fstype, opts) for mount, _root, fstype, opts in cgroup_mounts()]


def _own_paths() -> dict[str, str]:
    """Controller name (or '' for the v2 unified hierarchy) -> this process's cgroup path."""
    paths = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _hid, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                paths[c] = path
    return paths


def _write(path: str, value: str) -> bool:
    try:
        with open(path, "w") as f:
            f.write(value)
        return True
    except OSError:
        return False


def _v1_dir(controller: str) -> str | None:
    own = _own_paths()
    for mount, fstype, opts in _mounts():
        if fstype == "cgroup" and controller in opts and controller in own:
            return os.path.join(mount, own[controller].lstrip("/"), _BASE_NAME)
    return None


def _v2_base(controllers: set[str]) -> str | None:
    """A v2 directory whose children get `controllers`, creating and enabling what is needed."""
    own = _own_paths().get("")
    mount = next((m for m, fstype, _ in _mounts() if fstype == "cgroup2"), None)
    if own is None or mount is None:
        return None
    here = os.path.join(mount, own.lstrip("/"))
    for parent in (here, os.path.dirname(here.rstrip("/"))):
        if not parent.startswith(mount):
            continue
        try:
            with open(os.path.join(parent, "cgroup.controllers")) as f:
                available = set(f.read().split())
        except OSError:
            continue
        if not controllers <= available:
            continue
        _write(os.path.join(parent, "cgroup.subtree_control"), " ".join(f"+{c}" for c in controllers))
        base = os.path.join(parent, _BASE_NAME)
        try:
            os.makedirs(base, exist_ok=True)
        except OSError:
            continue
        # base holds no processes, so it may always delegate to its children.
        _write(os.path.join(base, "cgroup.subtree_control"), " ".join(f"+{c}" for c in controllers))
        with open(os.path.join(base, "cgroup.controllers")) as f:
            if controllers <= set(f.read().split()):
                return base
    return None


@dataclass
class SandboxCgroup:
    """The cgroup directories of one sandbox; `procs_files` are what a launcher writes its pid into."""

    dirs: list[str] = field(default_factory=list)
    version: str = "v1"

    @classmethod
    def create(cls, name: str, memory_bytes: int | None, pids_max: int | None) -> SandboxCgroup | None:
        wanted = {c for c, v in (("memory", memory_bytes), ("pids", pids_max)) if v}
        if not wanted:
            return None
        if os.geteuid() == 0:
            group = cls._create_v1(name, wanted) or cls._create_v2(name, wanted)
        else:
            group = cls._create_v2(name, wanted)
        if group is None:
            _warn_unavailable()
            return None
        group._set_limits(memory_bytes, pids_max)
        return group

    @classmethod
    def _create_v1(cls, name: str, wanted: set[str]) -> SandboxCgroup | None:
        dirs = []
        for controller in sorted(wanted):
            base = _v1_dir(controller)
            if base is None:
                break
            try:
                os.makedirs(os.path.join(base, name), exist_ok=True)
            except OSError:
                break
            dirs.append(os.path.join(base, name))
        if len(dirs) == len(wanted):
            return cls(dirs=dirs, version="v1")
        for d in dirs:
            _rmdir(d)
        return None

    @classmethod
    def _create_v2(cls, name: str, wanted: set[str]) -> SandboxCgroup | None:
        base = _v2_base(wanted)
        if base is None:
            return None
        try:
            os.makedirs(os.path.join(base, name), exist_ok=True)
        except OSError:
            return None
        return cls(dirs=[os.path.join(base, name)], version="v2")

    def _set_limits(self, memory_bytes: int | None, pids_max: int | None) -> None:
        for d in self.dirs:
            if memory_bytes:
                if self.version == "v2":
                    _write(os.path.join(d, "memory.max"), str(memory_bytes))
                    _write(os.path.join(d, "memory.swap.max"), "0")
                else:
                    _write(os.path.join(d, "memory.limit_in_bytes"), str(memory_bytes))
                    # Only present with swap accounting; without it there is no swap to escape into.
                    _write(os.path.join(d, "memory.memsw.limit_in_bytes"), str(memory_bytes))
            if pids_max:
                _write(os.path.join(d, "pids.max"), str(pids_max))

    @property
    def procs_files(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self.procs_files:
            try:
                with open(path) as f:
                    found.update(int(x) for x in f.read().split())
            except OSError:
                pass
        return found

    def oom_kills(self) -> int:
        """How many processes the kernel OOM-killed in this cgroup so far (0 where not reported)."""
        for d in self.dirs:
            for fname in ("memory.events", "memory.oom_control"):
                try:
                    with open(os.path.join(d, fname)) as f:
                        for line in f:
                            key, _, value = line.partition(" ")
                            if key == "oom_kill":
                                return int(value)
                except OSError:
                    continue
        return 0

    def pids_limit_hits(self) -> int:
        """How many forks the pids limit refused so far (a fork bomb, or a runaway pool of workers)."""
        for d in self.dirs:
            try:
                with open(os.path.join(d, "pids.events")) as f:
                    for line in f:
                        key, _, value = line.partition(" ")
                        if key == "max":
                            return int(value)
            except OSError:
                continue
        return 0

    def kill_all(self, wait_s: float = 2.0) -> bool:
        """SIGKILL every process in the cgroup until it is empty; True when it emptied in time."""
        deadline = time.monotonic() + wait_s
        if self.version == "v2" and _write(os.path.join(self.dirs[0], "cgroup.kill"), "1"):
            pass
        while True:
            pids = self.pids()
            if not pids:
                return True
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)

    def destroy(self) -> None:
        self.kill_all()
        for d in self.dirs:
            _rmdir(d)


def _rmdir(path: str) -> None:
    for _ in range(50):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)  # the last killed task may still be exiting
    log.warning("could not remove cgroup %s", path)


def _warn_unavailable() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            "sandbox: no writable cgroup (v1 or v2) for memory and pids limits; falling back to rlimits, "
            "which cap each process rather than the whole sandbox. Run as root or delegate a cgroup.",
            RuntimeWarning,
            stacklevel=3,
        )
