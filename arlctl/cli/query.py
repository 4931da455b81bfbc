"""`arlctl query`: SQL over trajectory shards with DuckDB (the view is named `trajectories`)."""

from __future__ import annotations

import csv
import sys

import duckdb
import typer
from rich.markup import escape
from rich.table import Table

from arlctl.cli.common import MAX_STRAYS_SHOWN, console, handle_errors, print_json
from arlctl.errors import TerminalError
from arlctl.io.duck import connect
from arlctl.io.shards import scan
from arlctl.render import one_line, plain

HELP = """Run SQL over shards; the rows are visible as the view `trajectories`.

List and struct columns work as in DuckDB:

  arlctl query "select env, avg(reward) from trajectories group by 1" RUN/rewarded

  arlctl query "select trajectory_id, len(response_ids) n from trajectories order by n desc limit 5" RUN/rollouts

  arlctl query "select t.tool_calls from trajectories, unnest(turns) as u(t) limit 3" RUN/rollouts --json
"""


def gather_shards(paths: list[str]) -> list[str]:
    """All shards under the given paths; strays (not *.parquet, or a name that globs) are reported, never read.

    A directory such as `runs/r[1]` is fine: no path reaches DuckDB as text (arlctl.io.duck opens each
    listed file with pyarrow), so it reads that run and not `runs/r1`.
    """
    shards: list[str] = []
    strays: list[str] = []
    for path in paths:
        listing = scan(path)
        strays.extend(listing.strays)
        shards.extend(listing.shards)
    if strays:  # one warning, every name on one line (a planted newline or escape spelled out)
        shown = ", ".join(one_line(stray) for stray in strays[:MAX_STRAYS_SHOWN])
        more = f" and {len(strays) - MAX_STRAYS_SHOWN} more" if len(strays) > MAX_STRAYS_SHOWN else ""
        console.print(f"[yellow]warning:[/] {len(strays)} file(s) not read (not a shard name): {escape(shown)}{more}",
                      soft_wrap=True)
    if not shards:
        raise TerminalError(f"no shards found at {', '.join(paths)}", hint="shards are *.parquet files")
    return shards


def register(app: typer.Typer) -> None:
    @app.command("query", help=HELP)
    @handle_errors
    def query(
        sql: str = typer.Argument(..., help="SQL; the shards are the view `trajectories`."),
        paths: list[str] = typer.Argument(..., help="Shard files or directories (any fsspec URL)."),
        as_json: bool = typer.Option(False, "--json", help="NDJSON rows on stdout."),
        as_csv: bool = typer.Option(False, "--csv", help="CSV on stdout."),
        limit: int = typer.Option(1000, "--max-rows", help="Rows shown in the table view."),
    ) -> None:
        shards = gather_shards(paths)
        foreign: list[str] = []
        con = connect(shards, foreign=foreign)
        _warn_foreign(foreign, len(shards))
        try:
            result = con.execute(sql)
        except duckdb.Error as err:
            message = " ".join(str(err).split())
            raise TerminalError(f"SQL error: {message}") from None
        columns = [d[0] for d in result.description] if result.description else []
        rows = result.fetchall()
        if as_json:
            for row in rows:
                print_json(dict(zip(columns, row, strict=True)))
            return
        if as_csv:
            writer = csv.writer(sys.stdout)
            writer.writerow(columns)
            writer.writerows(rows)
            return
        table = Table(*columns, show_lines=False)
        for row in rows[:limit]:
            table.add_row(*[plain(_cell(v)) for v in row])  # shard text: never markup or escape codes
        console.print(table)
        console.print(f"[dim]{len(rows)} rows[/]")


def _warn_foreign(foreign: list[str], total: int) -> None:
    """Parquet files that are not trajectory shards are never counted silently among the trajectories."""
    if not foreign:
        return
    shown = ", ".join(one_line(name) for name in foreign[:MAX_STRAYS_SHOWN])
    more = f" and {len(foreign) - MAX_STRAYS_SHOWN} more" if len(foreign) > MAX_STRAYS_SHOWN else ""
    if len(foreign) == total:
        console.print(f"[yellow]warning:[/] none of the {total} Parquet file(s) is a trajectory shard: "
                      f"`trajectories` holds their own columns ({escape(shown)}{more})", soft_wrap=True)
    else:
        console.print(f"[yellow]warning:[/] {len(foreign)} Parquet file(s) not read (not trajectory shards: "
                      f"no trajectory columns): {escape(shown)}{more}", soft_wrap=True)


def _cell(value: object) -> str:
    text = "NULL" if value is None else str(value)
    return text if len(text) <= 120 else text[:117] + "..."
