"""The grading pytest plugin: records each test's outcome, authenticated so model code cannot forge it.

Runs inside the grading sandbox, in the same process as the model's code, so it trusts nothing that
happens after `pytest_configure`. At configure time (before any test module, hence any package code, is
imported) it:
  1. reads its secret from an inherited pipe and closes the pipe (the key is in no file, argv or env);
  2. opens the results file (outside the repository) and keeps the handle;
  3. snapshots the identity of every function and class of pytest, _pytest, pluggy, unittest and builtins;
  4. installs an audit hook (which cannot be removed) that refuses writes to the tests and to the results
     directory, process spawning, and heap walking (gc.get_objects & co.) and ctypes.
Every record it writes carries an HMAC over (seq, fields) keyed by the secret; the host verifies them.
A changed pytest/unittest/builtins function, a test file whose bytes differ from the expected one, or a
test module that pytest's own importer did not load from that file becomes an authenticated "tamper"
record. Stdlib only: this file is copied into the sandbox.
"""

import gc  # noqa: F401  (imported before the audit hook so later imports are not needed)
import hashlib
import hmac
import json
import os
import sys

# Our own references to builtins, taken before any model code runs: patching builtins.type (say) must
# not break the integrity check that is meant to notice it.
_id, _vars, _callable, _isinstance, _type, _len, _sorted, _any = id, vars, callable, isinstance, type, len, sorted, any
_STATE = {}
_WATCHED_PREFIXES = ("pytest", "_pytest", "pluggy", "unittest", "builtins")
_SPAWN_EVENTS = {"os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen",
                 "pty.spawn", "os.startfile", "os.kill", "os.killpg", "signal.pthread_kill"}
