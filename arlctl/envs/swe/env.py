"""The swe environment: fix a bug in a repository inside a sandbox; graded later by hidden tests.

Two action styles:
  mode="tools" (default)  OpenAI function tools, hermes <tool_call> blocks: bash, view_file, edit_file,
                          create_file, run_tests, submit.
  mode="text"             mini-swe-agent style: exactly one ```bash block per turn; the command
                          `echo SUBMIT` (or `submit`) ends the episode.
The workspace is the task's one-commit snapshot (tasks.prepare_snapshot) in a sandbox leased from a warm
pool (SweEnvFactory holds the pools of one run, shared by its envs); for an image task (docker only) the
sandbox runs the task's image with the snapshot mounted over its repo_dir. `env_info()` says where
(the row's env_info: bwrap host, or docker engine and container). Tool failures are
observations, never exceptions. On submit (and from `final_state()` when the loop ends otherwise) the
episode's artifact is the diff of the workspace against the snapshot's commit, new files included,
computed with a private git index so the agent's .git edits cannot hide it. A diff over `max_diff_bytes`
is cut at a line, starts with the DIFF_TRUNCATED marker line, and `final_state_truncated` says why: the
rollout records such a row as status `truncated`, and `diff_truncation()` lets the grader refuse to score
a partial patch.

Step rewards (process rewards, `filter --adv turn`): a turn that calls run_tests gets reward_step = the
share of the visible test suite (VISIBLE_TESTS) passing after its last such call, read from pytest's
summary line (passed / (passed + failed + errors)); a call that ran only part of the suite is followed by
a run of the whole suite, so narrowing the path cannot raise the share. Visible tests that differ from the
snapshot's (edited, added, deleted: checked with a private git index, as the diff is) give 0.0: the prompt
forbids editing them. A run with no summary (a timeout, a suite that did not run) gives no step reward
(null). Step rewards only shape credit between turns; the hidden tests alone decide the outcome.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import shlex
from typing import Any

from arlctl.envs.base import Action, EnvFailure, EnvReset, StepResult
from arlctl.envs.swe.sandboxes import Lease, PoolProvider, Provider
from arlctl.envs.swe.tasks import ENV_NAME, prepare_snapshot, sandbox_options
from arlctl.envs.swe.tools import HANDLERS
from arlctl.errors import TerminalError, UsageError
from arlctl.sandbox.base import SandboxError, placement_of
from arlctl.tools.bash_blocks import parse_bash_blocks
from arlctl.tools.calls import ToolCall
from arlctl.tools.hermes import parse_hermes
from arlctl.tools.render import format_parse_error, format_tool_result

ENV_VERSION = "swe-1"
SUBMIT_COMMANDS = {"echo SUBMIT", "submit", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}
TRUNCATION_MARKER = "\n[... output truncated: {omitted} characters omitted ...]\n"
MAX_DIFF_BYTES = 1 << 20  # the sandboxes' default output cap per stream
# First line of a diff that was cut; git would skip it as commentary, so the grader must check for it.
DIFF_TRUNCATED = "# arlctl: diff truncated: kept {kept} of {size} bytes\n"
_DIFF_TRUNCATED_RE = re.compile(r"# arlctl: diff truncated: kept (\d+) of (\d+|unknown) bytes\n")
_DIFF_SIZE_RE = re.compile(r"arlctl-diff-bytes:\s*(\d+)")
VISIBLE_TESTS = "tests"  # the visible suite: what run_tests runs by default
# pytest's closing summary, e.g. "1 failed, 2 passed in 0.05s" (-q) or "==== 3 passed in 0.02s ====".
_SUMMARY_RE = re.compile(r"^=*\s*(\d+ [a-z]+(?:, \d+ [a-z]+)*) in [\d.]+s\b")
_COUNT_RE = re.compile(r"(\d+) ([a-z]+)")


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


_STR = {"type": "string"}
TOOLS = [
    _fn("bash", "Run a shell command in the repository root; returns exit code and output.",
        {"command": {**_STR, "description": "the command"}}, ["command"]),
    _fn("view_file", "Show a file with line numbers, optionally only lines start_line..end_line.",
        {"path": _STR, "start_line": {"type": "integer"}, "end_line": {"type": "integer"}}, ["path"]),
    _fn("edit_file", "Replace the exact text `old` (which must occur exactly once) with `new` in a file.",
        {"path": _STR, "old": _STR, "new": _STR}, ["path", "old", "new"]),
    _fn("create_file", "Create or overwrite a file with the given content.",
        {"path": _STR, "content": _STR}, ["path", "content"]),
    _fn("run_tests", "Run the repository's visible tests with pytest (optionally one file or test id).",
        {"path": {**_STR, "description": "e.g. tests/test_x.py; default: tests"}}, []),
    _fn("submit", "Finish: submit the current state of the repository as your fix.", {}, []),
]

SYSTEM_TOOLS = """You are a software engineer fixing a bug in a Python repository.
The repository is checked out in the current directory ({workdir}). Investigate with the tools, make the
smallest change to the source code that fixes the issue, run the tests, then call submit. Do not edit
the tests: hidden tests decide whether the issue is fixed."""

SYSTEM_TEXT = """You are a software engineer fixing a bug in a Python repository, checked out in {workdir}.
Each reply must contain exactly one ```bash block with one command; you will see its output. Investigate,
make the smallest change to the source code that fixes the issue (e.g. with sed or python), run the tests
with `python -m pytest -q tests`, and when done reply with the command `echo SUBMIT`. Do not edit the
tests: hidden tests decide whether the issue is fixed."""

USER_TEMPLATE = """Repository: {repo} (task {instance_id})

<issue>
{problem}
</issue>"""


class SweEnv:
    """One episode of one swe task over one leased sandbox. The loop builds one per trajectory.

    Its sandboxes come from `provider` (a run's SweEnvFactory passes its shared one); an env made on
    its own (`make_env("swe")`) leases from a private one-sandbox provider and closes it in close().
    """

    name = ENV_NAME
    version = ENV_VERSION

    def __init__(self, mode: str = "tools", sandbox: str = "bwrap", sandboxes: int = 8,
                 provider: Provider | None = None, command_timeout: float = 20.0, max_output_chars: int = 8000,
                 max_calls_per_turn: int = 8, insecure_sandbox: bool = False,
                 max_diff_bytes: int = MAX_DIFF_BYTES, **limits: Any):
        if mode not in ("tools", "text"):
            raise UsageError(f"swe mode must be 'tools' or 'text', got {mode!r}")
        self.mode, self.kind, self.sandboxes = mode, sandbox, sandboxes
        self.provider, self.insecure, self.limits = provider, insecure_sandbox, limits
        self.command_timeout, self.max_output_chars = command_timeout, max_output_chars
        self.max_calls_per_turn = max_calls_per_turn
        self.max_diff_bytes = max_diff_bytes
        self.final_state_truncated: str | None = None  # why the last final_state() was cut, if it was
        self.tools = list(TOOLS) if mode == "tools" else []
        self.tool_format = "hermes" if mode == "tools" else "bash"
        self.task: dict[str, Any] | None = None
        self.lease: Lease | None = None
        self.placement: dict[str, Any] | None = None  # where this episode's sandbox runs (env_info)
        self.base_commit = ""
        self._private: PoolProvider | None = None  # made when no provider was given; closed by close()

    def new_provider(self, sandboxes: int | None = None) -> PoolProvider:
        """A provider of this env's sandbox kind and limits (`sandboxes` held at once; default: its own)."""
        return PoolProvider(self.kind, sandboxes=sandboxes or self.sandboxes, insecure=self.insecure, **self.limits)

    # ---- the Env protocol ---------------------------------------------------------------------------

    def parse_action(self, text: str) -> Action:
        if self.mode == "text":
            calls, errors = parse_bash_blocks(text)
        else:
            calls, errors = parse_hermes(text, self.tools)
        return Action(text=text, tool_calls=calls, parse_errors=errors)

    async def reset(self, task: dict[str, Any]) -> EnvReset:
        if not isinstance(task.get("problem_statement"), str):
            raise TerminalError(f"swe task {task.get('task_id')!r} has no problem_statement")
        await self._release()
        self.final_state_truncated, self.placement = None, None
        # Image tasks (SWE-bench images) need the docker backend; this refuses them elsewhere, clearly.
        hosts = self.limits.get("docker_hosts")  # the engines the sandboxes go to: the image is looked up there
        options = await asyncio.to_thread(sandbox_options, task, self.kind, hosts)
        snapshot = await asyncio.to_thread(prepare_snapshot, task, hosts)
        provider = self.provider or self._private_provider()
        self.lease = await (provider.acquire(snapshot, options) if options else provider.acquire(snapshot))
        self.placement = placement_of(self.sandbox)
        moves = list(getattr(self.lease, "moves", None) or [])
        if moves:  # the pool gave up sandboxes (a dead engine, a failed health check) before this one
            self.placement["replaced_from"] = moves
        self.task = task
        head = await self.sandbox.exec(_git("rev-parse HEAD"), timeout=self.command_timeout)
        self.base_commit = head.stdout.strip() or "HEAD"
        workdir = self.sandbox.workdir
        system = (SYSTEM_TOOLS if self.mode == "tools" else SYSTEM_TEXT).format(workdir=workdir)
        user = USER_TEMPLATE.format(repo=task.get("repo", ""), instance_id=task.get("instance_id", task["task_id"]),
                                    problem=task["problem_statement"].strip())
        return EnvReset(messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
                        tools=list(self.tools))

    async def step(self, action: Action) -> StepResult:
        if self.lease is None:
            raise TerminalError("SweEnv.step called before reset")
        if not action.tool_calls and not action.parse_errors:
            action = self.parse_action(action.text)
        role = "tool" if self.mode == "tools" else "user"
        observations, errors = [], []
        step_reward: float | None = None  # set by run_tests calls (see the module docstring)
        for parse_error in action.parse_errors:
            observations.append({**format_parse_error(parse_error), "role": role})
            errors.append(parse_error.message)
        for index, call in enumerate(action.tool_calls):
            if self._is_submit(call):
                return StepResult(observations=observations, done=True, final_state=await self.final_state(),
                                  finish_reason="submit", error="; ".join(errors) or None, reward_step=step_reward)
            if index >= self.max_calls_per_turn:
                content = f"error: at most {self.max_calls_per_turn} tool calls per turn; this call was skipped"
            else:
                content = await self._run_tool(call)
                if call.name == "run_tests" and not content.startswith("error:"):
                    step_reward = await self._visible_share(call, content)
            if content.startswith("error:"):
                errors.append(content.splitlines()[0])
            message = format_tool_result(call, content)
            observations.append(message if self.mode == "tools" else {"role": "user", "content": content})
        if not observations:
            hint = "call a tool, or submit" if self.mode == "tools" else "reply with one ```bash block"
            observations.append({"role": "user", "content": f"No action found: {hint}."})
        return StepResult(observations=observations, done=False, error="; ".join(errors) or None,
                          reward_step=step_reward)

    def env_info(self) -> dict[str, Any] | None:
        """Where this episode ran (the row's env_info): its sandbox's placement (bwrap: host; docker:
        engine and container), `replaced_from` when the pool moved it off failed sandboxes first, and
        `taint_reason` when the sandbox broke under the episode (its engine died, say). None before a
        sandbox was leased. Kept after close(), so it can still be read for the row."""
        self._note_taint()
        return None if self.placement is None else dict(self.placement)

    def _note_taint(self) -> None:
        if self.lease is not None and self.placement is not None and self.lease.sandbox.tainted:
            self.placement["taint_reason"] = self.lease.sandbox.taint_reason or "tainted"

    async def close(self) -> None:
        await self._release()
        self.task = None
        private, self._private = self._private, None
        if private is not None:
            await private.close()

    # ---- the artifact -------------------------------------------------------------------------------

    async def final_state(self) -> str:
        """The diff of the workspace against the snapshot commit, new files included.

        Over max_diff_bytes it is cut at a line and flagged (DIFF_TRUNCATED first line and
        self.final_state_truncated): the diff's full size is measured, never inferred from the output.
        """
        self.final_state_truncated = None
        if self.lease is None:
            return ""
        base = shlex.quote(self.base_commit)
        # A private index: whatever the agent did to .git/index, the diff is of the files on disk.
        pathspec = "-- . ':(exclude,glob)**/__pycache__/**' ':(exclude,glob)**/*.pyc' ':(exclude).pytest_cache'"
        out = f"/tmp/.arlctl-diff-{secrets.token_hex(8)}"
        script = (f"export GIT_INDEX_FILE=/tmp/.arlctl-diff-index && rm -f $GIT_INDEX_FILE {out} && "
                  f"{_git('read-tree ' + base)} && {_git('add -A -f ' + pathspec)} && "
                  f"{_git(f'diff --cached {_DIFF_FLAGS} ' + base)} > {out} && "
                  f'echo "arlctl-diff-bytes: $(wc -c < {out})" >&2 && head -c {int(self.max_diff_bytes)} {out}; '
                  f"status=$?; rm -f {out}; exit $status")
        try:
            result = await self.sandbox.exec(script, timeout=self.command_timeout)
        except SandboxError as err:
            raise EnvFailure(f"sandbox failed while taking the diff: {err}") from err
        if result.exit_code != 0:  # the agent broke its own repository (say, removed .git): an empty diff
            return ""
        return self._flag_cut(result.stdout, result.stderr)

    def _flag_cut(self, diff: str, stderr: str) -> str:
        """`diff` as is, or (when it is not the whole diff) cut at its last line with the marker first."""
        sizes = _DIFF_SIZE_RE.findall(stderr)
        size = int(sizes[-1]) if sizes else None
        # Cut by us (head -c) or by the sandbox's own output cap: either way less than the whole diff.
        # (Undecodable bytes decode to U+FFFD, 3 bytes, so the kept text never looks shorter than it is.)
        whole = size is not None and size <= self.max_diff_bytes and len(diff.encode("utf-8", "replace")) >= size
        if whole:
            return diff
        kept = diff[: diff.rfind("\n") + 1]  # no half line: the kept part is a readable prefix
        kept_bytes = len(kept.encode("utf-8", "replace"))
        self.final_state_truncated = (f"diff truncated: {size if size is not None else 'unknown'} bytes, "
                                      f"limit {self.max_diff_bytes}; kept the first {kept_bytes}")
        return DIFF_TRUNCATED.format(kept=kept_bytes, size=size if size is not None else "unknown") + kept

    # ---- tools --------------------------------------------------------------------------------------

    @property
    def sandbox(self):
        assert self.lease is not None
        return self.lease.sandbox

    def _is_submit(self, call: ToolCall) -> bool:
        if call.name == "submit":
            return True
        return call.name == "bash" and str(call.arguments.get("command", "")).strip() in SUBMIT_COMMANDS

    async def _run_tool(self, call: ToolCall) -> str:
        handler = HANDLERS.get(call.name)
        if handler is None:
            return f"error: unknown tool {call.name!r}; available: {', '.join(HANDLERS)}, submit"
        try:
            return await handler(self, call.arguments)
        except SandboxError as err:  # the sandbox broke, not the tool call: no observation, an env_error row
            raise EnvFailure(f"sandbox failed during {call.name}: {err}") from err
        except Exception as err:  # a tool failure is something the model should see, not a crash
            return f"error: {call.name} failed: {type(err).__name__}: {err}"

    async def _visible_share(self, call: ToolCall, output: str) -> float | None:
        """The step reward of a run_tests call: the visible suite's pass share now (module docstring)."""
        try:
            changed = await self._visible_tests_changed()
            if changed is None:
                return None  # git cannot compare (the agent broke .git): no measurement, no reward
            if changed:
                return 0.0
            if str(call.arguments.get("path") or VISIBLE_TESTS).strip().rstrip("/") != VISIBLE_TESTS:
                output = await HANDLERS["run_tests"](self, {})  # a part of the suite ran: measure the whole
        except SandboxError as err:
            raise EnvFailure(f"sandbox failed while measuring the visible tests: {err}") from err
        return pytest_share(output)

    async def _visible_tests_changed(self) -> bool | None:
        """True when the files under VISIBLE_TESTS differ from the snapshot commit's; None when git cannot say."""
        index = f"/tmp/.arlctl-steps-index-{secrets.token_hex(8)}"
        base = shlex.quote(self.base_commit)
        pathspec = f"-- {VISIBLE_TESTS} ':(exclude,glob)**/__pycache__/**' ':(exclude,glob)**/*.pyc'"
        script = (f"export GIT_INDEX_FILE={index} && {_git('read-tree ' + base)} && "
                  f"{_git('add -A -f ' + pathspec)} && {_git(f'diff --cached --quiet {base} -- {VISIBLE_TESTS}')}; "
                  f"status=$?; rm -f {index}; exit $status")
        result = await self.sandbox.exec(script, timeout=self.command_timeout)
        return {0: False, 1: True}.get(result.exit_code)

    def truncate(self, text: str) -> str:
        if len(text) <= self.max_output_chars:
            return text
        head = self.max_output_chars * 2 // 3
        tail = self.max_output_chars - head
        omitted = len(text) - head - tail
        return text[:head] + TRUNCATION_MARKER.format(omitted=omitted) + text[-tail:]

    def _private_provider(self) -> PoolProvider:
        if self._private is None:
            self._private = self.new_provider(sandboxes=1)  # one episode holds one sandbox
        return self._private

    async def _release(self) -> None:
        self._note_taint()
        lease, self.lease = self.lease, None
        if lease is not None:
            await lease.release()


