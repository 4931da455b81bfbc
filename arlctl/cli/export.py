"""`arlctl export`: send a run's metrics to TensorBoard, W&B or MLflow, each value exactly once."""

from __future__ import annotations

import typer

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.cli.options import DryRunOpt, JsonOpt, config_command
from arlctl.render import plain
from arlctl.trackers import ExportConfig

HELP = """Send every numeric metric of a run to experiment trackers: train rows (RUN/metrics/train-step-*.parquet) at their step, rollout and reward rows (one per invocation) at their invocation number, eval summaries (RUN/evals/NAME/vNNNNNN/summary.json) at their policy version. Tags are STREAM/METRIC (train/loss, rollout/generated_tokens_per_s, eval/gsm8k/accuracy).

Nothing is sent twice: each tracker destination has a cursor in RUN/exports/TRACKER/, replaced after the tracker accepted each batch, so a re-run, or --follow after a crash, sends only what is new. TensorBoard writes event files to RUN/exports/tensorboard (or --tb-dir); W&B runs offline by default in RUN/exports/wandb (upload later with `wandb sync`); MLflow logs to a local store, sqlite:///RUN/exports/mlflow/mlflow.db (or --mlflow-uri). The tracker packages come with `pip install 'arlctl\\[trackers]'`. A metrics file that cannot be read is named and the command exits 1 after sending the rest.

  arlctl export runs/r1 --to tensorboard && tensorboard --logdir runs/r1/exports/tensorboard

  arlctl export runs/r1 --to wandb --to mlflow --follow --every 10

  arlctl export runs/r1 --to mlflow --dry-run --json | jq .trackers.mlflow.rows
"""


def register(app: typer.Typer) -> None:
    @app.command("export", help=HELP)
    @handle_errors
    @config_command(ExportConfig)
    def export_cmd(
        cfg: ExportConfig,
        run: str = typer.Argument(..., help="Run directory (local path or fsspec URL)."),
        as_json: JsonOpt = False,
        dry_run: DryRunOpt = False,
    ) -> None:
        from arlctl.errors import TerminalError, UsageError
        from arlctl.io.fs import get_fs
        from arlctl.trackers.export import export

        fs, path = get_fs(run)
        if not fs.exists(path):
            raise UsageError(f"run directory {run} does not exist")
        cfg.check()
        if cfg.follow and not dry_run:
            console.print(plain(f"following {run} (every {cfg.every:g}s); Ctrl-C stops after the current batch"))
        result = export(run, cfg, dry_run=dry_run, log=lambda line: console.print(plain(line)))
        if as_json:
            print_json(result.to_json())
        else:
            console.print(plain(result.summary_line()))
        for url, err in result.unreadable.items():
            console.print(plain(f"unreadable: {url}: {err}", style="yellow"))
        if result.unreadable:
            first = next(iter(result.unreadable.items()))
            raise TerminalError(f"{len(result.unreadable)} metrics source(s) could not be read; first: {first[0]}: "
                                f"{first[1]}", hint="fix or remove the file; the next export sends it once readable")
