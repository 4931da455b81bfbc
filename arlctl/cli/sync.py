"""`arlctl sync`: publish the newest checkpoint as policy/vN and point LATEST at it (over stages/sync.py)."""

from __future__ import annotations

import typer

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.cli.options import config_command
from arlctl.errors import UsageError
from arlctl.io.run import resolve_io
from arlctl.io.stage_loop import run_stage
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
        from arlctl.stages.results import SyncIO

        run, dry_run, watch, as_json = opts.run, opts.dry_run, opts.watch, opts.as_json
        if run is None and (opts.ckpt is None or opts.policy_dir is None):
            raise UsageError("give --ckpt and --policy-dir, or --run RUN")
        ckpt, policy_dir = resolve_io("sync", run, opts.ckpt, opts.policy_dir, watch=watch,
                                      flags=("--ckpt", "--policy-dir"))
        io = SyncIO(ckpt=ckpt, policy_dir=policy_dir, dry_run=dry_run)

        def once(stop) -> dict:
            result = stage.run(cfg, io, stop)
            console.print(result.summary_line(dry_run), markup=False, soft_wrap=True)
            if result.version is not None:
                for removed in result.removed:
                    console.print(f"removed old version {removed}")
                if cfg.notify and not dry_run and not result.stale and (not watch or result.latest_updated):
                    import asyncio

                    from arlctl.inference.openai import notify_reload

                    # Raises TransientError (exit 75) naming the servers that failed; the others have reloaded.
                    result.notified = asyncio.run(notify_reload(cfg.notify, str(result.path),
                                                                flavor=cfg.notify_flavor))
                    console.print(f"notified {len(cfg.notify)} servers to load {result.name}")
            if as_json:
                print_json(result.to_json())
            return result.to_json()

        run_stage(once, out=io.policy_dir, lock_name="sync", watch=watch, poll=opts.poll, lock_wait=opts.lock_wait,
                  dry_run=dry_run, units=lambda summary: int(bool(summary.get("latest_updated"))))
