"""The exec server that runs *inside* a sandbox, bwrap or docker (stdlib only; run as `python3 -I -S`).

It reads length-prefixed JSON requests on fd 0 and answers on fd 1, one at a time. For each command it
spawns the process, caps its captured output, enforces the wall timeout, and afterwards sends SIGKILL to
every other process in the sandbox's pid namespace (`kill(-1)` spares only itself and the namespace's
init), so nothing a command started, daemonised or not, outlives the command. It reaps orphans (it is
pid 1 in both backends) and marks itself non-dumpable, so sandboxed code running as the same uid
cannot ptrace it or read its file descriptors.

Requests: {"op": "exec", "argv": [...], "timeout": s, "stdin": b64|null, "max_output": n, "cwd": path}
          {"op": "ping"}, {"op": "scrub", "dirs": [...]} (between leases: _lease_reset.scrub plus the
          drift of the server's own state, whose verdict {"clean", "left"} is the reply), {"op": "verify"}
          (the drift alone, for docker, whose reset runs as a command). Exec replies are JSON with base64
          stdout/stderr.

Confinement (docs/security.md, "No lease outlives its lease"): the server is the sandbox's init (pid 1
of its pid namespace: bwrap --as-pid-1, docker's own pid 1), the only process there a lease did not
start. Before its first request it makes itself non-dumpable, puts every signal at its default or
ignored, and installs a seccomp filter that every command inherits. The kernel then refuses a lease any
ptrace, process_vm_readv/writev or /proc/1/mem access to it (non-dumpable, no CAP_SYS_PTRACE) and drops
every signal sent to it (the init of a namespace gets no default-action signal from inside it); the
filter keeps what the kernel allows between processes of one uid regardless (prlimit, setpriority,
ioprio_set, the scheduler, affinity and page-migration calls) to the calling process itself. Each
command is a session of its own, so "my process group" never includes the server. The server records
its own limits, priority, scheduling, oom_score_adj and the mode, owner and xattrs of every writable
mount root at start; the scrub (and the "verify" op) compares them with now and reports any drift.

It starts with the sandbox, runs every command of a trajectory, and in the bwrap backend serves lease
after lease (scrubbed in between), so start and exec are both kept short: no module that pulls in `re`
at start (json and base64 do; the JSON C accelerator and binascii are used instead, checked against
known output, with json as the fallback), and each command is one posix_spawn and one poll loop over its pipes and a pidfd, with no threads.
Descriptors: anything inherited at start beyond 0-2 is closed then; every descriptor the server opens
later is close-on-exec, and a command gets only its own stdin, stdout and stderr.
"""

import os
import select
import signal
import struct
import sys
import time
from binascii import a2b_base64, b2a_base64

_CHUNK = 1 << 16
_DEVNULL = -1  # opened in main()


_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219, "ppc64le": 130, "s390x": 280}
_PR_GET_DUMPABLE, _PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP = 3, 4, 38, 22

# The seccomp filter: per architecture (its AUDIT_ARCH value), the syscalls that let one process change
# another of the same uid without ptrace rights, each with the argument values that make it act on the
# caller only. Every other value of those calls fails with EPERM; every other syscall is allowed (the
# kernel's own checks stand). Offsets are into struct seccomp_data: args[i] is at 16 + 8 * i, low word
# first (both architectures are little-endian); an int argument (a pid, `which`, `who`) is its low word.
_A0, _A1, _A2L, _A2H = 16, 24, 32, 36
_SELF = [[(_A0, 0)]]  # the pid argument is 0: the calling process
_GUARDED = {
    "prlimit64": [[(_A0, 0)], [(_A2L, 0), (_A2H, 0)]],  # pid 0, or no new limit (a read)
    "setpriority": [[(_A0, 0), (_A1, 0)], [(_A0, 1), (_A1, 0)]],  # PRIO_PROCESS/PRIO_PGRP of the caller
    "ioprio_set": [[(_A0, 1), (_A1, 0)]],  # IOPRIO_WHO_PROCESS, who 0
    "sched_setparam": _SELF, "sched_setscheduler": _SELF, "sched_setaffinity": _SELF,
    "sched_setattr": _SELF, "migrate_pages": _SELF, "move_pages": _SELF,
}
_ARCHES = {
    "x86_64": (0xC000003E, {"prlimit64": 302, "setpriority": 141, "ioprio_set": 251, "sched_setparam": 142,
                            "sched_setscheduler": 144, "sched_setaffinity": 203, "sched_setattr": 314,
                            "migrate_pages": 256, "move_pages": 279}),
    "aarch64": (0xC00000B7, {"prlimit64": 261, "setpriority": 140, "ioprio_set": 30, "sched_setparam": 118,
                             "sched_setscheduler": 119, "sched_setaffinity": 122, "sched_setattr": 274,
                             "migrate_pages": 238, "move_pages": 239}),
}
_RLIMIT_NAMES = ("cpu", "fsize", "data", "stack", "core", "rss", "nproc", "nofile", "memlock", "as", "locks",
                 "sigpending", "msgqueue", "nice", "rtprio", "rttime")


