"""Task sources for `arlctl rollout --tasks SPEC`: builtin generators and JSONL files.

    builtin:math?n=256&seed=0&difficulty=1     generated in process (options as a query string)
    reasoning-gym:leg_counting?n=8             a scheme: SCHEME:REST handed whole to the module that owns it
    tasks.jsonl | s3://bucket/tasks.jsonl      one task object per line (any fsspec URL)
    tasks.parquet                              one task per row (as the `datasets` library writes them)

Every task is a dict with at least `task_id` and `env`. Builtin sources live in BUILTIN_SOURCES; a module
registers its own with `register_task_source` when imported. `load_tasks` imports the module named in
registry.PROVIDERS for a builtin it has not seen yet, so `builtin:swe` works without this file importing swe code.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

from arlctl.errors import UsageError, did_you_mean
from arlctl.io.fs import get_fs

MAX_TASK_DEPTH = 64  # JSON nesting levels a task may use (SWE-bench rows use 3)
TaskSource = Callable[[dict[str, str]], list[dict[str, Any]]]
BUILTIN_SOURCES: dict[str, TaskSource] = {}
# Task schemes: `SCHEME:REST` specs (not URLs: no "//" after the colon) -> module whose import registers it.
TASK_SCHEMES = {"reasoning-gym": "arlctl.envs.reasoning_gym", "humaneval": "arlctl.envs.code"}
SCHEME_SOURCES: dict[str, Callable[[str], list[dict[str, Any]]]] = {}


def register_task_scheme(name: str) -> Callable[[Callable[[str], list[dict[str, Any]]]], Any]:
    """Decorator: make `NAME:REST` call fn(REST) and return its task list (REST is the scheme's own syntax)."""

    def decorate(fn: Callable[[str], list[dict[str, Any]]]) -> Callable[[str], list[dict[str, Any]]]:
        SCHEME_SOURCES[name] = fn
        return fn

    return decorate


def scheme_of(spec: str) -> str | None:
    """The task scheme a spec uses (`reasoning-gym:...`), or None for builtin specs, paths and URLs."""
    scheme, colon, rest = spec.partition(":")
    return scheme if colon and scheme in TASK_SCHEMES and not rest.startswith("//") else None


def _load_scheme(spec: str, scheme: str) -> list[dict[str, Any]]:
    import importlib

    if scheme not in SCHEME_SOURCES:
        try:
            importlib.import_module(TASK_SCHEMES[scheme])
        except ImportError as exc:
            raise UsageError(f"task source {spec!r} is not available: {exc}",
                             hint=f"install the package the {scheme} scheme needs") from None
    return SCHEME_SOURCES[scheme](spec.partition(":")[2])


def register_task_source(name: str) -> Callable[[TaskSource], TaskSource]:
    """Decorator: make `builtin:NAME?k=v` call fn({"k": "v"}) and return its task list."""

    def decorate(fn: TaskSource) -> TaskSource:
        BUILTIN_SOURCES[name] = fn
        return fn

    return decorate


def int_option(options: dict[str, str], key: str, default: int, source: str) -> int:
    """Read an integer query option; a non-integer is a usage error naming the option."""
    raw = options.pop(key, None)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise UsageError(f"{source}: option {key}={raw!r} is not an integer") from None


def reject_unknown_options(options: dict[str, str], source: str, allowed: list[str]) -> None:
    if options:
        raise UsageError(
            f"{source}: unknown option(s) {', '.join(sorted(options))}", hint=f"allowed: {', '.join(allowed)}"
        )


@register_task_source("math")
def _builtin_math(options: dict[str, str]) -> list[dict[str, Any]]:
    from arlctl.envs.math_gen import KINDS, generate_tasks

    source = "builtin:math"
    n = int_option(options, "n", 256, source)
    seed = int_option(options, "seed", 0, source)
    difficulty = int_option(options, "difficulty", 1, source)
    start = int_option(options, "start", 0, source)
    kinds = tuple(k for k in options.pop("kinds", ",".join(KINDS)).split(",") if k)
    reject_unknown_options(options, source, ["n", "seed", "difficulty", "start", "kinds"])
    return generate_tasks(n, seed=seed, difficulty=difficulty, kinds=kinds, start=start)


def builtin_source_names() -> list[str]:
    """Every builtin task source, registered or not: the provider modules are imported to find out (an
    error message's list, so never just the ones this process happened to load; one whose optional
    dependency is missing is left out)."""
    import importlib

    from arlctl.envs.registry import PROVIDERS

    for module in sorted(set(PROVIDERS.values())):
        try:
            importlib.import_module(module)
        except ImportError:
            continue
    return sorted(BUILTIN_SOURCES)


def _load_builtin(spec: str) -> list[dict[str, Any]]:
    name, _, query = spec[len("builtin:") :].partition("?")
    from arlctl.envs.registry import import_provider  # late: the registry imports the env modules

    import_provider(name, BUILTIN_SOURCES, "builtin task source")
    if name not in BUILTIN_SOURCES:
        known = builtin_source_names()
        guess = did_you_mean(name, known, shown=lambda n: f"builtin:{n}")
        listed = ", ".join(f"builtin:{n}" for n in known)
        raise UsageError(f"unknown task source builtin:{name}",
                         hint=(f"{guess} " if guess else "") + f"known: {listed}, or a JSONL or Parquet file path")
    options: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if key in options:
            raise UsageError(f"builtin:{name}: option {key} given twice")
        options[key] = value
    return BUILTIN_SOURCES[name](options)


def _load_jsonl(url: str) -> list[dict[str, Any]]:
    """Every non-blank line one task object. Any bad line is a one-line usage error `url:line: reason`;
    a file without a task is an error too (a typo'd path to an empty file must not roll out nothing)."""
    fs, path = get_fs(url)
    if not fs.exists(path):
        raise UsageError(f"task file not found: {url}", hint="give a JSONL file or builtin:math?n=...")
    tasks: list[dict[str, Any]] = []
    with fs.open(path, "rb") as handle:  # bytes: a bad byte is reported with its line, not as a traceback
        for lineno, raw in enumerate(handle, start=1):
            task = _parse_line(raw, url, lineno)
            if task is not None:
                tasks.append(task)
    if not tasks:
        raise UsageError(f"{url}: no tasks", hint="the file is empty or holds only blank lines")
    return tasks


def _load_parquet(url: str) -> list[dict[str, Any]]:
    """Every row one task (columns as keys; nulls dropped), as `datasets` writes SWE-bench-style rows."""
    import pyarrow.parquet as pq

    fs, path = get_fs(url)
    if not fs.exists(path):
        raise UsageError(f"task file not found: {url}", hint="give a Parquet or JSONL file or builtin:math?n=...")
    try:
        with fs.open(path, "rb") as handle:
            rows = pq.read_table(handle).to_pylist()
    except Exception as exc:  # not Parquet, or a broken footer: one line naming the file
        raise UsageError(f"{url}: not a readable Parquet file: {type(exc).__name__}: {exc}") from None
    tasks = []
    for position, row in enumerate(rows, start=1):
        task = {key: value for key, value in row.items() if value is not None}
        where = f"{url}:row {position}"
        if _depth(task) > MAX_TASK_DEPTH:
            raise UsageError(f"{where}: nested deeper than {MAX_TASK_DEPTH} levels")
        if "task_id" not in task and "instance_id" in task:
            task["task_id"] = task["instance_id"]
        task["task_id"] = _task_id(task.get("task_id"), where)
        tasks.append(task)
    if not tasks:
        raise UsageError(f"{url}: no tasks", hint="the Parquet file has no rows")
    return tasks


def _parse_line(raw: bytes, url: str, lineno: int) -> dict[str, Any] | None:
    """One JSONL line as a task (None for a blank line)."""
    where = f"{url}:{lineno}"
    try:
        line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")  # tolerate an editor's BOM
    except UnicodeDecodeError as exc:
        raise UsageError(f"{where}: invalid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})",
                         hint="task files are UTF-8 JSONL") from None
    if not line.strip():
        return None
    try:
        task = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: bad JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise UsageError(f"{where}: bad JSON: nested too deeply") from None
    if not isinstance(task, dict):
        raise UsageError(f"{where}: a task must be a JSON object, got {type(task).__name__}")
    if _depth(task) > MAX_TASK_DEPTH:
        # json.loads accepts ~1000 levels, but every later recursive walk (rows, hashing) could not.
        raise UsageError(f"{where}: bad JSON: nested deeper than {MAX_TASK_DEPTH} levels")
    if "task_id" not in task and "instance_id" in task:
        task["task_id"] = task["instance_id"]  # SWE-bench files name their id instance_id
    task["task_id"] = _task_id(task.get("task_id"), where)
    return task


def _depth(value: Any) -> int:
    """Nesting depth of a JSON value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, level + 1) for child in children if isinstance(child, dict | list))
    return deepest


def _task_id(value: Any, where: str) -> str:
    """A task id as a string: ids key groups, lineage and worker shares, so they must be plain text."""
    if value is None or value == "":
        raise UsageError(f"{where}: task has no 'task_id'")
    # bool is an int to Python, but `true` is no id anyone meant.
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise UsageError(f"{where}: task_id must be a string (or an integer), got {type(value).__name__} "
                         f"{json.dumps(value)[:60]}")
    text = str(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a "\\ud800" escape: not text, cannot key anything
        raise UsageError(f"{where}: task_id {json.dumps(text)} is not valid Unicode text") from None
    return text


def load_tasks(spec: str, env: str | None = None, default_env: str | None = None) -> list[dict[str, Any]]:
    """Load the tasks a spec names; with `env`, fill in missing `env` fields and reject other envs.

    Without `env`, each task keeps its own `env` field (several envs may share one file); `default_env`
    fills it in where a task has none, else such a task is an error.

    Task ids must be unique: groups and lineage are keyed by them.
    """
    if env is not None:  # an unknown env is named as such, not as a task/env mismatch or a missing source
        from arlctl.envs.registry import resolve_env

        resolve_env(env)
    scheme = scheme_of(spec)
    if spec.startswith("builtin:"):
        tasks = _load_builtin(spec)
    elif scheme is not None:
        tasks = _load_scheme(spec, scheme)
    elif spec.split("?")[0].endswith(".parquet"):
        tasks = _load_parquet(spec)
    else:
        tasks = _load_jsonl(spec)
    if not tasks:
        raise UsageError(f"{spec}: no tasks")
    seen: set[str] = set()
    for position, task in enumerate(tasks):
        task_id = task["task_id"]
        if task_id in seen:
            raise UsageError(f"{spec}: duplicate task_id {task_id!r} (task {position + 1})")
        seen.add(task_id)
        if env is not None:
            task.setdefault("env", env)
            if task["env"] != env:
                raise UsageError(
                    f"{spec}: task {task_id!r} is for env {task['env']!r}, not {env!r}",
                    hint=f"use --env {task['env']} or another task file",
                )
        elif "env" not in task and default_env is not None:
            task["env"] = default_env
        elif "env" not in task:
            raise UsageError(
                f"{spec}: task {task_id!r} has no 'env' field", hint='add "env" to each task or pass --env'
            )
    return tasks
