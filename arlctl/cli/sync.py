"""`arlctl sync`: publish the newest checkpoint as policy/vN and point LATEST at it (over stages/sync.py)."""

from __future__ import annotations

from typing import Any

import typer

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.cli.options import config_command
from arlctl.stages.configs import SyncConfig
from arlctl.stages.jobs import SyncOptions

HELP = """Publish the newest complete checkpoint as POLICYDIR/vNNNNNN (HF files + version.json with the sha256 of the weights), atomically replace POLICYDIR/LATEST, keep the newest --keep versions. Idempotent: re-running with nothing new does nothing. A checkpoint whose weights hold NaN or inf is refused (exit 1, naming the tensor) and LATEST keeps naming the last good version.

  arlctl sync --run RUN

  arlctl sync --ckpt RUN/checkpoints --policy-dir RUN/policy --keep 5

  arlctl sync --run s3://bucket/run    # on an object store: version.json marks a version complete
"""


def register(app: typer.Typer) -> None:
    @app.command("sync", help=HELP)
    @handle_errors
    @config_command(SyncConfig, options=SyncOptions)
    def sync_cmd(cfg: SyncConfig, opts: SyncOptions) -> None:
        # torch comes with the stage: import late so `arlctl --help` stays fast
        from arlctl.stages import sync as stage

        job = stage.plan_sync(cfg, opts)

        def show(result: Any) -> None:
            console.print(result.summary_line(opts.dry_run), markup=False, soft_wrap=True)
            if result.version is not None:
                for removed in result.removed:
                    console.print(f"removed old version {removed}")
            if result.notified is not None:
                console.print(f"notified {len(cfg.notify)} servers to load {result.name}")
            if opts.as_json:
                print_json(result.to_json())

        stage.run_job(job, on_round=show)
