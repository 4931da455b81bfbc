"""Task sources for `arlctl rollout --tasks SPEC`: builtin generators and JSONL files.

    builtin:math?n=256&seed=0&difficulty=1     generated in process (options as a query string)
    tasks.jsonl | s3://bucket/tasks.jsonl      one task object per line (any fsspec URL)

Every task is a dict with at least `task_id` and `env`. Builtin sources live in BUILTIN_SOURCES; a module
registers its own with `register_task_source` when imported. `load_tasks` imports the module named in
registry.PROVIDERS for a builtin it has not seen yet, so `builtin:swe` works without this file importing swe code.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

from arlctl.errors import UsageError
from arlctl.io.fs import get_fs

TaskSource = Callable[[dict[str, str]], list[dict[str, Any]]]
BUILTIN_SOURCES: dict[str, TaskSource] = {}
# builtin name -> module whose import registers it (lazy, so loading math tasks never imports swe).


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


def _load_builtin(spec: str) -> list[dict[str, Any]]:
    name, _, query = spec[len("builtin:") :].partition("?")
    from arlctl.envs.registry import import_provider  # late: the registry imports the env modules

    import_provider(name, BUILTIN_SOURCES, "builtin task source")
    if name not in BUILTIN_SOURCES:
        known = ", ".join(f"builtin:{n}" for n in sorted(BUILTIN_SOURCES))
        raise UsageError(f"unknown task source builtin:{name}", hint=f"known: {known}, or a JSONL file path")
    options: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if key in options:
            raise UsageError(f"builtin:{name}: option {key} given twice")
        options[key] = value
    return BUILTIN_SOURCES[name](options)


def _load_jsonl(url: str) -> list[dict[str, Any]]:
    fs, path = get_fs(url)
    if not fs.exists(path):
        raise UsageError(f"task file not found: {url}", hint="give a JSONL file or builtin:math?n=...")
    tasks: list[dict[str, Any]] = []
    with fs.open(path, "r", encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                task = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"{url}:{lineno}: bad JSON: {exc.msg} (column {exc.colno})") from None
            if not isinstance(task, dict):
                raise UsageError(f"{url}:{lineno}: a task must be a JSON object, got {type(task).__name__}")
            if "task_id" not in task and "instance_id" in task:
                task["task_id"] = task["instance_id"]  # SWE-bench files name their id instance_id
            if not isinstance(task.get("task_id"), str | int) or task["task_id"] == "":
                raise UsageError(f"{url}:{lineno}: task has no 'task_id'")
            task["task_id"] = str(task["task_id"])
            tasks.append(task)
    return tasks


def load_tasks(spec: str, env: str | None = None) -> list[dict[str, Any]]:
    """Load the tasks a spec names; with `env`, fill in missing `env` fields and reject other envs.

    Task ids must be unique: groups and lineage are keyed by them.
    """
    tasks = _load_builtin(spec) if spec.startswith("builtin:") else _load_jsonl(spec)
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
        elif "env" not in task:
            raise UsageError(
                f"{spec}: task {task_id!r} has no 'env' field", hint='add "env" to each task or pass --env'
            )
    return tasks
