"""`arlctl reward`: score rollouts; 1:1 output shards; inputs already consumed are skipped."""

from __future__ import annotations

import typer
from rich.markup import escape

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.cli.daemon import LOCK_WAIT_HELP, POLL_HELP, WATCH_HELP, run_stage
from arlctl.cli.rollout import parse_env_options
from arlctl.errors import TerminalError
from arlctl.io.layout import resolve_io

MAX_ROW_ERRORS_SHOWN = 10  # rows named on stderr per round; --json carries them all

HELP = """Score trajectories with a reward function: fills reward, reward_components, reward_info and
reward_version. Each input shard gives one output shard of the same name; re-running skips what the
output directory already holds (lineage), so it is safe after a crash or from cron.

  arlctl reward --run runs/r1 --reward math

  arlctl reward --in runs/r1/rollouts --out runs/r1/rewarded-v2 --reward math --reward-opt format_weight=0.1

  arlctl reward --run runs/r1 --watch --poll 5 --worker 0/2      # a daemon taking half the shards

A row whose task is not a JSON object, or that the reward function fails on, gets reward = null and
reward_info {"error": cause}, named on stderr; its shard is still written. An unreadable input shard
is reported (exit 1) after the others are rewarded; --quarantine moves it to _quarantine/ instead.
"""


def register(app: typer.Typer) -> None:
    @app.command("reward", help=HELP)
    @handle_errors
    def reward_cmd(
        reward: str = typer.Option("math", "--reward", help="Reward function: math, swe."),
        run: str = typer.Option(None, "--run", help="Run directory: RUN/rollouts -> RUN/rewarded."),
        in_: str = typer.Option(None, "--in", help="Input shard directory."),
        out: str = typer.Option(None, "--out", help="Output shard directory."),
        reward_opt: list[str] = typer.Option([], "--reward-opt", help="KEY=VALUE options of the reward."),
        concurrency: int = typer.Option(4, "--concurrency", help="Rows graded at once (sandboxed graders)."),
        quarantine: bool = typer.Option(False, "--quarantine", help="Move corrupt inputs to _quarantine/ and go on."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Score but write nothing."),
        worker: str = typer.Option(None, "--worker", help="I/N: take only worker I's share of the inputs (0-based)."),
        watch: bool = typer.Option(False, "--watch", help=WATCH_HELP),
        poll: float = typer.Option(5.0, "--poll", help=POLL_HELP),
        lock_wait: float = typer.Option(0.0, "--lock-wait", help=LOCK_WAIT_HELP),
        as_json: bool = typer.Option(False, "--json", help="One JSON summary on stdout."),
    ) -> None:
        from arlctl.envs.registry import get_reward
        from arlctl.io.partition import parse_worker
        from arlctl.stages.reward import RewardSummary, reward_dir

        in_, out = resolve_io("reward", run, in_, out)
        shard = parse_worker(worker)
        reward_options = parse_env_options(reward_opt)
        fn = get_reward(reward, **reward_options)
        if reward == "swe" and not dry_run:  # the grader's sandbox must run pytest, or every row fails
            from arlctl.doctor import DoctorOptions, preflight, stage_checks

            kind = str(reward_options.get("sandbox") or "bwrap")
            preflight(stage_checks("swe", kind, grading=True),
                      DoctorOptions(sandbox=kind, image=reward_options.get("image")))
        mode = "quarantine" if quarantine else "raise"
        total = RewardSummary()

        def once(stop) -> dict:
            done = reward_dir(in_, out, fn, concurrency=concurrency, on_corrupt=mode, dry_run=dry_run,
                              worker=shard, stop=stop)
            for name in ("inputs_seen", "skipped_consumed", "rows", "reward_sum"):
                setattr(total, name, getattr(total, name) + getattr(done, name))
            total.written += done.written
            total.corrupt += done.corrupt
            total.row_errors += done.row_errors
            for line in done.row_errors[:MAX_ROW_ERRORS_SHOWN]:
                console.print(f"[yellow]no reward[/] {escape(line)}", soft_wrap=True)
            if len(done.row_errors) > MAX_ROW_ERRORS_SHOWN:
                console.print(f"[yellow]no reward[/] ... and {len(done.row_errors) - MAX_ROW_ERRORS_SHOWN} more rows "
                              "(each has reward_info.error)")
            return done.as_dict()

        run_stage(once, out=out, lock_name="reward" if shard[1] == 1 else f"reward-worker{shard[0]}of{shard[1]}",
                  watch=watch, poll=poll, lock_wait=lock_wait, dry_run=dry_run,
                  units=lambda summary: len(summary["written"]))
        summary = total.as_dict()
        summary["reward_version"] = fn.version
        if as_json:
            print_json(summary)
        mean = "-" if summary["mean_reward"] is None else f"{summary['mean_reward']:.4f}"
        verb = "would write" if dry_run else "wrote"
        console.print(f"rewarded {summary['rows']} rows ({fn.version}), mean reward {mean}; {verb} "
                      f"{len(summary['written']) if not dry_run else summary['inputs'] - summary['skipped_consumed']} "
                      f"shards to {out}; skipped {summary['skipped_consumed']} already consumed"
                      + (f"; {len(summary['row_errors'])} rows got no reward (see above)" if summary["row_errors"] else ""))
        for line in summary["corrupt"]:
            console.print(f"[yellow]quarantined[/] {escape(line)}", soft_wrap=True)
        if summary["rows"] and not total.rewarded:  # every row failed: a broken grader, not a 0 for the policy
            raise TerminalError(f"no row got a reward: all {summary['rows']} failed; first: {total.row_errors[0]}",
                                hint="run `arlctl doctor`; the rows are written with reward_info.error")
