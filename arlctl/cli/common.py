"""Helpers shared by every CLI module: consoles, error handling, JSON output.

Text from trajectories, task files and error messages is data, not terminal input: it is printed
through arlctl/render.py's `plain` / `terminal_safe` (control characters spelled out, never markup).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from arlctl.errors import ArlctlError
from arlctl.render import plain

# Human output goes to stderr so that stdout stays clean for --json / --csv (DESIGN.md §12).
console = Console(stderr=True, highlight=False)
MAX_STRAYS_SHOWN = 10  # stray file names listed in a "not read" warning (all are counted)

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
            _print_error(str(err), err.hint)
            raise typer.Exit(err.exit_code) from None
        except Exception as err:  # an unexpected failure: still one line unless --debug
            if debug_enabled():
                traceback.print_exc()
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            _print_error(f"{type(err).__name__}: {first}", "re-run with --debug for the traceback")
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def _print_error(message: str, hint: str | None) -> None:
    """The one error line (and hint). Messages quote user and model text: never markup, never raw."""
    console.print(Text.assemble(("error:", "bold red"), " ", plain(message)), soft_wrap=True)
    if hint:
        console.print(plain(f"hint: {hint}", style="dim"), soft_wrap=True)


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


def stop_on_signals(what: str) -> asyncio.Event:
    """An event set by the first SIGINT or SIGTERM (printing `NAME: what`); a second signal stops at once.

    Servers drain on the event (finish what is in flight, write what is open) and exit; must be called
    from inside the running event loop.
    """
    import signal

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(name: str) -> None:
        if stop.is_set():
            raise KeyboardInterrupt  # a second signal: stop now
        console.print(f"{name}: {what}")
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig.name)
    return stop
