"""The grading driver: runs first in a fresh sandbox, applies the diffs, runs pytest, reports back.

Executed as `python3 -I -c <this source>` with a JSON bundle on stdin; no model code has run in the
sandbox before it. It applies the (already filtered) agent diff, restores and applies the tests, then
runs pytest in a child process with one of two plugins:
- probe mode (the built-in suite): the tests are in probe form and hold no expected values; the
  recorder (harness/probe.py) writes the checked values to a file, and the host compares them;
- in-process mode (SWE-bench rows, image tasks): the HMAC plugin (harness/plugin.py) receives the
  per-run secret through a pipe (never argv, env or a file) and authenticates pytest's own outcomes.
Runner mode (rows whose tests run under their own runner: django's, sympy's, ...) runs the row's eval
script under bash instead and brings back its log, which the host grades with the swebench package's
parser for that runner; nothing in that log is authenticated (the tested process writes it).
It prints one line `<marker><json>` with the pytest exit code and the raw results (in-process mode: also
the status lines of pytest's `-rA` log, for the host's SWE-bench cross-check); the host judges them. The marker is secret too, so output written by model code cannot pass for the driver's. Stdlib only.
"""

import collections
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time

# The pytest log's status lines come back for the SWE-bench cross-check (official.py): at most this
# many characters once JSON-escaped, so the report line stays well inside the sandbox's 1 MiB output cap.
STATUS_LINES_LIMIT = 128_000
_STATUS_WORDS = (b"PASSED", b"FAILED", b"SKIPPED", b"ERROR", b"XFAIL", b"XPASS")
# Runner mode: the eval script's log comes back whole up to this many characters once JSON-escaped; a longer
# one keeps its head (the START marker's side) and its tail (the end marker and the exit code).
RUNNER_LOG_LIMIT = 600_000
_COLOUR = re.compile(rb"\[(\d+)m")
_CONTROL = bytes(range(1, 32))


def _no_peeking():
    # PR_SET_DUMPABLE = 0: the pytest child (same uid) cannot open /proc/<driver>/fd or read our memory.
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
    except Exception:
        pass


def _git(work, *args):
    cmd = ["git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-C", work, *args]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp", "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": "/dev/null"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def _apply(work, hdir, name, diff):
    path = os.path.join(hdir, name)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(diff)
    # No --recount: a patch whose hunk counts are wrong is rejected, not repaired.
    result = _git(work, "apply", "--whitespace=nowarn", path)
    return result.returncode == 0, (result.stderr or result.stdout)[-2000:]


