"""Environment mixes for `arlctl rollout --env-mix 'swe:0.7,math:0.3'`: parse the mix, find each env's
tasks, and sample groups across the envs at the requested ratios.

    parse_env_mix("swe:0.7,math:0.3")          -> [("swe", 0.7), ("math", 0.3)]
    parse_env_mix("mypkg.env:make:1,math:1")   -> [("mypkg.env:make", 0.5), ("math", 0.5)]
    mix_sources(mix, ["swe=swe.jsonl"])        -> {"swe": [...], "math": tasks of builtin:math}
    mixed_tasks(sources, mix, seed=0, n_groups=1000)   -> 1,000 task dicts, ~700 swe and ~300 math

Each yielded task is the task of one GRPO group. The env of each group is chosen by smooth weighted round
robin (the env whose running credit is highest goes next; a seeded random choice breaks exact ties), so
after any number n of groups each env's count is within one group of ratio * n — far inside the ±5% the
issue asks over 1,000 groups, and without the drift plain random sampling has over short runs. Within an
env the tasks are used in source order on the first pass and reshuffled (seeded) on every later pass.
"""

from __future__ import annotations

import copy
import math
import os
import random
import re
from collections.abc import Iterator
from typing import Any

from arlctl.envs.tasks import BUILTIN_SOURCES, load_tasks
from arlctl.errors import UsageError

MIX_EXAMPLE = "--env-mix 'swe:0.7,math:0.3'"
# What an ENV in `--tasks ENV=SOURCE` looks like: an env name or a module:attr plugin spec. A builtin spec
# ("builtin:math?n=4") or a path ("data/a=b.jsonl") has '?' or '/' before its first '=', so never matches.
_ENV_NAME = re.compile(r"^[A-Za-z_][\w.-]*(:[A-Za-z_][\w.-]*)?$")
_TIE = 1e-9  # credits within this are equal: float sums of weights are not exact


# ------------------------------------------------------------------------------------------ the mix spec
def parse_env_mix(spec: str) -> list[tuple[str, float]]:
    """`NAME:WEIGHT,...` as [(name, weight)] with weights normalised to sum 1, in the order given.

    The weight is the text after the LAST colon of an item, so plugin specs keep their own colon:
    `mypkg.env:make:0.5`. Weights must be positive finite numbers; names must not repeat.
    """
    items = spec.split(",")
    mix: list[tuple[str, float]] = []
    for position, raw in enumerate(items, start=1):
        item = raw.strip()
        if not item:
            raise UsageError(f"--env-mix {spec!r}: item {position} is empty", hint=f"e.g. {MIX_EXAMPLE}")
        name, weight = _parse_item(item, spec)
        if name in (n for n, _ in mix):
            raise UsageError(f"--env-mix {spec!r}: env {name!r} is given twice",
                             hint="give each env once, with its total weight")
        mix.append((name, weight))
    total = sum(w for _, w in mix)
    return [(name, w / total) for name, w in mix]


def _parse_item(item: str, spec: str) -> tuple[str, float]:
    name, colon, text = item.rpartition(":")
    name = name.strip()
    if not colon or not name:
        raise UsageError(f"--env-mix {spec!r}: {item!r} has no weight",
                         hint=f"give NAME:WEIGHT for every env, e.g. {MIX_EXAMPLE} (a plugin: mypkg.env:make:0.5)")
    try:
        weight = float(text)
    except ValueError:
        raise UsageError(f"--env-mix {spec!r}: weight {text.strip()!r} of {name!r} is not a number",
                         hint=f"e.g. {MIX_EXAMPLE}; a plugin spec needs its weight too: mypkg.env:make:0.5") from None
    if not math.isfinite(weight) or weight <= 0:
        raise UsageError(f"--env-mix {spec!r}: weight of {name!r} must be a positive finite number, got {text.strip()}",
                         hint="drop an env from the mix instead of giving it weight 0")
    return name, weight


