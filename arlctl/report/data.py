"""The report's numbers: one DuckDB query per section over the run's shards and metrics rows.

`collect(files)` returns a plain dict (what `arlctl report --json` prints and the page embeds). A section
the run did not record is None (or holds None values), never a zero: a run without vLLM has no prefix
cache, a run without `train` has no trainer metrics. Definitions:

  correct rate      the `correct` reward component where the reward has one (math), else the share of rows
                    with full reward (reward >= 1); rows with a null reward count in neither.
  staleness (lag)   per trained row, (step - 1) - policy_version, where `step` is the optimizer step that
                    consumed the row's batch (train-step metrics name it): the same definition as
                    `arlctl status`.
  parse failure     a turn whose text opens more tool calls (`<tool_call>` hermes, `[TOOL_CALLS]` mistral)
                    than the parser returned; the rate is over turns that opened or made at least one call.
  other time        per trajectory, wall time not spent generating or in the environment (reset, template
                    work, waiting for a concurrency slot), summed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from arlctl.errors import UsageError
from arlctl.io.fs import basename
from arlctl.report.sources import SAMPLE_FILES, SAMPLE_SOURCE, RunFiles, RunViews, read_json

# Trainer columns plotted first, in this order; any other numeric column of the train-step rows follows.
TRAIN_KEY = ("loss", "approx_kl", "ref_kl", "entropy", "clip_frac_low", "clip_frac_high", "grad_norm",
             "tokens_per_s", "reward_mean", "advantage_abs_mean", "lr", "step_time_s")
TRAIN_SKIP = ("step", "time")  # the x axis and a timestamp
# What a turn's text opens a tool call with, per format (bound as query parameters, never spliced into SQL).
CALL_OPENINGS = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]"}
SAMPLE_KEYS = ("trajectory_id", "env", "task_id", "policy_version", "status", "num_turns", "reward")


# ----------------------------------------------------------------------------------------------- queries
# Every query is a constant over the constant view names of sources.RunViews; what varies is bound ($p).

CORRECT = ("case when reward is null then null when reward_components['correct'] is not null "
           "then reward_components['correct']::double else (reward >= 1)::int::double end")
REWARD_BY_VERSION = f"""
    select env, policy_version, count(*) as rows, count(reward) as rewarded,
           avg(reward)::double as mean_reward, avg({CORRECT}) as correct_rate
    from rewarded group by 1, 2 order by 1, 2"""

_THROUGHPUT_RUNS = """
    select regexp_extract(filename, '[^/]*$') as file, trajectories::double as trajectories,
           seconds::double as seconds, {gen}::double as generated_tokens,
           60 * trajectories / nullif(seconds, 0) as trajectories_per_min,
           {gen} / nullif(seconds, 0) as generated_tokens_per_s
    from rollout_metrics order by file"""
_THROUGHPUT_TOTAL = """
    select sum(trajectories)::double as trajectories, sum(seconds)::double as seconds,
           60 * sum(trajectories) / nullif(sum(seconds), 0) as trajectories_per_min,
           sum({gen}) / nullif(sum(seconds), 0) as generated_tokens_per_s
    from rollout_metrics"""
# Rollout metrics rows from before `generated_tokens` was recorded have no such column: a null there.
THROUGHPUT = {"runs": _THROUGHPUT_RUNS.format(gen="generated_tokens"),
              "total": _THROUGHPUT_TOTAL.format(gen="generated_tokens")}
THROUGHPUT_NO_TOKENS = {"runs": _THROUGHPUT_RUNS.format(gen="null"), "total": _THROUGHPUT_TOTAL.format(gen="null")}

LATENCY_SAMPLE_ROWS = 100_000  # per-turn latencies kept for the histogram
_TURN_LATENCIES = ("select t.env_latency_s::double as s from rollouts, unnest(turns) as u(t) "
                   "where t.env_latency_s is not null")
ENV_LATENCY_STATS = f"""
    select count(*) as turns, avg(s) as mean_s, quantile_cont(s, 0.5) as p50_s,
           quantile_cont(s, 0.9) as p90_s, quantile_cont(s, 0.99) as p99_s, max(s) as max_s
    from ({_TURN_LATENCIES})"""
ENV_LATENCY_SAMPLE = (f"select s from ({_TURN_LATENCIES}) using sample reservoir({LATENCY_SAMPLE_ROWS} rows) "
                      "repeatable (0)")

_TURNS = "select u.t as turn from rollouts, unnest(turns) as u(t)"
_CALLS = "case when json_valid(turn.tool_calls) then coalesce(json_array_length(turn.tool_calls), 0) else 0 end"
_OPENS = ("(length(turn.text) - length(replace(turn.text, $hermes, ''))) // length($hermes)"
          " + (length(turn.text) - length(replace(turn.text, $mistral, ''))) // length($mistral)")
TOOL_PARSE = f"""
    select count(*) as turns, count(*) filter (where opens > 0 or calls > 0) as call_turns,
           count(*) filter (where opens > calls) as parse_failures
    from (select {_OPENS} as opens, {_CALLS} as calls from ({_TURNS}))"""
TOOL_MIX = f"""
    select name, count(*) as calls from (
        select unnest(json_extract_string(turn.tool_calls, '$[*].name')) as name
        from ({_TURNS}) where json_valid(turn.tool_calls))
    group by 1 order by 2 desc, 1"""

ERROR_CAUSES = {"rollout": "select error_causes from rollout_metrics where error_causes is not null",
                "reward": "select error_causes from reward_metrics where error_causes is not null"}

SAMPLE_BY_PREFIX = f"select distinct trajectory_id from {SAMPLE_SOURCE} where starts_with(trajectory_id, $p) limit 2"
SAMPLE_PICKS = (  # best and worst reward of the newest version, a failed row, the most tool calls
    f"select trajectory_id from {SAMPLE_SOURCE} where reward is not null "
    "order by policy_version desc, reward desc, trajectory_id limit 1",
    f"select trajectory_id from {SAMPLE_SOURCE} where reward is not null "
    "order by reward asc, policy_version desc, trajectory_id limit 1",
    f"select trajectory_id from {SAMPLE_SOURCE} where status not in ('ok', 'truncated') order by trajectory_id limit 1",
    f"select trajectory_id from {SAMPLE_SOURCE} order by num_tool_calls desc, env_errors desc, trajectory_id limit 1",
)
SAMPLE_FILENAMES = f"select distinct filename from {SAMPLE_SOURCE} where list_contains($ids, trajectory_id)"
SAMPLE_WHOLE_ROWS = (f"select * from {SAMPLE_FILES} where list_contains($ids, trajectory_id) "
                     "qualify row_number() over (partition by trajectory_id) = 1")


@dataclass
class ReportData:
    """`numbers`: every number the page shows (JSON-ready; `--json`); `series`: raw values behind the
    histograms (sampled, not shown as numbers); `samples`: whole rows to render."""

    numbers: dict[str, Any]
    series: dict[str, list[float]]
    samples: list[dict[str, Any]]


def collect(files: RunFiles, samples: int = 4, sample_ids: tuple[str, ...] = ()) -> ReportData:
    """Every section of the report."""
    views = RunViews(files)
    try:
        numbers = {
            "run": files.run,
            "files": files.count(),
            "overview": overview(views),
            "reward_by_version": reward_by_version(views),
            "evals": evals(files, views),
            "train": train(views),
            "staleness": staleness(views),
            "throughput": throughput(views),
            "time_split": time_split(views),
            "env_latency": env_latency(views),
            "inference": inference(views),
            "lengths": lengths(views),
            "tools": tools(views),
            "failures": failures(views),
        }
        rows = sample_rows(views, samples, sample_ids)
    finally:
        views.close()
    series = {
        "env_latency_s": (numbers["env_latency"] or {}).pop("values", []),
        "response_tokens": (numbers["lengths"] or {}).pop("response_tokens", []),
    }
    numbers["samples"] = [{k: row[k] for k in SAMPLE_KEYS} for row in rows]
    return ReportData(numbers=numbers, series=series, samples=rows)


# ----------------------------------------------------------------------------------------------- sections


def overview(v: RunViews) -> dict[str, Any]:
    out: dict[str, Any] = {"rollout_rows": None, "rewarded_rows": None, "batch_rows": None, "train_steps": None,
                           "policy_versions": None}
    out["run_minutes"] = out["trajectories_per_run_minute"] = None
    if v.has("rollouts"):
        # run time: first trajectory started to last finished, pauses for training included (live runs
        # get this before any rollout metrics row exists: a daemon writes its row when it stops)
        row = v.one("""select count(*) n, count(distinct policy_version) versions,
                              epoch(max(finished_at) - min(started_at)) / 60 as minutes from rollouts""")
        out["rollout_rows"], out["policy_versions"], out["run_minutes"] = row["n"], row["versions"], row["minutes"]
        if row["minutes"]:
            out["trajectories_per_run_minute"] = row["n"] / row["minutes"]
    if v.has("rewarded"):
        out["rewarded_rows"] = v.one("select count(*) n from rewarded")["n"]
    if v.has("batches"):
        out["batch_rows"] = v.one("select count(*) n from batches")["n"]
    if v.has("train_metrics"):
        out["train_steps"] = v.one("select count(distinct step) n from train_metrics")["n"]
    return out


def reward_by_version(v: RunViews) -> list[dict[str, Any]] | None:
    """Per env and policy version (of the first turn): rows, rewarded rows, mean reward, correct rate."""
    if not v.has("rewarded"):
        return None
    return v.rows(REWARD_BY_VERSION)


def evals(files: RunFiles, v: RunViews) -> list[dict[str, Any]] | None:
    """One entry per RUN/evals/<name>/vNNNNNN/summary.json, read defensively (fields may be missing), with
    the row count and mean reward of the shards beside it (`shard_rows`, `shard_mean_reward`)."""
    if not files.evals:
        return None
    by_dir: dict[str, dict[str, Any]] = {}
    if v.has("eval_rows"):
        by_dir = {r["dir"]: r for r in v.rows("""
            select regexp_extract(filename, '^(.*)/[^/]*$', 1) as dir, count(*) as shard_rows,
                   avg(reward)::double as shard_mean_reward from eval_rows group by 1""")}
    out = []
    for url in files.evals:
        summary = read_json(url)
        if summary is None:
            continue  # not written completely yet: summary.json is the marker, written last
        _, name, version_dir, _ = url.rsplit("/", 3)  # .../evals/<name>/vNNNNNN/summary.json
        out.append({
            "name": str(summary.get("name") or name),
            "version": _int(summary.get("version"), default=_version_of(version_dir)),
            "rows": _int(_first(summary, "n_rows", "rows", "n")),
            "graded": _int(_first(summary, "n_graded", "graded")),
            "correct_rate": _float(summary.get("correct_rate")),
            "correct_stderr": _float(_first(summary, "correct_se", "correct_stderr", "stderr")),
            "mean_reward": _float(summary.get("mean_reward")),
            "null_reward": _int(summary.get("null_reward")),
            "pass_at_k": {str(k): _float(x) for k, x in (summary.get("pass_at_k") or {}).items()}
            if isinstance(summary.get("pass_at_k"), dict) else {},
            **{k: by_dir.get(url.rsplit("/", 1)[0], {}).get(k) for k in ("shard_rows", "shard_mean_reward")},
        })
    return sorted(out, key=lambda e: (e["name"], e["version"] if e["version"] is not None else -1)) or None


def train(v: RunViews) -> dict[str, Any] | None:
    """Every numeric column of the train-step rows, per step; the key columns first.

    The rows are read by pyarrow, without SQL, and the columns chosen here, in Python, by their Arrow type:
    a metrics column's name is data (a run can hold any name) and never becomes SQL text."""
    if not v.has("train_metrics", "step"):
        return None
    table = v.table("train_metrics")
    table = table.take(pc.sort_indices(table.column(table.column_names.index("step"))))  # nulls last, as SQL
    names = table.column_names
    numeric = [c for c, f in zip(names, table.schema, strict=True) if _is_number(f.type) and c not in TRAIN_SKIP]
    numeric = [c for i, c in enumerate(numeric) if c not in numeric[:i]]  # one column per name
    ordered = [c for c in TRAIN_KEY if c in numeric] + [c for c in numeric if c not in TRAIN_KEY]
    values = {c: [None if x is None else float(x) for x in table.column(names.index(c)).to_pylist()]
              for c in ordered}
    step_values = table.column(names.index("step")).to_pylist()
    steps = [{"step": step, **{c: values[c][i] for c in ordered}} for i, step in enumerate(step_values)]
    recorded = [c for c in ordered if any(s[c] is not None for s in steps)]
    last = {c: next((s[c] for s in reversed(steps) if s[c] is not None), None) for c in recorded}
    # Columns past the key ones that never changed (counters that stayed 0) go in a table, not a plot.
    constant = {c: last[c] for c in recorded if c not in TRAIN_KEY
                and len({s[c] for s in steps if s[c] is not None}) == 1}
    return {"columns": recorded, "not_recorded": [c for c in ordered if c not in recorded],
            "constant": constant, "steps": steps, "last": last}


