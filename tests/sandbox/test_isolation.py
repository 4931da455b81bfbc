"""Isolation between leases and from the host: real attacks on the sandbox root, its stale-sandbox sweep,
what one lease can leave for the next (bwrap and docker), task snapshots, and the logs kept from a run.

- The sandbox root is a guessable name in a shared directory: a root another user created (or made
  writable, or replaced by a symlink, or whose parent others can rename) is refused before anything is
  written into it.
- root's sweep of stale sandboxes acts only on real directories it created: a symlink or a foreign
  entry planted in the root never gets a mount detached or a file removed through it.
- A warm sandbox handed to the next lease holds nothing of the last one: /dev/shm, /dev, /tmp, SysV
  shm / semaphores / message queues, POSIX message queues, processes, keys in the session, user,
  user-session and persistent keyrings. bwrap proves it with an in-place scrub, relaunches when the
  scrub finds anything it cannot empty, and never lets a command possess the host's session keyring.
- A task's repo_snapshot is read only from allowed bases; /root, /etc and links into them are refused
  with a one-line cause before anything there is opened, and a rollout records such a row as env_error.
- scrub_log bounds what is kept from a sandbox's output and removes keys and host paths.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from sandbox_helpers import LIMITS, processes_with, run

from arlctl.errors import UsageError
from arlctl.sandbox import make_sandbox
from arlctl.sandbox.rootdir import default_root
from arlctl.sandbox.scrub import KEY_PLACEHOLDER, PATH_PLACEHOLDER, scrub_log

NOBODY = 65534
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root (chown to another uid, tmpfs mounts)")


@pytest.fixture
def bwrap_kind() -> str:
    if shutil.which("bwrap") is None:
        pytest.skip("bwrap not installed (apt-get install bubblewrap)")
    return "bwrap"


@pytest.fixture
def public_dir():
    """A directory under the system tmp whose parents uid 65534 can pass (bwrap runs as it under root)."""
    path = Path(tempfile.gettempdir()) / f"arlctl-iso-{uuid.uuid4().hex[:8]}"
    yield path
    _unmount_under(path)
    shutil.rmtree(path, ignore_errors=True)


def _unmount_under(path: Path) -> None:
    with open("/proc/mounts") as f:
        points = [line.split()[1] for line in f if line.split()[1].startswith(str(path))]
    for point in sorted(points, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def _mount_tmpfs(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "arlctl-test", str(path)], check=True)


def _is_mount(path: Path) -> bool:
    with open("/proc/mounts") as f:
        return any(line.split()[1] == str(path) for line in f)


def _dead_owner() -> str:
    """An `owner` record of a process that has exited (its pid reaped just now)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return f"{child.pid} 12345"


# ---- the sandbox root ---------------------------------------------------------------------------


def _foreign(path: Path) -> None:
    path.mkdir(mode=0o755)
    os.chown(path, NOBODY, NOBODY)


def _world_writable(path: Path) -> None:
    path.mkdir()
    path.chmod(0o777)


def _world_writable_sticky(path: Path) -> None:
    path.mkdir()
    path.chmod(0o1777)


def _symlink_to_own_dir(path: Path) -> None:
    real = path.with_name("real-root")
    real.mkdir(mode=0o700)
    path.symlink_to(real)


def _regular_file(path: Path) -> None:
    path.write_text("not a directory\n")


def _parent_renamable(path: Path) -> None:
    path.parent.mkdir()
    path.parent.chmod(0o777)  # others can rename `path` away and put their own in its place


def _parent_foreign(path: Path) -> None:
    path.parent.mkdir()
    os.chown(path.parent, NOBODY, NOBODY)


def _parent_via_foreign_symlink(path: Path) -> None:
    # Another user's link on the way (re-pointable at will) to another user's directory.
    theirs = path.parent.with_name("theirs")
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    path.parent.symlink_to(theirs)
    os.lchown(path.parent, NOBODY, NOBODY)


ROOT_ATTACKS = [
    pytest.param(_foreign, "owned by uid 65534", id="owned-by-another-uid", marks=needs_root),
    pytest.param(_world_writable, "writable by other users", id="mode-0777"),
    pytest.param(_world_writable_sticky, "writable by other users", id="mode-1777"),
    pytest.param(_symlink_to_own_dir, "is a symlink", id="symlink"),
    pytest.param(_regular_file, "is not a directory", id="regular-file"),
    pytest.param(_parent_renamable, "writable by other users and not sticky", id="parent-0777"),
    pytest.param(_parent_foreign, "owned by uid 65534", id="parent-owned-by-another-uid", marks=needs_root),
    pytest.param(_parent_via_foreign_symlink, "owned by uid 65534", id="parent-foreign-symlink", marks=needs_root),
]


