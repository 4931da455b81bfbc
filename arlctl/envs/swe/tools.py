"""The swe tools, each `async handler(env, arguments) -> observation text`.

Every file operation runs inside the sandbox (cat, a stdin write), never on the host's view of the
workspace, so a path like ../../etc/passwd means the sandbox's file, not the host's. Errors are returned
as text starting with "error:"; the env turns them into observations.
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable
from typing import Any

Handler = Callable[[Any, dict[str, Any]], Awaitable[str]]
_PYTEST = "PYTHONDONTWRITEBYTECODE=1 python -m pytest -q -p no:cacheprovider --tb=short"


def _path(arguments: dict[str, Any]) -> str:
    path = arguments.get("path")
    if not isinstance(path, str) or not path.strip():
        raise ValueError('a "path" string argument is required')
    return path.strip()


async def _read(env: Any, path: str) -> str:
    result = await env.sandbox.exec(f"cat -- {shlex.quote(path)}", timeout=env.command_timeout)
    if result.exit_code != 0:
        raise FileNotFoundError(result.stderr.strip() or f"cannot read {path}")
    return result.stdout


async def _write(env: Any, path: str, content: str) -> None:
    quoted = shlex.quote(path)
    script = f'mkdir -p "$(dirname -- {quoted})" && cat > {quoted}'
    result = await env.sandbox.exec(script, timeout=env.command_timeout, stdin=content.encode("utf-8"))
    if result.exit_code != 0:
        raise OSError(result.stderr.strip() or f"cannot write {path}")


async def bash(env: Any, arguments: dict[str, Any]) -> str:
    command = arguments.get("command")
    if not isinstance(command, str) or not command.strip():
        return 'error: bash needs a non-empty "command" string'
    result = await env.sandbox.exec(command, timeout=env.command_timeout)
    if result.timed_out:
        return f"error: timeout: the command did not finish within {env.command_timeout:g}s and was killed"
    output = result.stdout + (("\n" if result.stdout and result.stderr else "") + result.stderr)
    return env.truncate(f"exit code: {result.exit_code}\n{output}")


async def view_file(env: Any, arguments: dict[str, Any]) -> str:
    path = _path(arguments)
    try:
        lines = (await _read(env, path)).splitlines()
    except FileNotFoundError as err:
        return f"error: {err}"
    start = arguments.get("start_line") or 1
    end = arguments.get("end_line") or len(lines)
    if not isinstance(start, int) or not isinstance(end, int) or start < 1 or end < start:
        return f"error: bad line range {start}..{end}; lines are numbered from 1 and end_line >= start_line"
    shown = [f"{n:5d}  {lines[n - 1]}" for n in range(start, min(end, len(lines)) + 1)]
    header = f"{path} (lines {start}-{min(end, len(lines))} of {len(lines)})"
    return env.truncate(header + "\n" + "\n".join(shown))


async def edit_file(env: Any, arguments: dict[str, Any]) -> str:
    path = _path(arguments)
    old, new = arguments.get("old"), arguments.get("new")
    if not isinstance(old, str) or not isinstance(new, str):
        return 'error: edit_file needs "old" and "new" strings'
    if old == "":
        return 'error: "old" must not be empty; use create_file to write a whole file'
    try:
        content = await _read(env, path)
    except FileNotFoundError as err:
        return f"error: {err}"
    count = content.count(old)
    if count == 0:
        return (f"error: the text given as \"old\" was not found in {path}; it must match exactly, "
                "including indentation and line breaks (view_file shows the current text)")
    if count > 1:
        return f"error: the text given as \"old\" occurs {count} times in {path}; include more surrounding lines"
    await _write(env, path, content.replace(old, new, 1))
    line = content[: content.index(old)].count("\n") + 1
    return f"edited {path}: replaced 1 occurrence at line {line}"


async def create_file(env: Any, arguments: dict[str, Any]) -> str:
    path = _path(arguments)
    content = arguments.get("content")
    if not isinstance(content, str):
        return 'error: create_file needs a "content" string'
    await _write(env, path, content)
    return f"wrote {path} ({len(content.splitlines())} lines)"


async def run_tests(env: Any, arguments: dict[str, Any]) -> str:
    target = arguments.get("path") or "tests"
    if not isinstance(target, str):
        return 'error: "path" must be a string'
    result = await env.sandbox.exec(f"{_PYTEST} {shlex.quote(target)}", timeout=env.command_timeout * 3)
    if result.timed_out:
        return "error: timeout: the tests did not finish in time"
    return env.truncate(f"exit code: {result.exit_code}\n{result.stdout}{result.stderr}")


HANDLERS: dict[str, Handler] = {"bash": bash, "view_file": view_file, "edit_file": edit_file,
                                "create_file": create_file, "run_tests": run_tests}