def staleness(v: RunViews) -> dict[str, Any] | None:
    """Histogram of trained rows' lag: (step - 1) - policy_version."""
    if not (v.has("batches") and v.has("train_metrics", "step", "batch")):
        return None
    hist = v.rows("""
        select (t.step - 1) - b.policy_version as lag, count(*) as rows
        from batches b join (select distinct step, batch from train_metrics) t
          on t.batch = regexp_extract(b.filename, '[^/]*$')
        group by 1 order by 1""")
    if not hist:
        return None
    total = sum(h["rows"] for h in hist)
    return {"hist": hist, "trained_rows": total, "mean_lag": sum(h["lag"] * h["rows"] for h in hist) / total,
            "max_lag": max(h["lag"] for h in hist)}


def throughput(v: RunViews) -> dict[str, Any] | None:
    """Per rollout invocation and overall: trajectories per minute, generated tokens per second."""
    if not v.has("rollout_metrics", "trajectories", "seconds"):
        return None
    queries = THROUGHPUT if v.has("rollout_metrics", "generated_tokens") else THROUGHPUT_NO_TOKENS
    runs = v.rows(queries["runs"])
    total = v.one(queries["total"])
    return {"invocations": runs, **total}


def time_split(v: RunViews) -> dict[str, Any]:
    """Seconds per part: inside trajectories (generation, environment, other) and per stage."""
    out: dict[str, Any] = {"generation_s": None, "environment_s": None, "other_in_trajectory_s": None,
                           "rollout_stage_s": None, "reward_stage_s": None, "train_stage_s": None,
                           "queue_wait_s": None}
    if v.has("rollouts"):
        row = v.one("""
            select sum(gen_time_s)::double as g, sum(env_time_s)::double as e,
                   sum(greatest(wall_time_s - gen_time_s - env_time_s, 0))::double as o from rollouts""")
        out["generation_s"], out["environment_s"], out["other_in_trajectory_s"] = row["g"], row["e"], row["o"]
    if v.has("rollout_metrics", "seconds"):
        out["rollout_stage_s"] = v.one("select sum(seconds)::double s from rollout_metrics")["s"]
    if v.has("rollout_metrics", "backpressure_wait_s"):
        out["queue_wait_s"] = v.one("select sum(backpressure_wait_s)::double s from rollout_metrics")["s"]
    if v.has("reward_metrics", "seconds"):
        out["reward_stage_s"] = v.one("select sum(seconds)::double s from reward_metrics")["s"]
    if v.has("train_metrics", "step_time_s"):
        out["train_stage_s"] = v.one("select sum(step_time_s)::double s from train_metrics")["s"]
    return out


