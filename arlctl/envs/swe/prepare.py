"""`arlctl swe prepare`: give any SWE-bench-format row the probe form its grading needs to be trusted.

    prepared = await prepare_row(row, sandbox_factory)

For one row (FAIL_TO_PASS, PASS_TO_PASS, patch, test_patch, and a repo_snapshot, repo_path or image):
1. On the host, with git only (no code of the row runs): the pristine snapshot plus test_patch, and every
   file holding a FAIL_TO_PASS / PASS_TO_PASS test rewritten into probe form (probes.to_probe_form). The
   difference from the snapshot is `probe_patch`; the trusted demands of raise and tolerance checks stay
   here. A test some check of which cannot be converted is `unconvertible`, with the reason.
2. In fresh sandboxes of the row's own backend (bwrap, or a container of its image), the grading driver
   runs: the probe tests on the gold fix (its records become `probe_expected`, kept outside every
   sandbox), on the gold fix again and on the buggy code (the probe verdicts), and the original tests
   in-process on both (pytest's own verdicts, authenticated).
3. Test by test, the probe verdict must equal pytest's on the buggy and on the gold code; a second gold run
   that disagrees with the first (a value that changes between runs) shows up here too. A test where
   they disagree is `disagrees`; one pytest itself fails on the gold fix is `broken`.

The prepared row is the row with probe_patch, probe_expected and probe_tests (each graded test's id,
status and cause). The grader probe-grades it only when every graded test is `converted`; otherwise it
grades in-process and marks the verdict untrusted with the cause (grader.untrusted_cause).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arlctl.envs.swe.diffs import filter_diff, paths_in
from arlctl.envs.swe.grader import SandboxFactory, run_tests, score_report
from arlctl.envs.swe.probes import expected_from_gold, to_probe_form, verdicts
from arlctl.envs.swe.tasks import (
    BadTaskRow,
    check_task,
    prepare_snapshot,
    runner_graded,
    test_files,
    test_ids,
)
from arlctl.errors import TerminalError

PROBE_FIELDS = ("probe_patch", "probe_expected", "probe_tests")
PREPARE_VERSION = 1
_GIT_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_AUTHOR_NAME": "arlctl", "GIT_AUTHOR_EMAIL": "prepare@arlctl", "GIT_COMMITTER_NAME": "arlctl",
            "GIT_COMMITTER_EMAIL": "prepare@arlctl"}


RUNNER_ROW_CAUSE = ("the row's tests run under their own runner (eval_script / test_cmd); the probe form "
                    "covers pytest tests only")


@dataclass
class Prepared:
    """One row's outcome: the prepared row (None when it could not be prepared at all) and its tests."""

    task_id: str
    row: dict[str, Any] | None
    tests: list[dict[str, str]] = field(default_factory=list)  # {id, kind, status, cause}
    error: str = ""

    def count(self, status: str) -> int:
        return sum(t["status"] == status for t in self.tests)

    @property
    def usable_f2p(self) -> int:
        return sum(t["status"] == "converted" and t["kind"] == "FAIL_TO_PASS" for t in self.tests)

    @property
    def ok(self) -> bool:
        """Prepared with at least one FAIL_TO_PASS test graded by probes."""
        return self.row is not None and not self.error and self.usable_f2p > 0

    def to_json(self) -> dict[str, Any]:
        summary = {s: self.count(s) for s in ("converted", "unconvertible", "disagrees", "broken")}
        return {"task_id": self.task_id, "ok": self.ok, "error": self.error, "usable_f2p": self.usable_f2p,
                "probe_graded": bool(self.row) and all(t["status"] == "converted" for t in self.tests),
                **summary, "tests": self.tests}