# Every git setting that changes what `git diff` (or the `git add` before it) emits, pinned: the agent owns
# .git/config (and could set includes, a worktree elsewhere, filters, colours, prefixes, renames), and a
# `-c` value wins over every file. --git-dir/--work-tree override core.worktree and GIT_DIR-style tricks;
# no system or global file is read. The diff command line repeats the ones it has flags for (_DIFF_FLAGS).
_GIT_PINS = (
    "core.hooksPath=/dev/null", "core.fsmonitor=false", "core.quotePath=false", "core.autocrlf=false",
    "core.eol=lf", "core.safecrlf=false", "core.attributesFile=/dev/null", "core.bigFileThreshold=512m",
    "core.fileMode=true", "core.symlinks=true", "core.ignoreCase=false", "core.precomposeUnicode=false",
    "core.sparseCheckout=false", "core.bare=false", "diff.renames=false", "diff.noprefix=false",
    "diff.mnemonicPrefix=false", "diff.relative=false", "diff.srcPrefix=a/", "diff.dstPrefix=b/",
    "diff.algorithm=myers", "diff.indentHeuristic=true", "diff.context=3", "diff.interHunkContext=0",
    "diff.suppressBlankEmpty=false", "diff.colorMoved=false", "diff.orderFile=/dev/null", "diff.ignoreSubmodules=none",
    "diff.submodule=short", "color.ui=false", "color.diff=false", "safe.directory=*",
)
_DIFF_FLAGS = ("--no-color --no-ext-diff --no-textconv --no-renames --no-relative --src-prefix=a/ --dst-prefix=b/ "
               "--unified=3 --inter-hunk-context=0 --diff-algorithm=myers --ignore-submodules=none")