async def _start_and_close(kind: str, **options) -> None:
    """Create a sandbox (closing it again, should the attack have been accepted)."""
    sb = await make_sandbox(kind, None, **LIMITS, **options)
    await sb.close()


@pytest.mark.parametrize("plant, reason", ROOT_ATTACKS)
def test_an_unsafe_sandbox_root_is_refused(bwrap_kind, public_dir, monkeypatch, plant, reason):
    # Under a directory bwrap's uid can traverse, so only the root's own safety decides.
    public_dir.mkdir(mode=0o755)
    root = public_dir / "shared" / "arlctl-sandboxes" if "parent" in plant.__name__ else public_dir / "sbx"
    plant(root)
    before = sorted(os.listdir(root)) if root.is_dir() and not root.is_symlink() else None
    monkeypatch.setenv("ARLCTL_SANDBOX_ROOT", str(root))
    with pytest.raises(UsageError, match=reason) as refused:
        run(_start_and_close(bwrap_kind))
    assert str(root) in str(refused.value) and "\n" not in str(refused.value)
    assert "ARLCTL_SANDBOX_ROOT" in (refused.value.hint or "")
    if before is not None:
        assert sorted(os.listdir(root)) == before, "nothing may be written into a refused root"
    if plant is _symlink_to_own_dir:
        assert os.listdir(root.with_name("real-root")) == []


@needs_root
def test_the_default_root_is_per_user_and_refused_when_someone_else_made_it(bwrap_kind, public_dir, monkeypatch):
    public_dir.mkdir(mode=0o1777)  # a shared temporary directory
    public_dir.chmod(0o1777)
    monkeypatch.delenv("ARLCTL_SANDBOX_ROOT", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(public_dir))
    assert default_root() == str(public_dir / f"arlctl-sandboxes-{os.geteuid()}")
    _foreign(Path(default_root()))  # another user got there first
    with pytest.raises(UsageError, match="owned by uid 65534"):
        run(_start_and_close(bwrap_kind))
    assert os.listdir(default_root()) == []


def test_a_fresh_root_is_private_and_ours(bwrap_kind, public_dir):
    root = public_dir / "sandboxes"

    public_dir.mkdir(mode=0o755)
    run(_start_and_close(bwrap_kind, root_dir=str(root)))
    st = root.lstat()
    assert st.st_uid == os.geteuid()
    # bwrap runs as uid 65534 under root and must pass through: x for others, never r or w.
    assert st.st_mode & 0o777 == (0o711 if IS_ROOT else 0o700)


# ---- the stale-sandbox sweep ----------------------------------------------------------------------


def _entry(root: Path, owner: str, uid: int | None = None) -> Path:
    entry = root / uuid.uuid4().hex[:12]
    entry.mkdir(mode=0o711)
    (entry / "owner").write_text(owner)
    if uid is not None:
        os.chown(entry, uid, uid)
    return entry


@needs_root
def test_the_sweep_never_follows_a_planted_symlink_or_touches_foreign_entries(bwrap_kind, public_dir, tmp_path):
    """root's sweep used to read `owner` and run `umount -l` through whatever the root held: a symlink
    to another directory let anyone who could write the root detach an arbitrary mount."""
    root = public_dir / "sandboxes"
    public_dir.mkdir(mode=0o755)
    root.mkdir(mode=0o711)
    dead = _dead_owner()
    # 1. A symlink, named like a sandbox, to a directory that looks stale and holds a mount.
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "owner").write_text(dead)
    (victim / "data").write_text("keep me\n")
    _mount_tmpfs(victim / "fs")
    (victim / "fs" / "precious").write_text("keep me too\n")
    planted_link = root / uuid.uuid4().hex[:12]
    planted_link.symlink_to(victim)
    # 2. A real, stale-looking entry owned by another uid, with a mount inside.
    foreign = _entry(root, dead, uid=NOBODY)
    _mount_tmpfs(foreign / "fs")
    # 3. Our own stale entry whose `fs` is a symlink to a mount elsewhere.
    elsewhere = tmp_path / "elsewhere"
    _mount_tmpfs(elsewhere)
    (elsewhere / "precious").write_text("keep me\n")
    link_fs = _entry(root, dead)
    (link_fs / "fs").symlink_to(elsewhere)
    # 4. Our own entry whose `owner` is a symlink to a dead owner record elsewhere.
    link_owner = root / uuid.uuid4().hex[:12]
    link_owner.mkdir(mode=0o711)
    (link_owner / "owner").symlink_to(victim / "owner")
    _mount_tmpfs(link_owner / "fs")
    # 5. A genuine stale sandbox of ours (the control: it must still be swept).
    stale = _entry(root, dead)
    _mount_tmpfs(stale / "fs")

    try:
        run(_start_and_close(bwrap_kind, root_dir=str(root)))
        assert _is_mount(victim / "fs"), "the sweep detached a mount through a planted symlink"
        assert (victim / "fs" / "precious").read_text() == "keep me too\n"
        assert (victim / "data").read_text() == "keep me\n" and (victim / "owner").read_text() == dead
        assert planted_link.is_symlink()
        assert _is_mount(foreign / "fs") and (foreign / "owner").is_file(), "a foreign entry was touched"
        assert _is_mount(elsewhere) and (elsewhere / "precious").read_text() == "keep me\n"
        assert _is_mount(link_owner / "fs"), "an entry with a symlinked owner record was acted on"
        assert not link_fs.exists()  # ours and stale: removed, its link removed as a link
        assert not stale.exists() and not _is_mount(stale / "fs"), "the genuine stale sandbox was not swept"
    finally:
        _unmount_under(tmp_path)


