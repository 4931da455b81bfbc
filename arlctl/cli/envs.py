"""`arlctl envs`: the environments and reward functions `--env` / `--reward` accept, and where each comes from."""

from __future__ import annotations

import typer

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.render import plain

HELP = """List environments and reward functions: built in (with their module), installed plugins (Python entry points in the groups arlctl.envs / arlctl.rewards, with distribution and version) and their notes. Plugins are listed, not loaded. Any `package.module:attribute` spec works too without being listed.

  arlctl envs

  arlctl envs --json | jq '.envs[] | select(.source == "entry-point")'

  arlctl rollout --env mypkg.env:make --tasks tasks.jsonl --policy tiny --out /tmp/r   # out-of-tree env

A plugin name equal to a built-in one is shown as shadowed: the built-in wins."""


def register(app: typer.Typer) -> None:
    @app.command("envs", help=HELP)
    @handle_errors
    def envs_cmd(as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout.")) -> None:
        from arlctl.envs.registry import catalog

        listing = {"envs": catalog("env"), "rewards": catalog("reward")}
        if as_json:
            print_json(listing)
            return
        for title, entries in (("environments (--env)", listing["envs"]), ("rewards (--reward)", listing["rewards"])):
            console.print(title, style="bold")
            width = max((len(entry["name"]) for entry in entries), default=0)
            for entry in entries:
                # Plugin metadata is data from outside: plain text, never Rich markup.
                console.print(plain(f"  {entry['name']:<{width}}  {_describe(entry)}"), soft_wrap=True)


def _describe(entry: dict) -> str:
    """One entry's source: `builtin arlctl.envs.math (math-1)`, `entry point of DIST VERSION: module:attr`."""
    if entry["source"] == "entry-point":
        text = f"entry point of {entry['distribution']} {entry['distribution_version']}: {entry['module']}"
    else:
        text = f"{entry['source']} {entry.get('module', '')}"
    if entry.get("version"):
        text += f" ({entry['version']})"
    note = entry.get("note") or entry.get("error")
    return f"{text}  -- {note}" if note else text
