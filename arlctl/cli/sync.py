"""`arlctl sync`: publish the newest checkpoint as policy/vN and point LATEST at it (over stages/sync.py)."""

from __future__ import annotations

import typer

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.cli.daemon import LOCK_WAIT_HELP, POLL_HELP, WATCH_HELP, run_stage
from arlctl.errors import UsageError
from arlctl.io.fs import join

HELP = """Publish the newest complete checkpoint as POLICYDIR/vNNNNNN (HF files + version.json with the
sha256 of the weights), atomically replace POLICYDIR/LATEST, keep the newest --keep versions.
Idempotent: re-running with nothing new does nothing. A checkpoint whose weights hold NaN or inf is
refused (exit 1, naming the tensor) and LATEST keeps naming the last good version.

  arlctl sync --run RUN

  arlctl sync --ckpt RUN/checkpoints --policy-dir RUN/policy --keep 5

  arlctl sync --run s3://bucket/run    # on an object store: version.json marks a version complete
"""


def register(app: typer.Typer) -> None:
    @app.command("sync", help=HELP)
    @handle_errors
    def sync_cmd(
        ckpt: str = typer.Option(None, "--ckpt", help="Checkpoint directory (default RUN/checkpoints)."),
        policy_dir: str = typer.Option(None, "--policy-dir", help="Policy directory (default RUN/policy)."),
        run: str = typer.Option(None, "--run", help="Run directory that fills the defaults."),
        keep: int = typer.Option(3, "--keep", help="Versions to keep."),
        notify: list[str] = typer.Option([], "--notify", help="Inference server URL to reload (repeatable)."),
        notify_flavor: str = typer.Option("vllm", "--notify-flavor", help="Server kind: vllm or sglang."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Say what would happen; change nothing."),
        watch: bool = typer.Option(False, "--watch", help=WATCH_HELP),
        poll: float = typer.Option(5.0, "--poll", help=POLL_HELP),
        lock_wait: float = typer.Option(0.0, "--lock-wait", help=LOCK_WAIT_HELP),
        as_json: bool = typer.Option(False, "--json", help="One JSON summary on stdout."),
    ) -> None:
        from arlctl.stages.sync import sync  # torch comes with it: import late so `arlctl --help` stays fast

        if run is None and (ckpt is None or policy_dir is None):
            raise UsageError("give --ckpt and --policy-dir, or --run RUN")
        ckpt = ckpt or join(run, "checkpoints")
        policy_dir = policy_dir or join(run, "policy")
        def once(stop) -> dict:
            summary = sync(ckpt, policy_dir, keep=keep, dry_run=dry_run)
            if summary["version"] is None:
                console.print(f"nothing to do: {summary['nothing_to_do']}")
                if as_json:
                    print_json(summary)
                return summary
            name = f"v{summary['version']:06d}"
            if dry_run:
                verb = "would publish" if summary["would_publish"] else "already published"
                console.print(f"dry run: {verb} {name} from {summary['source_checkpoint']}")
            elif summary["stale"]:
                console.print(f"nothing to do: {name} is older than LATEST ({summary['previous']}); LATEST unchanged")
            elif summary["published"] or summary["latest_updated"]:
                console.print(f"published [bold]{name}[/] -> {summary['path']} (LATEST updated: {summary['latest_updated']})")
            else:
                console.print(f"nothing to do: {name} is already published")
            for removed in summary["removed"]:
                console.print(f"removed old version {removed}")
            if notify and not dry_run and not summary["stale"] and (not watch or summary["latest_updated"]):
                import asyncio

                from arlctl.inference.openai import notify_reload

                # Raises TransientError (exit 75) naming the servers that failed; the others have reloaded.
                summary["notified"] = asyncio.run(notify_reload(notify, str(summary["path"]), flavor=notify_flavor))
                console.print(f"notified {len(notify)} servers to load {name}")
            if as_json:
                print_json(summary)
            return summary

        run_stage(once, out=policy_dir, lock_name="sync", watch=watch, poll=poll, lock_wait=lock_wait,
                  dry_run=dry_run, units=lambda summary: int(bool(summary.get("latest_updated"))))