# ---- nothing of one lease reaches the next ----------------------------------------------------------

_MQ = (
    "import ctypes, os, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "mq_open = getattr(libc, 'mq_open', None) or ctypes.CDLL('librt.so.1', use_errno=True).mq_open\n"
    "flags = os.O_RDWR | (os.O_CREAT if sys.argv[2] == 'create' else 0)\n"
    "print('mq', mq_open(sys.argv[1].encode(), flags, 0o600, None))\n"
)

# Keys via the raw syscalls (no keyutils in the sandbox): `add` puts one key in each keyring, `list`
# prints the descriptions of every key the session, user, user-session and persistent keyrings hold.
_KEYS = (
    "import ctypes, os, struct, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "NR = {'x86_64': (248, 250), 'aarch64': (217, 219)}[os.uname().machine]\n"
    "L = ctypes.c_long\n"
    "def kc(*a):\n"
    "    return libc.syscall(NR[1], *(L(x) if isinstance(x, int) else x for x in a))\n"
    "pers = kc(22, -1, -3)\n"
    "rings = {'session': -3, 'user': -4, 'user-session': -5, 'persistent': pers}\n"
    "if sys.argv[1] == 'add':\n"
    "    for name, ring in rings.items():\n"
    "        key = libc.syscall(NR[0], b'user', (sys.argv[2] + '-' + name).encode(), b'secret', 6, L(ring))\n"
    "        print(name, 'added' if key > 0 else f'refused errno {ctypes.get_errno()}')\n"
    "found = []\n"
    "for name, ring in rings.items():\n"
    "    buf = ctypes.create_string_buffer(4096)\n"
    "    n = kc(11, ring, buf, 4096)\n"
    "    for i in range(max(n, 0) // 4):\n"
    "        d = ctypes.create_string_buffer(512)\n"
    "        kc(6, struct.unpack_from('i', buf.raw, 4 * i)[0], d, 512)\n"
    "        found.append(d.value.decode().rsplit(';', 1)[-1])\n"
    "print('keys', sorted(k for k in found if not k.startswith(('_', '.'))))\n"
)

_FINDINGS = (
    "import json, os, sys\n"
    "marker = sys.argv[1] + '-' + sys.argv[2]\n"  # never whole on this command line
    "def cmdline(p):\n"
    "    try:\n"
    "        return open(f'/proc/{p}/cmdline', 'rb').read().decode(errors='replace')\n"
    "    except OSError:\n"
    "        return ''\n"
    "found = {\n"
    "    'dev_shm': sorted(os.listdir('/dev/shm')),\n"
    "    'dev': sorted(n for n in os.listdir('/dev') if 'leak' in n),\n"
    "    'tmp': sorted(os.listdir('/tmp')),\n"
    "    'sysv': {k: open(f'/proc/sysvipc/{k}').read().splitlines()[1:] for k in ('shm', 'sem', 'msg')},\n"
    "    'procs': [p for p in os.listdir('/proc') if p.isdigit() and marker in cmdline(p)],\n"
    "}\n"
    "print(json.dumps(found))\n"
)


def _first_lease_script(marker: str) -> str:
    return (
        f"echo leak > /dev/shm/leak-{marker}; echo leak > /dev/leak-{marker} 2>/dev/null; "
        f"echo leak > /tmp/leak-{marker}; "
        f"mkdir /tmp/locked-{marker} && echo secret > /tmp/locked-{marker}/f && chmod 000 /tmp/locked-{marker}; "
        "ipcmk -M 4096 && ipcmk -S 2 && ipcmk -Q && "
        f"(setsid python3 -c 'import time; time.sleep(300)' {marker} </dev/null >/dev/null 2>&1 &) ; "
        "ls /dev/shm; cat /proc/sysvipc/shm /proc/sysvipc/sem /proc/sysvipc/msg | grep -vc key"
    )