def env_latency(v: RunViews) -> dict[str, Any] | None:
    """Per-turn environment latency: count, mean, quantiles; `values` is a sample for the histogram."""
    if not v.has("rollouts"):
        return None
    stats = v.one(ENV_LATENCY_STATS)
    if not stats["turns"]:
        return None
    values = [r["s"] for r in v.rows(ENV_LATENCY_SAMPLE)]
    return {**stats, "values": values}


def inference(v: RunViews) -> dict[str, Any]:
    """Backend counters the rollout metrics rows carry: prefix-cache hit rate (vLLM), idle ratio (hf)."""
    out: dict[str, Any] = {"prefix_cache_hit_rate": None, "idle_ratio": None, "backends": None}
    if not v.has("rollout_metrics"):
        return out
    if v.has("rollout_metrics", "backend"):
        out["backends"] = [r["backend"] for r in v.rows(
            "select distinct backend from rollout_metrics where backend is not null order by 1")]
    if v.has("rollout_metrics", "backend_cached_prompt_tokens", "backend_prompt_tokens"):
        out["prefix_cache_hit_rate"] = v.one("""
            select sum(backend_cached_prompt_tokens) / nullif(sum(backend_prompt_tokens), 0) as r
            from rollout_metrics""")["r"]
    elif v.has("rollout_metrics", "backend_prefix_cache_hit_rate"):
        out["prefix_cache_hit_rate"] = v.one("select avg(backend_prefix_cache_hit_rate) r from rollout_metrics")["r"]
    if v.has("rollout_metrics", "backend_idle_ratio", "seconds"):
        # weighted by each invocation's seconds: a long rollout's idle share counts for more
        out["idle_ratio"] = v.one("""
            select sum(backend_idle_ratio * seconds) / nullif(sum(seconds), 0) as r
            from rollout_metrics where backend_idle_ratio is not null""")["r"]
    return out


