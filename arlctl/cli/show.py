"""`arlctl show`: one trajectory, turn by turn (drawn by arlctl/render.py, which `arlctl report` shares)."""

from __future__ import annotations

from typing import Any

import typer

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.cli.query import gather_shards
from arlctl.errors import TerminalError
from arlctl.io.duck import VIEW, connect
from arlctl.render import mask_spans, render

HELP = """Show one trajectory turn by turn: the prompt, each generation (sampled, mask 1, green), each tool call and observation (environment, mask 0, dim), then the reward and its details. An id prefix is enough when it is unique.

  arlctl show 0192f3c4 RUN/rewarded

  arlctl show 0192f3c4-... RUN/rollouts --json
"""


def find_trajectory(paths: list[str], trajectory_id: str) -> dict[str, Any]:
    con = connect(gather_shards(paths))
    table = con.sql(
        f"select * from {VIEW} where starts_with(trajectory_id, $id) limit 2", params={"id": trajectory_id}
    ).to_arrow_table()
    if table.num_rows == 0:
        raise TerminalError(f"no trajectory with id {trajectory_id!r} in {', '.join(paths)}")
    if table.num_rows > 1:
        raise TerminalError(f"id prefix {trajectory_id!r} is ambiguous", hint="give more characters of the id")
    return table.to_pylist()[0]


def register(app: typer.Typer) -> None:
    @app.command("show", help=HELP)
    @handle_errors
    def show(
        trajectory_id: str = typer.Argument(..., help="Trajectory id or a unique prefix."),
        paths: list[str] = typer.Argument(..., help="Shard files or directories."),
        as_json: bool = typer.Option(False, "--json", help="The row as one JSON object (token lists included)."),
    ) -> None:
        row = find_trajectory(paths, trajectory_id)
        if as_json:
            row["reward_components"] = dict(row["reward_components"] or [])
            row["mask_spans"] = mask_spans(row["response_mask"])
            print_json(row)
            return
        render(row, console)
