"""Summary statistics of a set of trajectory shards, computed by DuckDB (used by `arlctl inspect`)."""

from __future__ import annotations

from typing import Any

import duckdb

from arlctl.io.duck import VIEW


def _one(con: duckdb.DuckDBPyConnection, sql: str) -> dict[str, Any]:
    cur = con.execute(sql)
    cols = [d[0] for d in cur.description]
    row = cur.fetchone()
    return dict(zip(cols, row, strict=True)) if row else {}


def _many(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    cur = con.execute(sql)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


# Row counts per value of a column, one constant query per column (no SQL is built from a name).
COUNTS = {
    "status": f"select status, count(*) from {VIEW} group by 1 order by 2 desc",
    "finish_reason": f"select finish_reason, count(*) from {VIEW} group by 1 order by 2 desc",
}


def _counts(con: duckdb.DuckDBPyConnection, column: str) -> dict[str, int]:
    return {str(k): int(v) for k, v in con.execute(COUNTS[column]).fetchall()}


def _round(d: dict[str, Any], digits: int = 4) -> dict[str, Any]:
    return {k: (round(v, digits) if isinstance(v, float) else v) for k, v in d.items()}


def inspect_stats(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """Rows, groups, statuses, rewards, advantages, versions and lag, tokens, time split, per env."""
    overall = _one(con, f"""
        select count(*) as rows, count(distinct group_id) as groups, count(distinct task_id) as tasks,
               count(distinct env) as envs
        from {VIEW}""")
    reward = _round(_one(con, f"""
        select count(reward) as n, avg(reward) as mean, stddev_samp(reward) as std,
               min(reward) as min, max(reward) as max
        from {VIEW}"""))
    advantage = _round(_one(con, f"""
        select count(advantage) as n, avg(advantage) as mean, stddev_samp(advantage) as std,
               min(advantage) as min, max(advantage) as max, avg(weight) as mean_weight
        from {VIEW}"""))
    versions = _round(_one(con, f"""
        with v as (select max(policy_version_last) as newest from {VIEW})
        select min(policy_version) as min_version, max(policy_version_last) as max_version,
               avg(v.newest - policy_version) as mean_lag, max(v.newest - policy_version) as max_lag,
               sum(case when policy_version_last > policy_version then 1 else 0 end) as spanning_versions
        from {VIEW}, v"""))
    tokens = _round(_one(con, f"""
        select avg(prompt_tokens) as prompt_mean, avg(response_tokens) as response_mean,
               quantile_cont(response_tokens, 0.5) as response_p50,
               quantile_cont(response_tokens, 0.99) as response_p99,
               avg(generated_tokens) as generated_mean,
               sum(generated_tokens)::double / greatest(sum(response_tokens), 1) as mask1_fraction,
               sum(generated_tokens) as generated_total
        from {VIEW}"""))
    timing = _round(_one(con, f"""
        select sum(wall_time_s) as wall_s, sum(gen_time_s) as gen_s, sum(env_time_s) as env_s,
               sum(gen_time_s) / greatest(sum(gen_time_s) + sum(env_time_s), 1e-9) as gen_fraction,
               sum(env_time_s) / greatest(sum(gen_time_s) + sum(env_time_s), 1e-9) as env_fraction,
               avg(wall_time_s) as wall_mean_s
        from {VIEW}"""))
    per_env = [_round(r) for r in _many(con, f"""
        select env, count(*) as rows, count(distinct group_id) as groups, avg(reward) as mean_reward,
               avg(num_turns) as mean_turns,
               sum(num_tool_calls)::double / greatest(sum(num_turns), 1) as tool_calls_per_turn,
               avg(case when num_tool_calls > 0 then 1.0 else 0.0 end) as tool_call_rate,
               avg(response_tokens) as mean_response_tokens,
               sum(gen_time_s) as gen_s, sum(env_time_s) as env_s,
               avg(case when status = 'ok' then 1.0 else 0.0 end) as ok_rate
        from {VIEW} group by env order by env""")]
    return {
        **overall,
        "status": _counts(con, "status"),
        "finish_reason": _counts(con, "finish_reason"),
        "reward": reward,
        "advantage": advantage,
        "policy_versions": versions,
        "tokens": tokens,
        "time": timing,
        "per_env": per_env,
    }