_HEAP_EVENTS = {"gc.get_objects", "gc.get_referrers", "gc.get_referents", "ctypes.dlopen", "ctypes.dlsym",
                "ctypes.addressof", "ctypes.cdata", "ctypes.string_at", "ctypes.wstring_at", "sys._current_frames"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _emit(kind, **fields):
    record = {"seq": _STATE["seq"], "kind": kind, **fields}
    payload = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    record["mac"] = hmac.new(_STATE["key"], payload, hashlib.sha256).hexdigest()
    _STATE["seq"] += 1
    _STATE["out"].write(json.dumps(record) + "\n")
    _STATE["out"].flush()


def _identities():
    ids = {}
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(_WATCHED_PREFIXES):
            continue
        ids[("module", name)] = _id(module)
        for attr, value in list(_vars(module).items()):
            if _callable(value):
                ids[(name, attr)] = _id(value)
            if _isinstance(value, _type) and getattr(value, "__module__", None) == name:
                for cattr, cvalue in list(_vars(value).items()):
                    if _callable(cvalue) or _isinstance(cvalue, (staticmethod, classmethod, property)):
                        ids[(name, attr, cattr)] = _id(cvalue)
    return ids


def _changed():
    """Names of watched objects that are no longer the ones seen at configure time."""
    before = _STATE["identities"]
    now = {}
    for key in before:
        if key[0] == "module":
            module = sys.modules.get(key[1])
            now[key] = _id(module) if module is not None else None
            continue
        module = sys.modules.get(key[0])
        obj = _vars(module).get(key[1]) if module is not None else None
        if _len(key) == 3:
            obj = _vars(obj).get(key[2]) if _isinstance(obj, _type) else None
        now[key] = _id(obj) if obj is not None else None
    return _sorted(".".join(k[1:] if k[0] == "module" else k) for k in before if now[k] != before[k])


def _protected(path):
    try:
        real = os.path.realpath(os.fsdecode(path))
    except Exception:
        return True
    return _any(real == p or real.startswith(p + os.sep) for p in _STATE["protected"])


def _audit(event, args):
    if event in _HEAP_EVENTS:
        raise RuntimeError(f"grading sandbox: {event} is not allowed")
    if event in _SPAWN_EVENTS and not _STATE["allow_subprocess"]:
        raise RuntimeError(f"grading sandbox: {event} is not allowed")
    if event == "import" and args and args[0] in ("ctypes", "_ctypes"):
        raise ImportError("grading sandbox: ctypes is not allowed")
    if event == "open" and args and _isinstance(args[0], (str, bytes, os.PathLike)):
        mode, flags = args[1], args[2] if _len(args) > 2 else 0
        writing = (_isinstance(mode, str) and _any(c in mode for c in "wax+")) or bool((flags or 0) & _WRITE_FLAGS)
        if writing and _protected(args[0]):
            raise PermissionError(f"grading sandbox: {args[0]} is read-only")
    elif event in ("os.remove", "os.rename", "os.replace", "os.truncate", "os.rmdir", "os.symlink", "os.link",
                   "os.chmod", "os.chown", "os.utime", "shutil.rmtree", "shutil.move", "os.mkdir"):
        for arg in args[:2]:
            if _isinstance(arg, (str, bytes, os.PathLike)) and _protected(arg):
                raise PermissionError(f"grading sandbox: {event} on {arg} is not allowed")


def pytest_addoption(parser):
    parser.addoption("--arlctl-key-fd", type=int, default=-1)
    parser.addoption("--arlctl-start-fd", type=int, default=-1)


def pytest_configure(config):
    start_fd = config.getoption("--arlctl-start-fd")
    if start_fd >= 0:  # tell the driver pytest came up, before any model code is imported
        os.write(start_fd, b"started")
        os.close(start_fd)
    fd = config.getoption("--arlctl-key-fd")
    with os.fdopen(fd, "rb") as pipe:
        setup = json.loads(pipe.read().decode())
    import unittest  # noqa: F401  (so its functions are in the integrity snapshot)

    _STATE.update(key=bytes.fromhex(setup["key"]), seq=0, hashed=set(), tampered=set(), checked_modules=set(),
                  expected=setup["expected_hashes"], allow_subprocess=setup["allow_subprocess"],
                  protected=[os.path.realpath(p) for p in setup["protected"]])
    _STATE["out"] = open(setup["results"], "a", encoding="utf-8")  # noqa: SIM115  (kept open for the run)
    _STATE["identities"] = _identities()
    sys.addaudithook(_audit)
    _emit("start", pid=os.getpid())


def pytest_collect_file(file_path, parent):
    """Hash each expected test file as it is collected, before pytest imports it."""
    rel = os.path.relpath(str(file_path), str(parent.config.rootpath))
    expected = _STATE["expected"].get(rel)
    if expected is not None:
        with open(file_path, "rb") as handle:
            digest = hashlib.sha256(handle.read()).hexdigest()
        _STATE["hashed"].add(rel)
        if digest != expected:
            _emit("tamper", what="test_file_changed", path=rel)


def pytest_collection_finish(session):
    """Each expected test module must have been loaded from its file by pytest's own importer."""
    root = str(session.config.rootpath)
    for item in session.items:
        module = getattr(item, "module", None)
        rel = os.path.relpath(str(item.path), root)
        if module is None or rel not in _STATE["expected"] or rel in _STATE["checked_modules"]:
            continue
        _STATE["checked_modules"].add(rel)
        loader = _type(getattr(module, "__loader__", None)).__name__
        origin = os.path.realpath(getattr(module, "__file__", "") or "")
        if loader != "AssertionRewritingHook" or origin != os.path.realpath(str(item.path)):
            _emit("tamper", what="test_module_replaced", path=rel, loader=loader)


def pytest_runtest_logreport(report):
    changed = _changed()
    for name in changed:
        if name not in _STATE["tampered"]:
            _STATE["tampered"].add(name)
            _emit("tamper", what="patched", name=name)
    outcome = report.outcome
    if getattr(report, "wasxfail", None) is not None:  # xfail marker or pytest.xfail(): failed as expected,
        outcome = "xpass" if outcome == "passed" else "xfail"  # or passed anyway (non-strict)
    _emit("report", nodeid=report.nodeid, when=report.when, outcome=outcome, tampered=bool(changed))


def pytest_sessionfinish(session, exitstatus):
    changed = _changed()
    for name in changed:
        if name not in _STATE["tampered"]:
            _emit("tamper", what="patched", name=name)
    _emit("session", exitstatus=int(exitstatus), hashed=sorted(_STATE["hashed"]), tampered=bool(changed))
