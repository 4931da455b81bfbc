"""Filesystem access through fsspec: every path in arlctl may be a local path or any fsspec URL."""

from __future__ import annotations

import os
import posixpath
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem


def get_fs(url: str, **storage_options: Any) -> tuple[fsspec.AbstractFileSystem, str]:
    """Return (filesystem, path-within-it) for a URL or local path."""
    fs, path = fsspec.core.url_to_fs(url, **storage_options)
    return fs, path


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return isinstance(fs, LocalFileSystem)


def join(url: str, *parts: str) -> str:
    """Join path parts onto a URL or local path without touching the scheme."""
    if "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://" + posixpath.join(rest, *parts)
    return posixpath.join(url, *parts)


def to_url(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """Turn a path returned by fs.ls / fs.find back into a URL the user can pass again."""
    if is_local(fs):
        return path
    protocol = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
    return path if path.startswith(f"{protocol}://") else f"{protocol}://{path.lstrip('/') if protocol != 'memory' else path}"


def basename(url: str) -> str:
    return posixpath.basename(url.rstrip("/"))


def is_hidden(name: str) -> bool:
    """Dot- and underscore-prefixed names are invisible to readers (temp files, quarantine, locks)."""
    return name.startswith(".") or name.startswith("_")


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make a rename inside `directory` durable (best effort: some filesystems refuse directory fsync)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
