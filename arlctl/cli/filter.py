"""`arlctl filter`: rewarded trajectories -> batch shards with advantages (thin layer over stages/filter.py)."""

from __future__ import annotations

from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.cli.daemon import LOCK_WAIT_HELP, POLL_HELP, WATCH_HELP, run_stage
from arlctl.errors import UsageError
from arlctl.io.fs import join

MAX_INVALID_SHOWN = 10  # invalid rows named on stderr per invocation; --json carries them all

HELP = """Filter rewarded trajectories and pack them into batch shards, one optimizer step each.

Rules, in order, each reported with its count: invalid_values, completeness, group_integrity,
zero_variance, duplicate, staleness, where, balance. invalid_values drops rows holding values no stage
may trust (token ids outside [0, --vocab-size), masks outside {0, 1}, non-finite log-probs or rewards,
turn offsets outside the row, absurd versions), each named with its shard on stderr. Input shards
already consumed (named in a batch's checked lineage) are skipped; lineage is compared by hash, never
executed. Every trajectory's outcome is recorded in METRICS/filter-<invocation>.parquet.

  arlctl filter --run RUN

  arlctl filter --in RUN/rewarded --out RUN/batches --batch-groups 4 --adv group-mean --max-lag 2

  arlctl filter --run RUN --where "num_tool_calls > 0" --dry-run
"""


