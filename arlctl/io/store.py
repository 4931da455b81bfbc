"""The storage-commit primitive: the one place where a local filesystem and an object store differ.

Everything arlctl commits goes through five operations (DESIGN.md §5 "Atomic commit"):

  write_file(url, data)              one file, whole or not at all. Local: hidden temp in the target
                                     directory, flush, fsync, os.replace, fsync the directory. Object
                                     store: one PUT of the final key.
  commit_dir(build, dest, marker)    a directory, whole or not at all. `build(tmp)` fills a local temporary
                                     directory (the marker file among them). Local: the temp directory is
                                     built beside `dest` and renamed into place. Object store (no rename):
                                     every file is uploaded under its final key and the marker LAST;
                                     readers trust only directories that hold their marker.
  list_committed(parent, marker)     the children of `parent` that hold `marker`.
  remove_dir(url, marker)            the marker first (the directory stops being committed), then the rest.
  local_copy(url, dest)              a committed remote directory downloaded once into a local cache,
                                     atomically (built hidden, renamed into place).

`scratch_copy` lends a local view of a directory for one read (itself when local). Callers never ask
whether a location is remote: a local location comes back as a `Path`, a remote one as its URL string.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from arlctl.errors import TransientError
from arlctl.io.fs import (
    download_dir,
    fsync_dir,
    get_fs,
    is_hidden,
    is_remote,
    join,
    list_files,
    to_url,
    upload_dir,
)

Location = Path | str  # a local directory as a Path, a remote one as its URL
Writer = Callable[[BinaryIO], None]


def location(url: str | os.PathLike) -> Location:
    """`url` as callers see it: a Path when local, the URL string when remote."""
    return str(url) if is_remote(url) else Path(url)


def child(parent: str | os.PathLike, name: str) -> Location:
    """The location of `name` inside the directory `parent`."""
    return join(str(parent), name) if is_remote(parent) else Path(parent) / name


def local_path(url: str | os.PathLike) -> Path | None:
    """Where `url` lies on this machine's filesystem (a Path to open, stat or hand to a tool), or None
    when it lives on an object store and must be read or written through this module."""
    if is_remote(url):
        return None
    text = str(url)
    return Path(text.split("://", 1)[1] if "://" in text else text).expanduser()  # file:///x -> /x


def stamp(url: str | os.PathLike) -> object | None:
    """A token that changes when the file `url` changes, None when it does not exist: one stat locally
    (mtime, size, inode), the content's sha256 on an object store (one small GET)."""
    if not is_remote(url):
        try:
            st = os.stat(url)
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)
    data = read_file(url)
    return None if data is None else hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------------------------- single files


def read_file(url: str | os.PathLike) -> bytes | None:
    """The content of `url`, or None when it does not exist. Always asks the store (no listing cache)."""
    if not is_remote(url):
        try:
            return Path(url).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
    fs, path = get_fs(str(url))
    try:
        return fs.cat_file(path)
    except FileNotFoundError:
        return None


def write_file(url: str | os.PathLike, data: bytes | str | Writer) -> str:
    """Commit one file atomically (see the module docstring). `data` may be a writer of a binary stream,
    so a large file is streamed to disk locally. Returns the URL (or local path) written."""
    if isinstance(data, str):
        data = data.encode()
    fs, path = get_fs(str(url))
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    if is_remote(url):
        if callable(data):
            buf = io.BytesIO()
            data(buf)
            data = buf.getvalue()
        if parent:
            fs.makedirs(parent, exist_ok=True)
        fs.pipe_file(path, data)
        fs.invalidate_cache(parent or path)
        return to_url(fs, path)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp"  # DESIGN.md §5; one writer per name (arlctl/io/lock.py)
    try:
        with open(tmp, "wb") as fh:
            data(fh) if callable(data) else fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        # Leave nothing half-written behind when we can help it; a SIGKILL leaves only a hidden tmp.
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)
    return path


def exists(url: str | os.PathLike) -> bool:
    if not is_remote(url):
        return Path(url).exists()
    fs, path = get_fs(str(url))
    fs.invalidate_cache(path)
    return fs.exists(path)


