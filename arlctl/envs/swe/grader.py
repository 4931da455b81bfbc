"""The swe reward: hidden tests run on the agent's diff in a fresh sandbox, in a way the diff cannot game.

    reward, components, info = await grade(task, diff, sandbox_factory)

1. Filter the diff (diffs.py): edits to tests, conftest.py, pytest configuration, import hooks, git
   metadata, binaries and symlinks are dropped and flagged as tamper in info.
2. Start a FRESH sandbox on the task's pristine snapshot; no model code has run in it. An image task
   (SWE-bench image) is graded in a fresh container of its own image, the pristine one-commit export
   of its repo_dir mounted over that directory (docker only; see tasks.py).
3. Inside it, the driver (harness/driver.py) applies the diff, restores the test files test_patch
   touches and applies test_patch (the hidden tests), hashes the expected test files, and runs pytest
   with --noconftest, -c /dev/null (repo config ignored), -p no:cacheprovider, plugin autoload off and
   -P (cwd not on sys.path first), with the harness plugin (harness/plugin.py) and results written
   outside the repository.
4. The plugin authenticates every record with a per-run secret handed over through a pipe; the host
   verifies each HMAC, the unbroken sequence, the final session record, the pytest exit code (which must
   agree with the session record) and the absence of tamper records (patched pytest/unittest/builtins,
   changed test files).

reward = 1 only if every FAIL_TO_PASS and PASS_TO_PASS id passed (setup, call and teardown), the exit
code is 0 and nothing was tampered with; ids missing from the results count as failed. Components:
f2p (fraction of FAIL_TO_PASS passed), p2p, tests_passed. Residual risk, stated plainly: the model's code
shares the pytest process, so code written specifically against this harness could in principle locate
the secret in the plugin's memory; heap walking, ctypes, process spawning and writes to the tests are
refused by an audit hook to make that hard, and the grader never trusts an unauthenticated byte.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from arlctl.envs.swe.diffs import filter_diff, paths_in
from arlctl.envs.swe.tasks import image_of, prepare_snapshot, sandbox_options, test_files, test_ids
from arlctl.errors import UsageError
from arlctl.sandbox.base import Sandbox

REWARD_VERSION = "swe-1"
HARNESS_DIR = Path(__file__).with_name("harness")
# snapshot directory (+ the task's backend options, image tasks only) -> a started sandbox
SandboxFactory = Callable[..., Awaitable[Sandbox]]


def _pytest_args(task: dict[str, Any], workdir: str) -> list[str]:
    return [*test_files(task), "-p", "no:cacheprovider", "--noconftest", "-c", "/dev/null", "--rootdir",
            workdir, "--import-mode=append", "-q", "--tb=short", "-o", "console_output_style=classic"]


def _bundle(task: dict[str, Any], diff: str, workdir: str, key: str, marker: str, timeout: float,
            allow_subprocess: bool) -> dict[str, Any]:
    nonce = secrets.token_hex(8)
    test_patch = task.get("test_patch") or ""
    return {
        "workdir": workdir, "harness_dir": f"/tmp/arlctl-grade-{nonce}", "plugin_module": f"arlctl_grade_{nonce}",
        "plugin_source": (HARNESS_DIR / "plugin.py").read_text(encoding="utf-8"), "diff": diff,
        "test_patch": test_patch, "test_paths": paths_in(test_patch), "test_files": test_files(task),
        "pytest_args": _pytest_args(task, workdir), "key": key, "marker": marker, "timeout": timeout,
        "allow_subprocess": allow_subprocess,
    }


def verify_records(text: str, key: bytes) -> tuple[list[dict[str, Any]], str | None]:
    """Authenticated records in order, or an error naming the first forged, missing or reordered one."""
    records: list[dict[str, Any]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            mac = record.pop("mac")
        except (ValueError, KeyError, AttributeError):
            return records, "unauthenticated result line"
        payload = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
        if not hmac.compare_digest(mac, hmac.new(key, payload, hashlib.sha256).hexdigest()):
            return records, "result record with a bad signature"
        if record.get("seq") != len(records):
            return records, "result records out of sequence"
        records.append(record)
        if record["kind"] == "session":
            break
    if not records or records[0].get("kind") != "start":
        return records, "no start record"
    if records[-1].get("kind") != "session":
        return records, "no session record (pytest did not finish)"
    return records, None


def outcomes_from(records: list[dict[str, Any]]) -> dict[str, str]:
    """nodeid -> passed | failed | error | skipped | xfail. Passed needs a passed call and no bad phase."""
    phases: dict[str, dict[str, str]] = {}
    for record in records:
        if record["kind"] == "report":
            result = "tampered" if record.get("tampered") else record["outcome"]
            phases.setdefault(record["nodeid"], {})[record["when"]] = result
    outcome = {}
    for nodeid, seen in phases.items():
        bad = {when for when, result in seen.items() if result in ("failed", "tampered")}
        if seen.get("call") == "passed" and all(r == "passed" for r in seen.values()):
            outcome[nodeid] = "passed"
        elif bad - {"call"}:
            outcome[nodeid] = "error"  # setup or teardown failed
        elif bad:
            outcome[nodeid] = "failed"
        elif "skipped" in seen.values() or "xfail" in seen.values():
            outcome[nodeid] = "xfail" if "xfail" in seen.values() else "skipped"
        else:
            outcome[nodeid] = "error"  # never reached its call phase
    return outcome


def score_report(task: dict[str, Any], report: dict[str, Any], key: bytes) -> tuple[float, dict, dict]:
    """Turn the driver's report into (reward, components, info)."""
    f2p, p2p = test_ids(task, "FAIL_TO_PASS"), test_ids(task, "PASS_TO_PASS")
    info: dict[str, Any] = {"apply_ok": report.get("apply_ok", False), "exit_code": report.get("exit_code"),
                            "timed_out": report.get("timed_out", False), "harness_tamper": []}
    records, error = verify_records(report.get("results", ""), key)
    outcomes = outcomes_from(records)
    for record in records:
        if record["kind"] == "tamper":
            info["harness_tamper"].append({k: v for k, v in record.items() if k not in ("seq", "kind")})
    session = records[-1] if records and records[-1]["kind"] == "session" else None
    if error:
        info["results_error"] = error
    if session is not None and session["exitstatus"] != report.get("exit_code"):
        info["results_error"] = f"exit code {report.get('exit_code')} disagrees with pytest's {session['exitstatus']}"
    passed = sorted(i for i in f2p + p2p if outcomes.get(i) == "passed")
    failed = sorted(i for i in f2p + p2p if outcomes.get(i) != "passed")
    # Trusted: the run finished, every record is authentic and pytest's exit code matches its own report.
    trusted = (info["apply_ok"] and not info.get("results_error") and not info["harness_tamper"]
               and not info["timed_out"] and session is not None)
    f2p_frac = sum(outcomes.get(i) == "passed" for i in f2p) / max(len(f2p), 1)
    p2p_frac = sum(outcomes.get(i) == "passed" for i in p2p) / max(len(p2p), 1)
    if not trusted:  # nothing from a run that was tampered with or did not finish is believed
        f2p_frac = p2p_frac = 0.0
    reward = 1.0 if trusted and report.get("exit_code") == 0 and not failed and f2p else 0.0
    info.update(trusted=bool(trusted), passed=passed, failed=failed,
                missing=sorted(i for i in f2p + p2p if i not in outcomes),
                outcomes={i: outcomes.get(i, "missing") for i in f2p + p2p})
    components = {"f2p": f2p_frac, "p2p": p2p_frac, "tests_passed": reward}
    return reward, components, info


