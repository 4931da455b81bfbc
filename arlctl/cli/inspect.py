"""`arlctl inspect`: what is in a set of shards, at a glance."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.cli.query import gather_shards
from arlctl.io.duck import VIEW, connect
from arlctl.render import plain
from arlctl.stats import inspect_stats

HELP = """Summarise shards: rows, groups, statuses, rewards, advantages, policy versions and lag, token statistics, the generation/environment time split, broken down per env, and per dataset for tasks that name one (reasoning-gym).

  arlctl inspect RUN/rewarded

  arlctl inspect RUN/rollouts --json | jq .tokens
"""


def register(app: typer.Typer) -> None:
    @app.command("inspect", help=HELP)
    @handle_errors
    def inspect(
        paths: list[str] = typer.Argument(..., help="Shard files or directories (any fsspec URL)."),
        as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
    ) -> None:
        shards = gather_shards(paths)
        con = connect(shards)
        stats = inspect_stats(con)
        stats["shards"] = len(shards)
        stats["by_env"] = by_env(con)
        stats["by_dataset"] = by_dataset(con)
        if as_json:
            print_json(stats)
            return
        _render(stats)


def by_env(con: Any) -> dict[str, dict[str, Any]]:
    """Per env: rows, trajectories, groups, row counts by status, rewarded trajectories and their mean
    reward (None when none is rewarded), mean turns per trajectory.

    Counted per trajectory so that `--history per-turn` rows (n rows of one turn each, sharing
    trajectory_id and a copied reward) weigh a trajectory once, as whole-trajectory rows do.
    """
    trajectories = con.execute(f"""
        with t as (select env, trajectory_id, any_value(group_id) as group_id, max(reward) as reward,
                          sum(num_turns) as turns, count(*) as rows
                   from {VIEW} group by env, trajectory_id)
        select env, sum(rows)::bigint, count(*), count(distinct group_id), count(reward), avg(reward), avg(turns)
        from t group by env order by env""").fetchall()
    statuses: dict[str, dict[str, int]] = {}
    for env, status, n in con.execute(
            f"select env, status, count(*) from {VIEW} group by 1, 2 order by 1, 3 desc, 2").fetchall():
        statuses.setdefault(str(env), {})[str(status)] = int(n)
    out: dict[str, dict[str, Any]] = {}
    for env, rows, n_traj, groups, rewarded, mean_reward, mean_turns in trajectories:
        out[str(env)] = {"rows": int(rows), "trajectories": int(n_traj), "groups": int(groups),
                         "status": statuses.get(str(env), {}), "rewarded": int(rewarded),
                         "mean_reward": None if mean_reward is None else round(float(mean_reward), 4),
                         "mean_turns": None if mean_turns is None else round(float(mean_turns), 4)}
    return out


def by_dataset(con: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """Per env, per the `dataset` its tasks name (reasoning-gym tasks do): rows, trajectories, rewarded
    trajectories and their mean reward (None when none is rewarded). {} when no task names a dataset.

    Counted per trajectory, as by_env is; a row whose task is not JSON has no dataset.
    """
    found = con.execute(f"""
        with r as (select env, trajectory_id, reward,
                          case when json_valid(task) then json_extract_string(task, '$.dataset') end as dataset
                   from {VIEW}),
             t as (select env, dataset, trajectory_id, max(reward) as reward, count(*) as rows
                   from r where dataset is not null group by env, dataset, trajectory_id)
        select env, dataset, sum(rows)::bigint, count(*), count(reward), avg(reward)
        from t group by env, dataset order by env, dataset""").fetchall()
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for env, dataset, rows, n_traj, rewarded, mean_reward in found:
        out.setdefault(str(env), {})[str(dataset)] = {
            "rows": int(rows), "trajectories": int(n_traj), "rewarded": int(rewarded),
            "mean_reward": None if mean_reward is None else round(float(mean_reward), 4)}
    return out


def _kv_table(title: str, data: dict[str, Any]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    for key, value in data.items():
        table.add_row(plain(key), plain("-" if value is None else str(value)))  # keys come from shard data
    return table


def _render(stats: dict[str, Any]) -> None:
    console.print(f"[bold]{stats['rows']}[/] trajectories in {stats['groups']} groups "
                  f"({stats['tasks']} tasks, {stats['shards']} shards)")
    console.print(_kv_table("status", stats["status"]))
    console.print(_kv_table("finish reason", stats["finish_reason"]))
    console.print(_kv_table("reward", stats["reward"]))
    if stats["advantage"]["n"]:
        console.print(_kv_table("advantage", stats["advantage"]))
    console.print(_kv_table("policy versions", stats["policy_versions"]))
    console.print(_kv_table("tokens", stats["tokens"]))
    console.print(_kv_table("time", stats["time"]))
    per_env = stats["per_env"]
    if per_env:
        table = Table(*per_env[0].keys(), title="per env", title_justify="left")
        for row in per_env:
            table.add_row(*[plain("-" if v is None else str(v)) for v in row.values()])
        console.print(table)
    if len(stats["by_env"]) > 1:
        console.print(_by_env_table(stats["by_env"]))
    if stats["by_dataset"]:
        console.print(_by_dataset_table(stats["by_dataset"]))


def _by_env_table(envs: dict[str, dict[str, Any]]) -> Table:
    table = Table("env", "rows", "groups", "status", "mean reward", "mean turns", title="by env",
                  title_justify="left")
    for env, info in envs.items():
        status = " ".join(f"{name}={n}" for name, n in info["status"].items())
        reward = "-" if info["mean_reward"] is None else f"{info['mean_reward']:.3f} ({info['rewarded']})"
        table.add_row(plain(env), str(info["rows"]), str(info["groups"]), plain(status), reward,
                      "-" if info["mean_turns"] is None else f"{info['mean_turns']:.2f}")
    return table


def _by_dataset_table(envs: dict[str, dict[str, dict[str, Any]]]) -> Table:
    table = Table("env", "dataset", "trajectories", "rewarded", "mean reward", title="by dataset",
                  title_justify="left")
    for env, datasets in envs.items():
        for dataset, info in datasets.items():
            reward = "-" if info["mean_reward"] is None else f"{info['mean_reward']:.3f}"
            table.add_row(plain(env), plain(dataset), str(info["trajectories"]), str(info["rewarded"]), reward)
    return table