def test_nothing_of_one_lease_reaches_the_next(backend, pool_factory):
    """A warm sandbox goes from lease 1 to lease 2 (same sandbox, reset, never replaced): files in
    /dev/shm, /dev and /tmp (a locked directory too), SysV shm / semaphores / message queues, a POSIX
    message queue and a daemon started in lease 1 are all gone in lease 2."""
    part1, part2 = "LEASE", uuid.uuid4().hex[:10]
    marker, queue = f"{part1}-{part2}", f"/arlq{part2}"

    async def scenario():
        async with pool_factory(backend) as pool:
            async with pool.acquire() as sb:
                first_sandbox = sb
                planted = await sb.exec(["/bin/sh", "-c", _first_lease_script(marker)], timeout=30)
                queue_made = await sb.exec(["python3", "-c", _MQ, queue, "create"], timeout=30)
                keys_made = await sb.exec(["python3", "-c", _KEYS, "add", marker], timeout=30)
            await pool.drain()
            assert processes_with(marker) == [], "a lease-1 process is still running on the host"
            async with pool.acquire() as sb:
                assert sb is first_sandbox, "the pool must reuse (reset) the warm sandbox"
                found = await sb.exec(["python3", "-c", _FINDINGS, part1, part2], timeout=30)
                queue_after = await sb.exec(["python3", "-c", _MQ, queue, "open"], timeout=30)
                keys_after = await sb.exec(["python3", "-c", _KEYS, "list", marker], timeout=30)
            await pool.drain()
            assert pool.stats().replacements == 0
            if backend == "bwrap":  # the cheap path did it: scrubbed in place, not relaunched
                assert first_sandbox.resets == {"scrubbed": 2, "relaunched": 0}, first_sandbox.last_scrub_left
            return planted, queue_made, found, queue_after, keys_made, keys_after

    planted, queue_made, found, queue_after, keys_made, keys_after = run(scenario())
    # Lease 1 really planted everything (or the test would prove nothing).
    assert planted.exit_code == 0, planted
    assert f"leak-{marker}" in planted.stdout and planted.stdout.split()[-1] == "3", planted
    assert queue_made.stdout.startswith("mq ") and queue_made.stdout.strip() != "mq -1", queue_made
    assert found.exit_code == 0, found
    assert json.loads(found.stdout) == {
        "dev_shm": [], "dev": [], "tmp": [], "sysv": {"shm": [], "sem": [], "msg": []}, "procs": []
    }
    assert queue_after.stdout.strip() == "mq -1", "a POSIX message queue survived into the next lease"
    if backend == "bwrap":  # (docker's default seccomp profile refuses the key syscalls outright)
        assert keys_made.stdout.count(" added") == 4, keys_made
        assert f"'{marker}-user'" in keys_made.stdout.splitlines()[-1], keys_made  # listed while planted
    assert keys_after.stdout.strip().splitlines()[-1] == "keys []", keys_after


def test_a_scrub_that_cannot_prove_the_sandbox_clean_relaunches_it(bwrap_kind, pool_factory):
    """The bwrap scrub told to empty only the workspace finds /tmp writable and not emptied: the sandbox
    is relaunched (new namespaces) instead of reused, the cause is kept, and the next lease sees nothing."""
    async def scenario():
        async with pool_factory(bwrap_kind) as pool:
            async with pool.acquire() as sb:
                sb.scrub_dirs = [sb.workdir]  # an incomplete scrub, as a bug in it would be
                before = await sb.exec("echo $PPID; echo x > /dev/shm/left; ipcmk -M 4096 >/dev/null", timeout=10)
            await pool.drain()
            async with pool.acquire() as again:
                after = await again.exec("echo $PPID; ls -A /dev/shm /tmp; grep -vc key /proc/sysvipc/shm", timeout=10)
            await pool.drain()
            return sb, again, before, after

    sb, again, before, after = run(scenario())
    assert again is sb and sb.resets == {"scrubbed": 0, "relaunched": 2}  # after each of the two leases
    assert sb.last_scrub_left == ["writable mount /tmp"]
    # The exec server is pid 1 of a fresh pid namespace each time: the same number, a new namespace.
    assert after.stdout.split() == [before.stdout.split()[0], "/dev/shm:", "/tmp:", "0"], after


