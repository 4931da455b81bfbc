"""`arlctl validate`: check every shard; optionally move bad ones to `_quarantine/`."""

from __future__ import annotations

import typer
from rich.markup import escape

from arlctl.cli.common import MAX_STRAYS_SHOWN, console, handle_errors, print_json
from arlctl.errors import CorruptShardError, TerminalError, UsageError
from arlctl.io.shards import quarantine, read_shard, scan
from arlctl.render import one_line, terminal_safe

HELP = """Check every shard (Parquet readable, trajectory schema, known version, token layout) and every value in it: token ids in [0, --vocab-size), masks in {0, 1}, finite log-probs <= 0, turn offsets inside the row, policy versions in [0, 10^9], finite rewards, advantages and weights (rule invalid_values). Exits 1 with one line per bad shard naming the rule and the first bad rows. --quarantine moves bad shards to `_quarantine/` beside them. A file not named like a shard (ASCII letters, digits and . _ = + - only, ending .parquet: no glob character, space, newline or escape) is never read; such files are counted in one warning.

  arlctl validate RUN/rollouts RUN/rewarded

  arlctl validate RUN/batches --vocab-size 49152

  arlctl validate RUN/rollouts --quarantine --json
"""


def validate_paths(paths: list[str], move_bad: bool, vocab_size: int | None = None) -> dict:
    good, bad, strays = [], [], []
    for path in paths:
        listing = scan(path)
        strays.extend(listing.strays)
        for shard in listing.shards:
            try:
                table = read_shard(shard, vocab_size=vocab_size)
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
        vocab_size: int = typer.Option(None, "--vocab-size",
                                       help="Token ids must be below this (the policy's vocabulary size)."),
        as_json: bool = typer.Option(False, "--json", help="One JSON summary on stdout."),
    ) -> None:
        if vocab_size is not None and vocab_size < 1:
            raise UsageError("--vocab-size must be >= 1")
        report = validate_paths(paths, move_bad, vocab_size)
        if not report["ok"] and not report["bad"]:
            raise TerminalError(f"no shards found at {', '.join(paths)}", hint="shards are *.parquet files")
        if as_json:
            print_json(report)
        if report["strays"]:  # one warning, every name on one line (a planted newline or escape spelled out)
            shown = ", ".join(one_line(stray) for stray in report["strays"][:MAX_STRAYS_SHOWN])
            more = len(report["strays"]) - MAX_STRAYS_SHOWN
            console.print(f"[yellow]warning:[/] {len(report['strays'])} file(s) not read (not a shard name): "
                          f"{escape(shown)}" + (f" and {more} more" if more > 0 else ""), soft_wrap=True)
        for entry in report["bad"]:
            moved = f" -> {entry['quarantined_to']}" if "quarantined_to" in entry else ""
            console.print(f"[red]bad[/] {escape(one_line(entry['shard']))}: {escape(terminal_safe(entry['error']))}{escape(moved)}", soft_wrap=True)
        console.print(f"{report['ok']} good shards ({report['rows']} rows), {len(report['bad'])} bad")
        if report["bad"]:
            raise typer.Exit(1)