def _filter_program(machine):
    """The classic-BPF seccomp program for `machine`, as (code, jt, jf, k) tuples. A foreign
    architecture (i386 calls from a 64-bit process) and the x32 range fail every syscall with EPERM."""
    audit_arch, numbers = _ARCHES[machine]
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    code = [(ld, 0, 0, 4), (jeq, 0, "deny", audit_arch), (ld, 0, 0, 0), (jge, "deny", 0, 0x40000000)]
    for rule, (name, alternatives) in enumerate(_GUARDED.items()):
        code.append((jeq, 0, f"rule{rule + 1}", numbers[name]))
        for alt, words in enumerate(alternatives):
            miss = f"alt{rule}.{alt + 1}"
            code += [insn for offset, value in words for insn in ((ld, 0, 0, offset), (jeq, 0, miss, value))]
            code += [(ret, 0, 0, allow), miss]
        code += [(ret, 0, 0, deny), f"rule{rule + 1}"]
    code += [(ret, 0, 0, allow), "deny", (ret, 0, 0, deny)]
    labels, program = {}, []
    for item in code:
        if isinstance(item, str):
            labels[item] = len(program)
        else:
            program.append(item)
    jump = lambda target, at: target if isinstance(target, int) else labels[target] - at - 1  # noqa: E731
    return [(op, jump(jt, i), jump(jf, i), k) for i, (op, jt, jf, k) in enumerate(program)]