def test_fresh_namespaces_relaunches_at_every_reset(bwrap_kind, pool_factory):
    """`fresh_namespaces=True` trades the cheap scrub for new namespaces each lease: pid numbers start
    again (a scrubbed sandbox's carry on), and the relaunch count says which path ran."""
    script = "sleep 0 & wait; echo $!"  # the pid a new process gets

    async def leases(fresh: bool):
        async with pool_factory(bwrap_kind, fresh_namespaces=fresh) as pool:
            pids = []
            for _ in range(3):
                async with pool.acquire() as sb:
                    pids.append(int((await sb.exec(script, timeout=10)).stdout))
                await pool.drain()
            return sb.resets, pids

    fresh_resets, fresh_pids = run(leases(True))
    kept_resets, kept_pids = run(leases(False))
    assert fresh_resets == {"scrubbed": 0, "relaunched": 3} and len(set(fresh_pids)) == 1, fresh_pids
    assert kept_resets == {"scrubbed": 3, "relaunched": 0} and kept_pids == sorted(set(kept_pids)), kept_pids


_HOST_SESSION_KEY = """
import asyncio, ctypes, json, sys
libc = ctypes.CDLL(None, use_errno=True)
L = ctypes.c_long
assert libc.syscall(250, L(1), b"arlctl-test-login-session") > 0     # join a named session keyring
key = libc.syscall(248, b"user", b"host-login-secret", b"hunter2", 7, L(-3))
assert key > 0, ctypes.get_errno()
from arlctl.sandbox import make_sandbox

async def main():
    sb = await make_sandbox("bwrap", None, **json.loads(sys.argv[2]))
    try:
        return await sb.exec(["python3", "-c", sys.argv[1], "list", "x"], timeout=30)
    finally:
        await sb.close()

r = asyncio.run(main())
print(json.dumps({"stdout": r.stdout, "stderr": r.stderr, "exit": r.exit_code}))
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the probe uses x86_64 syscall numbers")
def test_commands_never_possess_the_host_session_keyring(bwrap_kind):
    """A host process in a login session (a session keyring holding a key) starts a sandbox: the command
    inside lists every keyring it possesses and finds none of the host's keys."""
    out = subprocess.run([sys.executable, "-c", _HOST_SESSION_KEY, _KEYS, json.dumps(LIMITS)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["exit"] == 0, result
    assert result["stdout"].strip().splitlines()[-1] == "keys []", result


def test_bwrap_dev_is_read_only_and_dev_shm_is_usable(bwrap_kind, pool_factory):
    async def scenario():
        async with pool_factory(bwrap_kind) as pool, pool.acquire() as sb:
            return await sb.exec(
                "echo x > /dev/planted; echo $?; echo y > /dev/shm/ok && cat /dev/shm/ok; "
                "echo z > /dev/null && echo null-ok", timeout=10)

    result = run(scenario())
    assert result.stdout.split() == ["2", "y", "null-ok"], result


def test_the_lease_reset_reports_what_it_cannot_prove_empty(bwrap_kind, pool_factory):
    """The docker backend's in-container reset, run here inside a bwrap sandbox: told to empty the
    workspace and /tmp it proves them clean; told only the workspace, it reports /tmp as a writable
    place it did not empty instead of calling the sandbox clean."""
    source = (Path(__file__).parents[2] / "arlctl" / "sandbox" / "_lease_reset.py").read_text()

    async def scenario():
        async with pool_factory(bwrap_kind) as pool, pool.acquire() as sb:
            await sb.exec("echo x > /tmp/left; echo y > /dev/shm/left; ipcmk -M 4096", timeout=10)
            partial = await sb.exec(["python3", "-I", "-S", "-c", source, "/workspace"], timeout=30)
            full = await sb.exec(["python3", "-I", "-S", "-c", source, "/workspace", "/tmp"], timeout=30)
            after = await sb.exec("ls -A /workspace /tmp /dev/shm; cat /proc/sysvipc/shm | grep -vc key", timeout=10)
            return partial, full, after

    partial, full, after = run(scenario())
    assert json.loads(partial.stdout.splitlines()[-1]) == {"clean": False, "left": ["writable mount /tmp"]}
    assert json.loads(full.stdout.splitlines()[-1]) == {"clean": True, "left": []}
    assert after.stdout.split() == ["/dev/shm:", "/tmp:", "/workspace:", "0"], after  # all empty


@pytest.mark.docker
def test_docker_refuses_an_image_whose_writable_volume_the_reset_cannot_cover(snapshot):
    """An image with a VOLUME the sandbox user can write (here /home/sandbox) would carry files from one
    lease to the next; the reset finds it and the sandbox is refused, naming the mount."""
    import io

    from arlctl.sandbox import SandboxError
    from arlctl.sandbox.docker import DEFAULT_IMAGE, docker_client

    try:
        client = docker_client(timeout=30)
        client.images.get(DEFAULT_IMAGE)
    except Exception as err:
        pytest.skip(f"no docker engine with {DEFAULT_IMAGE} ({err}); run .ci/docker_setup.sh")
    tag = f"arlctl-test/volume:{uuid.uuid4().hex[:8]}"
    dockerfile = f"FROM {DEFAULT_IMAGE}\nVOLUME /home/sandbox\n".encode()
    client.images.build(fileobj=io.BytesIO(dockerfile), tag=tag, network_mode="none", rm=True)
    try:
        with pytest.raises(SandboxError, match="writable mount /home/sandbox"):
            run(make_sandbox("docker", str(snapshot), image=tag, **LIMITS))
    finally:
        client.images.remove(tag, force=True)
        client.close()


# ---- repo_snapshot comes only from allowed bases ---------------------------------------------------


@pytest.fixture
def snapshot_home(tmp_path, monkeypatch):
    """A private ARLCTL_HOME (snapshot cache) and one user-listed base."""
    home, base = tmp_path / "home", tmp_path / "allowed"
    home.mkdir()
    base.mkdir()
    monkeypatch.setenv("ARLCTL_HOME", str(home))
    monkeypatch.setenv("ARLCTL_SNAPSHOT_BASES", str(base))
    return home, base


def _swe_task(ref: str, task_id: str = "hostile-1") -> dict:
    from arlctl.envs.swe.tasks import load_suite_task

    task = load_suite_task("stockroom-001")
    task.update(task_id=task_id, instance_id=task_id, repo_snapshot=ref)
    return task


def _secret_dir(where: Path, token: str) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "id_rsa").write_text(f"-----BEGIN OPENSSH PRIVATE KEY-----\n{token}\n")
    (where / "id_rsa").chmod(0o600)
    return where


def _hostile_refs(tmp_path: Path, base: Path, token: str) -> dict[str, str]:
    from arlctl.envs.swe.tasks import SUITE_DIR

    secret = _secret_dir(tmp_path / "not-a-base", token)
    (base / "to-etc").symlink_to("/etc")
    (base / "to-secret").symlink_to(secret)
    (base / "repo").mkdir()
    with tarfile.open(tmp_path / "secret.tar", "w") as archive:
        archive.add(secret, arcname="repo")
    (base / "tar-link.tar").symlink_to(tmp_path / "secret.tar")
    return {
        "root": "/root",
        "etc": "/etc",
        "etc-file": "/etc/passwd",
        "outside-dir": str(secret),
        "symlink-to-etc": str(base / "to-etc"),
        "symlink-to-secret": str(base / "to-secret"),
        "dotdot-escape": f"{base}/repo/../../not-a-base",
        "tarball-symlink": str(base / "tar-link.tar"),
        "builtin-traversal": "builtin:../../../../../../etc",
        "suite-task-folder": str(SUITE_DIR / "stockroom-001"),  # holds the gold patch and hidden tests
        "home-tilde": "~",
    }


def test_hostile_repo_snapshots_are_refused_before_anything_is_read(tmp_path, snapshot_home):
    from arlctl.envs.swe.tasks import SnapshotRefused, prepare_snapshot

    home, base = snapshot_home
    token = f"TOKEN{uuid.uuid4().hex}"
    refs = _hostile_refs(tmp_path, base, token)
    key = tmp_path / "not-a-base" / "id_rsa"
    os.utime(key, (0, time.time()))  # atime < mtime: any read moves atime (relatime)
    refused = {}
    for name, ref in refs.items():
        with pytest.raises(SnapshotRefused) as err:
            prepare_snapshot(_swe_task(ref))
        refused[name] = str(err.value)
    assert len(refused) == len(refs) == 11
    for name, message in refused.items():
        assert "\n" not in message and "hostile-1" in message, (name, message)
        assert token not in message
    assert os.stat(key).st_atime == 0, "the refused key file was read"
    assert not (home / "swe" / "snapshots").exists() or not any((home / "swe" / "snapshots").iterdir())


def test_allowed_bases_still_work_and_links_inside_are_never_read(tmp_path, snapshot_home):
    """A snapshot in a listed base builds; a link in it to a secret stays a link (its target is not
    read: not for the content hash, not for the copy), and a sandbox on it cannot read the secret."""
    from arlctl.envs.swe.tasks import SUITE_DIR, prepare_snapshot

    home, base = snapshot_home
    token = f"TOKEN{uuid.uuid4().hex}"
    secret = _secret_dir(tmp_path / "private", token) / "id_rsa"
    os.utime(secret, (0, time.time()))
    repo = base / "myrepo"
    shutil.copytree(SUITE_DIR / "stockroom-001" / "repo", repo)
    (repo / "key").symlink_to(secret)
    built = Path(prepare_snapshot(_swe_task(str(repo), "custom-1")))
    assert built.is_relative_to(home)
    assert (built / "key").is_symlink()
    assert os.stat(secret).st_atime == 0, "the snapshot builder read through a link to a secret"
    objects = subprocess.run(["git", "-C", str(built), "cat-file", "--batch-all-objects", "--batch"],
                             capture_output=True).stdout
    assert token.encode() not in objects
    assert Path(prepare_snapshot(_swe_task("builtin:stockroom-001"))).is_dir()
    assert Path(prepare_snapshot(_swe_task(str(SUITE_DIR / "stockroom-001" / "repo"), "in-suite"))).is_dir()


def test_a_rollout_records_a_hostile_snapshot_as_env_error(bwrap_kind, tmp_path, snapshot_home):
    """Through the real rollout stage and SweEnv: the row ends as env_error with the cause, the batch
    goes on, and no sandbox ever sees the directory."""
    pytest.importorskip("transformers")
    from arlctl.envs.swe.env import SweEnvFactory
    from arlctl.envs.swe.oracle import OraclePolicy
    from arlctl.stages.agent_loop import RolloutConfig, Stats
    from arlctl.stages.rollout import rollout

    home, base = snapshot_home
    token = f"TOKEN{uuid.uuid4().hex}"
    refs = _hostile_refs(tmp_path, base, token)
    saved = os.environ.pop("ARLCTL_HOME")  # the tokenizer lives in the shared model cache
    try:
        from arlctl.models import smollm2_tokenizer

        tokenizer = smollm2_tokenizer()
    except Exception as err:
        pytest.skip(f"SmolLM2 tokenizer unavailable: {err}")
    finally:
        os.environ["ARLCTL_HOME"] = saved
    tasks = [_swe_task(refs["root"], "to-root"), _swe_task(refs["symlink-to-etc"], "to-etc")]
    cfg = RolloutConfig(env="swe", group_size=1, concurrency=2, max_turns=2, max_new_tokens=64)
    rows: list = []
    stats = Stats()

    async def sink(group):
        rows.extend(group)

    async def go():
        envs = SweEnvFactory(sandboxes=1)
        try:
            await rollout(tasks, OraclePolicy(tokenizer), envs, cfg, sink, stats=stats)
        finally:
            await envs.aclose()

    run(go())
    assert sorted((r.task_id, r.status) for r in rows) == [("to-etc", "env_error"), ("to-root", "env_error")]
    assert "outside the allowed snapshot bases" in stats.last_error
    assert all(token not in json.dumps(dataclasses.asdict(r), default=str) for r in rows)


def test_the_reward_stage_scores_a_hostile_snapshot_null_with_its_cause(bwrap_kind, tmp_path, snapshot_home):
    """Through the real reward stage and swe grader: each row naming /root or a link into /etc gets a null
    reward with the refusal as its cause; the shard is still written (no crash, no stuck stage)."""
    from arlctl.envs.registry import get_reward
    from arlctl.io.shards import Lineage, read_shard, write_shard
    from arlctl.schemas.rows import TrajectoryRow, Turn, rows_to_table
    from arlctl.stages.reward import reward_dir

    home, base = snapshot_home
    refs = _hostile_refs(tmp_path, base, f"TOKEN{uuid.uuid4().hex}")

    def row(task_id: str, ref: str) -> TrajectoryRow:
        return TrajectoryRow(group_id=f"g-{task_id}", sample_index=0, task_id=task_id, env="swe",
                             env_version="swe-1", task=_swe_task(ref, task_id), policy="p", prompt_text="p",
                             prompt_ids=[1, 2], response_ids=[3, 4], response_mask=[1, 1],
                             response_logprobs=[-0.1, -0.2], turns=[Turn(0, 0, 2, 0, "done")], final_state="")

    rows = [row("to-root", refs["root"]), row("to-etc", refs["symlink-to-etc"])]
    write_shard(rows_to_table(rows), str(tmp_path / "rollouts" / "part-1.parquet"), Lineage(stage="rollout"))
    summary = reward_dir(str(tmp_path / "rollouts"), str(tmp_path / "rewarded"), get_reward("swe"))
    assert len(summary.written) == 1
    out = {r["task_id"]: r for r in read_shard(str(tmp_path / "rewarded" / "part-1.parquet")).to_pylist()}
    for task_id in ("to-root", "to-etc"):
        assert out[task_id]["reward"] is None, out[task_id]
        assert "outside the allowed snapshot bases" in out[task_id]["reward_info"], out[task_id]


# ---- scrub_log ------------------------------------------------------------------------------------

KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
    "QyNTUxOQAAACDxyzSECRETSECRETSECRETSECRETSECRETSECRETSECRETSECRETSEC==\n"
    "-----END OPENSSH PRIVATE KEY-----\n"
)


