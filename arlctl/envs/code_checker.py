"""The checker of the code grader: runs a HumanEval problem's tests, in its own process, against the model's
function running in another process, and signs the verdict.

Executed first in a fresh sandbox as `python3 -I -S -c <this source>` with a JSON bundle on stdin (the
problem's prompt and tests, the model's program, the candidate runner's source, a per-run HMAC key, a
nonce and a secret output marker). No model code has run in the sandbox before it, and none ever runs in
this process:
1. it reads the bundle, then marks itself non-dumpable (PR_SET_DUMPABLE 0), so a same-uid process can
   neither read its memory (the key) nor open its file descriptors through /proc;
2. it executes the trusted prompt + tests in its own namespace (a failure here is the grader's, reported
   as an "infra" record), then emits a signed "start" record: from here on a missing verdict is the
   candidate's doing;
3. it starts the candidate process (code_candidate.py), which puts itself under a seccomp filter (no
   signals, tracing or memory reads of other processes; the checker reads /proc/<pid>/status to record
   whether the filter is in force) and loads the model's program; its output goes to a log file, never
   to this process's stdout;
4. it calls the tests' `check(candidate)` where `candidate` is a proxy: each call sends the arguments
   through a pipe and decodes the reply strictly into fresh built-in values (exact types only). So the
   comparisons in the tests run on values the model's code never held: an object with a rigged __eq__,
   patched builtins, sys.exit, os._exit or a fake success line cannot reach them;
5. it kills the candidate's process group and emits a signed "verdict" record {passed, cause, detail}.
A deadline (SIGALRM) bounds loading plus tests. Records are `<marker><json>` lines with an HMAC over the
record (seq, nonce, kind, fields); the host believes nothing else. Stdlib only.
"""

import builtins
import hashlib
import hmac
import json
import os
import signal
import struct
import subprocess
import sys
import time
import traceback

MAX_MESSAGE = 16 << 20  # bytes of one reply; more is the candidate flooding the pipe
MAX_DEPTH = 100
TEST_FILE = "test.py"


class Deadline(BaseException):
    """The time for loading plus tests ran out (raised by SIGALRM anywhere in the checker)."""


class GraderError(Exception):
    """The grader cannot do what the tests ask (an argument type it cannot send): not the model's failure."""


class CandidateFailure(Exception):
    """The candidate process did not answer a call with a plain value (it died, flooded or garbled)."""


def _no_peeking():
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception:
        pass


class Records:
    """Signed result lines on stdout: the only thing the host reads."""

    def __init__(self, key, nonce, marker):
        self.key, self.nonce, self.marker, self.seq = key, nonce, marker, 0

    def emit(self, kind, **fields):
        record = {"seq": self.seq, "nonce": self.nonce, "kind": kind, **fields}
        payload = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
        record["mac"] = hmac.new(self.key, payload, hashlib.sha256).hexdigest()
        self.seq += 1
        sys.stdout.write("\n" + self.marker + json.dumps(record) + "\n")
        sys.stdout.flush()


# ---- values across the pipe (format: code_candidate.py) -------------------------------------------------


def encode(value):
    """The tests' arguments as plain data (they are trusted values: a type we cannot send is our limit)."""
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return [encode(v) for v in value]
    if kind is tuple:
        return {"tuple": [encode(v) for v in value]}
    if kind is dict:
        return {"dict": [[encode(k), encode(v)] for k, v in value.items()]}
    if kind in (set, frozenset):
        return {kind.__name__: [encode(v) for v in value]}
    if kind is bytes:
        return {"bytes": value.hex()}
    if kind is complex:
        return {"complex": [value.real, value.imag]}
    raise GraderError(f"the grader cannot pass a {kind.__name__} argument to the candidate")


def _hashable(value):
    try:
        hash(value)
    except TypeError:
        raise CandidateFailure("the reply holds an unhashable dict key or set member") from None
    return value