_GIT_ENV = ("env -u GIT_EXTERNAL_DIFF -u GIT_DIFF_OPTS -u GIT_CONFIG_PARAMETERS -u GIT_CONFIG_COUNT GIT_CONFIG_NOSYSTEM=1 "
            "GIT_CONFIG_GLOBAL=/dev/null GIT_ATTR_NOSYSTEM=1 ")


def _git(args: str) -> str:
    # The artifact is always a plain a/ b/ diff, each file patch as git apply reads it, whatever the
    # agent wrote to .git/config.
    pins = " ".join(f"-c {shlex.quote(pin)}" for pin in _GIT_PINS)
    return f"{_GIT_ENV}git {pins} --git-dir=.git --work-tree=. {args}"


def pytest_share(output: str) -> float | None:
    """passed / (passed + failed + errors) from the last pytest summary line of `output`; None without one
    (or when it counts no test)."""
    summary = None
    for line in output.splitlines():
        match = _SUMMARY_RE.match(line.strip())
        if match:
            summary = match.group(1)
    if summary is None:
        return None
    counts: dict[str, int] = {}
    for number, word in _COUNT_RE.findall(summary):
        key = "error" if word.startswith("error") else word
        counts[key] = counts.get(key, 0) + int(number)
    total = counts.get("passed", 0) + counts.get("failed", 0) + counts.get("error", 0)
    return counts.get("passed", 0) / total if total else None


