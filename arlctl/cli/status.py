"""`arlctl status`: the state of a run directory once — what waits where, versions, backlog, staleness."""

from __future__ import annotations

import typer

from arlctl.cli.common import console, handle_errors, print_json

HELP = """Show a run directory's state: per stage the shards and rows waiting at its input and what it wrote, the published policy version and the trainer step, the untrained backlog (the number rollout --max-pending bounds), the staleness distribution of trained and waiting rows, the reward trend, the last errors stages recorded in RUN/metrics and their error causes summed over all metrics files (infrastructure causes "infra:..." first), and, when the run mixes envs, rows and recent reward per env. Works on local paths and fsspec URLs (s3://...).

  arlctl status runs/r1

  arlctl status s3://bucket/runs/r1 --json | jq .backlog.total

  arlctl status runs/r1 --json | jq '.error_causes, .by_env'
"""


def register(app: typer.Typer) -> None:
    @app.command("status", help=HELP)
    @handle_errors
    def status_cmd(
        run: str = typer.Argument(..., help="Run directory (local path or fsspec URL)."),
        recent: int = typer.Option(10, "--recent", help="Rewarded shards in the reward trend."),
        as_json: bool = typer.Option(False, "--json", help="The state as one JSON object on stdout."),
    ) -> None:
        from arlctl.errors import UsageError
        from arlctl.io.fs import get_fs
        from arlctl.runstate import render, run_state

        fs, path = get_fs(run)
        if not fs.exists(path):
            raise UsageError(f"run directory {run} does not exist")
        state = run_state(run, recent=recent)
        if as_json:
            print_json(state)
            return
        console.print(render(state))
