"""Run locks with real contending processes: local flock and S3 leases on moto's server."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import fsspec
import pytest

from arlctl.errors import UsageError
from arlctl.io.lock import LEASE_TTL_ENV, LockHeld, LockLost, RunLock
from arlctl.io.shards import scan

# A holder process: takes the lock, prints "acquired", holds it for HOLD_S, prints "released".
HOLDER = """
import sys, time
from arlctl.io.lock import LockHeld, RunLock
out, name, hold_s, wait_s, ttl_s = sys.argv[1], sys.argv[2], *map(float, sys.argv[3:6])
try:
    with RunLock(out, name, ttl_s=ttl_s, wait_s=wait_s):
        print("acquired", time.time(), flush=True)
        time.sleep(hold_s)
        print("released", time.time(), flush=True)
except LockHeld as err:
    print("held:", err, flush=True)
    sys.exit(err.exit_code)
"""


def start_holder(out: str, hold_s: float, ttl_s: float = 60.0, wait_s: float = 0.0) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, out, "reward", str(hold_s), str(wait_s), str(ttl_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.startswith("acquired"), line + proc.stderr.read()
    return proc


def run_contender(out: str, wait_s: float = 0.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", HOLDER, out, "reward", "0", str(wait_s), "60"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(10)


# ----------------------------------------------------------------------------------------------- local


def test_local_second_process_fails_fast_naming_holder(tmp_path):
    out = str(tmp_path / "rewarded")
    holder = start_holder(out, hold_s=600)
    try:
        result = run_contender(out, wait_s=0)  # a contender that waited for the holder would hit its timeout
        assert result.returncode == 75, result.stdout + result.stderr
        assert holder.poll() is None  # refused while the lock was still held: it did not wait its turn
        assert f"pid {holder.pid} on host {socket.gethostname()}" in result.stdout
        assert f"another `arlctl reward` holds {out}" in result.stdout
        # The same refusal in-process, as the CLI will see it.
        with pytest.raises(LockHeld) as info:
            RunLock(out, "reward").acquire()
        assert info.value.holder["pid"] == holder.pid
        assert info.value.exit_code == 75
    finally:
        kill(holder)


@pytest.mark.slow
def test_local_waiter_gets_lock_when_holder_finishes(tmp_path):
    out = str(tmp_path / "rewarded")
    holder = start_holder(out, hold_s=1.0)
    with RunLock(out, "reward", wait_s=30):
        acquired_at = time.time()
    released_line = holder.stdout.readline()
    holder.wait(10)
    assert released_line.startswith("released")
    assert acquired_at >= float(released_line.split()[1])  # never overlapped the holder


def test_local_sigkilled_holder_releases_at_once(tmp_path):
    out = str(tmp_path / "rewarded")
    holder = start_holder(out, hold_s=60)
    kill(holder)
    # wait_s=0: a lock the dead holder still held would raise LockHeld here instead of being taken.
    with RunLock(out, "reward", wait_s=0):
        assert "reward.lock" in os.listdir(tmp_path / "rewarded" / "_locks")


def test_local_lock_is_per_stage_and_hidden_from_readers(tmp_path):
    out = str(tmp_path / "rewarded")
    with RunLock(out, "reward"), RunLock(out, "filter"):  # different stages on one output: no conflict
        assert sorted(os.listdir(tmp_path / "rewarded" / "_locks")) == ["filter.lock", "reward.lock"]
        listing = scan(out)
        assert listing.shards == [] and listing.strays == []
    with RunLock(out, "reward"):  # released on exit: can be taken again
        pass


# ---------------------------------------------------------------------------------------- object stores


@pytest.mark.slow
def test_s3_contention_between_processes(s3_bucket):
    out = f"{s3_bucket}/run/rewarded"
    holder = start_holder(out, hold_s=60, ttl_s=30)
    try:
        result = run_contender(out, wait_s=0)
        assert result.returncode == 75, result.stdout + result.stderr
        assert f"pid {holder.pid} on host" in result.stdout
        lease = json.loads(fsspec.filesystem("s3").cat_file(f"{out}/_locks/reward.lease"))
        assert lease["pid"] == holder.pid and lease["expires_at"] > time.time()
    finally:
        kill(holder)


@pytest.mark.slow
def test_s3_killed_holder_is_taken_over_after_ttl(s3_bucket):
    out = f"{s3_bucket}/run/rewarded"
    holder = start_holder(out, hold_s=60, ttl_s=2)
    kill(holder)
    with pytest.raises(LockHeld) as info:  # the dead holder's lease has not expired yet
        RunLock(out, "reward", ttl_s=2).acquire()
    assert info.value.holder["pid"] == holder.pid
    dead_expires_at = info.value.holder["expires_at"]
    with RunLock(out, "reward", ttl_s=2, wait_s=15) as lock:
        taken_at = time.time()
        lease = json.loads(fsspec.filesystem("s3").cat_file(f"{out}/_locks/reward.lease"))
        assert lease["owner"] == lock.owner and lease["pid"] == os.getpid()
    assert taken_at >= dead_expires_at  # the dead holder's lease was honoured until it expired
    assert not fsspec.filesystem("s3").exists(f"{out}/_locks/reward.lease")  # released on exit


@pytest.mark.slow
def test_s3_renewal_keeps_live_holder(s3_bucket):
    out = f"{s3_bucket}/run/rewarded"
    with RunLock(out, "reward", ttl_s=2) as lock:
        # Hold for more than two ttls; without renewal the lease would expire and be taken.
        for _ in range(5):
            time.sleep(1.0)
            with pytest.raises(LockHeld):
                RunLock(out, "reward", ttl_s=2).acquire()
        lock.check()
        assert not lock.lost.is_set()
    with RunLock(out, "reward", ttl_s=2):  # released: free at once
        pass


def test_s3_lease_taken_from_under_holder_is_reported_lost(s3_bucket):
    out = f"{s3_bucket}/run/rewarded"
    fs = fsspec.filesystem("s3")
    with RunLock(out, "reward", ttl_s=1.5) as lock:
        # Someone else overwrites the lease (as a takeover after a long pause would): renewal must notice.
        fs.pipe_file(
            f"{out}/_locks/reward.lease", json.dumps({"owner": "other", "pid": 1, "expires_at": 0}).encode()
        )
        deadline = time.monotonic() + 5
        while not lock.lost.is_set() and time.monotonic() < deadline:
            time.sleep(0.1)
        with pytest.raises(LockLost):
            lock.check()
    # We must not have deleted the other owner's lease on release.
    assert json.loads(fs.cat_file(f"{out}/_locks/reward.lease"))["owner"] == "other"


def test_memory_store_lease_contention():
    out = f"memory://lock-test-{os.getpid()}-{time.time_ns()}/rewarded"
    with RunLock(out, "reward"):
        with pytest.raises(LockHeld) as info:
            RunLock(out, "reward").acquire()
        assert "since" in str(info.value) and info.value.holder["pid"] == os.getpid()
    with RunLock(out, "reward"):
        pass


def test_lease_ttl_comes_from_the_environment(monkeypatch):
    out = f"memory://lock-ttl-{os.getpid()}-{time.time_ns()}/rewarded"
    monkeypatch.delenv(LEASE_TTL_ENV, raising=False)
    assert RunLock(out, "reward").ttl_s == 60.0
    monkeypatch.setenv(LEASE_TTL_ENV, "12.5")
    with RunLock(out, "reward") as lock:
        lease = json.loads(fsspec.filesystem("memory").cat_file(f"{out}/_locks/reward.lease"))
        assert 11.0 < lease["expires_at"] - time.time() <= 12.5 and lock.ttl_s == 12.5
    for bad in ("soon", "0.5", "nan", "inf", "-3"):
        monkeypatch.setenv(LEASE_TTL_ENV, bad)
        with pytest.raises(UsageError, match=LEASE_TTL_ENV):
            RunLock(out, "reward")