def decode(value, depth=0):
    """A reply value as fresh built-in objects; only the exact JSON types json.loads makes are accepted."""
    if depth > MAX_DEPTH:
        raise CandidateFailure("the reply is nested too deeply")
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return [decode(v, depth + 1) for v in value]
    if kind is dict and len(value) == 1:
        (tag, inner), = value.items()
        if tag == "bytes" and type(inner) is str:
            try:
                return bytes.fromhex(inner)
            except ValueError:
                raise CandidateFailure("the reply holds malformed bytes") from None
        if type(inner) is list:
            if tag == "tuple":
                return tuple(decode(v, depth + 1) for v in inner)
            if tag in ("set", "frozenset"):
                members = (_hashable(decode(v, depth + 1)) for v in inner)
                return set(members) if tag == "set" else frozenset(members)
            if tag == "dict" and all(type(p) is list and len(p) == 2 for p in inner):
                return {_hashable(decode(k, depth + 1)): decode(v, depth + 1) for k, v in inner}
            if tag == "complex" and len(inner) == 2 and all(type(p) in (int, float) for p in inner):
                return complex(inner[0], inner[1])
    raise CandidateFailure("the reply is not a plain value")


class Channel:
    """Length-prefixed JSON over the two pipes to the candidate process."""

    def __init__(self, write_fd, read_fd, proc):
        self.write_fd, self.read_fd, self.proc = write_fd, read_fd, proc

    def send(self, message):
        view = memoryview(json.dumps(message).encode())
        view = memoryview(struct.pack(">I", len(view)) + bytes(view))
        try:
            while view:
                view = view[os.write(self.write_fd, view):]
        except OSError:  # BrokenPipeError: the candidate is gone
            raise CandidateFailure(self._gone()) from None

    def _read(self, n):
        chunks, left = [], n
        while left:
            chunk = os.read(self.read_fd, min(left, 1 << 20))
            if not chunk:
                raise CandidateFailure(self._gone())
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def recv(self):
        size = struct.unpack(">I", self._read(4))[0]
        if size > MAX_MESSAGE:
            raise CandidateFailure(f"the candidate sent a {size}-byte reply (limit {MAX_MESSAGE})")
        try:
            return json.loads(self._read(size))
        except (ValueError, RecursionError):
            raise CandidateFailure("the candidate sent a malformed reply") from None

    def _gone(self):
        try:
            code = self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            code = None
        return f"the candidate process stopped answering (exit code {code})"


def _proxy(channel, state):
    """The `candidate` the tests call: arguments out, a decoded plain value (or a raised error) back."""

    def candidate(*args, **kwargs):
        state["calls"] += 1
        channel.send({"args": encode(list(args)), "kwargs": encode(dict(kwargs))})
        reply = channel.recv()
        if type(reply) is not dict or len(reply) not in (1, 2):
            raise CandidateFailure("the candidate sent a malformed reply")
        if "ok" in reply:
            return decode(reply["ok"])
        if "raised" in reply:
            name, message = str(reply["raised"])[:100], str(reply.get("message", ""))[:300]
            kind = getattr(builtins, name, None)
            if not (isinstance(kind, type) and issubclass(kind, Exception)):
                kind = CandidateFailure
            error = kind(message)
            state["raised"] = (error, f"the function raised {name}: {message}")
            raise error
        if "unencodable" in reply:
            raise CandidateFailure(f"the function returned a {str(reply['unencodable'])[:100]} object; only "
                                   "plain values (numbers, strings, lists, tuples, dicts, sets) are compared")
        raise CandidateFailure("the candidate sent a malformed reply")

    return candidate


# ---- one run ----------------------------------------------------------------------------------------------


def _load_tests(bundle):
    namespace = {"__name__": "humaneval_tests"}
    exec(compile(bundle["tests"], TEST_FILE, "exec"), namespace)
    check = namespace.get("check")
    if not callable(check):
        raise RuntimeError("the tests define no check function")
    return check


def _test_line(exc, tests):
    """'line N: <source>' of the innermost test frame an exception passed through, or ''."""
    lineno = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == TEST_FILE:
            lineno = frame.lineno
    lines = tests.splitlines()
    if lineno is None or not 0 < lineno <= len(lines):
        return ""
    return f"line {lineno}: {lines[lineno - 1].strip()[:300]}"