def register(app: typer.Typer) -> None:
    @app.command("filter", help=HELP)
    @handle_errors
    def filter_cmd(
        in_url: str = typer.Option(None, "--in", help="Rewarded shards (default RUN/rewarded)."),
        out_url: str = typer.Option(None, "--out", help="Batch shard directory (default RUN/batches)."),
        run: str = typer.Option(None, "--run", help="Run directory that fills the defaults."),
        metrics: str = typer.Option(None, "--metrics", help="Where the audit table goes (default RUN/metrics)."),
        policy_dir: str = typer.Option(None, "--policy-dir", help="Policy dir whose LATEST is the current version."),
        ckpt_dir: str = typer.Option(None, "--ckpt-dir", help="Checkpoint dir; its newest step also counts."),
        current_version: int = typer.Option(None, "--current-version", help="Override the current version."),
        keep_status: list[str] = typer.Option(["ok"], "--keep-status", help="Statuses kept (repeatable)."),
        min_group_size: int = typer.Option(2, "--min-group-size", help="Fewest rows a group may keep."),
        keep_uniform: float = typer.Option(0.0, "--keep-uniform",
                                           help="Fraction of zero-variance groups kept (signal only with --adv batch)."),
        dedupe_threshold: float = typer.Option(None, "--dedupe-threshold",
                                               help="Tool-call n-gram Jaccard at which a row is a near-duplicate."),
        dedupe_ngram: int = typer.Option(3, "--dedupe-ngram", help="n of the tool-call n-grams."),
        max_lag: int = typer.Option(None, "--max-lag", help="Drop rows whose policy lags more than this."),
        decay: float = typer.Option(0.0, "--decay", help="weight = exp(-decay * lag)."),
        where: str = typer.Option(None, "--where", help="DuckDB SQL predicate rows must satisfy."),
        max_pos_frac: float = typer.Option(None, "--max-pos-frac", help="Cap on positive-advantage weight share."),
        adv: str = typer.Option("group", "--adv", help="Advantages: group | group-mean | batch."),
        batch_groups: int = typer.Option(8, "--batch-groups", help="Groups per batch shard (one optimizer step)."),
        min_groups: int = typer.Option(1, "--min-groups", help="Wait (consume nothing) until this many groups."),
        seed: int = typer.Option(0, "--seed", help="Seed of the --keep-uniform choice."),
        vocab_size: int = typer.Option(None, "--vocab-size",
                                       help="Token ids must be below this (the policy's vocabulary size)."),
        quarantine: bool = typer.Option(False, "--quarantine", help="Move corrupt input shards to _quarantine/."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the per-rule table; write nothing."),
        watch: bool = typer.Option(False, "--watch", help=WATCH_HELP),
        poll: float = typer.Option(5.0, "--poll", help=POLL_HELP),
        lock_wait: float = typer.Option(0.0, "--lock-wait", help=LOCK_WAIT_HELP),
        as_json: bool = typer.Option(False, "--json", help="One JSON summary on stdout."),
    ) -> None:
        from arlctl.stages.filter import (  # torch: import late
            FilterConfig,
            current_policy_version,
            run_filter,
        )

        if run is None and (in_url is None or out_url is None):
            raise UsageError("give --in and --out, or --run RUN")
        in_url = in_url or join(run, "rewarded")
        out_url = out_url or join(run, "batches")
        metrics = metrics or (join(run, "metrics") if run else join(out_url, "..", "metrics"))
        if run:
            policy_dir = policy_dir or join(run, "policy")
            ckpt_dir = ckpt_dir or join(run, "checkpoints")
        cfg = FilterConfig(keep_status=list(keep_status), min_group_size=min_group_size, keep_uniform=keep_uniform,
                           dedupe_threshold=dedupe_threshold, dedupe_ngram=dedupe_ngram, max_lag=max_lag,
                           decay=decay, where=where, max_pos_frac=max_pos_frac, adv=adv,
                           batch_groups=batch_groups, min_groups=min_groups, seed=seed, vocab_size=vocab_size)
        def once(stop) -> dict:
            # The policy version moves while a daemon runs: read it every round (staleness is against it).
            now = current_version if current_version is not None else current_policy_version(policy_dir, ckpt_dir)
            summary = run_filter(in_url, out_url, cfg, now, metrics_url=metrics, dry_run=dry_run,
                                 quarantine_bad=quarantine)
            if summary["inputs"] or not watch:
                _render(summary, out_url)
                if as_json:
                    print_json(summary)
            return summary

        run_stage(once, out=out_url, lock_name="filter", watch=watch, poll=poll, lock_wait=lock_wait,
                  dry_run=dry_run, units=lambda summary: len(summary["batches"]))


def _render(summary: dict[str, Any], out_url: str) -> None:
    from arlctl.stages.filter import RULES

    for name in summary["quarantined"]:
        console.print(f"[yellow]quarantined corrupt input[/] {name}")
    for line in summary["untrusted"]:
        console.print(f"[yellow]warning:[/] lineage not trusted, it marks nothing consumed: {escape(line)}",
                      soft_wrap=True)
    for line in summary["unresumed"]:
        console.print(f"[yellow]warning:[/] {escape(line)}", soft_wrap=True)
    for line in summary["invalid"][:MAX_INVALID_SHOWN]:
        console.print(f"[yellow]dropped invalid row[/] {escape(line)}", soft_wrap=True)
    if len(summary["invalid"]) > MAX_INVALID_SHOWN:
        console.print(f"[yellow]dropped invalid row[/] ... and {len(summary['invalid']) - MAX_INVALID_SHOWN} more "
                      "(every one is in the metrics audit under rule invalid_values)")
    for name in summary["recovered"]:
        console.print(f"recovered interrupted batch [bold]{name}[/]")
    if not summary["inputs"]:
        console.print("nothing to do: every input shard is already consumed")
        return
    table = Table("rule", "dropped", title=f"filter: {summary['rows_in']} rows from {len(summary['inputs'])} shards "
                  f"(policy version {summary['current_version']})", title_justify="left")
    for rule in RULES:
        label = "reweighted" if rule == "balance" else ""
        table.add_row(rule, f"{summary['rules'][rule]} {label}".strip())
    table.add_row("[bold]kept[/]", f"{summary['rows_kept']} rows, {summary['groups_kept']} groups")
    console.print(table)
    if summary["dry_run"]:
        console.print(f"dry run: would write {summary['batches_planned']} batch shards "
                      f"({summary['rows_kept']} rows) to {out_url}")
    elif summary["waiting"]:
        console.print(f"waiting: {summary['groups_kept']} groups survive, fewer than --min-groups; nothing consumed")
    else:
        console.print(f"wrote {len(summary['batches'])} batch shards to {out_url}")
