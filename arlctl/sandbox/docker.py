"""The Docker sandbox backend: one long-running container per sandbox, driven through the docker SDK.

The container is created with network_mode=none, a read-only root filesystem, size-limited tmpfs mounts
for the workspace and /tmp (the disk limit), memory/pids/cpu limits, every capability dropped,
no-new-privileges, a private IPC namespace, no log driver, and a non-root user. Its pid 1 is the same
exec server the bwrap backend uses (`_sbxd.py`, passed with `python3 -c`), reached through the
container's attach socket. Each command is wrapped in `timeout -s KILL <N>` and run by the server, which
also enforces the wall time and then SIGKILLs every other process in the container (`kill(-1)` from
pid 1), so a daemonised grandchild never outlives its exec. Going through the attach socket instead of
`exec_run` costs one round trip on an open connection rather than a runc exec (~2 ms instead of
~100 ms). Files go in and out as exec stdin/stdout, because the archive API refuses read-only containers.

A container serves many leases, so every reset runs `_lease_reset.py` inside it first: it kills any
stray process, empties the workspace, /tmp, /dev/shm and /dev/mqueue, removes every SysV IPC object of
the container's private IPC namespace, and then proves all of that empty (and that no other mount is
writable). The exec server (pid 1) then compares its own limits, priority, scheduling and the mode, owner and
xattrs of every writable mount root with what it recorded at start (the "verify" op; the seccomp filter
it put on every command keeps a lease from changing the first ones, see _sbxd.py). A container that is
not provably clean is tainted and the pool recreates it; only then is the snapshot unpacked for the next
lease.

Limits hit: a fork bomb meets the pids limit and the per-exec cleanup then kills it, so the exit code
alone does not tell. After each command the backend reads the container's own cgroup counters, pids.events
`max` (forks refused) and the OOM-kill count, and a change taints the sandbox (`taint_reason` says which)
so the pool replaces it, as the bwrap backend does with its own cgroup. The counters are read on the
host's cgroup fs (v1 or v2, found through /proc/<container pid>/cgroup) when the engine is local; where
it is not (a remote or rootless engine) they are read inside the container after any command that
failed or wrote to stderr.

The image is configurable (`image`, `python`, `user`, `workdir`; SWE-bench instance images work when they
have python3); the default `arlctl/sandbox-base:1` is built by .ci/docker_setup.sh (Debian with python3,
python3-pytest and git). Engine: `docker_host`, else $DOCKER_HOST, else /run/arlctl-docker.sock when it
exists, else docker's default socket.

Several engines (`docker_hosts`, or $ARLCTL_DOCKER_HOSTS; see docker_engines.py): `create` places each
sandbox on an engine that already holds its image, the one with the most free capacity among them (an
engine without the image only when none of those has room), and, when that engine turns out unreachable,
ejects it and places the sandbox on another; a start that fails because the engine has no such image
(ImageNotOnEngine) corrects what placement knows of that engine and tries the next. When no engine can
start it, the error names the image and every engine tried with its cause (ImageUnavailable when each
lacked the image). `engine` and `placement()` say where a sandbox runs. When an engine
dies under a running sandbox (its exec channel breaks, or a command's reply never comes and the engine
no longer answers a ping), the command raises SandboxError naming the engine: an infrastructure
failure, never an exit code a grader could score. The swe env turns it into an env_error row, and
`rollout --top-up` resamples that member from scratch (on whichever engine is up): a trajectory is never
continued on another sandbox, since the model's earlier turns acted on the dead one.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import math
import os
import socket
import struct
import tarfile
import time
import uuid
from pathlib import Path

from arlctl.sandbox import docker_engines
from arlctl.sandbox._channel import ExecChannel, exec_request, raw_stdout, to_result
from arlctl.sandbox.base import ExecResult, SandboxError
from arlctl.sandbox.cgroups import SandboxCgroup, cgroup_mounts
from arlctl.sandbox.docker_engines import DockerEngines, shared_engines

log = logging.getLogger(__name__)

DEFAULT_IMAGE = "arlctl/sandbox-base:1"
PRIVATE_SOCKET = "/run/arlctl-docker.sock"
_SERVER_SRC = (Path(__file__).with_name("_sbxd.py")).read_text()
_RESET_SRC = (Path(__file__).with_name("_lease_reset.py")).read_text()
_START_TIMEOUT_S = 30.0
_BACKSTOP_S = 5.0
_API_TIMEOUT_S = 15.0  # engine API calls after start (inspect, kill, remove): a hung engine costs this


class ImageNotOnEngine(SandboxError):
    """The engine answered, but has no such image (nothing is pulled at sandbox start: `arlctl sandbox
    prefetch` does that before a run). Another engine may hold it."""

    def __init__(self, message: str, engine: str, image: str, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.engine, self.image = engine, image


class ImageUnavailable(SandboxError):
    """Every engine that could be tried lacks the image: the task cannot run until it is pulled or built.
    `tried` maps each engine tried to its cause."""

    def __init__(self, message: str, image: str, tried: dict[str, str], hint: str | None = None):
        super().__init__(message, hint=hint)
        self.image, self.tried = image, tried


def docker_client(docker_host: str | None = None, timeout: float = 60.0):
    """A docker SDK client for the configured engine; raises SandboxError when none answers."""
    try:
        import docker
    except ImportError as e:
        raise SandboxError("the docker SDK is not installed", hint="pip install 'arlctl[docker]'") from e
    url = default_url(docker_host)
    try:
        client = (
            docker.DockerClient(base_url=url, timeout=timeout) if url else docker.from_env(timeout=timeout)
        )
        client.ping()
    except Exception as e:
        raise SandboxError(
            f"no docker engine reachable at {url or 'the default socket'}: {e}",
            hint="run .ci/docker_setup.sh and export the DOCKER_HOST it prints",
        ) from e
    return client


def default_url(docker_host: str | None = None) -> str | None:
    """The engine a lone client talks to: `docker_host`, $DOCKER_HOST, the first of $ARLCTL_DOCKER_HOSTS,
    the private socket when it exists; None: docker's own default."""
    if docker_host or os.environ.get("DOCKER_HOST"):
        return docker_host or os.environ.get("DOCKER_HOST")
    configured = docker_engines.hosts_from()
    if configured:
        return configured[0][0]
    return f"unix://{PRIVATE_SOCKET}" if os.path.exists(PRIVATE_SOCKET) else None