def test_scrub_keeps_workspace_paths_and_hides_every_other_path():
    log = (
        'File "/usr/lib/python3/dist-packages/_pytest/runner.py", line 3, in call\n'
        "/workspace/tests/test_calc.py:12: AssertionError\n"
        "rootdir: /workspace, configfile: /workspace/setup.cfg\n"
        "cat /root/.ssh/id_ed25519: read; also /workspace/../root/.aws/credentials and /workspace2/x\n"
        "HOME=/home/alice ~/.netrc //server/share https://example.org/x\n"
        "ratio 3/4 on 2024/01/02, a / b, ./rel/path and rel/path stay\n"
        "end of sentence /etc/shadow.\n"
    )
    out = scrub_log(log, "/workspace", limit=10_000)
    for leaked in ("/usr/lib", "/root", "/home/alice", ".netrc", "/workspace2", "/etc/shadow", "credentials",
                   "//server", "example.org/x"):
        assert leaked not in out, (leaked, out)
    assert "/workspace/tests/test_calc.py:12: AssertionError" in out
    assert "rootdir: /workspace, configfile: /workspace/setup.cfg" in out
    assert "ratio 3/4 on 2024/01/02, a / b, ./rel/path and rel/path stay" in out
    assert f'File "{PATH_PLACEHOLDER}", line 3' in out
    assert f"end of sentence {PATH_PLACEHOLDER}." in out


