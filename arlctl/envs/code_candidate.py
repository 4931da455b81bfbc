"""The candidate process of the code grader: loads the model's program and answers calls to its function.

Runs inside the grading sandbox, started by the checker (code_checker.py) as
`python3 -I -B -u -c <this source> REQ_FD RESP_FD MEMORY_MB`; its stdout and stderr go, unbuffered, to a
log file. It is the only process where model-written code runs, and nothing it does is believed: it never
sees the tests, and what it sends back is plain data that the checker decodes into fresh built-in values.
This file only has to serve an honest program well; a program that rewrites it (or the pipes) gains
nothing, because every value it could send is one an honest function could have returned. Before loading
the program it installs a seccomp filter so that neither it nor its children can signal, trace or read
another process (the checker, the exec server): killing those would end a grading without a verdict.

Protocol: length-prefixed JSON messages (4-byte big-endian length). The first request is
{"source", "entry_point"}; the reply {"loaded": true} or {"load_error": "..."}. Then each request
{"args", "kwargs"} (encoded values) gets {"ok": value}, {"raised": type name, "message": text} or
{"unencodable": type name}. Value encoding (shared with the checker): None, bools, ints, floats and
strings are JSON; a list is a JSON array; other containers are one-key objects: {"tuple": [...]},
{"dict": [[k, v], ...]}, {"set": [...]}, {"frozenset": [...]}, {"bytes": "hex"}, {"complex": [re, im]}.
Stdlib only: this file is copied into the sandbox.
"""

import builtins
import json
import operator
import os
import resource
import struct
import sys

_MAX_DEPTH = 100


# Syscalls that reach another process (signals, tracing, reading its memory), by architecture: the
# seccomp filter below makes them fail with EPERM. audit arch, then numbers: kill, tkill, tgkill,
# rt_sigqueueinfo, rt_tgsigqueueinfo, ptrace, process_vm_readv, process_vm_writev, pidfd_send_signal.
_CROSS_PROCESS = {
    "x86_64": (0xC000003E, (62, 200, 234, 129, 297, 101, 310, 311, 424)),
    "aarch64": (0xC00000B7, (129, 130, 131, 138, 240, 117, 270, 271, 424)),
}
_X32_BIT = 0x40000000  # x86_64's x32 ABI numbers: no normal program uses them, so they are refused too


def _filter_program(arch):
    """The classic-BPF seccomp program: deny _CROSS_PROCESS calls (and any other ABI), allow the rest."""
    audit, numbers = _CROSS_PROCESS[arch]
    ld_abs, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
    deny, allow = 0x00050000 | 1, 0x7FFF0000  # SECCOMP_RET_ERRNO | EPERM, SECCOMP_RET_ALLOW
    checks = [(jset, _X32_BIT)] if arch == "x86_64" else []
    checks += [(jeq, n) for n in numbers]
    # [0] load arch, [1] arch ok -> skip the deny at [2], [3] load nr, checks..., allow, deny
    program = [(ld_abs, 0, 0, 4), (jeq, 1, 0, audit), (ret, 0, 0, deny), (ld_abs, 0, 0, 0)]
    for i, (code, k) in enumerate(checks):
        program.append((code, len(checks) - i, 0, k))  # true: jump over the rest and the allow
    program += [(ret, 0, 0, allow), (ret, 0, 0, deny)]
    return program