def lengths(v: RunViews) -> dict[str, Any] | None:
    """Response tokens per trajectory and the number of turns."""
    if not v.has("rollouts"):
        return None
    stats = v.one("""
        select count(*) as trajectories, avg(response_tokens)::double as mean_response_tokens,
               quantile_cont(response_tokens, 0.5)::double as p50_response_tokens,
               quantile_cont(response_tokens, 0.9)::double as p90_response_tokens,
               max(response_tokens) as max_response_tokens, avg(generated_tokens)::double as mean_generated_tokens,
               avg(num_turns)::double as mean_turns from rollouts""")
    turns = v.rows("select num_turns as turns, count(*) as rows from rollouts group by 1 order by 1")
    values = [r["n"] for r in v.rows("select response_tokens as n from rollouts using sample reservoir(100000 rows) "
                                     "repeatable (0)")]
    return {**stats, "turns_hist": turns, "response_tokens": values}


def tools(v: RunViews) -> dict[str, Any] | None:
    """Tool mix (calls per tool name) and the tool-call parse-failure rate over turns."""
    if not v.has("rollouts"):
        return None
    parse = v.one(TOOL_PARSE, CALL_OPENINGS)
    parse["parse_failure_rate"] = parse["parse_failures"] / parse["call_turns"] if parse["call_turns"] else None
    mix = v.rows(TOOL_MIX)
    return {**parse, "mix": mix}


