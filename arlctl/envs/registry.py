"""Registries of environments and reward functions, by name: `--env math`, `--reward math`.

Each entry is registered by the module that defines it. Names in PROVIDERS are imported on first use,
so `make_env("swe")` works without this module importing the swe code (and its sandbox dependencies)
when only math is wanted. A reward function has the shape
    score(final_state, task, response_text) -> (reward, components, info)
and a version string that the reward stage writes into `reward_version`.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from arlctl.envs.base import Env
from arlctl.errors import UsageError

EnvFactory = Callable[..., Env]
ScoreFn = Callable[..., tuple[float, dict[str, float], dict[str, Any]]]


@dataclass(frozen=True)
class Reward:
    name: str
    version: str  # written to reward_version; includes non-default options so runs stay distinguishable
    score: ScoreFn


ENVS: dict[str, EnvFactory] = {}
REWARDS: dict[str, tuple[ScoreFn, str]] = {}  # name -> (score function, base version)
# Modules that register an env, its reward and its builtin task source when imported (on first use).
PROVIDERS = {"swe": "arlctl.envs.swe", "first-token": "arlctl.envs.toy"}


def register_env(name: str, factory: EnvFactory) -> None:
    ENVS[name] = factory


def register_reward(name: str, score: ScoreFn, version: str) -> None:
    REWARDS[name] = (score, version)


def import_provider(name: str, table: dict[str, Any], what: str) -> None:
    """Import the module that registers `name` into `table`, if it is not there yet."""
    if name not in table and name in PROVIDERS:
        try:
            importlib.import_module(PROVIDERS[name])
        except ImportError as exc:
            raise UsageError(f"{what} {name!r} is not available: {exc}") from None


def _ensure(name: str, table: dict[str, Any], what: str) -> None:
    import_provider(name, table, what)
    if name not in table:
        known = sorted(set(table) | set(PROVIDERS))
        raise UsageError(f"unknown {what} {name!r}", hint=f"known: {', '.join(known)}")


def make_env(name: str, **options: Any) -> Env:
    """A fresh environment instance; options go to its constructor (e.g. on_no_action="end")."""
    _ensure(name, ENVS, "env")
    try:
        return ENVS[name](**options)
    except TypeError as exc:
        raise UsageError(f"bad option for env {name!r}: {exc}") from None


def get_reward(name: str, **options: Any) -> Reward:
    """The named reward function with options bound (e.g. format_weight=0.1 for math)."""
    _ensure(name, REWARDS, "reward")
    score, version = REWARDS[name]
    try:  # fail now, with the option's name, rather than on the first row
        inspect.signature(score).bind(None, {}, "", **options)
    except TypeError as exc:
        raise UsageError(f"bad option for reward {name!r}: {exc}") from None
    if options:
        version += "+" + ",".join(f"{key}={options[key]}" for key in sorted(options))
        score = partial(score, **options)
    return Reward(name=name, version=version, score=score)


def get_reward_fn(name: str, **options: Any) -> ScoreFn:
    return get_reward(name, **options).score


def list_envs() -> list[str]:
    return sorted(set(ENVS) | set(PROVIDERS))


def _register_builtin() -> None:
    from arlctl.envs import math as math_env

    register_env(math_env.ENV_NAME, math_env.MathEnv)
    register_reward(math_env.ENV_NAME, math_env.score, math_env.REWARD_VERSION)


_register_builtin()