def test_scrub_workspace_is_exact_and_a_root_workspace_protects_nothing():
    assert scrub_log("/testbed/a.py /testbed", "/testbed/") == "/testbed/a.py /testbed"
    assert scrub_log("/testbedx/a.py", "/testbed") == PATH_PLACEHOLDER
    assert scrub_log("/etc/passwd", "/") == PATH_PLACEHOLDER


def test_scrub_removes_private_keys_whole_cut_short_or_headless():
    whole = scrub_log(f"before\n{KEY}after\n", "/workspace")
    assert whole == f"before\n{KEY_PLACEHOLDER}\nafter\n"
    unterminated = scrub_log("log\n" + KEY.split("-----END")[0], "/workspace")
    assert unterminated == f"log\n{KEY_PLACEHOLDER}"
    headless = scrub_log(KEY.split("\n", 1)[1] + "tail\n", "/workspace")  # the BEGIN line was cut away
    assert headless == f"{KEY_PLACEHOLDER}\ntail\n"
    for label in ("RSA PRIVATE KEY", "EC PRIVATE KEY", "ENCRYPTED PRIVATE KEY", "PGP PRIVATE KEY BLOCK"):
        block = f"-----BEGIN {label}-----\nSECRETBODY\n-----END {label}-----"
        assert scrub_log(f"a {block} b", "/workspace") == f"a {KEY_PLACEHOLDER} b"
    assert "SECRET" not in scrub_log(KEY * 3, "/workspace")


