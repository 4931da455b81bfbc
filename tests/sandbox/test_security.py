"""Real attacks against each sandbox backend (bwrap in the default tier, docker under the docker marker).

Every test runs the attack through a warm pool of one sandbox, then checks three things: the attack was
contained (it failed, or only hurt the sandbox's own workspace), the host is unchanged (snapshot
directory, host files, no surviving process), and the pool hands out a working sandbox with a pristine
workspace afterwards — a replacement when the attack spoiled the sandbox (timeout, OOM kill).
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from pathlib import Path

import pytest
from sandbox_helpers import processes_with, run, tree_digest, wait_no_processes

from arlctl.sandbox import SandboxError

# Generous bound on an attack that must end by itself (by its exec timeout or a limit); never a timing check.
HANG_S = 120


async def _attack(pool, cmd: str | list[str], timeout: float = 10.0):
    async with pool.acquire() as sb:
        result = await sb.exec(cmd, timeout=timeout)
    await pool.drain()
    return result


async def _pool_still_serves_pristine(pool, snapshot: Path) -> None:
    async with pool.acquire() as sb:
        readme = await sb.exec("cat README; ls -A | sort | tr '\\n' ' '", timeout=10)
        assert readme.exit_code == 0, readme
        assert readme.stdout == "pristine\nREADME calc tests "
        tests = await sb.exec("python3 -m pytest -q -p no:cacheprovider tests", timeout=60)
        assert tests.exit_code == 0, tests.stdout + tests.stderr
        assert "1 passed" in tests.stdout


def _host_probe() -> dict:
    canary = Path("/tmp") / f"arlctl-canary-{uuid.uuid4().hex}"
    canary.write_text("host file\n")
    return {
        "canary": canary,
        "passwd": Path("/etc/passwd").read_bytes(),
        "python": os.path.exists("/usr/bin/python3"),
    }


def _host_unchanged(probe: dict, snapshot: Path, digest: str) -> None:
    assert probe["canary"].read_text() == "host file\n"
    assert Path("/etc/passwd").read_bytes() == probe["passwd"]
    assert os.path.exists("/usr/bin/python3") == probe["python"]
    assert tree_digest(snapshot) == digest, "the pristine snapshot was modified from inside the sandbox"
    probe["canary"].unlink()


@pytest.mark.slow
def test_rm_rf_root_and_writes_outside_workspace(backend, pool_factory, snapshot):
    digest, probe = tree_digest(snapshot), _host_probe()
    marker = f"pwned-{uuid.uuid4().hex}"
    attack = (
        f"for d in / /etc /usr /usr/local /tmp /var /root /home {snapshot}; do echo x > $d/{marker}; done; "
        f"rm -rf --no-preserve-root / 2>/dev/null; ls -A /workspace | wc -l"
    )

    async def scenario():
        async with pool_factory(backend) as pool:
            result = await _attack(pool, attack, timeout=60)
            assert result.stdout.strip() == "0", "rm -rf / should at least empty the sandbox's own workspace"
            await _pool_still_serves_pristine(pool, snapshot)

    run(scenario())
    for d in ("/", "/etc", "/usr", "/usr/local", "/var", "/root", "/home", str(snapshot)):
        assert not os.path.exists(os.path.join(d, marker)), f"sandbox wrote {d}/{marker} on the host"
    _host_unchanged(probe, snapshot, digest)


@pytest.mark.slow
def test_fork_bomb_is_capped_and_sandbox_replaced(backend, pool_factory, snapshot):
    marker = f"forkbomb{uuid.uuid4().hex[:8]}"
    bomb = f"{marker}() {{ {marker} | {marker} & }}; {marker}; sleep 3; echo survived"

    async def scenario():
        async with pool_factory(backend) as pool:
            server_died = False
            try:
                async with pool.acquire() as sb:
                    # The bound only guards against a hang (an exec that outlives its timeout fails here).
                    result = await asyncio.wait_for(sb.exec(["/bin/sh", "-c", bomb], timeout=4), HANG_S)
            except SandboxError:
                # Under load the bomb can starve the in-sandbox exec server of pids too: the sandbox is
                # then lost as a whole, which is containment as well, and the pool must replace it.
                server_died = True
            else:
                # The pids limit refused forks (or the wall timeout ended it) while the host kept working.
                assert "Cannot fork" in result.stderr or result.timed_out, result
            await pool.drain()
            assert wait_no_processes(marker) == []
            if backend == "bwrap" or server_died:  # bwrap reads the cgroup's pids.events
                assert pool.stats().replacements == 1
            await _pool_still_serves_pristine(pool, snapshot)

    run(scenario())


def test_memory_bomb_is_killed_and_sandbox_replaced(backend, pool_factory, snapshot):
    bomb = ["python3", "-c", "a = []\nwhile True:\n    a.append(bytearray(16 << 20))"]

    async def scenario():
        async with pool_factory(backend, memory_mb=128) as pool:
            result = await _attack(pool, bomb, timeout=30)
            assert result.exit_code != 0 and not result.timed_out, result
            # Killed by the OOM killer (-9 / 137) or refused with MemoryError: either way it stopped.
            assert result.exit_code in (-9, 137) or "MemoryError" in result.stderr, result
            assert pool.stats().replacements == 1, "an OOM-killed sandbox must be replaced, not reused"
            await _pool_still_serves_pristine(pool, snapshot)

    run(scenario())


@pytest.mark.slow
def test_cpu_spin_past_timeout_is_killed(backend, pool_factory, snapshot):
    marker = f"SPIN_{uuid.uuid4().hex}"
    spin = ["python3", "-c", f"marker = '{marker}'\nwhile True:\n    pass"]

    async def scenario():
        async with pool_factory(backend) as pool:
            result = await asyncio.wait_for(_attack(pool, spin, timeout=1.0), HANG_S)  # a hang fails here
            assert result.timed_out and result.exit_code == 124  # the timeout, not the spin, ended it
            assert pool.stats().replacements == 1
            assert wait_no_processes(marker) == []
            await _pool_still_serves_pristine(pool, snapshot)

    run(scenario())


def test_daemonised_grandchild_does_not_outlive_its_exec(backend, pool_factory, snapshot):
    marker = f"DAEMON_{uuid.uuid4().hex}"
    daemon = (
        "import os, time\n"
        f"marker = '{marker}'\n"
        "if os.fork():\n    os._exit(0)\nos.setsid()\n"
        "if os.fork():\n    os._exit(0)\n"
        "os.closerange(0, 3)\ntime.sleep(300)\n"
    )

    async def scenario():
        async with pool_factory(backend) as pool:
            async with pool.acquire() as sb:
                result = await sb.exec(["python3", "-c", daemon], timeout=10)
                # The exec returns when its direct child exits, not when the daemon's sleep 300 would.
                assert result.exit_code == 0 and not result.timed_out, result
                # Checked from the host, while the sandbox is still held: nothing with the marker is left.
                assert wait_no_processes(marker, within_s=2.0) == []
                again = await sb.exec("echo alive", timeout=10)
                assert again.stdout == "alive\n"
            await pool.drain()

    run(scenario())
    assert processes_with(marker) == []


def test_no_network_socket_or_name_resolution(backend, pool_factory, snapshot):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    probe = (
        "import socket\n"
        f"for target in [('127.0.0.1', {port}), ('1.1.1.1', 53), ('10.0.0.1', 80)]:\n"
        "    try:\n        socket.create_connection(target, timeout=2); print('CONNECTED', target)\n"
        "    except OSError as e:\n        print('refused', target, e.errno)\n"
        "try:\n    socket.getaddrinfo('deb.debian.org', 80); print('RESOLVED')\n"
        "except OSError:\n    print('no dns')\n"
        "print(sorted(n for _, n in socket.if_nameindex()))\n"
    )

    async def scenario():
        async with pool_factory(backend) as pool:
            return await _attack(pool, ["python3", "-c", probe], timeout=30)

    try:
        result = run(scenario())
    finally:
        listener.close()
    assert "CONNECTED" not in result.stdout and "RESOLVED" not in result.stdout, result
    assert "no dns" in result.stdout
    assert result.stdout.strip().endswith("['lo']"), "only a loopback interface may exist inside"


def test_host_environment_and_files_do_not_leak(backend, pool_factory, snapshot, monkeypatch):
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    monkeypatch.setenv("ARLCTL_TEST_SECRET", secret)
    shadow = Path("/etc/shadow").read_text() if os.path.exists("/etc/shadow") else ""
    project = Path(__file__).resolve().parents[2]
    cache = Path.home() / ".cache"
    attack = (
        f"env; cat /proc/self/environ /proc/1/environ 2>&1; cat /etc/shadow 2>&1; "
        f"ls -la {project} {cache} /root 2>&1; cat {project}/pyproject.toml 2>&1; "
        f"cat {cache}/*/* 2>&1 | head -c 100000"
    )

    async def scenario():
        async with pool_factory(backend) as pool:
            return await _attack(pool, attack, timeout=30)

    result = run(scenario())
    seen = result.stdout + result.stderr
    assert secret not in seen
    assert "ARLCTL_TEST_SECRET" not in seen
    for line in shadow.splitlines():
        assert line not in seen, "a line of the host's /etc/shadow is visible inside"
    assert 'name = "arlctl"' not in seen, "the project checkout is readable from inside"
    assert "pyproject.toml" not in "\n".join(
        line for line in seen.splitlines() if not line.startswith("cat:")
    )


def test_proc_escape_attempts(backend, pool_factory, snapshot, monkeypatch):
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    monkeypatch.setenv("ARLCTL_TEST_SECRET", secret)
    host_pid = os.getpid()
    panic_before = Path("/proc/sys/kernel/panic").read_text()
    attack = (
        "for p in /proc/[0-9]*; do cat $p/environ $p/root/etc/shadow 2>/dev/null; "
        "ls $p/root/work $p/root/root $p/cwd/ 2>/dev/null; done; "
        f"cat /proc/{host_pid}/environ /proc/{host_pid}/root/etc/shadow 2>&1; "
        f"ls /proc/1/root/ 2>&1; echo b > /proc/sysrq-trigger 2>&1; "
        "echo 1 > /proc/sys/kernel/panic 2>&1; echo test > /proc/1/comm 2>&1; "
        f"touch /proc/1/root/escaped-{secret[-8:]} 2>&1; echo done"
    )

    async def scenario():
        async with pool_factory(backend) as pool:
            result = await _attack(pool, attack, timeout=30)
            await _pool_still_serves_pristine(pool, snapshot)
            return result

    result = run(scenario())
    seen = result.stdout + result.stderr
    assert secret not in seen
    assert "main" not in result.stdout.split() and "DESIGN.md" not in seen
    assert "done" in result.stdout
    assert not os.path.exists(f"/escaped-{secret[-8:]}")
    assert Path("/proc/sys/kernel/panic").read_text() == panic_before


def test_filling_the_disk_is_bounded(backend, pool_factory, snapshot):
    fill = (
        "dd if=/dev/zero of=/workspace/big bs=1M count=1024 2>&1 | tail -1; "
        "dd if=/dev/zero of=/tmp/big bs=1M count=1024 2>&1 | tail -1; "
        "du -sm /workspace/big /tmp/big | cut -f1"
    )
    free_before = os.statvfs("/tmp").f_bavail * os.statvfs("/tmp").f_frsize

    async def scenario():
        async with pool_factory(backend, disk_mb=32, memory_mb=512) as pool:
            result = await _attack(pool, fill, timeout=60)
            await _pool_still_serves_pristine(pool, snapshot)
            return result

    result = run(scenario())
    sizes = [int(x) for x in result.stdout.split() if x.isdigit()][-2:]
    assert len(sizes) == 2, result
    assert all(s <= 33 for s in sizes), f"wrote {sizes} MiB past a 32 MiB disk limit"
    assert sizes[0] >= 16, "the workspace should accept writes up to its limit"
    free_after = os.statvfs("/tmp").f_bavail * os.statvfs("/tmp").f_frsize
    assert free_before - free_after < 200 << 20


def test_host_file_access_never_follows_planted_symlinks(backend, pool_factory, snapshot, tmp_path):
    """get_file/put_file from the host must not read or write through a link the sandbox planted."""
    target = tmp_path / "host-secret"
    target.write_text("host only\n")
    from arlctl.sandbox import SandboxError

    async def scenario():
        async with pool_factory(backend) as pool, pool.acquire() as sb:
            await sb.exec(f"ln -s {target} link; ln -s {tmp_path} dirlink; ln -s /etc etclink", timeout=10)
            for path in ("link", "dirlink/host-secret"):
                try:
                    data = await sb.get_file(path)
                except (SandboxError, FileNotFoundError, OSError):
                    data = b""
                assert b"host only" not in data
            for path in ("link", "dirlink/host-secret", "etclink/arlctl-pwned"):
                try:
                    await sb.put_file(path, b"overwritten\n")
                except (SandboxError, OSError):
                    pass

    run(scenario())
    assert target.read_text() == "host only\n"
    assert not os.path.exists("/etc/arlctl-pwned")


def test_subprocess_backend_refused_without_insecure(snapshot):
    from arlctl.errors import UsageError
    from arlctl.sandbox import make_pool, make_sandbox

    with pytest.raises(UsageError, match="rlimits only"):
        run(make_sandbox("subprocess", str(snapshot)))
    with pytest.raises(UsageError):
        make_pool("subprocess", str(snapshot), size=1)


@pytest.mark.slow
def test_killing_the_sandbox_supervisor_spoils_only_that_sandbox(backend, pool_factory, snapshot):
    """Sandboxed code may try to kill whatever runs it inside (its parent, pid 1). pid 1 is the exec
    server, the namespace's init, which gets no signal from inside (issue 26, test_lease_isolation.py):
    on bwrap it is also the parent, so the command goes on and the sandbox is kept; on docker the parent
    is the `timeout` wrapper, whose death fails that exec and the pool replaces the sandbox. Never a hang."""
    from arlctl.sandbox import SandboxError

    async def scenario():
        async with pool_factory(backend) as pool:
            failed = False
            try:
                async with pool.acquire() as sb:
                    result = await sb.exec(
                        "kill -9 $PPID 1 2>/dev/null; sleep 2; echo still-here", timeout=10
                    )
                    failed = result.exit_code != 0
                    assert ("still-here" in result.stdout) == (backend == "bwrap"), result
            except SandboxError:
                failed = True
            assert failed == (backend != "bwrap")
            await pool.drain()
            assert pool.stats().replacements == (0 if backend == "bwrap" else 1)
            await _pool_still_serves_pristine(pool, snapshot)

    run(scenario())