def sha256(url: str | os.PathLike) -> str:
    """sha256 of one file, streamed (a remote file is read once, not kept)."""
    if not is_remote(url):
        with open(url, "rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()
    fs, path = get_fs(str(url))
    with fs.open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def dir_files(url: str | os.PathLike) -> dict[str, int]:
    """{name: size} of the visible top-level files of a directory ({} when it does not exist)."""
    if is_remote(url):
        files = list_files(str(url))
    else:
        root = Path(url)
        files = {e.name: e.stat().st_size for e in root.iterdir() if e.is_file()} if root.is_dir() else {}
    return {n: s for n, s in files.items() if "/" not in n and not is_hidden(os.path.basename(n))}


# ----------------------------------------------------------------------------------------------- directories


def commit_dir(build: Callable[[Path], None], dest_url: str | os.PathLike, marker: str,
               copy_from: tuple[Location, list[str]] | None = None, move: bool = False) -> Location:
    """Commit a directory built by `build(tmp)` at `dest_url`, `marker` last (see the module docstring).

    copy_from=(source, names): those files of the directory `source` (local or remote) are copied in
    first, server-side when source and destination are on the same store; with move=True and both local,
    they are renamed in instead (the source is a staging directory the caller discards). A directory
    already at `dest_url` (a leftover, or a replay after a crash) is replaced.
    """
    if is_remote(dest_url):
        return _commit_remote(build, str(dest_url), marker, copy_from)
    final = Path(dest_url)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        if copy_from is not None:
            _copy_into(copy_from[0], copy_from[1], tmp, move)
        build(tmp)
        _fsync_file(tmp / marker)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(final.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _commit_remote(build: Callable[[Path], None], dest: str, marker: str,
                   copy_from: tuple[Location, list[str]] | None) -> str:
    scratch = Path(tempfile.mkdtemp(prefix="arlctl-commit-"))
    try:
        # A committed directory already there: make it invisible before any of its files change.
        remove_file(join(dest, marker))
        if copy_from is not None:
            _copy_to_store(copy_from[0], copy_from[1], dest, scratch)
        build_dir = scratch / "build"
        build_dir.mkdir()
        build(build_dir)
        names = sorted(str(p.relative_to(build_dir)) for p in build_dir.rglob("*") if p.is_file())
        upload_dir(build_dir, dest, names, last=marker if marker in names else None)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return dest


def put_files(local_dir: Path, dest_url: str | os.PathLike, names: list[str]) -> None:
    """Copy `names` (relative paths under `local_dir`, subdirectories allowed) to the directory `dest_url`.

    A plain copy, not a commit: for staging files that a later `commit_dir(copy_from=...)` takes in."""
    if is_remote(dest_url):
        upload_dir(local_dir, str(dest_url), names)
        return
    for name in names:
        target = Path(dest_url) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(local_dir / name, target)


def _copy_into(source: Location, names: list[str], local_dir: Path, move: bool = False) -> None:
    if is_remote(source):
        download_dir(str(source), local_dir, names)
        return
    for name in names:
        (local_dir / name).parent.mkdir(parents=True, exist_ok=True)
        if move:  # rename on one filesystem (staging sits beside the checkpoint), a copy across two
            shutil.move(Path(source) / name, local_dir / name)
        else:
            shutil.copy2(Path(source) / name, local_dir / name)


def _copy_to_store(source: Location, names: list[str], dest: str, scratch: Path) -> None:
    fs, dest_path = get_fs(dest)
    if is_remote(source) and get_fs(str(source))[0] is fs:  # same store: a server-side copy
        src = get_fs(str(source))[1].rstrip("/")
        fs.copy([f"{src}/{n}" for n in names], [f"{dest_path.rstrip('/')}/{n}" for n in names])
        return
    local = Path(source)
    if is_remote(source):  # another store: through this machine
        local = scratch / "copy"
        local.mkdir()
        download_dir(str(source), local, names)
    upload_dir(local, dest, names)


def _fsync_file(path: Path) -> None:
    if path.is_file():
        with open(path, "rb+") as fh:
            os.fsync(fh.fileno())


def is_committed(url: str | os.PathLike, marker: str) -> bool:
    return read_file(child(url, marker)) is not None


def list_committed(parent_url: str | os.PathLike, marker: str) -> list[tuple[str, Location]]:
    """(name, location) of the visible children of `parent_url` that hold `marker`, in name order."""
    if is_remote(parent_url):
        found = []
        for rel in list_files(str(parent_url)):
            parts = rel.split("/")
            if len(parts) == 2 and parts[1] == marker and not is_hidden(parts[0]):
                found.append((parts[0], join(str(parent_url), parts[0])))
        return sorted(found)
    root = Path(parent_url)
    if not root.is_dir():
        return []
    return sorted((e.name, e) for e in root.iterdir() if not is_hidden(e.name) and (e / marker).is_file())


def list_names(parent_url: str | os.PathLike) -> list[str]:
    """Visible names directly under `parent_url` (files and directories, committed or not), in order."""
    if is_remote(parent_url):
        names = {rel.split("/", 1)[0] for rel in list_files(str(parent_url))}
    else:
        root = Path(parent_url)
        names = {e.name for e in root.iterdir()} if root.is_dir() else set()
    return sorted(n for n in names if not is_hidden(n))


def remove_file(url: str | os.PathLike) -> None:
    """Delete one file; a missing one is fine."""
    if not is_remote(url):
        Path(url).unlink(missing_ok=True)
        return
    fs, path = get_fs(str(url))
    try:
        fs.rm(path)
    except FileNotFoundError:
        pass
    fs.invalidate_cache(path)


def remove_dir(url: str | os.PathLike, marker: str | None = None) -> None:
    """Delete a committed directory so that no reader ever sees it half-deleted under its name.

    Object store: the marker goes first (from then on the directory is not committed), then every key.
    Local: renamed to a hidden name first, then deleted (the marker also goes first, for a crash between).
    """
    if is_remote(url):
        if marker:
            remove_file(join(str(url), marker))
        fs, path = get_fs(str(url))
        try:
            fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass
        fs.invalidate_cache(path)
        return
    path = Path(url)
    if marker:
        (path / marker).unlink(missing_ok=True)
    doomed = path.parent / f".{path.name}.deleting-{os.getpid()}"
    try:
        os.replace(path, doomed)
    except FileNotFoundError:
        return
    shutil.rmtree(doomed, ignore_errors=True)


# ----------------------------------------------------------------------------------------------- local views


@contextmanager
def scratch_copy(url: Location, names: list[str], sizes: dict[str, int] | None = None) -> Iterator[Path]:
    """A local directory holding `names` of the directory `url`: itself when local, else a scratch
    download removed afterwards. sizes: expected sizes; a mismatch (the directory was rewritten or
    pruned during the download) is a TransientError, never a silent mix of two versions."""
    if not is_remote(url):
        yield Path(url)
        return
    scratch = Path(tempfile.mkdtemp(prefix="arlctl-scratch-"))
    try:
        _download_checked(str(url), scratch, names, sizes)
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _download_checked(url: str, local_dir: Path, names: list[str], sizes: dict[str, int] | None) -> None:
    try:
        download_dir(url, local_dir, names)
    except FileNotFoundError as err:  # pruned or rewritten while we read it
        raise TransientError(f"{url} changed while it was downloaded: {err}", hint="retry") from err
    for name in names if sizes else []:
        if (local_dir / name).stat().st_size != sizes[name]:
            raise TransientError(f"{url}/{name} changed while it was downloaded",
                                 hint="another process rewrote this directory; retry")


def local_copy(url: str, dest: Path, names: list[str], complete: str,
               check: Callable[[Path], None] | None = None) -> Path:
    """Download `names` of the committed directory `url` once into the local cache entry `dest`.

    A visible entry holding `complete` is returned at once. Otherwise the files are downloaded into a
    hidden temp directory beside `dest`, `check(tmp)` may refuse them (raise), and the directory is
    renamed into place; a concurrent process that committed the same entry first wins.
    """
    if (dest / complete).is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        _download_checked(url, tmp, names, None)
        if check is not None:
            check(tmp)
        try:
            os.replace(tmp, dest)
        except OSError:
            if not (dest / complete).is_file():  # not another process's complete entry: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


__all__ = ["Location", "child", "commit_dir", "dir_files", "exists", "is_committed", "list_committed", "list_names", "local_copy",
           "local_path", "location", "stamp", "read_file", "remove_dir", "remove_file", "scratch_copy", "sha256", "write_file"]
