"""Helpers shared by every CLI module: consoles, error handling, JSON output."""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console

from arlctl.errors import ArlctlError

# Human output goes to stderr so that stdout stays clean for --json / --csv (DESIGN.md §12).
console = Console(stderr=True, highlight=False)

F = TypeVar("F", bound=Callable[..., Any])


def debug_enabled() -> bool:
    return os.environ.get("ARLCTL_DEBUG", "") not in ("", "0")


def handle_errors(fn: F) -> F:
    """Turn typed errors into one line with a hint and the right exit code; tracebacks only with --debug."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except ArlctlError as err:
            if debug_enabled():
                traceback.print_exc()
            console.print(f"[bold red]error:[/] {err}", markup=True, soft_wrap=True)
            if err.hint:
                console.print(f"[dim]hint: {err.hint}[/]")
            raise typer.Exit(err.exit_code) from None
        except Exception as err:  # an unexpected failure: still one line unless --debug
            if debug_enabled():
                traceback.print_exc()
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            console.print(f"[bold red]error:[/] {type(err).__name__}: {first}", soft_wrap=True)
            console.print("[dim]hint: re-run with --debug for the traceback[/]")
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, default=_json_default, sort_keys=False) + "\n")
    sys.stdout.flush()


def _json_default(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