def failures(v: RunViews) -> dict[str, Any]:
    """Row statuses, null rewards with their cause, and error causes the stages counted in RUN/metrics."""
    out: dict[str, Any] = {"statuses": None, "finish_reasons": None, "null_rewards": None, "reward_errors": None,
                           "error_causes": {}, "infra_failures": None}
    if v.has("rollouts"):
        out["statuses"] = {r["status"]: r["rows"] for r in v.rows(
            "select status, count(*) as rows from rollouts group by 1 order by 2 desc, 1")}
        out["finish_reasons"] = {r["finish_reason"]: r["rows"] for r in v.rows(
            "select finish_reason, count(*) as rows from rollouts group by 1 order by 2 desc, 1")}
    if v.has("rewarded"):
        out["null_rewards"] = v.one("select count(*) filter (where reward is null) n from rewarded")["n"]
        out["reward_errors"] = {str(r["cause"]): r["rows"] for r in v.rows("""
            select coalesce(json_extract_string(reward_info, '$.error'), '(no cause recorded)') as cause,
                   count(*) as rows
            from rewarded where reward is null group by 1 order by 2 desc, 1 limit 20""")}
    for stage, query in ERROR_CAUSES.items():
        if v.has(f"{stage}_metrics", "error_causes"):
            causes: dict[str, int] = {}
            for r in v.rows(query):
                for cause, n in _json_counts(r["error_causes"]).items():
                    causes[cause] = causes.get(cause, 0) + n
            out["error_causes"][stage] = dict(sorted(causes.items(), key=lambda kv: (-kv[1], kv[0])))
    if out["statuses"] is not None:
        infra_causes = sum(n for causes in out["error_causes"].values() for c, n in causes.items()
                           if c.startswith("infra:"))
        out["infra_failures"] = {"env_error_rows": out["statuses"].get("env_error", 0),
                                 "infra_causes": infra_causes}
    return out


