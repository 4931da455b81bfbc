"""`arlctl validate`: check every shard; optionally move bad ones to `_quarantine/`."""

from __future__ import annotations

import typer

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.errors import CorruptShardError, TerminalError
from arlctl.io.shards import quarantine, read_shard, scan

HELP = """Check every shard (Parquet readable, trajectory schema, known version, token layout).
Exits 1 with one line per bad shard. --quarantine moves bad shards to `_quarantine/` beside them.

  arlctl validate RUN/rollouts RUN/rewarded

  arlctl validate RUN/rollouts --quarantine --json
"""


def validate_paths(paths: list[str], move_bad: bool) -> dict:
    good, bad, strays = [], [], []
    for path in paths:
        listing = scan(path)
        strays.extend(listing.strays)
        for shard in listing.shards:
            try:
                table = read_shard(shard)
                good.append({"shard": shard, "rows": table.num_rows})
            except CorruptShardError as err:
                entry = {"shard": shard, "error": err.reason}
                if move_bad:
                    entry["quarantined_to"] = quarantine(shard)
                bad.append(entry)
    return {"ok": len(good), "bad": bad, "strays": strays, "rows": sum(g["rows"] for g in good)}


def register(app: typer.Typer) -> None:
    @app.command("validate", help=HELP)
    @handle_errors
    def validate(
        paths: list[str] = typer.Argument(..., help="Shard files or directories."),
        move_bad: bool = typer.Option(False, "--quarantine", help="Move bad shards to _quarantine/."),
        as_json: bool = typer.Option(False, "--json", help="One JSON summary on stdout."),
    ) -> None:
        report = validate_paths(paths, move_bad)
        if not report["ok"] and not report["bad"]:
            raise TerminalError(f"no shards found at {', '.join(paths)}", hint="shards are *.parquet files")
        if as_json:
            print_json(report)
        for stray in report["strays"]:
            console.print(f"[yellow]warning:[/] not a shard (ignored): {stray}", soft_wrap=True)
        for entry in report["bad"]:
            moved = f" -> {entry['quarantined_to']}" if "quarantined_to" in entry else ""
            console.print(f"[red]bad[/] {entry['shard']}: {entry['error']}{moved}", soft_wrap=True)
        console.print(f"{report['ok']} good shards ({report['rows']} rows), {len(report['bad'])} bad")
        if report["bad"]:
            raise typer.Exit(1)