async def grade(task: dict[str, Any], diff: str, sandbox_factory: SandboxFactory, *, timeout: float = 120.0,
                allow_subprocess: bool = False) -> tuple[float, dict[str, float], dict[str, Any]]:
    """Grade one diff against the task's hidden tests in a fresh sandbox from `sandbox_factory`.

    For an image task the factory is called as `factory(snapshot, image=..., workdir=..., env=...)`
    (a docker factory: `sandbox_factory("docker")`)."""
    started = time.monotonic()
    filtered = filter_diff(diff or "")
    key, marker = secrets.token_bytes(32), f"@@arlctl-grade-{secrets.token_hex(16)}@@"
    options = sandbox_options(task, "docker") if image_of(task) else {}
    snapshot = prepare_snapshot(task)
    sandbox = await (sandbox_factory(snapshot, **options) if options else sandbox_factory(snapshot))
    try:
        bundle = _bundle(task, filtered.diff, sandbox.workdir, key.hex(), marker, timeout, allow_subprocess)
        driver = (HARNESS_DIR / "driver.py").read_text(encoding="utf-8")
        result = await sandbox.exec(["python3", "-I", "-c", driver], timeout=timeout + 60,
                                    stdin=json.dumps(bundle).encode())
    finally:
        await sandbox.close()
    report: dict[str, Any] = {"apply_ok": False, "results": ""}
    lines = [line for line in result.stdout.splitlines() if line.startswith(marker)]
    if lines:
        report = json.loads(lines[-1][len(marker) :])
    reward, components, info = score_report(task, report, key)
    if not lines:
        info["results_error"] = f"grading driver produced no report (exit {result.exit_code}): {result.stderr[-500:]}"
    info.update(tamper=filtered.tamper, kept_files=filtered.kept, apply_error=report.get("apply_error", ""),
                harness_error=report.get("harness_error", ""), log_tail=report.get("log_tail", "")[-1500:],
                grade_seconds=round(time.monotonic() - started, 3), reward_version=REWARD_VERSION)
    return reward, components, info


