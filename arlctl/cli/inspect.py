"""`arlctl inspect`: what is in a set of shards, at a glance."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from arlctl.cli.common import console, handle_errors, plain, print_json
from arlctl.cli.query import gather_shards
from arlctl.io.duck import connect
from arlctl.stats import inspect_stats

HELP = """Summarise shards: rows, groups, statuses, rewards, advantages, policy versions and lag,
token statistics, the generation/environment time split, broken down per env.

  arlctl inspect RUN/rewarded

  arlctl inspect RUN/rollouts --json | jq .tokens
"""


def register(app: typer.Typer) -> None:
    @app.command("inspect", help=HELP)
    @handle_errors
    def inspect(
        paths: list[str] = typer.Argument(..., help="Shard files or directories (any fsspec URL)."),
        as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
    ) -> None:
        shards = gather_shards(paths)
        stats = inspect_stats(connect(shards))
        stats["shards"] = len(shards)
        if as_json:
            print_json(stats)
            return
        _render(stats)


def _kv_table(title: str, data: dict[str, Any]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    for key, value in data.items():
        table.add_row(plain(key), plain("-" if value is None else str(value)))  # keys come from shard data
    return table


def _render(stats: dict[str, Any]) -> None:
    console.print(f"[bold]{stats['rows']}[/] trajectories in {stats['groups']} groups "
                  f"({stats['tasks']} tasks, {stats['shards']} shards)")
    console.print(_kv_table("status", stats["status"]))
    console.print(_kv_table("finish reason", stats["finish_reason"]))
    console.print(_kv_table("reward", stats["reward"]))
    if stats["advantage"]["n"]:
        console.print(_kv_table("advantage", stats["advantage"]))
    console.print(_kv_table("policy versions", stats["policy_versions"]))
    console.print(_kv_table("tokens", stats["tokens"]))
    console.print(_kv_table("time", stats["time"]))
    per_env = stats["per_env"]
    if per_env:
        table = Table(*per_env[0].keys(), title="per env", title_justify="left")
        for row in per_env:
            table.add_row(*[plain("-" if v is None else str(v)) for v in row.values()])
        console.print(table)