def _confine():
    """Non-dumpable, on a session keyring of its own, and under the seccomp filter (module docstring);
    None when all of it holds, else why not (the server then refuses to serve). The keyring: commands
    inherit it, so they never possess the host's session keyring (a login session's keys)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        machine = os.uname().machine
        if machine not in _ARCHES:
            return f"no seccomp filter for the {machine} architecture"
        libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        if libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) != 0:
            return "could not make the exec server non-dumpable"
        number = _SYS_KEYCTL.get(machine)
        if number is not None:  # KEYCTL_JOIN_SESSION_KEYRING = 1, NULL name: a new anonymous keyring
            libc.syscall(number, ctypes.c_long(1), ctypes.c_void_p(None))

        class Insn(ctypes.Structure):
            _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                        ("k", ctypes.c_uint)]

        class Prog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]

        program = _filter_program(machine)
        insns = (Insn * len(program))(*(Insn(*insn) for insn in program))
        prog = Prog(len(program), insns)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return f"PR_SET_NO_NEW_PRIVS failed (errno {ctypes.get_errno()})"
        if libc.prctl(_PR_SET_SECCOMP, 2, ctypes.byref(prog), 0, 0) != 0:  # SECCOMP_MODE_FILTER
            return f"the seccomp filter was refused (errno {ctypes.get_errno()})"
        return None
    except Exception as e:
        return f"confinement failed: {type(e).__name__}: {e}"


def _writable_mount_roots():
    """Every mount point mounted read-write, as mountinfo lists it (octal escapes decoded)."""
    with open("/proc/self/mountinfo") as f:
        lines = f.read().splitlines()
    points = []
    for line in lines:
        fields = line.partition(" - ")[0].split()
        if len(fields) > 5 and "rw" in fields[5].split(","):
            points.append(fields[4].encode().decode("unicode_escape"))
    return sorted(set(points))


def _root_state(point):
    try:
        st = os.lstat(point)
        return [oct(st.st_mode), st.st_uid, st.st_gid, sorted(os.listxattr(point, follow_symlinks=False))]
    except OSError as e:
        return f"unreadable: {e.strerror}"


def _own_state():
    """What every command inherits from this server, and the writable mount roots (module docstring)."""
    import resource

    limits = []
    while True:
        try:
            limits.append(list(resource.getrlimit(len(limits))))
        except ValueError:  # past the last resource this kernel and build know
            break
    with open("/proc/self/oom_score_adj") as f:
        oom = f.read().strip()
    return {
        "rlimits": limits,
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "scheduler": [os.sched_getscheduler(0), os.sched_getparam(0).sched_priority],
        "affinity": sorted(os.sched_getaffinity(0)),
        "oom_score_adj": oom,
        "roots": {point: _root_state(point) for point in _writable_mount_roots()},
    }


_BASELINE = None  # _own_state() before the first request


def _drift():
    """Where the server's state differs from its start: a list of causes, [] when none."""
    if _BASELINE is None:
        return ["no baseline of the exec server's state"]
    try:
        now = _own_state()
    except Exception as e:
        return [f"exec server state unreadable: {type(e).__name__}: {e}"]
    left = []
    for key, before in _BASELINE.items():
        after = now[key]
        if key == "rlimits":
            for i, (was, got) in enumerate(zip(before, after)):
                if was != got:
                    name = _RLIMIT_NAMES[i] if i < len(_RLIMIT_NAMES) else str(i)
                    left.append(f"rlimit {name} of the exec server {was} -> {got}")
            if len(before) != len(after):
                left.append("rlimit count changed")
        elif key == "roots":
            for point in sorted(set(before) | set(after)):
                was, got = before.get(point, "absent"), after.get(point, "absent")
                if was != got:
                    left.append(f"mount root {point}: {_describe(was)} -> {_describe(got)}")
        elif before != after:
            left.append(f"{key} of the exec server {before} -> {after}")
    return left


def _describe(root):
    if isinstance(root, list):
        return f"mode {root[0]} owner {root[1]}:{root[2]} xattrs {root[3]}"
    return root


def _scrub(req):
    """Between leases: empty what the last lease could write and prove it (_lease_reset.py, bound
    beside this file). Runs in this process: no interpreter start per reset."""
    try:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        try:
            import _lease_reset
        finally:
            del sys.path[0]
        verdict = _lease_reset.scrub([str(d) for d in req.get("dirs") or []])
    except Exception as e:  # the host relaunches a sandbox it cannot prove clean (and is told why)
        verdict = {"clean": False, "left": [f"scrub failed: {type(e).__name__}: {e}"]}
    left = list(verdict.get("left") or []) + _drift()
    return {"clean": verdict.get("clean") is True and not left, "left": left[:20]}


def _json_codec():
    """(loads, dumps) as json's own, from the C accelerator json uses, without importing json."""
    sample = {"a": [1, -2.5, True, False, None, "\u00e9\n\"\\\x00"], "b": {}}
    text = '{"a": [1, -2.5, true, false, null, "\\u00e9\\n\\"\\\\\\u0000"], "b": {}}'
    try:
        import _json

        class Options:
            strict, object_hook, object_pairs_hook = True, None, None
            parse_float, parse_int = float, int
            parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__
            memo = {}

        scan = _json.make_scanner(Options)
        encode = _json.make_encoder(None, _unserializable, _json.encode_basestring_ascii, None, ": ", ", ",
                                    False, False, True)

        def loads(data):
            s = data.decode("utf-8").strip(" \t\n\r")
            try:
                obj, end = scan(s, 0)
            except StopIteration:
                raise ValueError("request is not JSON") from None
            if end != len(s):
                raise ValueError("extra data after the JSON request")
            return obj

        def dumps(obj):
            return "".join(encode(obj, 0)).encode()

        if dumps(sample) == text.encode() and loads(text.encode()) == sample:
            return loads, dumps
    except Exception:
        pass
    import json

    return json.loads, lambda obj: json.dumps(obj).encode()


