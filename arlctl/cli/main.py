"""The `arlctl` entry point: one Typer app; every command lives in its own module under arlctl/cli/."""

from __future__ import annotations

import importlib
import os

import typer

from arlctl import __version__
from arlctl.cli.help import use_help_format

HELP = """arlctl: agentic reinforcement learning as composable, crash-safe stages over Parquet shards.

Stages read and write one fixed trajectory schema, so they run one after another, from a shell loop or cron, or as daemons watching directories.

  arlctl query "select env, avg(reward) from trajectories group by 1" RUN/rewarded

  arlctl inspect RUN/rollouts --json | jq .rows
"""

app = typer.Typer(
    name="arlctl",
    help=HELP,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)

# Each module defines register(app). Listed in the order `--help` shows them.
COMMAND_MODULES = ["rollout", "reward", "filter", "train", "sync", "up", "status", "query", "inspect", "show", "validate", "model", "serve", "reward_serve", "eval", "report", "export", "plan", "fleet", "sandbox", "swe", "envs", "doctor"]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"arlctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
) -> None:
    if debug:
        os.environ["ARLCTL_DEBUG"] = "1"


for _name in COMMAND_MODULES:
    importlib.import_module(f"arlctl.cli.{_name}").register(app)
use_help_format(app)  # examples verbatim, flags as flags, panels (arlctl/cli/help.py)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
