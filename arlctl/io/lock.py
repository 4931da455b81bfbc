"""Run locks: one holder per (output location, stage), so two cron-launched copies never overlap.

Local paths: `fcntl.flock` on `<out>/_locks/<name>.lock`. The kernel drops the lock when the holder's
process dies, however it dies, so a SIGKILLed run never blocks the next one. The file's text names the
holder (JSON) so a refused contender can say who holds it.

Object stores (s3://, memory://, ...): a lease object `<out>/_locks/<name>.lease` holding JSON
{owner, host, pid, since, expires_at}. Every change is a compare-and-swap: on S3 a conditional PUT
(`If-None-Match: *` to create, `If-Match: <etag>` to renew or take over) and a conditional DELETE to
release; on stores without preconditions (memory://, ...) a read-compare-write under a process lock, then
a read-back that checks our owner token. A background thread renews the lease every ttl/3; a lease whose
holder was killed is taken over once `expires_at` passes (clocks of hosts sharing a lease must agree to
well within ttl). If renewal finds the lease taken, `lost` is set and `check()` raises LockLost.
The ttl is 60 s unless ARLCTL_LEASE_TTL_S says otherwise (shorter: a killed holder blocks its stage for
less time; longer: a slow store or a paused host loses its lease less often).

The `_locks/` directory is hidden: shard readers skip underscore-prefixed names.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from arlctl.errors import TransientError, UsageError
from arlctl.io.fs import get_fs, is_local, join

log = logging.getLogger(__name__)

LOCK_DIR = "_locks"
_POLL_S = 0.2  # how often a waiting contender retries
LEASE_TTL_ENV = "ARLCTL_LEASE_TTL_S"
DEFAULT_LEASE_TTL_S = 60.0
_GENERIC_CAS = threading.Lock()  # serialises read-compare-write on stores without preconditions


class LockHeld(TransientError):
    """Another process holds the run lock. `holder` is its JSON record (may be {} if unreadable)."""

    def __init__(self, name: str, out_url: str, holder: dict[str, Any], remote: bool):
        since = _iso(holder.get("since"))
        who = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, since {since}"
        message = f"another `arlctl {name}` holds {out_url} ({who}); wait, or let it finish"
        if remote and holder.get("expires_at"):
            hint = f"if that process is dead its lease expires at {_iso(holder['expires_at'])}; then rerun"
        else:
            hint = "rerun when it is done, or pass --lock-wait SECONDS to queue behind it"
        super().__init__(message, hint=hint)
        self.holder = holder


class LockLost(TransientError):
    """Our lease was taken over (we could not renew it in time): stop before committing more output."""


def lease_ttl_s() -> float:
    """The lease ttl on object stores: ARLCTL_LEASE_TTL_S (seconds, at least 1) or 60."""
    raw = os.environ.get(LEASE_TTL_ENV, "").strip()
    if not raw:
        return DEFAULT_LEASE_TTL_S
    try:
        ttl = float(raw)
    except ValueError:
        ttl = float("nan")
    if not 1.0 <= ttl < float("inf"):  # nan fails too; renewal runs every ttl/3
        raise UsageError(f"{LEASE_TTL_ENV}={raw!r} is not a number of seconds >= 1",
                          hint=f"unset it for the default {DEFAULT_LEASE_TTL_S:.0f} s")
    return ttl


@dataclass
class _Lease:
    record: dict[str, Any]
    version: str  # S3 ETag or sha256 of the bytes: what the next compare-and-swap must match


class RunLock:
    """`with RunLock(out_url, "reward", wait_s=0): ...` — raises LockHeld if not acquired. `ttl_s` (object
    stores only) defaults to lease_ttl_s()."""

    def __init__(self, out_url: str, name: str, ttl_s: float | None = None, wait_s: float = 0.0):
        self.ttl_s = lease_ttl_s() if ttl_s is None else float(ttl_s)
        self.out_url, self.name, self.wait_s = out_url, name, float(wait_s)
        self.fs, out_path = get_fs(out_url)
        self.local = is_local(self.fs)
        self.path = join(out_path, LOCK_DIR, f"{name}.{'lock' if self.local else 'lease'}")
        self.owner = uuid.uuid4().hex
        self.lost = threading.Event()
        self._fd: int | None = None
        self._lease: _Lease | None = None
        self._stop_renew = threading.Event()
        self._renewer: threading.Thread | None = None

    # ------------------------------------------------------------------------------------ public API
    def acquire(self) -> RunLock:
        deadline = time.monotonic() + self.wait_s
        while True:
            holder = self._try_acquire()
            if holder is None:
                return self
            if time.monotonic() >= deadline:
                raise LockHeld(self.name, self.out_url, holder, remote=not self.local)
            time.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())) or 0.01)

    def release(self) -> None:
        if self.local:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, 0)  # no stale holder text for the next reader
                os.close(self._fd)  # closing drops the flock
                self._fd = None
            return
        self._stop_renew.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
        if self._lease is not None and not self.lost.is_set():
            with contextlib.suppress(Exception):  # an unreleased lease only delays the next run by ttl
                _delete_if(self.fs, self.path, self._lease.version)
        self._lease = None

    def check(self) -> None:
        """Raise LockLost if the lease was taken over. Call before committing output in long runs."""
        if self.lost.is_set():
            raise LockLost(
                f"lost the run lock on {self.out_url} for `arlctl {self.name}`",
                hint="another copy took over after our lease expired; rerun",
            )

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    # ------------------------------------------------------------------------------------ one attempt
    def _holder_record(self) -> dict[str, Any]:
        now = time.time()
        return {
            "owner": self.owner,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "stage": self.name,
            "since": now,
            "expires_at": now + self.ttl_s,
        }

    def _try_acquire(self) -> dict[str, Any] | None:
        """None when acquired, else the current holder's record."""
        return self._try_local() if self.local else self._try_remote()

    def _try_local(self) -> dict[str, Any] | None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return _read_local_holder(self.path)
        record = self._holder_record()
        record.pop("expires_at")  # the kernel, not a clock, ends a local lock
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        self._fd = fd
        return None

    def _try_remote(self) -> dict[str, Any] | None:
        current = _read_lease(self.fs, self.path)
        record = self._holder_record()
        if current is not None and current.record.get("expires_at", 0) > time.time():
            return current.record
        try:  # absent: create; expired: take over, but only if nobody changed it since we read it
            version = _put_if(self.fs, self.path, record, None if current is None else current.version)
            # Read back: an S3-compatible store that ignores preconditions shows up here, not later.
            written = _read_lease(self.fs, self.path)
            if written is None or written.record.get("owner") != self.owner:
                raise _Conflict
        except _Conflict:
            again = _read_lease(self.fs, self.path)
            return again.record if again else {}
        if current is not None:
            log.warning(
                "took over expired run lock %s from pid %s on %s",
                self.path,
                current.record.get("pid"),
                current.record.get("host"),
            )
        self._lease = _Lease(record, version)
        self._stop_renew.clear()
        self._renewer = threading.Thread(target=self._renew_loop, name=f"lease-{self.name}", daemon=True)
        self._renewer.start()
        return None

    def _renew_loop(self) -> None:
        interval = self.ttl_s / 3
        while not self._stop_renew.wait(interval):
            assert self._lease is not None
            record = dict(self._lease.record, expires_at=time.time() + self.ttl_s)
            try:
                self._lease = _Lease(record, _put_if(self.fs, self.path, record, self._lease.version))
            except _Conflict:
                log.error("run lock %s was taken over; stopping renewal", self.path)
                self.lost.set()
                return
            except Exception as err:  # a network blip: try again next tick, the lease still has 2/3 ttl
                log.warning("could not renew run lock %s: %s", self.path, err)