def diff_truncation(final_state: str | None) -> tuple[int, int | None] | None:
    """(bytes kept, full size or None if unknown) when `final_state` is a diff SweEnv had to cut, else None.

    For the grader: a cut diff is not the agent's whole change, so it must not be applied and scored
    as if it were (its tail is missing; a cut at a file boundary would even apply cleanly).
    """
    match = _DIFF_TRUNCATED_RE.match(final_state or "")
    if match is None:
        return None
    return int(match.group(1)), None if match.group(2) == "unknown" else int(match.group(2))


class SweEnvFactory:
    """The swe envs of one run: each call makes a SweEnv, and all of them lease sandboxes from one
    PoolProvider (warm pools per snapshot, at most `sandboxes` held at once) that `aclose()` closes.

    The factory is the envs' provider: the PoolProvider is made on the first acquire, inside the run's
    event loop, and an acquire from a later event loop (a previous asyncio.run's pools died with their
    loop) starts a fresh one. A `provider` option is used as given and never closed here.
    """

    name = ENV_NAME

    def __init__(self, **options: Any):
        self._template = SweEnv(**options)  # checks the options now; it never resets, so holds nothing
        self.options = options
        self._provider: PoolProvider | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __call__(self) -> SweEnv:
        return SweEnv(**{**self.options, "provider": self.options.get("provider") or self})

    async def acquire(self, snapshot: str, options: dict[str, Any] | None = None) -> Lease:
        loop = asyncio.get_running_loop()
        if self._provider is None or self._loop is not loop:
            self._provider, self._loop = self._template.new_provider(), loop
        return await self._provider.acquire(snapshot, options)

    async def aclose(self) -> None:
        provider, self._provider, self._loop = self._provider, None, None
        if provider is not None:
            await provider.close()
