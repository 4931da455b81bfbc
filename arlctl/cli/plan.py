"""`arlctl plan` (being built; registers nothing yet)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    pass