def _pytest_missing(hdir):
    """Why this sandbox's interpreter cannot run pytest (checked before any model code runs), or ''."""
    probe = subprocess.run([sys.executable, "-I", "-c", "import pytest"], cwd=hdir, capture_output=True, text=True,
                           env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    if probe.returncode == 0:
        return ""
    last = (probe.stderr.strip().splitlines() or [f"exit {probe.returncode}"])[-1]
    return f"the sandbox interpreter {sys.executable} cannot import pytest: {last}"


def _restore(work, paths):
    """Put test_patch's files back to their pristine state (tracked: HEAD's version; new: absent)."""
    for rel in paths:
        target = os.path.join(work, rel)
        if _git(work, "cat-file", "-e", f"HEAD:{rel}").returncode == 0:
            _git(work, "checkout", "HEAD", "--", rel)
        elif os.path.lexists(target):
            os.remove(target)


def _wait(proc, timeout):
    """(exit code, timed out): the whole session of `proc` is killed at the timeout."""
    try:
        return proc.wait(timeout=timeout), False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(), True


def _run_pytest(bundle, hdir, key_setup):
    """pytest in a child; the HMAC plugin gets its key through a pipe, the probe recorder a results path.

    Either plugin writes "started" into a second pipe at configure time, before any test module (hence any
    model code) is imported, and closes it: what the driver reads there later says whether pytest came up,
    and nothing the tested code does afterwards can add it or take it back."""
    work = bundle["workdir"]
    module = bundle["plugin_module"]
    read_fd, write_fd = os.pipe()
    os.write(write_fd, json.dumps(key_setup).encode())
    os.close(write_fd)
    started_r, started_w = os.pipe()
    if bundle["mode"] == "probe":
        extra = ["-p", module, "--arlctl-probe-out", key_setup["results"]]
    else:
        extra = ["-p", module, "--arlctl-key-fd", str(read_fd)]
    extra += ["--arlctl-start-fd", str(started_w)]
    runner = (
        "import sys\n"
        f"sys.path.insert(0, {hdir!r})\n"
        "import pytest\n"
        f"sys.path.append({work!r})\n"
        f"sys.exit(pytest.main({bundle['pytest_args']!r} + {extra!r}))\n"
    )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp", "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONHASHSEED": "0"}
    log_path = os.path.join(hdir, "pytest.log")
    with open(log_path, "wb") as log:
        # -P: the working directory is not put first on sys.path, so a planted pytest.py cannot shadow pytest.
        proc = subprocess.Popen([sys.executable, "-P", "-s", "-B", "-c", runner], cwd=work, env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                pass_fds=(read_fd, started_w), start_new_session=True)
        os.close(read_fd)
        os.close(started_w)
        code, timed_out = _wait(proc, bundle["timeout"])
    with open(log_path, "rb") as handle:
        log_tail = handle.read()[-4000:].decode("utf-8", "replace")
    os.set_blocking(started_r, False)
    try:
        started = os.read(started_r, 64).startswith(b"started")
    except BlockingIOError:  # nothing written, and a grandchild still holds the write end
        started = False
    os.close(started_r)
    return code, timed_out, log_tail, started


def _status_lines(log_path):
    """(text, truncated): the log's lines that hold a status word once colour codes and control
    characters are removed, in order. SWE-bench's pytest parsers read no other line, so parsing these
    gives what parsing the whole log would. Only the last whole lines that fit STATUS_LINES_LIMIT
    (JSON-escaped) are kept; memory stays bounded however long the log is."""
    kept, size, cut = collections.deque(), 0, False
    with open(log_path, "rb") as handle:
        while True:
            raw = handle.readline(1 << 20)  # split at b"\n" only, as the parsers split; a huge line in parts
            if not raw:
                break
            clean = _COLOUR.sub(b"", raw).translate(None, _CONTROL)
            if any(word in clean for word in _STATUS_WORDS):
                kept.append(raw.decode("utf-8", "replace"))
                size += len(kept[-1])
                while size > STATUS_LINES_LIMIT:
                    size -= len(kept.popleft())
                    cut = True
    while kept and len(json.dumps("".join(kept))) > STATUS_LINES_LIMIT:  # escaping lengthens non-ASCII text
        kept.popleft()
        cut = True
    return "".join(kept), cut


def _bounded_log(path):
    """(text, truncated): the runner's whole log, or its head and tail when it is longer than the limit."""
    with open(path, "rb") as handle:
        raw = handle.read()
    text = raw.decode("utf-8", "replace")
    if len(json.dumps(text)) <= RUNNER_LOG_LIMIT:
        return text, False
    head, tail = text[: RUNNER_LOG_LIMIT // 16], text[-RUNNER_LOG_LIMIT // 2 :]
    while len(json.dumps(head + tail)) > RUNNER_LOG_LIMIT:  # escaping lengthens control and non-ASCII text
        tail = tail[len(tail) // 8 :]
    return head + "\n[arlctl: log cut here]\n" + tail, True


def _run_script(bundle, hdir, report):
    """Runner mode: the row's eval script under bash in its own session, its stdout and stderr one log."""
    work = bundle["workdir"]
    script_path, log_path = os.path.join(hdir, "eval.sh"), os.path.join(hdir, "eval.log")
    with open(script_path, "w", encoding="utf-8") as handle:
        handle.write(bundle["script"])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp", "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(["bash", script_path], cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        code, timed_out = _wait(proc, bundle["timeout"])
    report["runner_log"], report["runner_log_truncated"] = _bounded_log(log_path)
    report.update(exit_code=code, timed_out=timed_out, log_tail=report["runner_log"][-4000:])


def _no_bash():
    probe = subprocess.run(["bash", "-c", "true"], capture_output=True, env={"PATH": os.environ.get("PATH", "")})
    return "" if probe.returncode == 0 else f"bash cannot run in this sandbox (exit {probe.returncode})"


def main():
    bundle = json.loads(sys.stdin.read())
    _no_peeking()
    work, hdir = bundle["workdir"], bundle["harness_dir"]
    os.makedirs(hdir, mode=0o700)
    report = {"apply_ok": True, "apply_error": "", "exit_code": None, "timed_out": False, "results": "",
              "log_tail": "", "harness_error": ""}
    started = time.monotonic()
    if bundle["diff"].strip():
        report["apply_ok"], report["apply_error"] = _apply(work, hdir, "agent.diff", bundle["diff"])
    runner = bundle["mode"] == "runner"
    try:
        missing = _no_bash() if runner else _pytest_missing(hdir)
    except OSError as err:
        missing = f"the test environment cannot start: {err}"
    if missing:  # the grader cannot run tests here: an infrastructure failure, not the agent's
        report.update(harness_error=missing, infra=True)
    elif report["apply_ok"]:
        _restore(work, bundle["test_paths"])
        ok, err = _apply(work, hdir, "tests.diff", bundle["test_patch"]) if bundle["test_patch"].strip() else (True, "")
        if not ok:
            report.update(harness_error="test_patch does not apply: " + err, infra=True)
        elif runner:
            _run_script(bundle, hdir, report)
        else:
            with open(os.path.join(hdir, bundle["plugin_module"] + ".py"), "w", encoding="utf-8") as handle:
                handle.write(bundle["plugin_source"])
            hashes = {}
            for rel in bundle["test_files"]:
                path = os.path.join(work, rel)
                if os.path.isfile(path):
                    with open(path, "rb") as handle:
                        hashes[rel] = hashlib.sha256(handle.read()).hexdigest()
            results = os.path.join(hdir, "results.jsonl")
            protected = sorted({os.path.dirname(os.path.join(work, rel)) for rel in hashes} | {hdir})
            setup = {"key": bundle["key"], "results": results, "expected_hashes": hashes,
                     "protected": protected, "allow_subprocess": bundle["allow_subprocess"]}
            code, timed_out, log_tail, started = _run_pytest(bundle, hdir, setup)
            report.update(exit_code=code, timed_out=timed_out, log_tail=log_tail, started=started)
            if bundle.get("capture_log"):
                report["status_lines"], report["status_lines_truncated"] = _status_lines(
                    os.path.join(hdir, "pytest.log"))
            if os.path.exists(results):
                with open(results, encoding="utf-8", errors="replace") as handle:
                    report["results"] = handle.read(4_000_000)
    report["seconds"] = round(time.monotonic() - started, 3)
    sys.stdout.write("\n" + bundle["marker"] + json.dumps(report) + "\n")
    sys.stdout.flush()


main()
