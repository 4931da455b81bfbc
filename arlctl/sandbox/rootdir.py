"""The host directory that holds bwrap sandboxes: who may own it, and how stale sandboxes are swept.

The root (default `<tmp>/arlctl-sandboxes-<uid>`, or $ARLCTL_SANDBOX_ROOT) sits at a name anyone on the
host can guess, and root's stale-sandbox sweep unmounts and deletes things inside it. So:

- `ensure_root(path)` creates it 0700 (0711 when bwrap runs as another uid and must traverse it), or
  accepts an existing one only if it is a real directory (not a symlink), owned by this uid and not
  writable by group or others, under parents that no other user can rename it out of (each owned by
  root or us, and not group/other-writable unless sticky, like /tmp). Anything else is a UsageError
  naming the path and the fix; there is no silent fallback to another directory.
- `sweep_stale(root)` only acts on entries this code created: a real directory named like a sandbox
  id, owned by this uid, on the root's own filesystem, holding a regular `owner` file (opened with
  O_NOFOLLOW) whose process is gone. Its `fs` tmpfs is unmounted with UMOUNT_NOFOLLOW through the
  already-opened directory (st_dev/st_ino checked), and the entry is removed with an fd-relative
  rmtree, which never follows a symlink.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
import shutil
import stat
import tempfile

from arlctl.errors import UsageError

log = logging.getLogger(__name__)

SANDBOX_ID = re.compile(r"[0-9a-f]{12}")  # BwrapSandbox ids: uuid4().hex[:12]
_MNT_DETACH, _UMOUNT_NOFOLLOW = 2, 8
_ROOT_HINT = "remove it, or set $ARLCTL_SANDBOX_ROOT to a directory only you can write"


def default_root() -> str:
    """$ARLCTL_SANDBOX_ROOT, else a per-uid name in the temporary directory."""
    return os.environ.get("ARLCTL_SANDBOX_ROOT") or os.path.join(
        tempfile.gettempdir(), f"arlctl-sandboxes-{os.geteuid()}"
    )


def ensure_root(path: str, *, traversable: bool) -> str:
    """Create the sandbox root or check an existing one (see the module docstring); UsageError if unsafe.
    Returns the root's path with its parents resolved: use that one, so a symlink on the way that
    someone could re-point later plays no part after the check.

    traversable: another uid (bwrap's host uid when we are root) must be able to pass through it.
    """
    given = os.path.abspath(path)
    os.makedirs(os.path.dirname(given), mode=0o755, exist_ok=True)
    real_parent = os.path.realpath(os.path.dirname(given))
    _check_parents(real_parent, given)
    path = os.path.join(real_parent, os.path.basename(given))
    mode = 0o711 if traversable else 0o700
    try:
        os.mkdir(path, mode)
        os.chmod(path, mode)  # mkdir's mode passes through the umask
        return path
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        problem = "is a symlink"
    elif not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory"
    elif st.st_uid != os.geteuid():
        problem = f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    elif st.st_mode & 0o022:
        problem = f"is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    else:
        return path
    raise UsageError(f"refusing sandbox root {given}: it {problem}", hint=_ROOT_HINT)


def _check_parents(real_parent: str, root: str) -> None:
    """Nobody but root and us may rename or replace anything on the way to the sandbox root."""
    me = os.geteuid()
    current = "/"
    for part in [p for p in real_parent.split("/") if p]:
        current = os.path.join(current, part)
        st = os.lstat(current)
        if st.st_uid not in (0, me):
            problem = f"its parent {current} is owned by uid {st.st_uid}"
        elif st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            problem = f"its parent {current} is writable by other users and not sticky"
        else:
            continue
        raise UsageError(f"refusing sandbox root {root}: {problem}", hint=_ROOT_HINT)


def sweep_stale(root: str, is_alive) -> int:
    """Remove sandboxes under `root` whose owner process is gone; returns how many were removed.

    is_alive(owner_text) -> bool says whether the `owner` record names a live process.
    """
    removed = 0
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        root_st = os.fstat(root_fd)
        with os.scandir(root_fd) as entries:
            names = [e.name for e in entries if SANDBOX_ID.fullmatch(e.name)]
        for name in names:
            try:
                removed += _sweep_one(root_fd, root_st, name, is_alive)
            except OSError as e:  # a sandbox vanishing under us, or one we may not touch: leave it
                log.debug("sweep of %s/%s skipped: %s", root, name, e)
    finally:
        os.close(root_fd)
    return removed


def _sweep_one(root_fd: int, root_st: os.stat_result, name: str, is_alive) -> int:
    st = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_dev != root_st.st_dev:
        return 0  # a symlink, a file, someone else's, or a mount point: not a sandbox we made
    entry_fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root_fd)
    try:
        if (os.fstat(entry_fd).st_dev, os.fstat(entry_fd).st_ino) != (st.st_dev, st.st_ino):
            return 0
        owner = _read_owner(entry_fd)
        if owner is None or is_alive(owner):
            return 0  # being created right now, or its owner still runs
        if not _unmount_fs(entry_fd, st):
            return 0
    finally:
        os.close(entry_fd)
    shutil.rmtree(name, dir_fd=root_fd)  # fd-relative and symlink-safe
    return 1


def _read_owner(entry_fd: int) -> str | None:
    try:
        fd = os.open("owner", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=entry_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        return os.read(fd, 256).decode("ascii", "replace")
    finally:
        os.close(fd)


def _unmount_fs(entry_fd: int, entry_st: os.stat_result) -> bool:
    """Detach the entry's `fs` tmpfs if one is mounted there; False when it is there and stays."""
    try:
        fs = os.stat("fs", dir_fd=entry_fd, follow_symlinks=False)
    except FileNotFoundError:
        return True
    if not stat.S_ISDIR(fs.st_mode) or fs.st_dev == entry_st.st_dev:
        return True  # a plain directory (or a symlink, which rmtree removes as a link): nothing mounted
    # Through the fd we verified, and never following a link at `fs` itself.
    target = f"/proc/self/fd/{entry_fd}/fs".encode()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(target, _MNT_DETACH | _UMOUNT_NOFOLLOW) != 0:
        err = ctypes.get_errno()
        log.warning("could not unmount a stale sandbox tmpfs: %s", os.strerror(err or errno.EPERM))
        return False
    return True
