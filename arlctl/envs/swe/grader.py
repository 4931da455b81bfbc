"""The swe reward: hidden tests run on the agent's diff in a fresh sandbox, in a way the diff cannot game.

    reward, components, info = await grade(task, diff, sandbox_factory)

1. Filter the diff (diffs.py): edits to tests, conftest.py, pytest configuration, import hooks, git
   metadata, binaries and symlinks are dropped and flagged as tamper in info; a diff git reads
   differently from us (a file patch smuggled inside a hunk) or cannot parse is rejected whole.
   Then scan what the diff adds to Python files (scan.py) for code that reaches the interpreter or the
   harness: any finding is tamper and scores 0 without running anything.
2. Start a FRESH sandbox on the task's pristine snapshot; no model code has run in it. An image task
   (SWE-bench image) is graded in a fresh container of its own image, the pristine one-commit export
   of its repo_dir mounted over that directory (docker only; see tasks.py).
3. Inside it, the driver (harness/driver.py) applies the diff, restores the test files test_patch
   touches and applies test_patch (the hidden tests), hashes the expected test files, and runs pytest
   with --noconftest, -c /dev/null (repo config ignored), -p no:cacheprovider, plugin autoload off and
   -P (cwd not on sys.path first), with the harness plugin (harness/plugin.py) and results written
   outside the repository.
4. Probe mode (every task with `probe_patch` and `probe_expected`: the built-in suite). The tests run
   in their probe form, which holds no expected values; the tested process only records what each check
   would have compared (harness/probe.py) and the host compares those records with `probe_expected`,
   which never enters the sandbox (probes.py). Nothing the tested process does can forge the verdict:
   it can only write values, and it cannot see which values pass. pytest's own outcome is not used.
5. In-process mode (SWE-bench rows, image tasks: the tests must run as they are). The plugin
   authenticates every record with a per-run secret handed over through a pipe; the host
   verifies each HMAC, the unbroken sequence, the final session record, the pytest exit code (which must
   agree with the session record) and the absence of tamper records (patched pytest/unittest/builtins,
   changed test files).

6. In-process mode also runs pytest with -rA and brings back the log's status lines: reward_info.swebench
   holds SWE-bench's official verdict computed from that log and from the signed outcomes by the
   swebench package's own parsers and report functions (official.py), and reward_info.log_disagrees flags a log that says otherwise. The log is never
   the authority: the tested process writes it, and code under test can print "PASSED <id>" lines.

reward_info.trusted says where the verdict was computed: True on the host, out of the policy's reach (probe
mode, whatever the run did, and a 0 given without running the diff: scan tamper, a truncated diff); False
for every in-process verdict, with untrusted_cause (records_authentic keeps whether its records were
genuine). `arlctl filter` drops trusted: false rows unless --keep-untrusted.

reward = 1 only if every FAIL_TO_PASS and PASS_TO_PASS id passed (in probe mode: recorded exactly its
expected checks; in-process: setup, call and teardown passed, and pytest exited 0, or 1 because some
other test failed, which SWE-bench ignores too) and nothing was tampered with; ids missing from the
results count as failed. XFAIL and SKIPPED are not passes here (SWE-bench counts XFAIL, and a skipped
PASS_TO_PASS test): the policy's code can produce both with pytest.xfail() / pytest.skip(). Components: f2p (fraction of FAIL_TO_PASS
passed), p2p, tests_passed. Residual risk of in-process mode, stated plainly: the model's code shares the
pytest process, so code written against this harness can reach the plugin's state; the scan of step 1
and the audit hook make that hard, but only probe mode makes it impossible. docs/security.md has the
whole threat model.
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

from arlctl.envs.swe import official
from arlctl.envs.swe.diffs import filter_diff, paths_in
from arlctl.envs.swe.env import diff_truncation
from arlctl.envs.swe.official import cross_check
from arlctl.envs.swe.probes import PROBE_MODULE, verdicts
from arlctl.envs.swe.scan import scan_diff
from arlctl.envs.swe.tasks import (
    Hosts,
    check_task,
    image_of,
    prepare_snapshot,
    runner_graded,
    sandbox_options,
    test_files,
    test_ids,
)
from arlctl.errors import UsageError
from arlctl.sandbox.base import Sandbox
from arlctl.sandbox.scrub import scrub_log

# 2: pytest exit code 1 (a test outside both lists failed) scores, as in SWE-bench; 3: reward_info.trusted says
# only where the verdict was computed (True: on the host, out of the policy's reach; False: in-process)
REWARD_VERSION = "swe-3"
HARNESS_DIR = Path(__file__).with_name("harness")
# snapshot directory (+ the task's backend options, image tasks only) -> a started sandbox
SandboxFactory = Callable[..., Awaitable[Sandbox]]


def _pytest_args(task: dict[str, Any], workdir: str, mode: str) -> list[str]:
    # In-process mode adds -rA: the short summary SWE-bench's harness grades, for the log cross-check.
    summary = ["-rA"] if mode == "inprocess" else []
    return [*test_files(task), "-p", "no:cacheprovider", "--noconftest", "-c", "/dev/null", "--rootdir",
            workdir, "--import-mode=append", "-q", *summary, "--tb=short", "-o", "console_output_style=classic"]


def grading_mode(task: dict[str, Any]) -> str:
    """probe: the verdict is computed on the host from recorded values; inprocess: pytest's, authenticated;
    runner: read by the swebench package's parser from the log of the row's own test runner (tasks.runner_graded).

    A row is probe-graded when it has its probe form and every FAIL_TO_PASS / PASS_TO_PASS test is in it
    (`arlctl swe prepare` lists each test's status in `probe_tests`; the built-in suite has no such list:
    its every test is converted at build time). Otherwise it is graded in-process, untrusted."""
    if runner_graded(task):
        return "runner"
    return "probe" if task.get("probe_patch") and task.get("probe_expected") and not _unusable(task) else "inprocess"


def _unusable(task: dict[str, Any]) -> list[str]:
    """The graded tests `probe_tests` does not list as converted (empty for a row without the list)."""
    listed = task.get("probe_tests")
    if listed is None:
        return []
    usable = {t.get("id") for t in listed if isinstance(t, dict) and t.get("status") == "converted"} \
        if isinstance(listed, list) else set()
    return [i for i in test_ids(task, "FAIL_TO_PASS") + test_ids(task, "PASS_TO_PASS") if i not in usable]


RUNNER_CAUSE = ("runner grading: the verdict is read from the test runner's log, and the tested process writes "
                "that log (it can print any status line)")


def untrusted_cause(task: dict[str, Any]) -> str:
    """Why an in-process (or runner) verdict of this row is not trusted: the tested process could have forged it."""
    if grading_mode(task) == "runner":
        return RUNNER_CAUSE
    unusable = _unusable(task)
    if unusable:
        causes = {t.get("id"): t.get("cause") for t in task.get("probe_tests") or [] if isinstance(t, dict)}
        first = unusable[0]
        return (f"in-process grading: {len(unusable)} graded test(s) have no probe form, e.g. {first} "
                f"({causes.get(first) or 'not listed'}); the tested process can forge pytest's verdict")
    return ("in-process grading: the row is not prepared (no probe form; run `arlctl swe prepare`), "
            "so the tested process can forge pytest's verdict")


def _bundle(task: dict[str, Any], diff: str, workdir: str, key: str, marker: str, timeout: float,
            allow_subprocess: bool, mode: str | None = None) -> dict[str, Any]:
    nonce = secrets.token_hex(8)
    mode = mode or grading_mode(task)
    if mode == "runner":
        script, driver_applies = official.eval_script(task, workdir, bool(image_of(task)))
        test_patch = (task.get("test_patch") or "") if driver_applies else ""
        return {"mode": mode, "workdir": workdir, "harness_dir": f"/tmp/arlctl-grade-{nonce}", "diff": diff,
                "script": script, "test_patch": test_patch, "test_paths": paths_in(task.get("test_patch") or ""),
                "marker": marker, "timeout": timeout}
    if mode == "probe":  # the probe files import the recorder by its fixed name
        test_patch, module, plugin = task["probe_patch"], PROBE_MODULE, "probe.py"
    else:
        test_patch, module, plugin = task.get("test_patch") or "", f"arlctl_grade_{nonce}", "plugin.py"
    return {
        "mode": mode, "workdir": workdir, "harness_dir": f"/tmp/arlctl-grade-{nonce}", "plugin_module": module,
        "plugin_source": (HARNESS_DIR / plugin).read_text(encoding="utf-8"), "diff": diff,
        "test_patch": test_patch, "test_paths": paths_in(test_patch), "test_files": test_files(task),
        "pytest_args": _pytest_args(task, workdir, mode), "key": key, "marker": marker, "timeout": timeout,
        "allow_subprocess": allow_subprocess, "capture_log": mode == "inprocess",
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
    """nodeid -> passed | failed | error | skipped | xfail | xpass. Passed needs a passed call and no bad
    phase; xpass is a non-strict xfail test that passed (SWE-bench has no status for it)."""
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
        elif seen.get("call") == "xpass":
            outcome[nodeid] = "xpass"
        else:
            outcome[nodeid] = "error"  # never reached its call phase
    return outcome


def score_report(task: dict[str, Any], report: dict[str, Any], key: bytes) -> tuple[float, dict, dict]:
    """Turn the driver's report into (reward, components, info)."""
    f2p, p2p = test_ids(task, "FAIL_TO_PASS"), test_ids(task, "PASS_TO_PASS")
    info: dict[str, Any] = {"mode": "inprocess", "apply_ok": report.get("apply_ok", False),
                            "exit_code": report.get("exit_code"),
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
    # Authentic: the run finished, every record is authentic and pytest's exit code matches its own report.
    # Never trusted even so: the policy's code shares the pytest process (see untrusted_cause).
    trusted = (info["apply_ok"] and not info.get("results_error") and not info["harness_tamper"]
               and not info["timed_out"] and session is not None)
    f2p_frac = sum(outcomes.get(i) == "passed" for i in f2p) / max(len(f2p), 1)
    p2p_frac = sum(outcomes.get(i) == "passed" for i in p2p) / max(len(p2p), 1)
    if not trusted:  # nothing from a run that was tampered with or did not finish is believed
        f2p_frac = p2p_frac = 0.0
    # Exit code 1 (some test outside FAIL_TO_PASS / PASS_TO_PASS failed) is fine, as in SWE-bench; any other
    # non-zero code (interrupted, internal or usage error) is a run that did not go as pytest reported.
    reward = 1.0 if trusted and report.get("exit_code") in (0, 1) and not failed and f2p else 0.0
    info.update(trusted=False, records_authentic=bool(trusted), untrusted_cause=untrusted_cause(task),
                passed=passed, failed=failed, missing=sorted(i for i in f2p + p2p if i not in outcomes),
                outcomes={i: outcomes.get(i, "missing") for i in f2p + p2p})
    components = {"f2p": f2p_frac, "p2p": p2p_frac, "tests_passed": reward}
    return reward, components, info


def score_probes(task: dict[str, Any], report: dict[str, Any]) -> tuple[float, dict, dict]:
    """Probe mode: compare the recorded checks with the expected ones, here, outside the sandbox."""
    f2p, p2p = test_ids(task, "FAIL_TO_PASS"), test_ids(task, "PASS_TO_PASS")
    outcomes, details = verdicts(report.get("results", ""), task["probe_expected"], f2p + p2p)
    info: dict[str, Any] = {"mode": "probe", "apply_ok": report.get("apply_ok", False),
                            "exit_code": report.get("exit_code"), "timed_out": report.get("timed_out", False),
                            "harness_tamper": [], **details}
    ran = bool(info["apply_ok"]) and not report.get("harness_error")
    passed = sorted(i for i in f2p + p2p if outcomes.get(i) == "passed")
    failed = sorted(i for i in f2p + p2p if outcomes.get(i) != "passed")
    f2p_frac = sum(outcomes.get(i) == "passed" for i in f2p) / max(len(f2p), 1) if ran else 0.0
    p2p_frac = sum(outcomes.get(i) == "passed" for i in p2p) / max(len(p2p), 1) if ran else 0.0
    reward = 1.0 if ran and not failed and f2p else 0.0
    # Trusted whatever the run did: the verdict (a 0 for a diff that does not apply too) is computed here.
    info.update(trusted=True, passed=passed, failed=failed,
                missing=sorted(i for i in f2p + p2p if outcomes.get(i) == "missing"), outcomes=outcomes)
    return reward, {"f2p": f2p_frac, "p2p": p2p_frac, "tests_passed": reward}, info


def score_runner(task: dict[str, Any], report: dict[str, Any]) -> tuple[float, dict, dict]:
    """Runner mode: the swebench package grades the eval script's log (official.official_report), as its own
    harness does. Never trusted: the log is the tested process's output."""
    f2p, p2p = test_ids(task, "FAIL_TO_PASS"), test_ids(task, "PASS_TO_PASS")
    log = report.get("runner_log") or ""
    verdict = official.official_report(task, log, f2p, p2p, framed=True)
    verdict["log_truncated"] = bool(report.get("runner_log_truncated"))
    statuses = verdict.get("statuses") or {}
    ran = bool(report.get("apply_ok")) and not report.get("timed_out") and not report.get("harness_error")
    outcomes = {i: (statuses[i].lower() if i in statuses else "missing") for i in f2p + p2p}
    success = verdict.get("tests_status") or {}
    f2p_ok = len((success.get("FAIL_TO_PASS") or {}).get("success", [])) if ran else 0
    p2p_ok = len((success.get("PASS_TO_PASS") or {}).get("success", [])) if ran else 0
    reward = 1.0 if ran and verdict.get("resolved") else 0.0
    info: dict[str, Any] = {
        "mode": "runner", "apply_ok": report.get("apply_ok", False), "exit_code": report.get("exit_code"),
        "timed_out": report.get("timed_out", False), "harness_tamper": [], "trusted": False,
        "untrusted_cause": RUNNER_CAUSE, "swebench": verdict, "log_disagrees": None,
        "passed": sorted(i for i in f2p + p2p if outcomes[i] == "passed"),
        "failed": sorted(i for i in f2p + p2p if outcomes[i] != "passed"),
        "missing": sorted(i for i in f2p + p2p if outcomes[i] == "missing"), "outcomes": outcomes}
    components = {"f2p": f2p_ok / max(len(f2p), 1), "p2p": p2p_ok / max(len(p2p), 1), "tests_passed": reward}
    return reward, components, info


def _swebench_verdicts(task: dict[str, Any], report: dict[str, Any], key: bytes, trusted: bool) -> dict[str, Any]:
    """SWE-bench's official verdict (the swebench package's own functions, official.py) from the signed
    outcomes and from pytest's -rA log.

    For comparison only: the log is written by the process that runs the policy's code, which can print
    any "PASSED <id>" line it likes, so the reward never reads it. An untrusted run's outcomes are not
    believed here either."""
    records, _ = verify_records(report.get("results", ""), key)
    outcomes = outcomes_from(records) if trusted else {}
    check = cross_check(task, outcomes, report.get("status_lines") or "", test_ids(task, "FAIL_TO_PASS"),
                        test_ids(task, "PASS_TO_PASS"), exit_code=report.get("exit_code"))
    check["log_truncated"] = bool(report.get("status_lines_truncated"))
    return check


def _not_run(task: dict[str, Any], started: float, tamper: list, kept: list, why: str,
             **extra: Any) -> tuple[float, dict[str, float], dict[str, Any]]:
    """A 0 for a diff that is not run at all (flagged by the scan, or cut short), with the reason. Trusted in
    either mode: the verdict is the host's, and none of the policy's code ran."""
    f2p, p2p = test_ids(task, "FAIL_TO_PASS"), test_ids(task, "PASS_TO_PASS")
    info = {"mode": grading_mode(task), "trusted": True, "apply_ok": False, "passed": [],
            "failed": sorted(f2p + p2p), "missing": [], "harness_tamper": [], "tamper": tamper, "kept_files": kept,
            "results_error": why, "grade_seconds": round(time.monotonic() - started, 3),
            "reward_version": REWARD_VERSION, **extra}
    return 0.0, {"f2p": 0.0, "p2p": 0.0, "tests_passed": 0.0}, info


def _scan_tamper(filtered: Any, snapshot: str) -> list[dict[str, str]]:
    return [finding.as_tamper() for finding in scan_diff(filtered.diff, snapshot, filtered.sections)]


async def grade(task: dict[str, Any], diff: str, sandbox_factory: SandboxFactory, *, timeout: float = 120.0,
                allow_subprocess: bool = False, scan: bool = True, keep_log: bool = False,
                docker_hosts: Hosts = None) -> tuple[float | None, dict[str, float], dict[str, Any]]:
    """Grade one diff against the task's hidden tests in a fresh sandbox from `sandbox_factory`.

    For an image task the factory is called as `factory(snapshot, image=..., workdir=..., env=...)`
    (a docker factory: `sandbox_factory("docker")`; `docker_hosts`, the engines it places sandboxes on, is
    where the image is looked up). scan=False skips the static scan (tests use it to
    show that probe mode holds on its own); keep_log=True puts a runner-mode row's whole eval log in
    info["runner_log"] (left out otherwise: it can be 600 KB). The reward is None, with info["error"] and info["infra"], when
    the tests could not run at all (no report from the sandbox, pytest missing or not starting, the
    hidden tests not applying): an infrastructure failure is never a 0 for the policy."""
    started = time.monotonic()
    check_task(task)  # a bad row (FAIL_TO_PASS not JSON, ...) is a BadTaskRow naming it: null, not 0
    cut = diff_truncation(diff)
    if cut is not None:  # a cut diff is not the agent's change: not applied, scored 0 (the policy's doing)
        return _not_run(task, started, [], [], f"diff truncated: kept {cut[0]} of {cut[1] or 'unknown'} bytes; "
                        "not graded", truncated=True, kept_bytes=cut[0], diff_bytes=cut[1])
    filtered = filter_diff(diff or "")
    key, marker = secrets.token_bytes(32), f"@@arlctl-grade-{secrets.token_hex(16)}@@"
    snapshot = prepare_snapshot(task, docker_hosts)
    scan_tamper = _scan_tamper(filtered, snapshot) if scan else []
    if scan_tamper:  # flagged code is never run: reward 0, and the reason
        return _not_run(task, started, filtered.tamper + scan_tamper, filtered.kept,
                        f"tamper: {scan_tamper[0]['reason']} ({scan_tamper[0]['detail']})")
    report, result, workdir, lines = await _drive(task, filtered.diff, snapshot, sandbox_factory, key, marker,
                                                  timeout, allow_subprocess, docker_hosts=docker_hosts)
    if grading_mode(task) == "probe":
        reward, components, info = score_probes(task, report)
    elif grading_mode(task) == "runner":
        reward, components, info = score_runner(task, report)
        if keep_log:
            info["runner_log"] = report.get("runner_log") or ""
    else:
        reward, components, info = score_report(task, report, key)
        if "status_lines" in report:
            info["swebench"] = _swebench_verdicts(task, report, key, info["records_authentic"])
            info["log_disagrees"] = None if "error" in info["swebench"] else not info["swebench"]["agree"]
    if not lines:
        info["results_error"] = ("grading driver produced no report (exit "
                                 f"{result.exit_code}): {scrub_log(result.stderr, workdir, 500)}")
    info.update(tamper=filtered.tamper, kept_files=filtered.kept,
                apply_error=scrub_log(report.get("apply_error", ""), workdir),
                harness_error=scrub_log(report.get("harness_error", ""), workdir),
                log_tail=scrub_log(report.get("log_tail", ""), workdir),
                grade_seconds=round(time.monotonic() - started, 3), reward_version=REWARD_VERSION)
    infra = _infra_failure(report, info, bool(lines))
    if infra:  # the tests could not run: no verdict at all, never a 0 that enters a GRPO group
        info.update(error=infra, infra=True)
        return None, components, info
    return reward, components, info


async def _drive(task: dict[str, Any], diff: str, snapshot: str, sandbox_factory: SandboxFactory, key: bytes,
                 marker: str, timeout: float, allow_subprocess: bool, mode: str | None = None,
                 docker_hosts: Hosts = None) -> tuple[dict[str, Any], Any, str, list[str]]:
    """Run the grading driver on `diff` in a fresh sandbox: (report, exec result, workdir, marker lines)."""
    options = sandbox_options(task, "docker", docker_hosts) if image_of(task) else {}
    sandbox = await (sandbox_factory(snapshot, **options) if options else sandbox_factory(snapshot))
    try:
        bundle = _bundle(task, diff, sandbox.workdir, key.hex(), marker, timeout, allow_subprocess, mode)
        driver = (HARNESS_DIR / "driver.py").read_text(encoding="utf-8")
        command = ["python3", "-I", "-c", driver]
        entered = official.activation(task, bool(image_of(task))) if (mode or grading_mode(task)) != "runner" else ""
        if entered.strip():  # pytest runs in the row's test environment (runner mode's script activates it itself)
            script = "\n".join([*official.guarded(entered), 'exec python3 -I -c "$1"'])
            command = ["bash", "-c", script, "arlctl-grade", driver]
        result = await sandbox.exec(command, timeout=timeout + 60,
                                    stdin=json.dumps(bundle).encode())
    finally:
        await sandbox.close()
    report: dict[str, Any] = {"apply_ok": False, "results": ""}
    lines = [line for line in result.stdout.splitlines() if line.startswith(marker)]
    if lines:
        try:
            report = json.loads(lines[-1][len(marker) :])
        except ValueError:  # cut at the sandbox's output cap: no report, so no verdict (below)
            lines = []
    return report, result, sandbox.workdir, lines


async def run_tests(task: dict[str, Any], diff: str, sandbox_factory: SandboxFactory, mode: str, *,
                    timeout: float = 120.0) -> tuple[dict[str, Any], bytes]:
    """One driver run for `arlctl swe prepare`: the (trusted, not model-written) `diff` under the row's
    tests in `mode` (probe: task["probe_patch"]'s probe form; inprocess: test_patch as it is).

    Returns (report, key); raises TerminalError when the driver gave no report or could not run the tests."""
    from arlctl.errors import TerminalError

    check_task(task)
    key, marker = secrets.token_bytes(32), f"@@arlctl-grade-{secrets.token_hex(16)}@@"
    snapshot = prepare_snapshot(task)
    report, result, workdir, lines = await _drive(task, diff, snapshot, sandbox_factory, key, marker, timeout,
                                                  False, mode)
    if not lines:
        raise TerminalError(f"grading driver produced no report (exit {result.exit_code}): "
                            f"{scrub_log(result.stderr, workdir, 500)}")
    why = report.get("harness_error") or ("" if report.get("apply_ok") else
                                          f"the patch does not apply: {report.get('apply_error', '')[-300:]}")
    if why or report.get("timed_out") or report.get("started") is False:
        raise TerminalError(f"{mode} run of {task.get('instance_id') or task.get('task_id')}: "
                            f"{scrub_log(why, workdir, 500) or 'pytest timed out or did not start'}; "
                            f"log: {scrub_log(report.get('log_tail', ''), workdir, 300)}")
    return report, key


def _infra_failure(report: dict[str, Any], info: dict[str, Any], reported: bool) -> str:
    """Why the grader could not run the tests (an infrastructure failure, not the policy's), or ''."""
    if not reported:
        return str(info.get("results_error") or "grading driver produced no report")
    if report.get("infra"):
        return str(info["harness_error"] or "the grading harness failed")
    if info.get("mode") == "runner" and report.get("apply_ok") and not report.get("timed_out") \
            and official.START not in (report.get("runner_log") or ""):
        # Activation, the test files' reset and test_patch come before the marker, and none runs model code.
        return f"the eval script stopped before its tests started (exit {report.get('exit_code')}): " \
               f"{info['log_tail'][-300:]}"
    # The driver's own pipe says whether pytest reached configure, which is before any model code runs.
    if report.get("apply_ok") and report.get("exit_code") is not None and report.get("started") is False:
        return f"pytest did not start (exit {report.get('exit_code')}): {info['log_tail'][-300:]}"
    return ""


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
                allow_subprocess: bool = False, image: str | None = None, docker_hosts: Hosts = None
                ) -> tuple[float | None, dict[str, float], dict[str, Any]]:
    """The registered `--reward swe` function: final_state is the agent's diff.

    sandbox: the grading backend; by default bwrap, and docker for image tasks (which refuse others).
    image: with sandbox=docker, the image snapshot tasks are graded in (one holding the interpreter and
    packages the tests need; default the base image). docker_hosts: the engines grading sandboxes are placed
    on (as the docker backend's option; default $ARLCTL_DOCKER_HOSTS), where task images are looked up too."""
    kind = sandbox or ("docker" if image_of(task) else "bwrap")
    if docker_hosts and kind != "docker":
        raise UsageError(f"docker_hosts needs sandbox=docker, not {kind}", hint="--reward-opt sandbox=docker")
    sandbox_options(task, kind, docker_hosts)  # an image task on bwrap/subprocess: a UsageError that says so
    if image and kind != "docker":
        raise UsageError(f"a grading image needs sandbox=docker, not {kind}", hint="--reward-opt sandbox=docker")
    limits: dict[str, Any] = {"insecure": True} if insecure_sandbox else {}
    if image and not image_of(task):
        limits["image"] = image
    if docker_hosts:
        limits["docker_hosts"] = docker_hosts
    return await grade(task, final_state or "", sandbox_factory(kind, **limits), timeout=timeout,
                       allow_subprocess=allow_subprocess, docker_hosts=docker_hosts)


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