# --------------------------------------------------------------------------------------- task sources
def mix_sources(mix: list[tuple[str, float]], tasks_args: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The tasks of every env of the mix, from `--tasks` values (`ENV=SOURCE`, or a SOURCE whose rows
    carry "env"); an env without any falls back to its builtin task source `builtin:ENV`."""
    envs = [name for name, _ in mix]
    sources: dict[str, list[dict[str, Any]]] = {}
    origin: dict[str, str] = {}  # env -> the --tasks value its tasks came from (for the error message)

    def add(env: str, tasks: list[dict[str, Any]], arg: str) -> None:
        _check_in_mix(env, envs, arg)
        if env in sources:
            raise UsageError(f"--tasks: env {env!r} has tasks from both {origin[env]} and {arg}",
                             hint="give one task source per env")
        sources[env], origin[env] = tasks, arg

    for arg in tasks_args:
        env, source = _split_env_source(arg)
        if env is not None:
            _check_in_mix(env, envs, arg)  # before loading: a typo'd env must not wait on a big file
            add(env, load_tasks(source, env=env), arg)
            continue
        by_env: dict[str, list[dict[str, Any]]] = {}
        for task in load_tasks(source):  # rejects the first row without "env", naming it
            by_env.setdefault(str(task["env"]), []).append(task)
        for row_env, tasks in by_env.items():
            add(row_env, tasks, arg)
    for env in envs:
        if env not in sources:
            sources[env] = _builtin_default(env)
    return {env: sources[env] for env in envs}


def _check_in_mix(env: str, envs: list[str], arg: str) -> None:
    if env not in envs:
        raise UsageError(f"--tasks {arg}: tasks for env {env!r}, which is not in the mix ({', '.join(envs)})",
                         hint=f"add {env}:WEIGHT to --env-mix or drop those tasks")


def _split_env_source(arg: str) -> tuple[str | None, str]:
    """`ENV=SOURCE` as (ENV, SOURCE); anything else (a builtin spec, a path, a URL) as (None, arg).
    A local file whose own name looks like ENV=... (`math=v2.jsonl`) stays a file."""
    head, eq, tail = arg.partition("=")
    if eq and _ENV_NAME.match(head) and not head.startswith("builtin:") and not os.path.isfile(arg):
        if not tail:
            raise UsageError(f"--tasks {arg}: no source after '='", hint="e.g. --tasks math=tasks.jsonl")
        return head, tail
    return None, arg


def _builtin_default(env: str) -> list[dict[str, Any]]:
    from arlctl.envs.registry import family_of, import_provider  # late: the registry imports the env modules

    if ":" not in env or family_of(env) is not None:
        import_provider(env, BUILTIN_SOURCES, "builtin task source")
    if env not in BUILTIN_SOURCES:
        raise UsageError(f"env {env!r} of the mix has no tasks and no builtin task source",
                         hint=f"pass --tasks {env}=SOURCE (a JSONL file or builtin:NAME?...)")
    return load_tasks(f"builtin:{env}", env=env)


# ------------------------------------------------------------------------------------------- sampling
def mixed_tasks(sources: dict[str, list[dict[str, Any]]], weights: list[tuple[str, float]],
                seed: int | None, n_groups: int | None) -> Iterator[dict[str, Any]]:
    """Task dicts (deep copies, "env" set) for n_groups groups across the envs at the weights' ratios;
    n_groups None yields forever (the caller stops). Deterministic for a given seed."""
    if n_groups is not None and n_groups < 0:
        raise UsageError(f"number of groups must be >= 0, got {n_groups}")
    for env, _ in weights:
        if not sources.get(env):
            raise UsageError(f"env {env!r} of the mix has no tasks", hint=f"pass --tasks {env}=SOURCE")
    rng = random.Random(seed)
    cyclers = {env: _cycle(sources[env], _env_rng(seed, env)) for env, _ in weights}
    credit = {env: 0.0 for env, _ in weights}
    done = 0
    while n_groups is None or done < n_groups:
        env = _next_env(credit, weights, rng)
        task = copy.deepcopy(next(cyclers[env]))
        task["env"] = env
        yield task
        done += 1


def _next_env(credit: dict[str, float], weights: list[tuple[str, float]], rng: random.Random) -> str:
    """Smooth weighted round robin: every env earns its weight, the richest goes and pays 1 (the sum of
    the weights), so each env's count stays within one group of weight * groups so far."""
    for env, weight in weights:
        credit[env] += weight
    best = max(credit.values())
    tied = [env for env, _ in weights if credit[env] >= best - _TIE]
    env = tied[0] if len(tied) == 1 else rng.choice(tied)
    credit[env] -= 1.0
    return env


def _env_rng(seed: int | None, env: str) -> random.Random:
    # A string seed is hashed the same in every process (unlike hash()), so reruns reshuffle alike.
    return random.Random(None if seed is None else f"{seed}:{env}")


def _cycle(tasks: list[dict[str, Any]], rng: random.Random) -> Iterator[dict[str, Any]]:
    """The tasks in source order, then again and again, each later pass in a fresh seeded order."""
    order = list(range(len(tasks)))
    while True:
        for index in order:
            yield tasks[index]
        order = order[:]
        rng.shuffle(order)


__all__ = ["mix_sources", "mixed_tasks", "parse_env_mix"]
