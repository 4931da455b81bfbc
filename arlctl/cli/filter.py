"""`arlctl filter`: rewarded trajectories -> batch shards with advantages (thin layer over stages/filter.py)."""

from __future__ import annotations

from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.cli.options import config_command
from arlctl.stages.configs import FilterConfig
from arlctl.stages.jobs import FilterOptions

MAX_INVALID_SHOWN = 10  # invalid rows named on stderr per invocation; --json carries them all

HELP = """Filter rewarded trajectories and pack them into batch shards, one optimizer step each.

Rules, in order, each reported with its count: invalid_values, completeness, untrusted, group_integrity, zero_variance, duplicate, staleness, where, balance. invalid_values drops rows holding values no stage may trust (token ids outside [0, --vocab-size), masks outside {0, 1}, non-finite log-probs or rewards, turn offsets outside the row, absurd versions), each named with its shard on stderr. untrusted drops rows whose reward_info says trusted: false (a verdict the policy's code could have forged: swe rows graded in-process; `arlctl swe prepare` gives rows the probe form trusted grading needs); --keep-untrusted keeps them. Rewards that do not say (math, judges) are not touched. Input shards already consumed (named in a batch's checked lineage) are skipped; lineage is compared by hash, never executed. Every trajectory's outcome is recorded in METRICS/filter-<invocation>.parquet.

  arlctl filter --run RUN

  arlctl filter --in RUN/rewarded --out RUN/batches --batch-groups 4 --adv group-mean --max-lag 2

  arlctl filter --run RUN --where "num_tool_calls > 0" --dry-run

Turn-level credit: --adv turn (or turn-mean) gives every assistant turn its own advantage from step rewards (the env's turns[].reward_step, else a judge's reward_info step_rewards) and the reward: R_t = r_t + G * R_{t+1}, R_last = r_last + reward, baselined per turn index within the group; train applies it to that turn's tokens.

  arlctl filter --run RUN --adv turn --gamma 0.9
"""


def register(app: typer.Typer) -> None:
    @app.command("filter", help=HELP)
    @handle_errors
    @config_command(FilterConfig, options=FilterOptions)
    def filter_cmd(cfg: FilterConfig, opts: FilterOptions) -> None:
        # torch comes with the stage: import late so `arlctl --help` stays fast
        from arlctl.stages import filter as stage

        job = stage.plan_filter(cfg, opts)

        def show(result) -> None:
            if result.inputs or not job.watch:
                _render(result, job.io.out)
                if opts.as_json:
                    print_json(result.to_json())

        stage.run_job(job, on_round=show)


def _render(result: Any, out_url: str) -> None:
    from arlctl.stages.filter import RULES

    for name in result.quarantined:
        console.print(f"[yellow]quarantined corrupt input[/] {name}")
    for line in result.untrusted:
        console.print(f"[yellow]warning:[/] lineage not trusted, it marks nothing consumed: {escape(line)}",
                      soft_wrap=True)
    for line in result.unresumed:
        console.print(f"[yellow]warning:[/] {escape(line)}", soft_wrap=True)
    for line in result.invalid[:MAX_INVALID_SHOWN]:
        console.print(f"[yellow]dropped invalid row[/] {escape(line)}", soft_wrap=True)
    if len(result.invalid) > MAX_INVALID_SHOWN:
        console.print(f"[yellow]dropped invalid row[/] ... and {len(result.invalid) - MAX_INVALID_SHOWN} more "
                      "(every one is in the metrics audit under rule invalid_values)")
    for name in result.recovered:
        console.print(f"recovered interrupted batch [bold]{name}[/]")
    if not result.inputs:
        console.print(result.summary_line(out_url))
        return
    table = Table("rule", "dropped", title=f"filter: {result.rows_in} rows from {len(result.inputs)} shards "
                  f"(policy version {result.current_version})", title_justify="left")
    for rule in RULES:
        label = "reweighted" if rule == "balance" else ""
        table.add_row(rule, f"{result.rules[rule]} {label}".strip())
    table.add_row("[bold]kept[/]", f"{result.rows_kept} rows, {result.groups_kept} groups")
    console.print(table)
    console.print(result.summary_line(out_url), markup=False, soft_wrap=True)
