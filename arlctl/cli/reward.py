"""`arlctl reward`: score rollouts; 1:1 output shards; inputs already consumed are skipped (the job:
stages/reward_job.py)."""

from __future__ import annotations

import typer
from rich.markup import escape

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.cli.options import config_command
from arlctl.render import plain
from arlctl.stages.configs import RewardConfig
from arlctl.stages.jobs import RewardOptions

MAX_ROW_ERRORS_SHOWN = 10  # rows named on stderr per round; --json carries them all

HELP = """Score trajectories with a reward function: fills reward, reward_components, reward_info and reward_version. Each input shard gives one output shard of the same name; re-running skips what the output directory already holds (lineage), so it is safe after a crash or from cron.

  arlctl reward --run runs/r1 --reward math

  arlctl reward --in runs/r1/rollouts --out runs/r1/rewarded-v2 --reward math --reward-opt format_weight=0.1

  arlctl reward --run runs/r1 --watch --poll 5 --worker 0/2      # a daemon taking half the shards

  arlctl reward --run runs/mix --reward auto --reward-opt swe.sandbox=docker

  arlctl reward --run runs/r1 --reward 'swe + 0.2*judge + 0.1*format' --reward-opt judge.rubric=rubric.yaml

  arlctl reward --run runs/r1 --reward http://grader:8100/swe --concurrency 64      # an `arlctl reward-serve`

  arlctl reward --in runs/r1/rollouts --out runs/r1/rewarded --cache s3://bucket/reward-cache

--reward auto scores each row with the reward registered under the row's own `env` (built in, or a plugin's `arlctl.rewards` entry point of that name); --reward-opt then takes ENV.KEY=VALUE. A row whose env has no reward gets reward = null with reward_info.error "no reward registered for env X", never 0. The rows of a `rollout --history per-turn` trajectory are scored once, on their last row, and all get that reward. A reward that compares the members of a GRPO group (genrm) is called once per group.

A weighted sum ('A + 0.2*B', ' - ' with spaces subtracts) scores each component on its own: reward_components holds each component's value under its name (and its own components as NAME.PART), the reward is the weighted sum, reward_version composite(...) names every part; --reward-opt takes COMPONENT.KEY=VALUE. A component without a reward leaves the row's reward null with the component named, never counted as 0.

The reward cache: a row already scored under the same reward_version (options, rubric hash and judge model included) is not scored again. It is on by default with --run (RUN/reward-cache), off without --run unless --cache URL is given; --no-cache turns it off. Composite rewards are cached per component, so a changed weight re-runs no judge. Rows that got no reward are never cached (they are retried next time). Hits and misses are counted in the summary.

A row whose task is not a JSON object, or that the reward function fails on, gets reward = null and reward_info {"error": cause}, named on stderr; its shard is still written. An unreadable input shard is reported (exit 1) after the others are rewarded; --quarantine moves it to _quarantine/ instead. When no row got a reward, or more than --max-error-frac of the rows got none, the command exits 1 naming the most common cause, after writing its output. A reward server that cannot be reached, does not answer within $ARLCTL_REWARD_TIMEOUT_S seconds (default 900, one deadline per request over connect, headers and body) or answers anything but a JSON object exits 75 (retry later) naming the server, with its shard still pending; answers are read up to $ARLCTL_MAX_REWARD_ANSWER_BYTES (256 MiB), and only JSON numbers are rewards. SIGTERM stops at the next row: a shard stopped half-way is not written. One metrics row per invocation goes to RUN/metrics/reward-*.parquet: rows, rewarded, errors, seconds, error_causes (JSON {cause: rows}; "infra:" causes are the grader's, not the policy's), cache_hits, cache_misses, truncated and on_truncated.

Each output records the reward settings it was scored with: an input whose output was scored with other settings (another --reward, --reward-opt, --on-truncated) is kept as it is and named; when nothing else was rewarded the command exits 1: give a new --out to score it with these.
"""


def register(app: typer.Typer) -> None:
    @app.command("reward", help=HELP)
    @handle_errors
    @config_command(RewardConfig, options=RewardOptions)
    def reward_cmd(cfg: RewardConfig, opts: RewardOptions) -> None:
        from arlctl.stages import reward_job

        job = reward_job.plan_reward(cfg, opts)
        for line in job.warnings:
            console.print(f"[yellow]warning[/] {escape(line)}", soft_wrap=True)
        total = reward_job.run_job(job, on_round=_show_row_errors)
        if opts.as_json:
            print_json(reward_job.summary(job, total))
        console.print(plain(total.summary_line(job.reward.version, job.io.out, job.io.dry_run,
                                               cache=job.cache is not None)), soft_wrap=True)
        for line in total.corrupt:
            console.print(f"[yellow]quarantined[/] {escape(line)}", soft_wrap=True)
        if total.other_reward:
            console.print(f"[yellow]warning[/] kept as they are, rewarded earlier with other settings: "
                          f"{escape(', '.join(total.other_reward[:5]))}"
                          + (f" and {len(total.other_reward) - 5} more" if len(total.other_reward) > 5 else ""),
                          soft_wrap=True)
        error = reward_job.verdict(job, total)
        if error is not None:
            raise error


def _show_row_errors(done) -> None:
    for line in done.row_errors[:MAX_ROW_ERRORS_SHOWN]:
        console.print(f"[yellow]no reward[/] {escape(line)}", soft_wrap=True)
    if len(done.row_errors) > MAX_ROW_ERRORS_SHOWN:
        console.print(f"[yellow]no reward[/] ... and {len(done.row_errors) - MAX_ROW_ERRORS_SHOWN} more rows "
                      "(each has reward_info.error)")
