"""The bubblewrap sandbox backend (the default on Linux; DESIGN.md §7).

One sandbox is one long-lived `bwrap` process holding fresh user, pid, mount, network, ipc, uts and
cgroup namespaces, with every capability dropped, an empty environment, and the host system (/usr and a
few named /etc files) and /proc read-only (so no lease can set the namespace's IPC limits in /proc/sys). Inside it runs a tiny exec server (`_sbxd.py`, stdlib only) that spawns
each command; after every command it SIGKILLs everything else in the pid namespace, so a daemonised
grandchild never outlives its exec. Keeping bwrap alive between execs is what makes an exec cost a
fork rather than a namespace setup (~1 ms instead of ~30 ms).

Between leases nothing a lease wrote is kept. reset() empties the workspace and /tmp on the host side,
then asks the exec server to scrub in place (_lease_reset.py, in the server's own process): every
process but the server killed, /dev/shm and /dev/mqueue emptied, every SysV IPC object removed, the
session, user, user-session and persistent keyrings cleared, and all of it checked again along with
any other writable mount. Only a clean verdict keeps the sandbox; anything left, a taint (timeout, OOM,
crash) or `fresh_namespaces=True` relaunches bwrap instead, which gives the next lease new user, IPC,
pid and mount namespaces. Finally the workspace is copied back from pristine/. The scrub's round trip
takes about 1.3 ms and the whole reset 3–4 ms, where a relaunch costs ~50 ms; what it keeps across leases
is the namespaces themselves, so pid numbers carry on from the last lease's rather than starting at 1.

Host layout of one sandbox (under $ARLCTL_SANDBOX_ROOT, default <tmp>/arlctl-sandboxes-<uid>/<id>/; the
root must be ours and private, see rootdir.py):
  pristine/   the snapshot copied once and chowned to the sandbox uid; reset() copies it back
  fs/         a size-limited tmpfs (the disk limit) holding workspace/ (bound at /workspace) and tmp/
              (bound at /tmp); both survive across execs until reset()
  etc/, bin/, sbxd.py   generated passwd/group, python symlinks, the exec server

When the host process is root, bwrap itself runs as an unprivileged host uid (`host_uid`, default
65534) and maps it to uid 1000 inside, so even a kernel-level escape lands as nobody. Memory and pids
limits come from a child cgroup the launcher shell joins before exec'ing bwrap (v1 or v2, see
cgroups.py); without one, per-process rlimits are used and a warning is printed.

Python inside: `python` (default /usr/bin/python3, the distribution interpreter; install the
`python3-pytest` apt package so `python3 -m pytest` works). A different interpreter, e.g. a venv, needs
its installation directories passed in `ro_binds`; they are bound read-only at the same paths. /root,
/work, ~/.cache and the host environment are never visible.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import socket
import stat
import subprocess
import time
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path

from arlctl.sandbox import _files
from arlctl.sandbox._channel import ExecChannel, exec_request, raw_stdout, to_result
from arlctl.sandbox.base import ExecResult, SandboxError
from arlctl.sandbox.cgroups import SandboxCgroup
from arlctl.sandbox.rootdir import default_root, ensure_root, sweep_stale

SANDBOX_UID = 1000  # the uid commands see inside
_ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "nsswitch.conf")
_SERVER_SRC = Path(__file__).with_name("_sbxd.py")
_SCRUB_SRC = Path(__file__).with_name("_lease_reset.py")  # imported by the server for the in-place reset
_START_TIMEOUT_S = 15.0
_BACKSTOP_S = 5.0  # the host kills the whole sandbox this long after the server should have answered


def bwrap_available() -> bool:
    return shutil.which("bwrap") is not None


@functools.cache
def _bwrap_help_has(option: str) -> bool:
    """Whether this bubblewrap knows `option` (--disable-userns and --size came in 0.8 and 0.7)."""
    r = subprocess.run(["bwrap", "--help"], capture_output=True, text=True)
    return option in r.stdout + r.stderr


class BwrapSandbox:
    """A bubblewrap sandbox. Build with `await BwrapSandbox.create(snapshot, ...)`."""

    kind = "bwrap"

    def __init__(
        self,
        snapshot: str | None = None,
        *,
        memory_mb: int = 1024,
        pids: int = 256,
        disk_mb: int = 512,
        python: str = "/usr/bin/python3",
        ro_binds: Sequence[str] = (),
        env: dict[str, str] | None = None,
        host_uid: int = 65534,
        root_dir: str | None = None,
        max_output_bytes: int = 1 << 20,
        workdir: str = "/workspace",
        fresh_namespaces: bool = False,
    ):
        self.snapshot = snapshot
        self.memory_mb, self.pids_max, self.disk_mb = memory_mb, pids, disk_mb
        self.python, self.ro_binds, self.env = python, list(ro_binds), dict(env or {})
        self.max_output_bytes = max_output_bytes
        self.workdir = workdir
        self.fresh_namespaces = fresh_namespaces  # relaunch at every reset instead of scrubbing in place
        self.scrub_dirs = [workdir, "/tmp"]  # what the in-place scrub empties besides /dev/shm, /dev/mqueue
        self.resets = {"scrubbed": 0, "relaunched": 0}
        self.last_scrub_left: list[str] = []  # what the last refused scrub found (it then relaunched)
        self.privileged = os.geteuid() == 0
        self.host_uid = host_uid if self.privileged else os.geteuid()
        self.id = uuid.uuid4().hex[:12]
        self.root = Path(root_dir or default_root()) / self.id
        self.tainted = False  # set after a timeout, OOM kill or crash: the pool replaces, never reuses
        self.taint_reason: str | None = None  # no finer cause than `tainted` here: the pool counts that
        self.disk_limited = False
        self.cgroup: SandboxCgroup | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._chan: ExecChannel | None = None
        self._stderr_task: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self._limits_hit = (0, 0)
        self._closed = False
        self._dirty = False  # something ran inside since the last reset: reset() scrubs or relaunches

    @classmethod
    async def create(cls, snapshot: str | None = None, **kwargs) -> BwrapSandbox:
        sb = cls(snapshot, **kwargs)
        try:
            await sb.start()
        except BaseException:
            await sb.close()
            raise
        return sb

    def placement(self) -> dict[str, str]:
        """Where this sandbox runs: this host (bwrap sandboxes are local processes) and its own id."""
        return {"sandbox": self.kind, "host": socket.gethostname(), "id": self.id}

    # ---- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        if not bwrap_available():
            raise SandboxError("bwrap not found", hint="apt-get install bubblewrap")
        await asyncio.to_thread(self._prepare_host_dirs)
        await self._load_pristine()
        await self._copy_pristine()
        self.cgroup = SandboxCgroup.create(f"sbx-{self.id}", self.memory_mb << 20, self.pids_max)
        await self._launch()

    async def _load_pristine(self) -> None:
        """Copy the snapshot to pristine/, owned by the sandbox uid, once; resets copy from there."""
        pristine = self.root / "pristine"
        await asyncio.to_thread(_clear_dir, pristine)
        if self.snapshot:
            await _run_host(["cp", "-a", "--", f"{self.snapshot}/.", str(pristine)])
            if self.privileged:
                await _run_host(["chown", "-R", "-h", f"{self.host_uid}:{self.host_uid}", str(pristine)])

    async def _copy_pristine(self) -> None:
        """Copy pristine/'s entries into the workspace. Its entries, not pristine/. itself: that would
        give the workspace root the snapshot's mode and xattrs, and the root must stay as the exec server
        recorded it at start (the scrub checks it)."""
        entries = sorted(str(p) for p in (self.root / "pristine").iterdir()) if self.snapshot else []
        if entries:
            await _run_host(["cp", "-a", "--", *entries, f"{self._ws}/"])

    async def set_snapshot(self, snapshot: str | None) -> None:
        """Serve another task: make `snapshot` the pristine state and reset the workspace to it."""
        async with self._lock:
            self.snapshot = snapshot
            await self._load_pristine()
        await self.reset()

    def _prepare_host_dirs(self) -> None:
        self.root = Path(ensure_root(str(self.root.parent), traversable=self.privileged)) / self.id
        if self.privileged:  # bwrap runs as host_uid and must reach the workspace to bind it
            for ancestor in self.root.parents:
                if not os.stat(ancestor).st_mode & 0o001:
                    raise SandboxError(
                        f"{ancestor} is not searchable by uid {self.host_uid}, which bwrap runs as",
                        hint="choose a sandbox root whose parents are o+x ($ARLCTL_SANDBOX_ROOT)",
                    )
        _sweep_stale_once(str(self.root.parent))
        self.root.mkdir(mode=0o711)
        (self.root / "owner").write_text(_process_identity())
        (self.root / "fs").mkdir(mode=0o711)
        (self.root / "pristine").mkdir(mode=0o700)
        if self.privileged:
            opts = f"size={self.disk_mb}m,mode=0711,nosuid,nodev"
            r = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", opts, "arlctl-sandbox", str(self.root / "fs")],
                capture_output=True,
                text=True,
            )
            self.disk_limited = r.returncode == 0
        if not self.disk_limited:
            warnings.warn(
                f"bwrap sandbox: could not mount a size-limited tmpfs ({self.disk_mb} MiB) for the "
                "workspace; disk use inside the sandbox is not limited",
                RuntimeWarning,
                stacklevel=2,
            )
        self._make_mount_dirs()
        (self.root / "etc").mkdir()
        (self.root / "etc" / "passwd").write_text(
            f"root:x:0:0:root:/nonexistent:/usr/sbin/nologin\nsandbox:x:{SANDBOX_UID}:{SANDBOX_UID}::/tmp:/bin/sh\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        )
        (self.root / "etc" / "group").write_text(f"root:x:0:\nsandbox:x:{SANDBOX_UID}:\nnogroup:x:65534:\n")
        (self.root / "bin").mkdir()
        for name in ("python", "python3"):
            os.symlink(self.python, self.root / "bin" / name)
        shutil.copyfile(_SERVER_SRC, self.root / "sbxd.py")
        shutil.copyfile(_SCRUB_SRC, self.root / "_lease_reset.py")
        for p in (
            self.root / "etc",
            self.root / "bin",
            self.root / "sbxd.py",
            self.root / "_lease_reset.py",
            *(self.root / "etc").iterdir(),
        ):
            p.chmod(0o755 if p.is_dir() else 0o644)

    @property
    def _ws(self) -> Path:
        return self.root / "fs" / "workspace"

    @property
    def _tmp(self) -> Path:
        return self.root / "fs" / "tmp"

    def _bwrap_argv(self) -> list[str]:
        # Every namespace (no network), no capabilities, no inherited environment, killed with its parent.
        argv = ["bwrap", "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session"]
        if _bwrap_help_has("--as-pid-1"):  # the exec server is the namespace's init: no bwrap reaper there
            argv.append("--as-pid-1")
        argv += ["--cap-drop", "ALL"]
        argv += ["--clearenv", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox"]
        argv += ["--ro-bind", "/usr", "/usr"]
        if _bwrap_help_has("--disable-userns"):  # no nested user namespaces from inside
            argv.append("--disable-userns")
        for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            src = f"/{top}"
            if os.path.islink(src):
                argv += ["--symlink", os.readlink(src), src]
            elif os.path.isdir(src):
                argv += ["--ro-bind", src, src]
        for name in _ETC_FILES:
            argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        for etc_py in sorted(Path("/etc").glob("python3*")):
            argv += ["--ro-bind", str(etc_py), str(etc_py)]
        for path in self.ro_binds:
            argv += ["--ro-bind", path, path]
        root = self.root
        argv += ["--ro-bind", str(root / "etc" / "passwd"), "/etc/passwd"]
        argv += ["--ro-bind", str(root / "etc" / "group"), "/etc/group"]
        argv += ["--ro-bind", str(root / "bin"), "/opt/arlctl/bin"]
        argv += ["--ro-bind", str(root / "sbxd.py"), "/opt/arlctl/sbxd.py"]
        argv += ["--ro-bind", str(root / "_lease_reset.py"), "/opt/arlctl/_lease_reset.py"]
        # A private /dev, read-only but for a fresh /dev/shm tmpfs (as big as the disk limit) and the IPC
        # namespace's POSIX message queues mounted at /dev/mqueue, so the reset can list and empty both.
        argv += ["--proc", "/proc", "--dev", "/dev"]
        if _bwrap_help_has("--size"):
            argv += ["--size", str(self.disk_mb << 20)]
        argv += ["--tmpfs", "/dev/shm"]
        if _bwrap_help_has("--mqueue"):
            argv += ["--mqueue", "/dev/mqueue"]
        argv += ["--remount-ro", "/dev"]
        # /proc read-only: the sandbox uid is the root uid of bwrap's outer user namespace, which owns the
        # IPC namespace, so /proc/sys/kernel/{shm*,msg*,sem} and /proc/sys/fs/mqueue/* (limits every later
        # lease would inherit) would otherwise be writable from inside; bwrap covers /proc/sys only when
        # the directory itself is writable, which it never is.
        argv += ["--remount-ro", "/proc"]
        argv += ["--bind", str(self._ws), self.workdir, "--bind", str(self._tmp), "/tmp"]
        argv += ["--remount-ro", "/", "--chdir", self.workdir]
        env = {
            "PATH": "/opt/arlctl/bin:/usr/local/bin:/usr/bin:/bin",
            "HOME": "/tmp",
            "LANG": "C.UTF-8",
            "USER": "sandbox",
            **self.env,
        }
        for key, value in env.items():
            argv += ["--setenv", key, value]
        return argv + ["--", self.python, "-I", "-S", "/opt/arlctl/sbxd.py"]

    def _launcher_argv(self) -> list[str]:
        # The shell joins the cgroup *before* exec'ing bwrap, so no sandboxed process is ever outside it.
        script = "set -e; ulimit -c 0; "
        if self.cgroup:
            script += "".join(f'echo $$ > "{f}"; ' for f in self.cgroup.procs_files)
        else:
            script += (
                f"ulimit -v {self.memory_mb * 1024} 2>/dev/null || true; ulimit -u {self.pids_max} || true; "
            )
        script += 'exec "$@"'
        prefix = []
        if self.privileged:
            prefix = [
                "setpriv",
                f"--reuid={self.host_uid}",
                f"--regid={self.host_uid}",
                "--clear-groups",
                "--no-new-privs",
                "--",
            ]
        return ["/bin/sh", "-c", script, "arlctl-sandbox", *prefix, *self._bwrap_argv()]

    async def _launch(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            *self._launcher_argv(),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            start_new_session=True,
        )
        self._chan = ExecChannel(self._proc.stdout, self._proc.stdin)
        self._dirty = False
        try:
            hello = await asyncio.wait_for(self._chan.recv(), _START_TIMEOUT_S)
        except (TimeoutError, SandboxError) as e:
            err = b""
            if self._proc.stderr:
                try:
                    self._proc.kill()
                except ProcessLookupError:  # bwrap already exited: its stderr says why
                    pass
                err = await self._proc.stderr.read(4000)
            raise SandboxError(
                f"bwrap sandbox failed to start: {err.decode(errors='replace').strip() or e}"
            ) from e
        if not hello.get("ready"):
            raise SandboxError(f"bwrap sandbox failed to start: {hello}")
        # Nothing is read from stderr afterwards; drain it so the server can never block on a full pipe.
        self._stderr_task = asyncio.get_running_loop().create_task(_discard(self._proc.stderr))

    def _kill_everything(self) -> None:
        """Kill the sandbox outright: the bwrap process, and every process in its cgroup."""
        if self._proc and self._proc.returncode is None:
            try:
                self._proc.kill()
            except ProcessLookupError:
                pass
        if self.cgroup:
            self.cgroup.kill_all()

    # ---- the Sandbox protocol --------------------------------------------------------------------

    async def exec(
        self, cmd: str | list[str], timeout: float = 30.0, stdin: bytes | None = None
    ) -> ExecResult:
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        request = exec_request(argv, timeout, stdin, self.workdir, self.max_output_bytes)
        async with self._lock:  # one command at a time: the cleanup after each kills everything else
            if self._closed or self._proc is None or self._proc.returncode is not None:
                self.tainted = True
                raise SandboxError("sandbox is not running")
            self._dirty = True
            started = time.monotonic()
            try:
                reply = await self._chan.call(request, timeout + _BACKSTOP_S)
            except TimeoutError:
                self.tainted = True
                self._kill_everything()
                return ExecResult(
                    124,
                    "",
                    "sandbox unresponsive; killed",
                    timed_out=True,
                    duration_s=time.monotonic() - started,
                )
            except SandboxError:
                self.tainted = True
                self._kill_everything()
                raise
        if self.cgroup:
            # A command that hit the memory or pids limit spoils the sandbox: the pool replaces it.
            limits_hit = (self.cgroup.oom_kills(), self.cgroup.pids_limit_hits())
            if limits_hit != self._limits_hit:
                self._limits_hit = limits_hit
                self.tainted = True
        if reply.get("timed_out"):
            self.tainted = True
        return to_result(reply, started, self.max_output_bytes)

    def _mounts(self) -> dict[str, str]:
        return {self.workdir: str(self._ws), "/tmp": str(self._tmp)}

    async def put_file(self, path: str, data: bytes) -> None:
        # Fast path: write straight into the host side of the workspace, never following a link.
        try:
            host, parts = _files.map_path(path, self._mounts(), self.workdir)
            owner = (self.host_uid, self.host_uid) if self.privileged else None
            return await asyncio.to_thread(_files.write_beneath, host, parts, data, owner)
        except _files.HostPathRefused:
            pass
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        reply = await self._call_inside(["/bin/sh", "-c", script, "put", path], data, 1 << 16)
        if reply["exit"] != 0:
            raise SandboxError(f"put_file {path} failed: {to_result(reply, 0, 0).stderr.strip()}")

    async def get_file(self, path: str) -> bytes:
        try:
            host, parts = _files.map_path(path, self._mounts(), self.workdir)
            return await asyncio.to_thread(_files.read_beneath, host, parts)
        except _files.HostPathRefused:
            pass
        reply = await self._call_inside(["cat", "--", path], None, 64 << 20)
        if reply["exit"] != 0:
            err = to_result(reply, 0, 0).stderr
            if "No such file" in err:
                raise FileNotFoundError(path)
            raise SandboxError(f"get_file {path} failed: {err.strip()}")
        return raw_stdout(reply)

    async def _call_inside(self, argv: list[str], stdin: bytes | None, max_output: int) -> dict:
        """Run a helper command inside the sandbox (links then resolve in the sandbox's own view)."""
        async with self._lock:
            if self._closed or self._chan is None or self._proc is None or self._proc.returncode is not None:
                raise SandboxError("sandbox is not running")
            self._dirty = True
            try:
                return await self._chan.call(
                    exec_request(argv, 60, stdin, self.workdir, max_output), 60 + _BACKSTOP_S
                )
            except (TimeoutError, SandboxError) as e:
                self.tainted = True
                self._kill_everything()
                raise SandboxError(f"sandbox failed during file transfer: {e}") from e

    async def health(self, timeout: float = 2.0) -> bool:
        """Cheap liveness: the exec server answers a ping and the workspace is still there."""
        if self._closed or self.tainted or self._proc is None or self._proc.returncode is not None:
            return False
        async with self._lock:
            if not await self._chan.ping(timeout):
                self.tainted = True
                return False
        return self._ws.is_dir()

    async def reset(self) -> None:
        async with self._lock:
            if self._closed:
                raise SandboxError("sandbox is closed")
            alive = self._proc is not None and self._proc.returncode is None
            # Without /dev/mqueue (a bwrap too old for --mqueue) the scrub cannot see POSIX queues, and
            # without --as-pid-1 bwrap's own reaper (pid 1, dumpable) is in reach of every lease.
            fresh = self.fresh_namespaces or not (_bwrap_help_has("--mqueue") and _bwrap_help_has("--as-pid-1"))
            relaunch = self.tainted or not alive or (self._dirty and fresh)
            if relaunch:  # the old namespaces die with the old bwrap, together with anything they held
                await self._stop()
            if not relaunch:
                try:
                    await asyncio.to_thread(self._clear_host_dirs)
                except OSError as e:  # a root the lease locked (chmod 000), when we are not root
                    self.last_scrub_left = [f"host side not emptied: {e}"]
                    relaunch = True
                    await self._stop()
            if self._dirty and not relaunch and not await self._scrub():
                relaunch = True
                await self._stop()
            if relaunch:  # from new directories: a mode, owner or xattr on the old ones stays with them
                await asyncio.to_thread(self._renew_host_dirs)
                await self._launch()
                self.tainted = False
                self.resets["relaunched"] += 1
            await self._copy_pristine()
            self._dirty = False

    async def _scrub(self) -> bool:
        """The in-place reset (module docstring): True when the server proved the sandbox clean."""
        assert self._chan is not None
        try:
            verdict = await self._chan.call({"op": "scrub", "dirs": self.scrub_dirs}, 10 + _BACKSTOP_S)
        except (TimeoutError, SandboxError) as e:
            verdict = {"clean": False, "left": [f"no answer: {e}"]}
        if verdict.get("clean") is True:
            self.resets["scrubbed"] += 1
            return True
        self.last_scrub_left = [str(x) for x in verdict.get("left") or ["no verdict"]]
        return False

    async def _stop(self) -> None:
        self._kill_everything()
        await self._wait_proc()

    def _clear_host_dirs(self) -> None:
        _clear_dir(self._ws)
        _clear_dir(self._tmp)

    def _make_mount_dirs(self) -> None:
        """The workspace and /tmp as bwrap binds them: new, 0755, the sandbox uid's, no xattr."""
        for d in (self._ws, self._tmp):
            d.mkdir(mode=0o755)
            d.chmod(0o755)  # whatever the umask
            if self.privileged:
                os.chown(d, self.host_uid, self.host_uid)

    def _renew_host_dirs(self) -> None:
        """For a relaunch (bwrap stopped): replace the two directories rather than empty them."""
        for d in (self._ws, self._tmp):
            _unlock_tree(d)
            shutil.rmtree(d)
        self._make_mount_dirs()

    async def _wait_proc(self) -> None:
        if self._proc is not None:
            try:
                await asyncio.wait_for(self._proc.wait(), 5)
            except TimeoutError:
                pass

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._kill_everything()
        await self._wait_proc()
        if self.cgroup:
            await asyncio.to_thread(self.cgroup.destroy)
        await asyncio.to_thread(self._remove_host_dirs)

    def _remove_host_dirs(self) -> None:
        if self.disk_limited:
            subprocess.run(["umount", "-l", str(self.root / "fs")], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


def _process_identity(pid: int | None = None) -> str:
    """'pid starttime': survives pid reuse, unlike a bare pid."""
    pid = pid or os.getpid()
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f"{pid} {f.read().rsplit(')', 1)[1].split()[19]}"
    except (OSError, IndexError):
        return ""


_swept: set[str] = set()


def _owner_alive(owner: str) -> bool:
    """True while the process an `owner` record names still runs (or the record is half written)."""
    pid = owner.split()[0] if owner.split() else ""
    return not pid.isdigit() or _process_identity(int(pid)) == owner


def _sweep_stale_once(parent: str) -> None:
    """Remove sandboxes whose owning process died without close() (killed test runs, OOM, SIGKILL):
    their tmpfs stays mounted and their directory stays behind otherwise. Once per process and root;
    rootdir.sweep_stale touches only entries we created and never follows a symlink."""
    if parent in _swept:
        return
    _swept.add(parent)
    sweep_stale(parent, _owner_alive)


def _unlock_tree(path: Path) -> None:
    """Make `path` and every directory under it searchable and writable by its owner, so a tree a
    lease locked (chmod 000) can be removed. Only real directories: never through a link (the lease's
    processes are all dead by then, so nothing can swap one in)."""
    os.chmod(path, 0o700)  # first: a locked top cannot be listed
    for top, dirs, _names in os.walk(path):
        for d in (os.path.join(top, name) for name in dirs):
            try:
                if stat.S_ISDIR(os.lstat(d).st_mode):
                    os.chmod(d, 0o700)
            except OSError:
                pass


def _clear_dir(path: Path) -> None:
    """Remove everything inside `path` (not path itself: it is bind-mounted into the sandbox)."""
    with os.scandir(path) as it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)  # rmtree never follows symlinks out of the tree
            else:
                os.unlink(entry.path)


async def _run_host(argv: list[str]) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise SandboxError(f"{argv[0]} failed: {err.decode(errors='replace').strip()}")


async def _discard(stream: asyncio.StreamReader | None) -> None:
    if stream is None:
        return
    while await stream.read(65536):
        pass