def host_cgroup(pid: int) -> SandboxCgroup | None:
    """The cgroup directories (pids and memory; v1 or v2) of host process `pid` on this host's cgroup fs,
    or None when they are not visible from here (no such pid, another cgroup namespace, no mount)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            entries = [line.rstrip("\n").split(":", 2) for line in f if line.count(":") >= 2]
        mounts = cgroup_mounts()
    except OSError:
        return None

    def on_host(path: str, fstype: str, controller: str) -> str | None:
        for mount, root, kind, opts in mounts:
            if kind != fstype or (controller and controller not in opts):
                continue
            rel = (
                path
                if root == "/"
                else (path[len(root) :] if path.startswith(root.rstrip("/") + "/") else None)
            )
            if rel is not None and os.path.isdir(found := os.path.join(mount, rel.lstrip("/"))):
                return found
        return None

    v1 = {c: p for _hid, controllers, p in entries for c in controllers.split(",") if c}
    dirs = [d for c in ("pids", "memory") if c in v1 and (d := on_host(v1[c], "cgroup", c))]
    if dirs:
        return SandboxCgroup(dirs=dirs, version="v1")
    unified = next((p for _hid, controllers, p in entries if not controllers), None)
    if unified is not None and (d := on_host(unified, "cgroup2", "")):
        return SandboxCgroup(dirs=[d], version="v2")
    return None


# Inside the container, its own cgroup is mounted read-only at /sys/fs/cgroup (v1: one dir per controller).
# Shell builtins only: right after a fork bomb there may be no pid to spare for sed or cat.
_COUNTERS_INSIDE = (
    "for f in /sys/fs/cgroup/pids/pids.events /sys/fs/cgroup/pids.events; do [ -r $f ] && "
    "while read k v; do [ $k = max ] && echo pids $v; done < $f && break; done; "
    "for f in /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events; do [ -r $f ] && "
    "while read k v; do [ $k = oom_kill ] && echo oom $v; done < $f && break; done; echo ok"
)


def _reset_report(reply: dict) -> dict:
    """The JSON verdict `_lease_reset.py` prints last; {} when it printed none (it crashed)."""
    lines = raw_stdout(reply).decode(errors="replace").strip().splitlines()
    try:
        report = json.loads(lines[-1]) if lines else {}
    except ValueError:
        return {}
    return report if isinstance(report, dict) else {}


def _tar_of(directory: str | None, uid: int, gid: int) -> bytes:
    def owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid, info.gid, info.uname, info.gname = uid, gid, "", ""
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if directory:
            for child in sorted(Path(directory).iterdir()):
                tar.add(child, arcname=child.name, filter=owned)
    return buf.getvalue()


def _image_not_found(e: Exception) -> bool:
    try:
        from docker.errors import ImageNotFound
    except ImportError:
        return False
    return isinstance(e, ImageNotFound)


def _start_failure(image: str, tried: dict[str, SandboxError], none_left: SandboxError) -> SandboxError:
    """The error of a sandbox no engine could start: the image, each engine tried and why, and why no
    other engine was tried (none_left: at its limit, ejected). ImageUnavailable when every engine tried
    lacked the image, so the caller can tell a task that cannot run from an outage."""
    causes = {
        host: "image not on the engine" if isinstance(e, ImageNotOnEngine) else str(e)
        for host, e in tried.items()
    }
    reasons = getattr(none_left, "reasons", {})
    others = [f"{host}: {why}" for host, why in reasons.items() if host not in tried]
    message = (
        f"docker sandbox from image {image} could not start on any engine; tried "
        + "; ".join(f"{host}: {cause}" for host, cause in causes.items())
        + (f"; not tried: {'; '.join(others)}" if others else "")
    )
    if all(isinstance(e, ImageNotOnEngine) for e in tried.values()):
        return ImageUnavailable(
            message,
            image,
            causes,
            hint=f"no engine tried holds {image}: pull or build it (arlctl sandbox prefetch --tasks FILE "
            "lists the images each engine lacks)",
        )
    last = list(tried.values())[-1]
    return SandboxError(message, hint=last.hint)


class _Demux:
    """Reads the stdout stream out of docker's multiplexed attach protocol (8-byte frame headers)."""

    def __init__(self, reader: asyncio.StreamReader):
        self.reader, self.buf = reader, bytearray()

    async def readexactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            header = await self.reader.readexactly(8)
            payload = await self.reader.readexactly(struct.unpack(">I", header[4:])[0])
            if header[0] == 1:  # stdout; the server's stderr (a traceback at worst) is dropped
                self.buf += payload
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out


