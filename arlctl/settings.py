"""Stage settings as data: `setting(...)` declares a config field with its help text, once.

A stage's config dataclass (stages/configs.py, stages/agent_loop.RolloutConfig) declares each field with
`setting(default, "help")`; the CLI derives its options from those fields (arlctl/cli/options.py) and
`arlctl up` checks a recipe against them (arlctl/supervisor.py). This module imports nothing heavy, so
building the CLI or checking a recipe never loads torch. `parse_env_options` reads the KEY=VALUE
settings a command passes on to an env, a reward or a backend (--env-opt, --reward-opt, --backend-opt).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

from arlctl.errors import UsageError


def setting(default: Any = dataclasses.MISSING, help: str = "", *, flag: str | None = None,  # noqa: A002
            short: str | None = None, cli: bool = True, factory: Callable[[], Any] | None = None,
            metavar: str | None = None, recipe: bool = True) -> Any:
    """A config field with its help text: `lr: float = setting(1e-6, "Peak learning rate (AdamW).")`.

    flag: the option's spelling when it is not --field-name (a "--resume/--no-resume" pair too);
    cli=False: a setting with no command option (set by code, e.g. adam_betas); metavar: how --help shows
    its value (e.g. "VA VB" for a `tuple[str, str]`, which takes two); recipe=False: a one-shot option that
    an `arlctl up` recipe may not give a daemon (e.g. eval's --compare)."""
    metadata = {"help": help, "flag": flag, "short": short, "cli": cli, "metavar": metavar, "recipe": recipe}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def flag_of(f: dataclasses.Field) -> str:
    """The long option a config field becomes: its `flag` (first spelling), else --field-name."""
    flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
    return flag.split("/")[0]


def cli_fields(config: type) -> list[dataclasses.Field]:
    """The fields of `config` that are command options."""
    return [f for f in dataclasses.fields(config) if f.metadata.get("cli", False)]


def field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise TypeError(f"config field {f.name} has no default: every stage setting needs one")


def field_types(config: type) -> dict[str, Any]:
    """Resolved annotations of `config` (its module may use `from __future__ import annotations`)."""
    return typing.get_type_hints(config)


def options_of(config: type) -> dict[str, tuple[str, Any]]:
    """{long option without dashes: (field name, type)} of a config: what a recipe may set."""
    types = field_types(config)
    return {flag_of(f)[2:]: (f.name, types[f.name]) for f in cli_fields(config)}


def parse_env_options(pairs: list[str], flag: str = "--env-opt") -> dict[str, Any]:
    """KEY=VALUE options (--env-opt, --reward-opt, --backend-opt) as keyword arguments, numbers and
    true/false coerced: `max-turns=8` -> {"max_turns": 8}."""
    options: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise UsageError(f"{flag} expects KEY=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        options[key.replace("-", "_")] = _coerce(value)
    return options


def _coerce(value: str) -> Any:
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(value.lower(), value)