def _isolate():
    """Make this process (and its children) unable to signal, trace or read any other process in the
    sandbox: the checker, the exec server. Killing them would end the grading without a verdict."""
    import ctypes
    import platform

    arch = platform.machine()
    if arch not in _CROSS_PROCESS:
        return False
    program = _filter_program(arch)
    raw = b"".join(struct.pack("HBBI", *insn) for insn in program)
    buffer = ctypes.create_string_buffer(raw, len(raw))

    class FilterProgram(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = FilterProgram(len(program), ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        return False
    return libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


def _limits(memory_mb):
    """Set before any model code runs: address space (a MemoryError, not an OOM kill), files, no cores,
    and first in line for the OOM killer should the sandbox run out of memory anyway."""
    limit = memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_FSIZE, (8 << 20, 8 << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        with open("/proc/self/oom_score_adj", "w") as handle:
            handle.write("1000")
    except OSError:
        pass


def _read_exact(fd, n):
    buf = bytearray()  # grows in place (appending to bytes copies the whole message per pipe read)
    while len(buf) < n:
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _recv(fd):
    head = _read_exact(fd, 4)
    if head is None:
        return None
    body = _read_exact(fd, struct.unpack(">I", head)[0])
    return None if body is None else json.loads(body)


def _send(fd, message):
    data = json.dumps(message).encode()
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


class Unencodable(Exception):
    pass


def encode(value, depth=0):
    """A plain-data copy of a returned value. Subclasses of built-in types become their base type; number
    types that convert losslessly (numpy scalars) become int/float; anything else is Unencodable."""
    if depth > _MAX_DEPTH:
        raise Unencodable("a value nested deeper than 100 levels")
    if value is None or value is True or value is False:
        return value
    if isinstance(value, int):
        return int.__index__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, list):
        return [encode(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return {"tuple": [encode(v, depth + 1) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if isinstance(value, frozenset):
        return {"frozenset": [encode(v, depth + 1) for v in value]}
    if isinstance(value, set):
        return {"set": [encode(v, depth + 1) for v in value]}
    if isinstance(value, bytes | bytearray):
        return {"bytes": bytes(value).hex()}
    if isinstance(value, complex):
        return {"complex": [value.real, value.imag]}
    if hasattr(type(value), "__index__"):
        return operator.index(value)
    if hasattr(type(value), "__float__") and type(value).__module__ == "numpy":
        return float(value)
    raise Unencodable(type(value).__name__)


def decode(value):
    """The inverse of encode for the checker's arguments (trusted: they come from the tests)."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    (tag, inner), = value.items()
    if tag == "tuple":
        return tuple(decode(v) for v in inner)
    if tag == "dict":
        return {decode(k): decode(v) for k, v in inner}
    if tag == "set":
        return {decode(v) for v in inner}
    if tag == "frozenset":
        return frozenset(decode(v) for v in inner)
    if tag == "bytes":
        return bytes.fromhex(inner)
    if tag == "complex":
        return complex(*inner)
    raise ValueError(f"unknown tag {tag!r}")


def _load(request):
    """The model's program as a module; (function, None) or (None, why it cannot be called)."""
    namespace = {"__name__": "candidate", "__builtins__": builtins}
    try:
        exec(compile(request["source"], "candidate.py", "exec"), namespace)
    except BaseException as exc:  # noqa: BLE001  (SystemExit at module level is a load failure too)
        return None, f"{type(exc).__name__}: {exc}"[:500]
    function = namespace.get(request["entry_point"])
    if not callable(function):
        return None, f"the program defines no function {request['entry_point']!r}"
    return function, None


def _answer(function, request):
    try:
        result = function(*decode(request["args"]), **decode(request["kwargs"]))
    except BaseException as exc:  # noqa: BLE001  (sys.exit inside the function is a failed call)
        return {"raised": type(exc).__name__, "message": str(exc)[:300]}
    try:
        return {"ok": encode(result)}
    except Unencodable as exc:
        return {"unencodable": str(exc)[:100]}
    except Exception as exc:  # noqa: BLE001  (an object whose conversion raises)
        return {"unencodable": f"{type(result).__name__} ({type(exc).__name__})"[:100]}


def main():
    req_fd, resp_fd, memory_mb = (int(a) for a in sys.argv[1:4])
    _isolate()  # the checker reads the result from /proc/<pid>/status, not from us
    _limits(memory_mb)
    request = _recv(req_fd)
    function, error = _load(request)
    if error is not None:
        _send(resp_fd, {"load_error": error})
        return
    _send(resp_fd, {"loaded": True})
    while True:
        request = _recv(req_fd)
        if request is None:
            return
        _send(resp_fd, _answer(function, request))


if __name__ == "__main__":
    main()