def _git(work: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    cmd = ["git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "diff.renames=false",
           "-c", "safe.directory=*", "-C", str(work), *args]
    return subprocess.run(cmd, env=_GIT_ENV, input=stdin, capture_output=True, text=True)


def probe_patch_for(task: dict[str, Any], snapshot: str) -> tuple[str, dict[str, dict[str, Any]], dict[str, str]]:
    """(probe_patch, site demands, test id -> why it is unconvertible) for a row, made on the host.

    The patch takes the pristine snapshot to: test_patch applied, and every file holding a graded test in
    probe form. Only git and Python's parser touch the files; nothing of the row is run."""
    ids = test_ids(task, "FAIL_TO_PASS") + test_ids(task, "PASS_TO_PASS")
    with tempfile.TemporaryDirectory(prefix="arlctl-prepare-") as scratch:
        work = Path(scratch) / "repo"
        shutil.copytree(snapshot, work, symlinks=True)
        test_patch = task.get("test_patch") or ""
        if test_patch.strip():
            (Path(scratch) / "tests.diff").write_text(test_patch, encoding="utf-8")
            applied = _git(work, "apply", "--whitespace=nowarn", str(Path(scratch) / "tests.diff"))
            if applied.returncode != 0:
                raise BadTaskRow(f"swe task {task.get('task_id')!r}: test_patch does not apply to the snapshot: "
                                 f"{(applied.stderr or applied.stdout)[-300:]}")
        sites: dict[str, dict[str, Any]] = {}
        causes: dict[str, str] = {}
        for index, rel in enumerate(test_files(task)):
            target = work / rel
            in_file = [i for i in ids if i.split("::")[0] == rel]
            if target.is_symlink() or not target.is_file():
                causes.update(dict.fromkeys(in_file, f"{rel} is not a regular file after test_patch"))
                continue
            try:
                source = target.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                causes.update(dict.fromkeys(in_file, f"{rel} is not UTF-8"))
                continue
            form = to_probe_form(source, f"{index}.")
            if not form.source:
                causes.update(dict.fromkeys(in_file, form.issues["*"]))
                continue
            target.write_text(form.source, encoding="utf-8")
            sites.update(form.sites)
            for node in in_file:
                why = form.cause_for(node)
                if why:
                    causes[node] = why
        for step in (["add", "-A", "-f"], ["diff", "--cached", "--binary", "--no-renames"]):
            result = _git(work, *step)
            if result.returncode != 0:
                raise TerminalError(f"git {step[0]} failed while preparing {task.get('task_id')!r}: "
                                    f"{result.stderr[-300:]}")
        return result.stdout, sites, causes


def _passed(outcomes: dict[str, str]) -> dict[str, bool]:
    return {i: o == "passed" for i, o in outcomes.items()}


async def prepare_row(row: dict[str, Any], sandbox_factory: SandboxFactory, *, timeout: float = 120.0) -> Prepared:
    """Prepare one row (see the module docstring). A row that cannot be prepared at all (bad fields, a
    test_patch or gold patch that does not apply, a sandbox that gives no report) comes back with its
    error and no row; the caller reports it and exits non-zero."""
    task = {k: v for k, v in row.items() if k not in PROBE_FIELDS}  # any probe fields are rebuilt from scratch
    task_id = str(task.get("task_id") or task.get("instance_id") or "?")
    try:
        check_task(task)
        f2p, p2p = test_ids(task, "FAIL_TO_PASS"), test_ids(task, "PASS_TO_PASS")
        if runner_graded(task):  # kept as it is: graded from its runner's log, untrusted (grader.py)
            return Prepared(task_id, task, tests=[
                {"id": i, "kind": kind, "status": "unconvertible", "cause": RUNNER_ROW_CAUSE}
                for kind, ids in (("FAIL_TO_PASS", f2p), ("PASS_TO_PASS", p2p)) for i in ids])
        gold = filter_diff(task.get("patch") or "")
        if gold.tamper:
            return Prepared(task_id, None, error="the gold patch edits files the grader drops "
                            f"({', '.join(sorted({t.get('path', '?') for t in gold.tamper}))})")
        snapshot = await asyncio.to_thread(prepare_snapshot, task)
        probe_patch, sites, causes = await asyncio.to_thread(probe_patch_for, task, snapshot)
        if not paths_in(probe_patch):
            return Prepared(task_id, None, error="the probe form changes no file")
        probe_task = {**task, "probe_patch": probe_patch, "probe_expected": {}}
        gold_records, _ = await run_tests(probe_task, gold.diff, sandbox_factory, "probe", timeout=timeout)
        expected, problems = expected_from_gold(gold_records.get("results", ""), sites)
        probe_verdicts = {}
        for name, diff in (("gold", gold.diff), ("buggy", "")):
            report, _ = await run_tests(probe_task, diff, sandbox_factory, "probe", timeout=timeout)
            probe_verdicts[name] = _passed(verdicts(report.get("results", ""), expected, f2p + p2p)[0])
        runner = {}
        for name, diff in (("gold", gold.diff), ("buggy", "")):
            report, key = await run_tests(task, diff, sandbox_factory, "inprocess", timeout=timeout)
            _, _, info = score_report(task, report, key)
            if not info["records_authentic"]:
                raise TerminalError(f"the in-process run on the {name} code is not authentic: "
                                    f"{info.get('results_error') or info['harness_tamper'][:1]}")
            runner[name] = _passed(info["outcomes"])
    except (TerminalError, OSError) as err:
        return Prepared(task_id, None, error=str(err).splitlines()[0][:500])
    tests = []
    for kind, ids in (("FAIL_TO_PASS", f2p), ("PASS_TO_PASS", p2p)):
        for node in ids:
            status, cause = "converted", ""
            if node in causes:
                status, cause = "unconvertible", causes[node]
            elif not runner["gold"][node]:
                status, cause = "broken", "fails under pytest on the gold fix"
            elif kind == "PASS_TO_PASS" and not runner["buggy"][node]:
                status, cause = "broken", "a PASS_TO_PASS test that fails under pytest on the buggy code"
            elif problems.get(node) or problems.get("*"):
                status, cause = "disagrees", problems.get(node) or problems["*"]
            else:
                wrong = [name for name in ("buggy", "gold") if probe_verdicts[name][node] != runner[name][node]]
                if wrong:
                    status = "disagrees"
                    cause = "; ".join(f"on the {name} code pytest says "
                                      f"{'passed' if runner[name][node] else 'failed'}, the probes "
                                      f"{'passed' if probe_verdicts[name][node] else 'failed'}" for name in wrong)
            tests.append({"id": node, "kind": kind, "status": status, "cause": cause})
    graded = set(f2p + p2p)
    prepared = {**task, "probe_patch": probe_patch,
                "probe_expected": {k: v for k, v in expected.items() if k in graded},
                "probe_tests": tests, "probe_prepare_version": PREPARE_VERSION}
    return Prepared(task_id, prepared, tests)


async def prepare_rows(rows: list[dict[str, Any]], sandbox_factory: SandboxFactory, *, concurrency: int = 2,
                       timeout: float = 120.0, on_done: Any = None) -> list[Prepared]:
    """prepare_row over many rows, at most `concurrency` at once, in input order; on_done(Prepared) per row."""
    slots = asyncio.Semaphore(max(1, concurrency))

    async def one(row: dict[str, Any]) -> Prepared:
        async with slots:
            done = await prepare_row(row, sandbox_factory, timeout=timeout)
        if on_done is not None:
            on_done(done)
        return done

    return list(await asyncio.gather(*(one(r) for r in rows)))


def write_prepared(results: list[Prepared], out: Path) -> Path:
    """DIR/tasks.jsonl: every row that could be prepared (written atomically); returns its path."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    target = out / "tasks.jsonl"
    fd, tmp = tempfile.mkstemp(prefix=".tasks.", dir=out)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        for result in results:
            if result.row is not None:
                handle.write(json.dumps(result.row) + "\n")
    os.replace(tmp, target)
    return target
