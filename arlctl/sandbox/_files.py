"""Host-side file access into a sandbox's workspace that never follows a link the sandbox planted.

Sandboxed code owns the workspace, so any path component may be a symlink to a host file. Reading or
writing as the (root) host process through such a link would leak or overwrite host files; every
component is therefore opened relative to its parent with O_NOFOLLOW, and '..' is refused.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat

from arlctl.sandbox.base import SandboxError

_REFUSED_ERRNOS = (errno.ELOOP, errno.ENOTDIR)


class HostPathRefused(SandboxError):
    """The host will not touch this path directly (a link, '..', or outside the shared directories);
    the backend falls back to doing the same operation inside the sandbox, where links resolve safely."""


def map_path(path: str, mounts: dict[str, str], workdir: str) -> tuple[str, list[str]]:
    """Sandbox path -> (host directory, relative components). `mounts` maps sandbox dirs to host dirs."""
    full = path if path.startswith("/") else posixpath.join(workdir, path)
    parts = [p for p in full.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise HostPathRefused(f"path {path!r} contains '..'")
    norm = "/" + "/".join(parts)
    for inside, host in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
        if norm == inside or norm.startswith(inside.rstrip("/") + "/"):
            rel = [p for p in norm[len(inside) :].split("/") if p]
            if not rel:
                raise HostPathRefused(f"path {path!r} is a directory")
            return host, rel
    raise HostPathRefused(f"path {path!r} is outside the sandbox's writable directories {sorted(mounts)}")


def _open_parent(root: str, parts: list[str], create: bool, owner: tuple[int, int] | None) -> int:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in parts[:-1]:
            try:
                nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(name, 0o755, dir_fd=fd)
                if owner:
                    os.chown(name, *owner, dir_fd=fd, follow_symlinks=False)
                nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except OSError:
        os.close(fd)
        raise


def read_beneath(root: str, parts: list[str], max_bytes: int = 64 << 20) -> bytes:
    try:
        dfd = _open_parent(root, parts, create=False, owner=None)
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
        finally:
            os.close(dfd)
    except FileNotFoundError as e:
        raise FileNotFoundError("/".join(parts)) from e
    except OSError as e:
        if e.errno in _REFUSED_ERRNOS:
            raise HostPathRefused(f"{'/'.join(parts)} goes through a symlink") from e
        raise SandboxError(f"cannot read {'/'.join(parts)}: {e.strerror}") from e
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HostPathRefused(f"{'/'.join(parts)} is not a regular file")
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > max_bytes:
                raise SandboxError(f"{'/'.join(parts)} is larger than {max_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_beneath(
    root: str, parts: list[str], data: bytes, owner: tuple[int, int] | None, mode: int = 0o644
) -> None:
    try:
        dfd = _open_parent(root, parts, create=True, owner=owner)
        try:
            # O_NOFOLLOW refuses a planted symlink; unlinking first also defeats a planted hard link.
            try:
                st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    raise SandboxError(f"{'/'.join(parts)} is a directory")
                os.unlink(parts[-1], dir_fd=dfd)
            except FileNotFoundError:
                pass
            fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dfd)
            try:
                if owner:
                    os.fchown(fd, *owner)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
        finally:
            os.close(dfd)
    except SandboxError:
        raise
    except OSError as e:
        if e.errno in _REFUSED_ERRNOS:
            raise HostPathRefused(f"{'/'.join(parts)} goes through a symlink") from e
        raise SandboxError(f"cannot write {'/'.join(parts)}: {e.strerror}") from e