class DockerSandbox:
    """Build with `await DockerSandbox.create(snapshot, ...)`."""

    kind = "docker"

    def __init__(
        self,
        snapshot: str | None = None,
        *,
        image: str = DEFAULT_IMAGE,
        memory_mb: int = 1024,
        pids: int = 256,
        cpus: float = 1.0,
        disk_mb: int = 512,
        user: str = "1000:1000",
        workdir: str = "/workspace",
        python: str = "python3",
        env: dict[str, str] | None = None,
        docker_host: str | None = None,
        max_output_bytes: int = 1 << 20,
    ):
        self.snapshot, self.image, self.user, self.workdir, self.python = (
            snapshot,
            image,
            user,
            workdir,
            python,
        )
        self.memory_mb, self.pids_max, self.cpus, self.disk_mb = memory_mb, pids, cpus, disk_mb
        self.env = {"HOME": "/tmp", "LANG": "C.UTF-8", "PATH": "/usr/local/bin:/usr/bin:/bin", **(env or {})}
        self.docker_host, self.max_output_bytes = docker_host, max_output_bytes
        self.engine = default_url(docker_host) or "default"  # where it runs (placement, error messages)
        self.engines: DockerEngines | None = None  # set by create() when placed over several engines
        self._reserved = False  # holds a slot of self.engine in self.engines (released by close())
        self.tainted = False
        self.taint_reason: str | None = None  # why it was tainted: timeout, unresponsive, oom, pids_limit
        self.limits_hit = (0, 0)  # (OOM kills, forks refused by the pids limit) seen so far
        self.cgroup: SandboxCgroup | None = None  # the container's cgroup on the host fs, when visible
        self.container = None
        self._client = None
        self._sock: socket.socket | None = None
        self._chan: ExecChannel | None = None
        self._snapshot_tar = b""
        self._lock = asyncio.Lock()
        self._closed = False

    @classmethod
    async def create(
        cls,
        snapshot: str | None = None,
        *,
        docker_hosts: str | list[str] | None = None,
        engine_limit: int | None = None,
        engines: DockerEngines | None = None,
        **kwargs,
    ) -> DockerSandbox:
        """Start a sandbox; over several engines (`engines`, `docker_hosts` or $ARLCTL_DOCKER_HOSTS, unless
        one `docker_host` is given) on one that holds its image, by free capacity, skipping any found dead
        or without the image; when none can start it, the error names the image and each engine tried."""
        if engines is None and (docker_hosts or not kwargs.get("docker_host")):
            hosts = docker_engines.hosts_from(docker_hosts, engine_limit)
            engines = shared_engines(hosts) if hosts else None
        if engines is None:
            sb = cls(snapshot, **kwargs)
            try:
                await sb.start()
            except BaseException:
                await sb.close()
                raise
            return sb
        image = kwargs.get("image") or DEFAULT_IMAGE
        holding = await engines.holders(image)
        tried: dict[str, SandboxError] = {}  # engine -> why the start there failed, in order
        while True:
            try:
                host = engines.placement.reserve(exclude=tried, holding=holding)
            except SandboxError as none_left:
                if not tried:
                    raise
                raise _start_failure(image, tried, none_left) from list(tried.values())[-1]
            sb = cls(snapshot, **{**kwargs, "docker_host": host})
            sb.engines, sb._reserved = engines, True
            try:
                await sb.start()
            except BaseException as e:
                await sb.close()
                if not isinstance(e, SandboxError):
                    raise
                if isinstance(e, ImageNotOnEngine):
                    engines.note_image(host, image, False)  # placement knew otherwise, or took a chance
                    engines.placement.image_placed(host, local=False)
                if await engines.check(host) is None:  # else it is ejected (and that is logged)
                    # It answers: this start failed (say, the image is not on that engine).
                    engines.placement.confirm(host)
                    log.warning("docker sandbox could not start on %s (%s); trying another engine", host, e)
                tried[host] = e
                continue
            engines.placement.confirm(host)
            # Nothing is pulled at start: a container that was created means the image was there.
            engines.placement.image_placed(host, local=True)
            engines.note_image(host, image, True)
            return sb

    def placement(self) -> dict[str, str]:
        """Where this sandbox runs: the engine (docker host URL), the container (short id and name) and
        its image. The container fields are empty before the container exists."""
        container = self.container
        return {
            "sandbox": self.kind,
            "engine": self.engine,
            "container": container.id[:12] if container is not None else "",
            "name": (container.name or "") if container is not None else "",
            "image": self.image,
        }

    async def start(self) -> None:
        fd = await asyncio.to_thread(self._create_and_attach)
        reader, writer = await asyncio.open_connection(sock=socket.socket(fileno=fd))
        self._chan = ExecChannel(_Demux(reader), writer)
        await asyncio.to_thread(self.container.start)
        try:
            hello = await asyncio.wait_for(self._chan.recv(), _START_TIMEOUT_S)
        except (TimeoutError, SandboxError) as e:
            logs = await asyncio.to_thread(self._state)
            raise SandboxError(f"docker sandbox failed to start: {logs or e}") from e
        if not hello.get("ready"):
            raise SandboxError(f"docker sandbox failed to start: {hello}")
        self.cgroup = await asyncio.to_thread(self._find_cgroup)
        self._client.api.timeout = _API_TIMEOUT_S
        await self._restore()

    def _create_and_attach(self) -> int:
        """Create the container and attach to its stdio *before* starting it, so no output is lost."""
        self._client = docker_client(self.docker_host)
        uid, _, gid = self.user.partition(":")
        self._snapshot_tar = _tar_of(self.snapshot, int(uid), int(gid or uid))
        tmpfs_opts = f"size={self.disk_mb}m,uid={uid},gid={gid or uid},exec"
        try:
            self.container = self._client.containers.create(
                self.image,
                [self.python, "-I", "-S", "-c", _SERVER_SRC],
                name=f"arlctl-sbx-{uuid.uuid4().hex[:12]}",
                labels={"arlctl.sandbox": "1"},
                user=self.user,
                working_dir=self.workdir,
                environment=self.env,
                stdin_open=True,
                tty=False,
                log_config={"Type": "none", "Config": {}},
                network_mode="none",
                read_only=True,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                mem_limit=self.memory_mb << 20,
                memswap_limit=self.memory_mb << 20,
                pids_limit=self.pids_max,
                nano_cpus=int(self.cpus * 1e9),
                ipc_mode="private",
                tmpfs={self.workdir: f"{tmpfs_opts},mode=0755", "/tmp": f"{tmpfs_opts},mode=1777"},
            )
            attached = self._client.api.attach_socket(
                self.container.id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
        except Exception as e:
            if _image_not_found(e):
                raise ImageNotOnEngine(
                    f"docker image {self.image} is not on engine {self.engine}",
                    self.engine,
                    self.image,
                    hint="pull or build it there first (arlctl sandbox prefetch --tasks FILE pulls every "
                    "task's image)",
                ) from e
            raise SandboxError(
                f"could not create a container from {self.image}: {e}",
                hint="build the image with .ci/docker_setup.sh or pass --image",
            ) from e
        if self._closed:  # closed (a cancelled start) while this thread was creating: close() saw nothing
            self._remove_quietly()
            raise SandboxError("docker sandbox closed while starting")
        raw = getattr(attached, "_sock", attached)
        fd = os.dup(raw.fileno())  # our own handle: the SDK may close its objects when collected
        self._attached = attached
        return fd

    def _state(self) -> str:
        try:
            self.container.reload()
            return f"container {self.container.status}: {self.container.attrs['State'].get('Error', '')}"
        except Exception:
            return ""

    def _find_cgroup(self) -> SandboxCgroup | None:
        try:
            self.container.reload()
            pid = int(self.container.attrs["State"]["Pid"])
        except Exception:
            return None
        group = host_cgroup(pid) if pid > 0 else None
        if group is None:
            log.debug(
                "docker sandbox %s: cgroup not visible on this host; limits read inside", self.container.id
            )
        return group

    async def _limit_counters(self, suspect: bool) -> tuple[int, int] | None:
        """(OOM kills, pids-limit hits) of the container so far, or None where they cannot be read now."""
        if self.cgroup is not None:
            return self.cgroup.oom_kills(), self.cgroup.pids_limit_hits()
        if not suspect:  # reading inside costs an exec: only after a failure or output on stderr
            return None
        for attempt in range(5):  # the bomb's last processes may still hold every pid for a moment
            try:
                reply = await self._call(["/bin/sh", "-c", _COUNTERS_INSIDE], 10, None, 1 << 12)
            except (TimeoutError, SandboxError):
                return None
            lines = raw_stdout(reply).decode().splitlines()
            if lines[-1:] == ["ok"]:
                counters = dict(line.split() for line in lines if line.count(" ") == 1)
                return int(counters.get("oom", 0)), int(counters.get("pids", 0))
            await asyncio.sleep(0.05 * (attempt + 1))
        return None

    def _taint(self, reason: str) -> None:
        if not self.tainted:
            self.tainted, self.taint_reason = True, reason

    def _kill_container(self) -> None:
        try:
            self.container.kill()
        except Exception:
            pass

    async def _call(self, argv: list[str], timeout: float, stdin: bytes | None, max_output: int) -> dict:
        if self._closed or self._chan is None:
            raise SandboxError("sandbox is not running")
        # `timeout -s KILL` is the second line of defence; the server kills at `timeout` itself.
        wrapped = ["timeout", "-s", "KILL", str(math.ceil(timeout) + 1), *argv]
        request = exec_request(wrapped, timeout, stdin, self.workdir, max_output)
        try:
            return await self._chan.call(request, timeout + _BACKSTOP_S)
        except (TimeoutError, SandboxError) as e:
            # The exec server hung or died: a fork bomb that starved it shows in the counters, if they
            # are still there (when pid 1 dies the container's cgroup goes with it) ...
            if self.cgroup is not None and self.cgroup.pids_limit_hits() > self.limits_hit[1]:
                self._taint("pids_limit")
            # ... or the engine under it went away: infrastructure, never a result to grade.
            if not self.tainted and (why := await self._engine_down()) is not None:
                self._taint("engine_unreachable")
                raise SandboxError(
                    f"docker engine {self.engine} is unreachable: {why}",
                    hint="the pool places new sandboxes on the other engines",
                ) from e
            self._taint("unresponsive")
            await asyncio.to_thread(self._kill_container)
            raise

    async def _engine_down(self) -> str | None:
        """None while this sandbox's engine answers a ping, else why not (ejecting it from the placement)."""
        if self.engines is not None:
            return await self.engines.check(self.engine)
        try:
            await asyncio.wait_for(asyncio.to_thread(self._client.ping), 5.0)
            return None
        except Exception as e:
            return f"{type(e).__name__}: {e}"

    # ---- the Sandbox protocol --------------------------------------------------------------------

    async def exec(
        self, cmd: str | list[str], timeout: float = 30.0, stdin: bytes | None = None
    ) -> ExecResult:
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        async with self._lock:  # one at a time: the cleanup after each command kills everything else
            started = time.monotonic()
            try:
                reply = await self._call(argv, timeout, stdin, self.max_output_bytes)
            except TimeoutError:
                return ExecResult(
                    124,
                    "",
                    "sandbox unresponsive; killed",
                    timed_out=True,
                    duration_s=time.monotonic() - started,
                )
            # A command that hit the memory or pids limit spoils the sandbox: the pool replaces it.
            # (A refused fork always says so on stderr, even when the command's own exit code is 0.)
            suspect = reply.get("exit") != 0 or bool(reply.get("timed_out") or reply.get("stderr"))
            counters = await self._limit_counters(suspect)
        if counters is not None and any(now > before for now, before in zip(counters, self.limits_hit)):
            oom = counters[0] > self.limits_hit[0]
            self.limits_hit = counters
            self._taint("oom" if oom else "pids_limit")
            log.warning(
                "docker sandbox %s hit its %s limit; it will be replaced",
                self.container.short_id,
                "memory" if oom else f"process ({self.pids_max} pids)",
            )
        if reply.get("timed_out"):
            self._taint("timeout")
        elif reply.get("exit") in (137, -9):
            self._taint("killed")  # SIGKILLed: the OOM killer, most likely; do not reuse
        return to_result(reply, started, self.max_output_bytes)

    async def put_file(self, path: str, data: bytes) -> None:
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        result = await self.exec(["/bin/sh", "-c", script, "put", path], timeout=60, stdin=data)
        if result.exit_code != 0:
            raise SandboxError(f"put_file {path} failed: {result.stderr.strip()}")

    async def get_file(self, path: str) -> bytes:
        async with self._lock:
            reply = await self._call(["cat", "--", path], 60, None, 64 << 20)
        if reply["exit"] != 0:
            err = to_result(reply, time.monotonic(), 0).stderr
            if "No such file" in err:
                raise FileNotFoundError(path)
            raise SandboxError(f"get_file {path} failed: {err.strip()}")
        return raw_stdout(reply)

    async def health(self, timeout: float = 2.0) -> bool:
        if self._closed or self.tainted or self._chan is None:
            return False
        if self.engines is not None and not self.engines.placement.is_up(self.engine):
            return False  # its engine was found dead: replace it without waiting on a ping
        async with self._lock:
            return await self._chan.ping(timeout)

    async def _restore(self) -> None:
        """Wipe everything a lease could leave (proving it gone), then unpack the snapshot."""
        argv = [self.python, "-I", "-S", "-c", _RESET_SRC, self.workdir, "/tmp"]
        reply = await self._call(argv, 120, None, 1 << 16)
        report = _reset_report(reply)
        # And the exec server itself (limits, priority, mount roots as at start), asked even when the
        # reset already failed, so the cause names the drift too.
        server = await self._verify_server()
        if not (report.get("clean") is True and server.get("clean") is True):
            self._taint("reset_unclean")
            causes = [str(x) for x in (report.get("left") or []) + (server.get("left") or [])]
            if not report:  # the reset printed no verdict: its stderr says why
                causes.insert(0, to_result(reply, 0, 0).stderr.strip()[-300:] or "the reset gave no verdict")
            raise SandboxError(f"docker sandbox is not provably clean between leases: {', '.join(causes)}")
        reply = await self._call(
            ["tar", "-x", "-f", "-", "-C", self.workdir], 120, self._snapshot_tar, 1 << 16
        )
        if reply["exit"] != 0:
            raise SandboxError(f"could not restore the workspace: {to_result(reply, 0, 0).stderr.strip()}")

    async def _verify_server(self) -> dict:
        """The exec server's own verdict on what a lease could have changed in it (_sbxd.py _drift)."""
        try:
            return await self._chan.call({"op": "verify"}, 10 + _BACKSTOP_S)
        except (TimeoutError, SandboxError) as e:
            return {"clean": False, "left": [f"exec server gave no verdict: {e}"]}

    async def set_snapshot(self, snapshot: str | None) -> None:
        """Serve another task: make `snapshot` the pristine state and reset the workspace to it."""
        uid, _, gid = self.user.partition(":")
        self._snapshot_tar = await asyncio.to_thread(_tar_of, snapshot, int(uid), int(gid or uid))
        self.snapshot = snapshot
        await self.reset()

    async def reset(self) -> None:
        async with self._lock:
            if self._closed or self.container is None:
                raise SandboxError("sandbox is closed")
            await self._restore()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._reserved and self.engines is not None:
            self._reserved = False
            self.engines.placement.release(self.engine)
        if self._chan is not None:
            self._chan.writer.close()
        if self.container is not None:
            await asyncio.to_thread(self._remove_quietly)
        if self._client is not None:
            self._client.close()

    def _remove_quietly(self) -> None:
        try:
            self.container.remove(force=True, v=True)  # and its anonymous volumes (an image's VOLUME)
        except Exception:
            pass
