"""The exec server that runs *inside* a sandbox, bwrap or docker (stdlib only; run as `python3 -I -S`).

It reads length-prefixed JSON requests on fd 0 and answers on fd 1, one at a time. For each command it
spawns the process, caps its captured output, enforces the wall timeout, and afterwards sends SIGKILL to
every other process in the sandbox's pid namespace (`kill(-1)` spares only itself and the namespace's
init), so nothing a command started, daemonised or not, outlives the command. It reaps orphans (it is
pid 1 in the docker backend) and marks itself non-dumpable, so sandboxed code running as the same uid
cannot ptrace it or read its file descriptors.

Requests: {"op": "exec", "argv": [...], "timeout": s, "stdin": b64|null, "max_output": n, "cwd": path}
          {"op": "ping"}. Replies are JSON with base64 stdout/stderr.
"""

import base64
import json
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time


def _no_dump():
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception:
        pass


def _read_exact(fd, n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _send(obj):
    data = json.dumps(obj).encode()
    os.write(1, struct.pack(">I", len(data)) + data)


def _drain(stream, limit, out):
    """Keep the first `limit` bytes, read and drop the rest so the writer never blocks."""
    kept = []
    size = 0
    total = 0
    while True:
        chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
        if not chunk:
            break
        total += len(chunk)
        if size < limit:
            kept.append(chunk[: limit - size])
            size += len(kept[-1])
    out.append((b"".join(kept), total > limit))


def _feed(stream, data):
    try:
        if data:
            stream.write(data)
    except OSError:
        pass
    finally:
        try:
            stream.close()
        except OSError:
            pass


def _kill_others():
    try:
        os.kill(-1, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap():
    """Collect exited orphans; needed where this server is pid 1 (the docker backend)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _wait_exit(pid, timeout):
    """True when pid exited within timeout. Popen.wait(timeout) polls with growing sleeps, which adds
    up to half a command's run time to its latency; a pidfd wakes us the moment the process exits."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
            time.sleep(0.001)
        return False
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def _run(req):
    started = time.monotonic()
    stdin = base64.b64decode(req["stdin"]) if req.get("stdin") else None
    limit = int(req.get("max_output", 1 << 20))
    try:
        proc = subprocess.Popen(
            req["argv"],
            cwd=req.get("cwd") or None,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            close_fds=True,
        )
    except OSError as e:
        return {
            "exit": 127,
            "stdout": "",
            "stderr": base64.b64encode(str(e).encode()).decode(),
            "timed_out": False,
            "truncated": False,
            "duration": time.monotonic() - started,
        }
    outs, errs = [], []
    threads = [
        threading.Thread(target=_drain, args=(proc.stdout, limit, outs), daemon=True),
        threading.Thread(target=_drain, args=(proc.stderr, limit, errs), daemon=True),
    ]
    if stdin is not None:
        threads.append(threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True))
    for t in threads:
        t.start()
    timed_out = not _wait_exit(proc.pid, float(req.get("timeout", 30.0)))
    if timed_out:
        _kill_others()
    code = proc.wait()
    # Whatever the command left behind (daemons, background jobs) dies with it.
    _kill_others()
    for t in threads:
        t.join()
    _reap()
    (out, out_trunc), (err, err_trunc) = outs[0], errs[0]
    return {
        "exit": 124 if timed_out else code,
        "stdout": base64.b64encode(out).decode(),
        "stderr": base64.b64encode(err).decode(),
        "timed_out": timed_out,
        "truncated": out_trunc or err_trunc,
        "duration": time.monotonic() - started,
    }


def main():
    _no_dump()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    _send({"ready": True, "pid": os.getpid()})
    while True:
        header = _read_exact(0, 4)
        if header is None:
            return 0
        body = _read_exact(0, struct.unpack(">I", header)[0])
        if body is None:
            return 0
        req = json.loads(body)
        _reap()
        if req.get("op") == "ping":
            _send({"ok": True})
        elif req.get("op") == "exec":
            _send(_run(req))
        else:
            _send({"error": "unknown op"})


if __name__ == "__main__":
    sys.exit(main())