def _unserializable(obj):
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def _read_exact(fd, n):
    # A bytearray grows in place: appending to bytes copied the whole frame per chunk, which made a 72 MB
    # snapshot (a django checkout) take 30 s to arrive in 64 KiB pipe reads.
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _close_inherited():
    """Close every descriptor above stderr that came with the process, and make sure 0-2 are open (a
    pipe created later must never land on one of them)."""
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        fds = range(3, 1024)
    for fd in fds:
        if fd > 2:
            try:
                os.close(fd)
            except OSError:
                pass
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.dup2(os.open(os.devnull, os.O_RDWR), fd)


def _kill_others():
    try:
        os.kill(-1, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap():
    """Collect exited orphans (this server is the pid namespace's init: they are reparented to it)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _spawn(argv, cwd, stdin_fd, out_fd, err_fd):
    """Start argv (searched on PATH) in cwd with the three descriptors as its 0, 1, 2."""
    home = os.getcwd() if cwd else None
    if cwd:
        os.chdir(cwd)  # a relative argv[0] resolves in cwd, as with subprocess's cwd=
    try:
        actions = [(os.POSIX_SPAWN_DUP2, stdin_fd, 0), (os.POSIX_SPAWN_DUP2, out_fd, 1),
                   (os.POSIX_SPAWN_DUP2, err_fd, 2)]
        # SIGPIPE and SIGXFSZ are ignored here (Python's start, and this server's own choice for SIGPIPE);
        # the command gets their defaults, as subprocess's restore_signals gives.
        # A session (and process group) of its own: "my group" never names the server.
        return os.posix_spawnp(argv[0], argv, os.environ, file_actions=actions,
                               setsigdef=(signal.SIGPIPE, signal.SIGXFSZ), setsid=True)
    except OSError as e:
        if e.filename is None:  # name the program, as subprocess does
            raise OSError(e.errno, e.strerror, argv[0]) from None
        raise
    finally:
        if home is not None:
            os.chdir(home)


def _pidfd(pid):
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _end(pid, timed_out):
    """The command's wait status; on a timeout it is killed first. Then everything else in the sandbox."""
    if timed_out:
        _kill_others()
    status = os.waitpid(pid, 0)[1]
    _kill_others()  # whatever the command left behind (daemons, background jobs) dies with it
    return status


def _collect(pid, out_r, err_r, stdin_w, stdin, limit, deadline):
    """Serve the command's pipes until it exits or the deadline passes, then read both pipes to their end
    (every writer is dead by then). A pidfd wakes the loop the moment the command exits; without one
    (an old kernel) it looks every 5 ms. Returns (wait status, timed_out, (kept, total) per stream)."""
    kept, size, total = {out_r: [], err_r: []}, {out_r: 0, err_r: 0}, {out_r: 0, err_r: 0}
    poller = select.poll()
    for fd in (out_r, err_r):
        poller.register(fd, select.POLLIN)
    fed = 0
    if stdin_w is not None:
        os.set_blocking(stdin_w, False)
        poller.register(stdin_w, select.POLLOUT)
    pidfd = _pidfd(pid)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    open_pipes, status, timed_out = 2, None, False
    try:
        while True:
            wait_ms = None
            if status is None:
                left = deadline - time.monotonic()
                if pidfd is None and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                    status = _end(pid, False)
                elif left <= 0:
                    timed_out = True
                    status = _end(pid, True)
                else:
                    wait_ms = min(left, 0.005 if pidfd is None else left) * 1000 + 1
            if status is not None:  # only the output pipes are served from here on
                for fd in (stdin_w, pidfd):
                    if fd is not None:
                        poller.unregister(fd)
                        os.close(fd)
                stdin_w = pidfd = None
                if not open_pipes:
                    break
            for fd, _events in poller.poll(wait_ms):
                if fd == pidfd:
                    status = _end(pid, False)
                    break  # the top of the loop stops serving stdin and the pidfd
                elif fd == stdin_w:
                    try:
                        fed += os.write(stdin_w, stdin[fed : fed + _CHUNK])
                    except BlockingIOError:
                        continue
                    except OSError:  # the command closed its stdin: the rest is not wanted
                        fed = len(stdin)
                    if fed >= len(stdin):
                        poller.unregister(stdin_w)
                        os.close(stdin_w)
                        stdin_w = None
                elif fd in kept:
                    chunk = os.read(fd, _CHUNK)
                    if not chunk:
                        poller.unregister(fd)
                        open_pipes -= 1
                        continue
                    total[fd] += len(chunk)
                    if size[fd] < limit:
                        kept[fd].append(chunk[: limit - size[fd]])
                        size[fd] += len(kept[fd][-1])
    finally:
        for fd in (stdin_w, pidfd):
            if fd is not None:
                os.close(fd)
    return status, timed_out, [(b"".join(kept[fd]), total[fd]) for fd in (out_r, err_r)]


def _exit_code(status):
    """subprocess's returncode: the exit status, or minus the signal that ended the process."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _b64(data):
    return b2a_base64(data, newline=False).decode("ascii")


def _run(req):
    started = time.monotonic()
    stdin = a2b_base64(req["stdin"]) if req.get("stdin") else None
    limit = int(req.get("max_output", 1 << 20))
    deadline = started + float(req.get("timeout", 30.0))
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    stdin_r, stdin_w = os.pipe() if stdin is not None else (None, None)
    try:
        try:
            argv = req["argv"]
            pid = _spawn(argv, req.get("cwd") or None, _DEVNULL if stdin_r is None else stdin_r, out_w, err_w)
        except (OSError, ValueError, TypeError, IndexError) as e:
            if stdin_w is not None:
                os.close(stdin_w)
            return {
                "exit": 127,
                "stdout": "",
                "stderr": _b64(str(e).encode()),
                "timed_out": False,
                "truncated": False,
                "duration": time.monotonic() - started,
            }
        finally:
            for fd in (out_w, err_w, stdin_r):  # the command holds its own copies
                if fd is not None:
                    os.close(fd)
        status, timed_out, ((out, out_total), (err, err_total)) = _collect(
            pid, out_r, err_r, stdin_w, stdin, limit, deadline
        )
    finally:
        os.close(out_r)
        os.close(err_r)
    _reap()
    return {
        "exit": 124 if timed_out else _exit_code(status),
        "stdout": _b64(out),
        "stderr": _b64(err),
        "timed_out": timed_out,
        "truncated": out_total > limit or err_total > limit,
        "duration": time.monotonic() - started,
    }


def main():
    global _DEVNULL, _BASELINE
    _close_inherited()
    # No handler anywhere: as the namespace's init, the server then never gets a signal from inside it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    refused = _confine()
    # A write to a pipe whose reader is gone fails with EPIPE instead of killing the server: a command
    # that exits without reading all its stdin must not take the server down. When the host itself is
    # gone (fd 1 broken), the server exits.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    _DEVNULL = os.open(os.devnull, os.O_RDONLY)
    loads, dumps = _json_codec()

    def send(obj):
        data = dumps(obj)
        _write_all(1, struct.pack(">I", len(data)) + data)

    try:
        if refused is None:
            try:
                _BASELINE = _own_state()
            except Exception as e:
                refused = f"could not record the exec server's state: {type(e).__name__}: {e}"
        if refused is not None:  # fail closed: a server that cannot confine its commands serves none
            send({"ready": False, "error": refused})
            return 1
        send({"ready": True, "pid": os.getpid()})
        while True:
            header = _read_exact(0, 4)
            if header is None:
                return 0
            body = _read_exact(0, struct.unpack(">I", header)[0])
            if body is None:
                return 0
            req = loads(body)
            _reap()
            if req.get("op") == "ping":
                send({"ok": True})
            elif req.get("op") == "exec":
                send(_run(req))
            elif req.get("op") == "scrub":
                send(_scrub(req))
            elif req.get("op") == "verify":
                left = _drift()
                send({"clean": not left, "left": left[:20]})
            else:
                send({"error": "unknown op"})
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
