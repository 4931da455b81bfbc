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


# ----------------------------------------------------------------------------------------------- object-store transfers
#
# Low-level helpers of arlctl/io/store.py, which owns committing (a marker file last) and is what callers use.

LOCAL_SCHEMES = ("file", "local")


def is_remote(url: str | os.PathLike) -> bool:
    """True for an fsspec URL outside the local filesystem (s3://, gs://, memory://, ...)."""
    text = str(url)
    return "://" in text and text.split("://", 1)[0] not in LOCAL_SCHEMES


def list_files(url: str) -> dict[str, int]:
    """{relative path: size} of every object under the directory `url`, hidden names included."""
    fs, path = get_fs(url)
    path = path.rstrip("/")
    fs.invalidate_cache(path)  # a long-running process must see what others wrote since its last listing
    try:
        found = fs.find(path, detail=True)
    except FileNotFoundError:
        return {}
    return {name[len(path) + 1:]: int(info.get("size") or 0) for name, info in found.items()
            if info.get("type") == "file" and name.startswith(path + "/")}


def upload_dir(local_dir: str | os.PathLike, url: str, names: list[str], last: str | None = None) -> None:
    """Upload `names` (files of `local_dir`) under the directory `url`, concurrently, then `last` alone."""
    fs, path = get_fs(url)
    path = path.rstrip("/")
    local = os.fspath(local_dir)
    first = [n for n in names if n != last]
    if first:
        fs.put([os.path.join(local, n) for n in first], [f"{path}/{n}" for n in first])
    if last is not None:
        fs.put_file(os.path.join(local, last), f"{path}/{last}")
    fs.invalidate_cache(path)


def download_dir(url: str, local_dir: str | os.PathLike, names: list[str]) -> None:
    """Download `names` (relative to the directory `url`) into `local_dir`, concurrently."""
    fs, path = get_fs(url)
    path = path.rstrip("/")
    local = os.fspath(local_dir)
    for name in names:
        os.makedirs(os.path.dirname(os.path.join(local, name)) or local, exist_ok=True)
    if names:
        fs.get([f"{path}/{n}" for n in names], [os.path.join(local, n) for n in names])