def _load_candidate(bundle, channel, state):
    """Have the candidate load the program; None when it is ready, else the failed verdict."""
    try:
        channel.send({"source": bundle["source"], "entry_point": bundle["entry_point"]})
        reply = channel.recv()
    except CandidateFailure as exc:  # os._exit at module level, a runner the program broke, ...
        return {"passed": False, "cause": "load_error", "detail": str(exc)[:500]}
    if type(reply) is dict and type(reply.get("load_error")) is str:
        return {"passed": False, "cause": "load_error", "detail": reply["load_error"][:500]}
    if reply != {"loaded": True}:
        return {"passed": False, "cause": "load_error", "detail": "the candidate sent a malformed reply"}
    state["isolated"] = _seccomp_mode(channel.proc.pid) == 2
    return None


def _converse(bundle, check, channel, state):
    """Load the program in the candidate, run check(candidate); the verdict fields."""
    failed = _load_candidate(bundle, channel, state)
    if failed is not None:
        return failed
    candidate = _proxy(channel, state)
    # Some tests name the function itself (HumanEval/33 compares with `sort_third(...)`): in the reference
    # harness that is the model's function, so here the name means the proxy too, not the prompt's stub.
    check.__globals__[bundle["entry_point"]] = candidate
    try:
        check(candidate)
    except Exception as exc:
        where = _test_line(exc, bundle["tests"])
        raised = state.get("raised")
        if raised is not None and raised[0] is exc:  # the function's own exception, passed through
            return {"passed": False, "cause": "raised", "detail": raised[1], "where": where}
        if isinstance(exc, GraderError):  # the host turns this into a null reward (infra), never a 0
            return {"passed": False, "cause": "grader_error", "detail": str(exc)[:500], "where": where}
        if isinstance(exc, CandidateFailure):
            return {"passed": False, "cause": "candidate_error", "detail": str(exc)[:500], "where": where}
        if isinstance(exc, AssertionError):
            return {"passed": False, "cause": "assertion", "detail": where}
        return {"passed": False, "cause": "error", "detail": f"{type(exc).__name__}: {exc}"[:500], "where": where}
    return {"passed": True, "cause": "passed", "detail": ""}


def _seccomp_mode(pid):
    """The candidate's seccomp mode as the kernel reports it (2: its filter is in force), or -1."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("Seccomp:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return -1


def _on_alarm(signum, frame):
    raise Deadline()


def _run(bundle, check):
    log_path = f"/tmp/arlctl-candidate-{bundle['nonce']}.log"
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
    argv = [sys.executable, "-I", "-B", "-u", "-c", bundle["runner"], str(req_r), str(resp_w), str(bundle["memory_mb"])]
    state = {"calls": 0}
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, bundle["timeout"])
    proc = None
    # Our own handle on the log: whatever the candidate does to the path (a symlink, a FIFO), we read the
    # file it was given, never what the name points to later.
    log = open(log_path, "w+b")  # noqa: SIM115  (read back after the candidate is gone)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd="/tmp", pass_fds=(req_r, resp_w), start_new_session=True)
        os.close(req_r)
        os.close(resp_w)
        verdict = _converse(bundle, check, Channel(req_w, resp_r, proc), state)
    except Deadline:
        verdict = {"passed": False, "cause": "timeout",
                   "detail": f"loading and testing took longer than {bundle['timeout']:g}s"}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
    verdict["calls"] = state["calls"]
    verdict["isolated"] = state.get("isolated", False)
    size = os.fstat(log.fileno()).st_size
    verdict["output"] = os.pread(log.fileno(), 2000, max(0, size - 2000)).decode("utf-8", "replace")
    log.close()
    return verdict


def main():
    bundle = json.loads(sys.stdin.buffer.read())
    _no_peeking()
    records = Records(bytes.fromhex(bundle["key"]), bundle["nonce"], bundle["marker"])
    started = time.monotonic()
    try:
        check = _load_tests(bundle)
    except Exception as exc:  # the trusted tests do not run here: the grader's failure, not the model's
        records.emit("infra", error=f"the tests do not load: {type(exc).__name__}: {exc}"[:500])
        return
    records.emit("start")
    verdict = _run(bundle, check)
    verdict["seconds"] = round(time.monotonic() - started, 3)
    records.emit("verdict", **verdict)


if __name__ == "__main__":
    main()