def test_scrub_bounds_to_the_limit_keeping_the_tail_with_a_marker():
    text = "".join(f"line {i}\n" for i in range(2000))  # 2000 lines; 'line 1999\n' is last
    out = scrub_log(text, "/workspace", limit=1500)
    assert len(out) <= 1500
    assert out.endswith("line 1999\n")
    head, _, kept = out.partition("\n")
    cut = int(head.split()[1])
    assert head == f"[... {cut} characters cut ...]"
    assert cut + len(kept) == len(text) and text.endswith(kept)  # exactly the cut count is missing
    assert scrub_log("short", "/workspace", limit=1500) == "short"
    assert scrub_log("x" * 100, "/workspace", limit=10) == "x" * 10  # no room for a marker: bare tail
    # A key cut by the bound is removed before cutting, so no fragment of it survives.
    bounded = scrub_log("x" * 5000 + KEY + "y" * 100, "/workspace", limit=200)
    assert "SECRET" not in bounded and "PRIVATE" not in bounded.replace(KEY_PLACEHOLDER, "")


def test_scrub_is_linear_on_hostile_input():
    """A megabyte of slashes or of BEGIN lines (what a model could print) scrubs in bounded time."""
    for text in ("/" * (1 << 20), "-----BEGIN RSA PRIVATE KEY-----" * 30_000, "/a" * (1 << 19)):
        worker = threading.Thread(target=scrub_log, args=(text, "/workspace"))
        worker.start()
        worker.join(60)
        assert not worker.is_alive()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
