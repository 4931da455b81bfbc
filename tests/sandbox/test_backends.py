"""Behaviour of each backend through the Sandbox protocol, and of the warm pool, against real sandboxes."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest
from sandbox_helpers import LIMITS, run

from arlctl.errors import UsageError
from arlctl.sandbox import PoolExhausted, Sandbox, SandboxError, make_pool, make_sandbox


async def _sandbox(kind: str, snapshot, **kw):
    extra = {"insecure": True} if kind == "subprocess" else {}
    return await make_sandbox(kind, str(snapshot), **extra, **{**LIMITS, **kw})


def test_protocol_exec_files_and_reset(backend, snapshot):
    async def scenario():
        sb = await _sandbox(backend, snapshot)
        try:
            assert isinstance(sb, Sandbox)
            r = await sb.exec("echo out; echo err >&2; exit 3", timeout=10)
            assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, "out\n", "err\n", False)
            r = await sb.exec(["python3", "-c", "import sys; print(sys.stdin.read()[::-1])"], stdin=b"abc")
            assert r.stdout == "cba\n"
            r = await sb.exec("python3 -m pytest -q -p no:cacheprovider tests", timeout=60)
            assert r.exit_code == 0 and "1 passed" in r.stdout, r.stdout + r.stderr
            # Files written by the host are seen inside, and the other way round; binary-safe.
            blob = bytes(range(256)) * 3
            await sb.put_file("new/dir/blob.bin", blob)
            r = await sb.exec("sha256sum new/dir/blob.bin | cut -c1-16", timeout=10)
            import hashlib

            assert r.stdout.strip() == hashlib.sha256(blob).hexdigest()[:16]
            await sb.exec("printf 'edited' > README", timeout=10)
            assert await sb.get_file("README") == b"edited"
            assert (
                await sb.get_file(f"{sb.workdir}/calc/__init__.py")
                == (snapshot / "calc" / "__init__.py").read_bytes()
            )
            with pytest.raises(FileNotFoundError):
                await sb.get_file("missing.txt")
            # Links inside the workspace still work: the transfer then happens inside the sandbox.
            await sb.exec("ln -s calc/__init__.py alias.py; ln -s calc pkglink", timeout=10)
            assert await sb.get_file("alias.py") == (snapshot / "calc" / "__init__.py").read_bytes()
            await sb.put_file("pkglink/extra.py", b"x = 1\n")
            assert (await sb.exec("cat calc/extra.py", timeout=10)).stdout == "x = 1\n"
            assert b"ID=" in await sb.get_file("/usr/lib/os-release")  # a system file, read-only inside
            await sb.reset()
            assert await sb.get_file("README") == b"pristine\n"
            r = await sb.exec("ls new 2>&1; echo $?", timeout=10)
            assert r.stdout.strip().endswith("2")
        finally:
            await sb.close()

    run(scenario())


def test_output_is_capped(backend, snapshot):
    async def scenario():
        sb = await _sandbox(backend, snapshot, max_output_bytes=1000)
        try:
            r = await sb.exec("yes | head -c 5000000", timeout=30)
            assert r.exit_code == 0 and len(r.stdout) == 1000
        finally:
            await sb.close()

    run(scenario())


def test_subprocess_backend_runs_trusted_code_with_limits(snapshot):
    async def scenario():
        sb = await make_sandbox("subprocess", str(snapshot), insecure=True, memory_mb=256)
        try:
            r = await sb.exec("cat README", timeout=10)
            assert r.stdout == "pristine\n"
            r = await sb.exec(["python3", "-c", "bytearray(512 << 20)"], timeout=30)
            assert r.exit_code != 0 and "MemoryError" in r.stderr  # RLIMIT_AS refuses the allocation
            r = await sb.exec("sleep 30", timeout=0.5)
            assert r.timed_out and r.exit_code == 124  # killed at the timeout, not run for its 30 s
        finally:
            await sb.close()

    run(scenario())


def test_unknown_kind_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown sandbox kind"):
        make_pool("chroot", None, size=1)


# ---- the warm pool (bwrap: real sandboxes, fast to start) ---------------------------------------------


@pytest.fixture
def bwrap_kind() -> str:
    if shutil.which("bwrap") is None:
        pytest.skip("bwrap not installed (apt-get install bubblewrap)")
    return "bwrap"


def test_pool_resets_on_release_and_records_stats(bwrap_kind, pool_factory):
    async def scenario():
        async with pool_factory(bwrap_kind, size=2) as pool:
            async with pool.acquire() as sb:
                await sb.exec("rm README; echo dirty > calc/__init__.py", timeout=10)
            await pool.drain()
            seen = set()
            for _ in range(6):
                async with pool.acquire() as sb:
                    seen.add(id(sb))
                    r = await sb.exec("cat README calc/__init__.py", timeout=10)
                    assert r.stdout == "pristine\ndef add(a, b):\n    return a + b\n"
                await pool.drain()
            stats = pool.stats()
            assert stats.acquires == 7 and stats.resets == 7 and stats.replacements == 0
            assert len(seen) == 2
            assert 0 <= stats.queue_wait_p50_ms <= stats.queue_wait_p99_ms <= stats.queue_wait_max_ms

    run(scenario())


def test_pool_replaces_after_timeout_crash_and_failed_health(bwrap_kind, pool_factory):
    async def scenario():
        async with pool_factory(bwrap_kind, size=1) as pool:
            async with pool.acquire() as sb:
                first = sb
                assert (await sb.exec("sleep 5", timeout=0.3)).timed_out
            await pool.drain()
            async with pool.acquire() as sb:
                assert sb is not first
                second = sb
            await pool.drain()
            assert pool.stats().replacements == 1
            # A SandboxError raised inside the block (the sandbox crashed) spoils it too.
            with pytest.raises(SandboxError):
                async with pool.acquire() as sb:
                    raise SandboxError("exec server died")
            await pool.drain()
            assert pool.stats().replacements == 2
            # A sandbox whose server was killed from outside fails the health check on acquire.
            async with pool.acquire() as sb:
                third = sb
            await pool.drain()
            third._proc.kill()
            await third._proc.wait()
            async with pool.acquire() as sb:
                assert sb is not third and sb is not second
                assert (await sb.exec("echo ok", timeout=10)).stdout == "ok\n"
            await pool.drain()
            assert pool.stats().health_failures == 1

    run(scenario())


def test_pool_wait_is_bounded(bwrap_kind, snapshot):
    async def scenario():
        async with make_pool(bwrap_kind, str(snapshot), size=1, max_wait_s=0.3, **LIMITS) as pool:
            async with pool.acquire():
                with pytest.raises(PoolExhausted):
                    async with pool.acquire():
                        pass
            # Once released (and reset), the waiter would have got it.
            async with pool.acquire() as sb:
                assert (await sb.exec("true", timeout=10)).exit_code == 0

    run(scenario())


def test_pool_serves_concurrent_users(bwrap_kind, pool_factory):
    async def user(pool, i):
        async with pool.acquire() as sb:
            await sb.put_file("mine.txt", str(i).encode())
            await asyncio.sleep(0.01)
            return (await sb.exec("cat mine.txt; ls", timeout=10)).stdout

    async def scenario():
        async with pool_factory(bwrap_kind, size=2) as pool:
            outs = await asyncio.gather(*(user(pool, i) for i in range(8)))
            assert pool.stats().acquires == 8
            return outs

    outs = run(scenario())
    # Each user saw only its own file on top of the pristine snapshot.
    assert outs == [f"{i}README\ncalc\nmine.txt\ntests\n" for i in range(8)]


def test_bwrap_sandbox_lives_in_a_limited_cgroup(bwrap_kind, snapshot):
    async def scenario():
        sb = await make_sandbox(bwrap_kind, str(snapshot), memory_mb=200, pids=50)
        try:
            if sb.cgroup is None:
                pytest.skip("no writable cgroup on this host (the backend warned and fell back to rlimits)")
            members = sb.cgroup.pids()
            assert len(members) >= 2  # bwrap's init and the exec server, nothing outside it
            limits = {}
            for d in sb.cgroup.dirs:
                for name in ("memory.limit_in_bytes", "memory.max", "pids.max"):
                    path = os.path.join(d, name)
                    if os.path.exists(path):
                        limits[name] = Path(path).read_text().strip()
            assert limits.get("memory.limit_in_bytes", limits.get("memory.max")) == str(200 << 20)
            assert limits["pids.max"] == "50"
            # A command's processes are charged to the same cgroup while they run.
            r = await sb.exec("cat /proc/self/cgroup | grep -c . ; sleep 0.2", timeout=10)
            assert r.exit_code == 0
            dirs = list(sb.cgroup.dirs)
        finally:
            await sb.close()
        assert not any(os.path.exists(d) for d in dirs), "close() must remove the sandbox's cgroups"

    run(scenario())


def test_one_pool_serves_many_task_snapshots(bwrap_kind, pool_factory, snapshot, tmp_path):
    other = tmp_path / "other-task"
    (other / "src").mkdir(parents=True)
    (other / "src" / "main.py").write_text("print('other task')\n")

    async def scenario():
        async with pool_factory(bwrap_kind, size=1) as pool:
            async with pool.acquire(snapshot=str(other)) as sb:
                r = await sb.exec("ls -A; python3 src/main.py", timeout=10)
                assert r.stdout == "src\nother task\n"
                await sb.exec("echo dirty > src/main.py", timeout=10)
            await pool.drain()
            async with pool.acquire(snapshot=str(other)) as sb:
                assert (await sb.exec("python3 src/main.py", timeout=10)).stdout == "other task\n"
            await pool.drain()
            async with pool.acquire(snapshot=str(snapshot)) as sb:
                assert (await sb.exec("ls -A", timeout=10)).stdout == "README\ncalc\ntests\n"

    run(scenario())


def test_set_snapshot_switches_the_pristine_state(backend, snapshot, tmp_path):
    other = tmp_path / "other-task"
    other.mkdir()
    (other / "only-here.txt").write_text("B\n")

    async def scenario():
        sb = await _sandbox(backend, snapshot)
        try:
            await sb.set_snapshot(str(other))
            assert (await sb.exec("ls -A; cat only-here.txt", timeout=10)).stdout == "only-here.txt\nB\n"
            await sb.exec("rm only-here.txt", timeout=10)
            await sb.reset()
            assert await sb.get_file("only-here.txt") == b"B\n"
        finally:
            await sb.close()

    run(scenario())


@pytest.fixture
def shared_root():
    """A sandbox root the unprivileged bwrap uid can reach (pytest's tmp_path is private to root)."""
    import tempfile
    import uuid

    root = Path(tempfile.gettempdir()) / f"arlctl-sweep-test-{uuid.uuid4().hex[:8]}"
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_sandboxes_of_a_killed_process_are_swept(bwrap_kind, shared_root):
    """A process SIGKILLed while holding sandboxes leaves a mounted tmpfs and a directory; the next
    process that creates a sandbox under the same root removes them."""
    import signal
    import subprocess
    import sys

    root = shared_root
    child_src = (
        "import asyncio, sys\n"
        "from arlctl.sandbox.bwrap import BwrapSandbox\n"
        "async def main():\n"
        f"    sb = await BwrapSandbox.create(None, root_dir={str(root)!r})\n"
        "    print(sb.root, flush=True)\n"
        "    await asyncio.sleep(120)\n"
        "asyncio.run(main())\n"
    )
    child = subprocess.Popen([sys.executable, "-c", child_src], stdout=subprocess.PIPE, text=True)
    try:
        stale = Path(child.stdout.readline().strip())
        assert stale.is_dir()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert stale.is_dir()  # nobody cleaned up: the process had no chance to

    async def scenario():
        sb = await make_sandbox(bwrap_kind, None, root_dir=str(root), **LIMITS)
        await sb.close()

    run(scenario())
    assert not stale.exists()
    with open("/proc/mounts") as f:
        assert str(stale) not in f.read()


def test_unreachable_sandbox_root_is_a_clear_error(bwrap_kind, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only root runs bwrap as another uid")
    tmp_path.chmod(0o700)
    with pytest.raises(SandboxError, match="not searchable by uid 65534"):
        run(make_sandbox(bwrap_kind, None, root_dir=str(tmp_path / "sandboxes")))