def sample_rows(v: RunViews, count: int, ids: tuple[str, ...]) -> list[dict[str, Any]]:
    """A few whole rows to read: the ones asked for by id (prefix), then the best and worst reward of the
    newest version, a failed row, and the row with the most tool calls."""
    view = v.sample_view  # `sample_source` is this view, registered under a constant name
    if view is None:
        return []
    chosen: list[str] = []
    for prefix in ids:
        found = [r["trajectory_id"] for r in v.rows(SAMPLE_BY_PREFIX, {"p": prefix})]
        if not found:
            raise UsageError(f"--sample {prefix}: no trajectory with that id in {view}/")
        if len(found) > 1:
            raise UsageError(f"--sample {prefix}: the id prefix is ambiguous", hint="give more characters of the id")
        chosen.append(found[0])
    for query in SAMPLE_PICKS:
        if len(chosen) >= count + len(ids):
            break
        found = v.rows(query)
        if found and found[0]["trajectory_id"] not in chosen:
            chosen.append(found[0]["trajectory_id"])
    if not chosen:
        return []
    # Read whole rows (token lists included) only from the files that hold them, not the whole view.
    files = [r["filename"] for r in v.rows(SAMPLE_FILENAMES, {"ids": chosen})]
    v.register_samples(files)
    rows = v.arrow(SAMPLE_WHOLE_ROWS, {"ids": chosen}).to_pylist()
    order = {tid: i for i, tid in enumerate(chosen)}
    return sorted(rows, key=lambda r: order[r["trajectory_id"]])


# ----------------------------------------------------------------------------------------------- helpers


def _json_counts(text: str) -> dict[str, int]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {str(k): int(n) for k, n in value.items() if isinstance(n, (int, float)) and not isinstance(n, bool)}


def _first(summary: dict[str, Any], *keys: str) -> Any:
    """The first of `keys` the summary has (eval summaries have named some fields differently over time)."""
    return next((summary[k] for k in keys if summary.get(k) is not None), None)


def _int(value: Any, default: int | None = None) -> int | None:
    try:
        return int(value) if value is not None else default
    except (TypeError, ValueError):
        return default


def _is_number(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)


def _float(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if out == out else None  # NaN is not a number to show


def _version_of(name: str) -> int | None:
    return _int(basename(name).lstrip("v"))