# ---------------------------------------------------------------------------------- store primitives
class _Conflict(Exception):
    """A compare-and-swap found the object changed (or present, when creating)."""


def _is_s3(fs: Any) -> bool:
    return "s3" in (fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,))


def _read_lease(fs: Any, path: str) -> _Lease | None:
    try:
        if _is_s3(fs):
            # ETag first, body second: a body newer than its ETag only makes our later CAS fail, safely.
            version = fs.info(path, refresh=True)["ETag"]
            data = fs.cat_file(path)
        else:
            data = fs.cat_file(path)
            version = hashlib.sha256(data).hexdigest()
    except FileNotFoundError:
        return None
    try:
        record = json.loads(data)
    except ValueError:
        record = {}  # unreadable lease: treat as expired so a torn write cannot wedge the stage
    return _Lease(record if isinstance(record, dict) else {}, version)


def _put_if(fs: Any, path: str, record: dict[str, Any], version: str | None) -> str:
    """Write `record` if the object is absent (version None) or still at `version`. Returns the new version."""
    data = json.dumps(record).encode()
    if _is_s3(fs):
        try:
            if version is None:
                out = fs.pipe_file(path, data, mode="create")
            else:
                out = fs.pipe_file(path, data, IfMatch=version)
        except FileExistsError:
            raise _Conflict from None
        except OSError as err:
            if _is_precondition(err):
                raise _Conflict from None
            raise
        etag = (out or {}).get("ETag")
        return etag or fs.info(path, refresh=True)["ETag"]
    with _GENERIC_CAS:
        current = _read_lease(fs, path)
        if (current.version if current else None) != version:
            raise _Conflict
        fs.pipe_file(path, data)
        written = _read_lease(fs, path)
        if written is None or written.record.get("owner") != record["owner"]:
            raise _Conflict  # someone outside this process wrote between our read and write
        return written.version


def _delete_if(fs: Any, path: str, version: str) -> None:
    if _is_s3(fs):
        bucket, key, _ = fs.split_path(path)
        try:
            fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=version)
            return
        except OSError as err:
            if _is_precondition(err):
                return  # no longer ours: leave it
            # A store without conditional DELETE: fall through to read-compare-delete.
        finally:
            fs.invalidate_cache(path)
    with _GENERIC_CAS:
        current = _read_lease(fs, path)
        if current is not None and current.version == version:
            fs.rm_file(path)


def _is_precondition(err: BaseException) -> bool:
    text = str(err).lower()
    return "pre-condition" in text or "precondition" in text


def _read_local_holder(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            record = json.loads(fh.read() or b"{}")
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _iso(stamp: Any) -> str:
    if not isinstance(stamp, (int, float)):
        return "?"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stamp))


__all__ = ["LOCK_DIR", "LockHeld", "LockLost", "RunLock"]