def bwrap_factory(**limits: Any) -> SandboxFactory:
    """A factory of fresh bwrap sandboxes (the default grading backend)."""
    return sandbox_factory("bwrap", **limits)


def sandbox_factory(kind: str = "bwrap", **limits: Any) -> SandboxFactory:
    from arlctl.sandbox import make_sandbox

    async def make(snapshot: str, **options: Any) -> Sandbox:
        if options and kind != "docker":
            raise UsageError(f"an image task cannot be graded in a {kind} sandbox", hint="use sandbox=docker")
        merged = {**limits, **options}
        if "env" in options:
            merged["env"] = {**(limits.get("env") or {}), **options["env"]}
        return await make_sandbox(kind, snapshot, **merged)

    return make


async def score(final_state: str | None, task: dict[str, Any], response_text: str = "", *,
                sandbox: str | None = None, timeout: float = 120.0, insecure_sandbox: bool = False,
                allow_subprocess: bool = False) -> tuple[float, dict[str, float], dict[str, Any]]:
    """The registered `--reward swe` function: final_state is the agent's diff.

    sandbox: the grading backend; by default bwrap, and docker for image tasks (which refuse others)."""
    kind = sandbox or ("docker" if image_of(task) else "bwrap")
    sandbox_options(task, kind)  # an image task on bwrap/subprocess: a UsageError that says so
    limits: dict[str, Any] = {"insecure": True} if insecure_sandbox else {}
    return await grade(task, final_state or "", sandbox_factory(kind, **limits), timeout=timeout,
                       allow_subprocess=allow_subprocess)


async def self_check(task_list: list[dict[str, Any]] | None = None, factory: SandboxFactory | None = None,
                     concurrency: int = 2) -> list[dict[str, Any]]:
    """SWE-bench's harness check: for every task, gold patch -> 1 and empty patch -> 0.

    Returns one row per task: {task_id, gold, empty, ok}; ok is False for any task that breaks the rule.
    """
    import asyncio

    from arlctl.envs.swe.tasks import builtin_swe

    tasks = task_list if task_list is not None else builtin_swe({})
    factory = factory or bwrap_factory()
    slots = asyncio.Semaphore(concurrency)

    async def one(task: dict[str, Any]) -> dict[str, Any]:
        async with slots:
            gold, _, gold_info = await grade(task, task["patch"], factory)
            empty, _, _ = await grade(task, "", factory)
        return {"task_id": task["task_id"], "gold": gold, "empty": empty, "ok": gold == 1.0 and empty == 0.0,
                "gold_failed": gold_info["failed"], "error": gold_info.get("results_error")}

    return list(await asyncio.gather(*(one(t) for t in tasks)))

