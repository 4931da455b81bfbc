"""How `--help` reads, piped or on a terminal: examples verbatim, flags shown as flags, big commands in panels.

Typer renders help with Rich, which wraps every paragraph to the console (80 columns when piped), so an
example command was cut mid-command, and it shows every option's type, so a flag read `--json <bool>`.
A help text's example paragraphs (every line starts with `arlctl ` or is indented two spaces) are taken out
of the wrapped prose and printed last, under "Examples", one line each whatever the width. Options of a
command with PANEL_MIN or more get the panel arlctl/cli/options.py `PANELS` gives their name.
`use_help_format(app)` puts every command and group of the app on these classes.
"""

from __future__ import annotations

import inspect
import textwrap
from typing import Any

import typer
from rich.text import Text
from typer import rich_utils
from typer.core import TyperCommand, TyperGroup
from typer.models import DefaultPlaceholder

from arlctl.cli.options import PANEL_OF

PANEL_MIN = 15  # options (help included) from which a command's options are grouped into panels


def is_example(paragraph: str) -> bool:
    """A paragraph to print verbatim: each line an `arlctl ...` command or indented (a shell example)."""
    lines = paragraph.splitlines()
    return bool(lines) and all(line.startswith("  ") or line.startswith("arlctl ") for line in lines)


def split_examples(help_text: str) -> tuple[str, list[str]]:
    """(the prose paragraphs, the example paragraphs) of a command's help text."""
    paragraphs = inspect.cleandoc(help_text).split("\n\n")
    prose = [p for p in paragraphs if not is_example(p)]
    return "\n\n".join(prose), [p for p in paragraphs if is_example(p)]


class _ArlctlHelp:
    """format_help for a Typer command or group (mixed in before TyperCommand / TyperGroup)."""

    help: str | None

    def format_help(self, ctx: Any, formatter: Any) -> None:
        params = self.get_params(ctx)  # type: ignore[attr-defined]
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""  # a flag takes no value: show `--json`, not `--json <bool>`
            if len(params) >= PANEL_MIN and getattr(param, "rich_help_panel", None) is None:
                param.rich_help_panel = PANEL_OF.get(param.name or "")
        full = self.help or ""
        prose, examples = split_examples(full)
        self.help = prose
        try:
            super().format_help(ctx, formatter)  # type: ignore[misc]
        finally:
            self.help = full
        if examples:
            console = rich_utils._get_rich_console()
            console.print(" Examples:", style="bold")
            for paragraph in examples:
                console.print()
                for line in textwrap.dedent(paragraph).splitlines():
                    # soft_wrap: no wrapping and no cropping, so a copied line is the whole command
                    console.print(Text("   " + line), soft_wrap=True)
            console.print()


class ArlctlCommand(_ArlctlHelp, TyperCommand):
    pass


class ArlctlGroup(_ArlctlHelp, TyperGroup):
    pass


def use_help_format(app: typer.Typer) -> None:
    """Every command and group registered on `app` (sub-apps included) renders help through these classes."""
    if _unset(app.info.cls, TyperGroup):
        app.info.cls = ArlctlGroup
    for command in app.registered_commands:
        if _unset(command.cls, TyperCommand):  # app.command() fills in TyperCommand itself
            command.cls = ArlctlCommand
    for group in app.registered_groups:
        if group.typer_instance is not None:
            use_help_format(group.typer_instance)


def _unset(cls: Any, default: type) -> bool:
    """A class Typer would pick by default (None, its placeholder, or the default class itself)."""
    return cls is None or cls is default or isinstance(cls, DefaultPlaceholder)
