"""The state of a run directory at a glance: what waits where, versions, backlog, staleness, reward.

`run_state(RUN)` reads only what the stages already write (DESIGN.md §5) — shard footers (row counts and
lineage), a few small columns, checkpoints' state.json, policy/LATEST, RUN/metrics — from a local path or
any fsspec URL, and returns a plain dict (what `arlctl status --json` prints). `render(state)` turns it
into the compact Rich panel that `arlctl status` prints and `arlctl up`'s live dashboard redraws.

Definitions (the rollout daemon's backpressure uses the same numbers, see docs/daemons.md):
  consumed     a rollouts/ shard is consumed once a rewarded/ shard names it in its lineage; a rewarded/
               shard once a finished filter invocation names it (its manifest in batches/_filter/, or
               all of its batches visible: a half-written invocation has not consumed its inputs yet);
               a batches/ shard once the newest checkpoint's state.json lists it in consumed_batches.
  backlog      trajectories (rows) not yet trained: rows of unconsumed rollouts/ + rewarded/ + batches/
               shards, plus `in_flight` (rows a rollout process has started but not yet committed).
               Rows the filter drops leave the backlog when the filter consumes their shard. With it:
               `batch_shards` (batch shards waiting for the trainer: one optimizer step each) and
               `rows_per_step` (rewarded rows the filter consumed per batch shard it wrote; None before
               its first batch): what the rollout daemon projects a new group's lag at train time from.
  trainer_version   max(newest complete checkpoint step, version that policy/LATEST names): arlctl/io/ledger.py
                    `trainer_version`, the number filter measures staleness from.
  staleness    trained rows: (step - 1) - policy_version for a row trained at optimizer step `step` (the
               weights it updated had seen step - 1 batches; policy_version is the row's first, oldest
               turn). Waiting rows: trainer_version - policy_version.
  by_env       per env (the rows' `env` column): rows written and waiting per shard directory, and the mean
               reward of the rewarded rows in the newest `recent` rewarded shards.
  error_causes per stage, the {cause: count} JSON column `error_causes` summed over ALL of the stage's
               metrics files (causes "infra:..." are infrastructure failures, listed first).
  train_lag    lag at train time from train's step metrics (RUN/metrics/train-step-*.parquet): the max and
               the row-weighted mean over the rows that entered the loss, and the rows dropped as stale.
  filter_last  the newest filter audit (RUN/metrics/filter-*.parquet, by modification time): groups seen,
               kept, and dropped per rule (a group counts under the rule that dropped most of its rows).

Shards are immutable, so each footer and column read is cached in a `ShardCache` that a caller polling
repeatedly (the rollout daemon, the dashboard) keeps between calls.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from arlctl.errors import TerminalError
from arlctl.io import ledger
from arlctl.io.fs import basename, get_fs, to_url
from arlctl.io.run import RunLayout
from arlctl.io.shards import LINEAGE_KEY, Lineage, scan

STAGES = ("rollout", "reward", "filter", "train", "sync")


# ------------------------------------------------------------------------------------------ shard reads
@dataclass(frozen=True)
class Footer:
    rows: int
    lineage: Lineage | None
    corrupt: bool = False


class ShardCache:
    """Footers and small columns of shards, keyed by URL. Committed shards never change, so each is read
    once; a re-run that overwrites a 1:1 output with the same name writes the same content."""

    def __init__(self) -> None:
        self._footers: dict[str, Footer] = {}
        self._columns: dict[tuple[str, tuple[str, ...]], pa.Table | None] = {}

    def footer(self, url: str) -> Footer:
        if url not in self._footers:
            self._footers[url] = _read_footer(url)
        return self._footers[url]

    def columns(self, url: str, names: tuple[str, ...]) -> pa.Table | None:
        key = (url, names)
        if key not in self._columns:
            try:
                fs, path = get_fs(url)
                with fs.open(path, "rb") as fh:
                    self._columns[key] = pq.read_table(fh, columns=list(names))
            except Exception:  # corrupt or vanished: the footer read reports it
                self._columns[key] = None
        return self._columns[key]


def _read_footer(url: str) -> Footer:
    try:
        fs, path = get_fs(url)
        with fs.open(path, "rb") as fh:
            meta = pq.ParquetFile(fh).metadata
        raw = (meta.metadata or {}).get(LINEAGE_KEY)
        return Footer(meta.num_rows, Lineage.from_json(raw) if raw else None)
    except Exception:
        return Footer(0, None, corrupt=True)


# ------------------------------------------------------------------------------------ trainer and policy
def trainer_progress(ckpt_url: str) -> dict[str, Any]:
    """The newest complete checkpoint (arlctl/io/ledger.py): step, consumed batches, count, when it was saved,
    and `resume_step`: the newest *full* one (with optimizer state), where a restarted trainer continues from;
    checkpoints after it are weights-only (`train --publish-every`): published, not resumable."""
    found = ledger.list_checkpoints(ckpt_url)
    newest: dict[str, Any] | None = None
    for step, location in reversed(found):
        try:
            state = ledger.read_state(location)
        except (TerminalError, ValueError):
            continue  # pruned or rewritten since the listing: the next older one is the newest
        if newest is None:
            newest = {"step": int(state.get("step", step)), "consumed_batches": list(state.get("consumed_batches", [])),
                      "checkpoints": ledger.checkpoint_dirs(ckpt_url), "saved_at": ledger.state_saved_at(location),
                      "resume_step": None}
        if state.get("full", True):
            newest["resume_step"] = int(state.get("step", step))
            return newest
    return newest or {"step": None, "consumed_batches": [], "checkpoints": ledger.checkpoint_dirs(ckpt_url),
                      "saved_at": None, "resume_step": None}


def published_policy(policy_url: str) -> dict[str, Any]:
    """What policy/LATEST names: version number (None when nothing is published), name, publish time."""
    versions = ledger.version_dirs(policy_url)
    name = ledger.read_latest_raw(policy_url)
    version = ledger.parse_version(name)
    if version is None:
        return {"version": None, "name": name, "published_at": None, "versions": versions}
    try:
        info = ledger.read_version_info(policy_url, name) or {}
    except ValueError:
        info = {}
    return {"version": version, "name": name, "published_at": info.get("created_at"), "versions": versions}


# ---------------------------------------------------------------------------------------------- scanning
@dataclass
class _Dir:
    shards: list[str]  # visible shard URLs, name order
    consumed: set[str]  # basenames consumed by the next stage

    def waiting(self) -> list[str]:
        return [u for u in self.shards if basename(u) not in self.consumed]


def _scan(run: str, cache: ShardCache) -> dict[str, Any]:
    """Each directory's shards and which of them the next stage consumed. Stages commit while this lists, so
    a downstream directory is listed before its upstream one and each consumed set comes from the very
    listing that is counted: a shard committed between two listings then shows as waiting (counted twice at
    worst, for one poll), never as consumed by an output not counted. Listing upstream first let a filter
    commit in between hide its new batches and its inputs at once: a run with work left read as drained."""
    rd = RunLayout(run)
    lineage_of = lambda url: cache.footer(url).lineage  # noqa: E731
    trainer = trainer_progress(rd.checkpoints)
    policy = published_policy(rd.policy)
    filtered = ledger.read_filter_ledger(rd.batches, lineage_of)
    rewarded_shards = scan(rd.rewarded).shards
    dirs = {
        "rollouts": _Dir(scan(rd.rollouts).shards,
                         ledger.consumed_inputs(rd.rewarded, lineage_of=lineage_of, shards=rewarded_shards)),
        "rewarded": _Dir(rewarded_shards, filtered.drained()),
        "batches": _Dir(filtered.shards, set(trainer["consumed_batches"])),
    }
    return {"dirs": dirs, "trainer": trainer, "policy": policy,
            "trainer_version": ledger.trainer_version(rd.policy, rd.checkpoints)}


def _rows(urls: list[str], cache: ShardCache) -> int:
    return sum(cache.footer(u).rows for u in urls)


def backlog(run: str, cache: ShardCache | None = None, in_flight: int = 0) -> dict[str, Any]:
    """The untrained backlog in trajectories (see the module docstring) and the trainer's version."""
    cache = cache or ShardCache()
    scanned = _scan(run, cache)
    return _backlog(scanned, cache, in_flight)


def _backlog(scanned: dict[str, Any], cache: ShardCache, in_flight: int) -> dict[str, Any]:
    dirs = scanned["dirs"]
    counts = {name: _rows(d.waiting(), cache) for name, d in dirs.items()}
    filtered = [u for u in dirs["rewarded"].shards if basename(u) in dirs["rewarded"].consumed]
    batches = len(dirs["batches"].shards)
    return {**counts, "in_flight": in_flight, "total": sum(counts.values()) + in_flight,
            "trainer_version": scanned["trainer_version"], "policy_version": scanned["policy"]["version"],
            "trainer_step": scanned["trainer"]["step"], "batch_shards": len(dirs["batches"].waiting()),
            "rows_per_step": _rows(filtered, cache) / batches if batches else None}


# --------------------------------------------------------------------------------------------- the state
def run_state(run: str, cache: ShardCache | None = None, recent: int = 10, in_flight: int = 0) -> dict[str, Any]:
    """Everything `arlctl status` shows, as a JSON-able dict (see the module docstring for definitions)."""
    cache = cache or ShardCache()
    scanned = _scan(run, cache)
    dirs, trainer, policy = scanned["dirs"], scanned["trainer"], scanned["policy"]

    def last_time(urls: list[str]) -> float | None:
        times = [lin.created_at for u in urls if (lin := cache.footer(u).lineage) is not None]
        return max(times) if times else None

    def shard_dir(urls: list[str]) -> dict[str, Any]:
        return {"output_shards": len(urls), "output_rows": _rows(urls, cache), "last_output_at": last_time(urls)}

    def waiting(d: _Dir) -> dict[str, Any]:
        pending = d.waiting()
        return {"waiting_shards": len(pending), "waiting_rows": _rows(pending, cache)}

    checkpoints_ahead = (trainer["step"] or 0) > (policy["version"] or 0)
    stages = {
        "rollout": {**shard_dir(dirs["rollouts"].shards)},
        "reward": {**waiting(dirs["rollouts"]), **shard_dir(dirs["rewarded"].shards)},
        "filter": {**waiting(dirs["rewarded"]), **shard_dir(dirs["batches"].shards)},
        "train": {**waiting(dirs["batches"]), "output_checkpoints": trainer["checkpoints"], "step": trainer["step"],
                  "resume_step": trainer["resume_step"], "last_output_at": trainer["saved_at"]},
        "sync": {"waiting_shards": int(checkpoints_ahead), "output_versions": policy["versions"],
                 "version": policy["version"], "last_output_at": policy["published_at"]},
    }
    corrupt = [basename(u) for d in dirs.values() for u in d.shards if cache.footer(u).corrupt]
    return {
        "run": run,
        "time": time.time(),
        "policy_version": policy["version"],
        "trainer_step": trainer["step"],
        "trainer_version": scanned["trainer_version"],
        "backlog": _backlog(scanned, cache, in_flight),
        "stages": stages,
        "staleness": _staleness(scanned, cache),
        "reward_trend": _reward_trend(dirs["rewarded"].shards, cache, recent),
        "errors": _errors(RunLayout(run).metrics, cache),
        "error_causes": error_causes(RunLayout(run).metrics, cache),
        "by_env": _by_env(dirs, cache, recent),
        "corrupt_shards": corrupt,
        "train_lag": train_lag(RunLayout(run).metrics, cache),
        "filter_last": filter_last_pass(RunLayout(run).metrics, cache),
    }


def train_lag(metrics_url: str, cache: ShardCache) -> dict[str, Any]:
    """Lag at train time over every train step recorded (older step files without the *_trained columns
    give their whole batch's lag)."""
    steps, rows, weighted, dropped, worst = 0, 0, 0.0, 0, None
    for url in scan(metrics_url).shards:
        if not basename(url).startswith("train-step-"):
            continue
        table = cache.columns(url, ("rows", "max_lag_trained", "mean_lag_trained", "rows_dropped_stale")) \
            or cache.columns(url, ("rows", "max_lag", "mean_lag", "rows_dropped_stale"))
        if table is None:
            continue
        for n, top, mean, stale in zip(*(table.column(i).to_pylist() for i in range(4)), strict=True):
            steps += 1
            dropped += int(stale or 0)
            if n:
                rows += int(n)
                weighted += float(mean or 0.0) * int(n)
                worst = int(top) if worst is None else max(worst, int(top))
    return {"steps": steps, "rows": rows, "max": worst, "mean": weighted / rows if rows else None,
            "rows_dropped_stale": dropped}


def filter_last_pass(metrics_url: str, cache: ShardCache) -> dict[str, Any] | None:
    """What the newest filter invocation did with its groups (None before the first): kept, and dropped
    per rule, e.g. {"groups": 8, "kept": 0, "dropped": {"zero_variance": 8}}."""
    fs, path = get_fs(metrics_url)
    try:
        entries = [e for e in fs.ls(path, detail=True) if basename(e["name"]).startswith("filter-")
                   and basename(e["name"]).endswith(".parquet")]
    except (FileNotFoundError, OSError):
        return None
    if not entries:
        return None

    def modified(entry: dict[str, Any]) -> float:
        stamp = entry.get("mtime", entry.get("LastModified", entry.get("created", 0)))
        return stamp.timestamp() if hasattr(stamp, "timestamp") else float(stamp or 0)

    newest = max(entries, key=lambda e: (modified(e), e["name"]))
    table = cache.columns(to_url(fs, newest["name"]), ("group_id", "rule"))
    if table is None:
        return None
    rules: dict[str, Counter[str]] = {}
    for group, rule in zip(table.column("group_id").to_pylist(), table.column("rule").to_pylist(), strict=True):
        rules.setdefault(str(group), Counter())[str(rule)] += 1
    kept = sum(1 for counts in rules.values() if counts["kept"])
    dropped = Counter(counts.most_common(1)[0][0] for counts in rules.values() if not counts["kept"])
    return {"groups": len(rules), "kept": kept, "dropped": dict(dropped.most_common()), "file": basename(newest["name"])}


def _histogram(lags: list[int]) -> dict[str, Any]:
    if not lags:
        return {"rows": 0, "max": None, "mean": None, "hist": {}}
    return {"rows": len(lags), "max": max(lags), "mean": sum(lags) / len(lags),
            "hist": {str(k): v for k, v in sorted(Counter(lags).items())}}


def _staleness(scanned: dict[str, Any], cache: ShardCache) -> dict[str, Any]:
    """Trained rows: (step - 1) - policy_version per row; waiting rows: trainer_version - policy_version."""
    batches_by_name = {basename(u): u for u in scanned["dirs"]["batches"].shards}
    trained: list[int] = []
    per_step: list[dict[str, Any]] = []
    for index, name in enumerate(scanned["trainer"]["consumed_batches"]):
        url = batches_by_name.get(name)
        table = cache.columns(url, ("policy_version",)) if url else None
        if table is None:
            continue
        lags = [index - int(v) for v in table.column("policy_version").to_pylist()]  # step - 1 == index
        trained += lags
        per_step.append({"step": index + 1, "max": max(lags, default=None), "min": min(lags, default=None)})
    waiting: list[int] = []
    for d in scanned["dirs"].values():
        for url in d.waiting():
            table = cache.columns(url, ("policy_version",))
            if table is not None:
                waiting += [scanned["trainer_version"] - int(v) for v in table.column("policy_version").to_pylist()]
    return {"trained": {**_histogram(trained), "per_step": per_step[-20:]}, "waiting": _histogram(waiting)}


def _reward_trend(rewarded: list[str], cache: ShardCache, recent: int) -> dict[str, Any]:
    """Mean reward of the newest `recent` rewarded shards, and per behaviour policy version (all shards)."""
    per_shard, by_version = [], {}
    for i, url in enumerate(rewarded):
        table = cache.columns(url, ("reward", "policy_version"))
        if table is None:
            continue
        rewards = table.column("reward").to_pylist()
        for reward, version in zip(rewards, table.column("policy_version").to_pylist()):
            if reward is not None:
                total = by_version.setdefault(int(version), [0.0, 0])
                total[0] += reward
                total[1] += 1
        if i >= len(rewarded) - recent:
            scored = [r for r in rewards if r is not None]
            lineage = cache.footer(url).lineage
            per_shard.append({"shard": basename(url), "rows": len(rewards),
                              "mean_reward": sum(scored) / len(scored) if scored else None,
                              "created_at": lineage.created_at if lineage else None})
    per_version = [{"policy_version": v, "rows": n, "mean_reward": s / n} for v, (s, n) in sorted(by_version.items())]
    return {"per_shard": per_shard, "per_version": per_version}


def _errors(metrics_url: str, cache: ShardCache) -> dict[str, Any]:
    """Per stage, from its newest metrics file that has error columns: the error count and the last error."""
    newest: dict[str, str] = {}
    for url in scan(metrics_url).shards:  # names sort by time within a stage prefix
        stage = basename(url).split("-", 1)[0]
        if stage in STAGES:
            newest[stage] = url
    out: dict[str, Any] = {}
    for stage, url in newest.items():
        try:
            fs, path = get_fs(url)
            with fs.open(path, "rb") as fh:
                names = pq.ParquetFile(fh).schema_arrow.names
        except Exception:
            continue
        wanted = tuple(n for n in ("errors", "last_error") if n in names)
        table = cache.columns(url, wanted) if wanted else None
        if table is None or table.num_rows == 0:
            continue
        row = table.to_pylist()[-1]
        out[stage] = {"errors": row.get("errors"), "last_error": row.get("last_error"), "file": basename(url)}
    return out


def _env_rows(urls: list[str], cache: ShardCache) -> Counter[str]:
    """Rows per env over the shards (only their `env` column is read)."""
    counts: Counter[str] = Counter()
    for url in urls:
        table = cache.columns(url, ("env",))
        if table is not None:
            for item in table.column("env").value_counts().to_pylist():
                counts[str(item["values"])] += int(item["counts"])
    return counts


def _by_env(dirs: dict[str, _Dir], cache: ShardCache, recent: int) -> dict[str, dict[str, Any]]:
    """Per env and shard directory: rows written and rows waiting at the next stage; and the mean reward
    of the rewarded rows in the newest `recent` rewarded shards (rows, like the reward trend)."""
    out: dict[str, dict[str, Any]] = {}

    def entry(env: str) -> dict[str, Any]:
        return out.setdefault(env, {**{name: {"rows": 0, "waiting_rows": 0} for name in dirs},
                                    "recent_reward": {"rows": 0, "mean_reward": None}})

    for name, d in dirs.items():
        for env, n in _env_rows(d.shards, cache).items():
            entry(env)[name]["rows"] = n
        for env, n in _env_rows(d.waiting(), cache).items():
            entry(env)[name]["waiting_rows"] = n
    sums: dict[str, list[float]] = {}
    rewarded = dirs["rewarded"].shards
    for url in rewarded[max(0, len(rewarded) - recent):]:
        table = cache.columns(url, ("env", "reward"))
        if table is None:
            continue
        for env, reward in zip(table.column("env").to_pylist(), table.column("reward").to_pylist()):
            if reward is not None:
                total = sums.setdefault(str(env), [0.0, 0])
                total[0] += reward
                total[1] += 1
    for env, (total, n) in sums.items():
        entry(env)["recent_reward"] = {"rows": n, "mean_reward": total / n}
    return dict(sorted(out.items()))


def error_causes(metrics_url: str, cache: ShardCache) -> dict[str, dict[str, int]]:
    """Per stage, the `error_causes` JSON objects ({cause: count}) of ALL its metrics files summed; causes
    ordered infrastructure ("infra:...") first, then by count. Files without the column are skipped."""
    totals: dict[str, Counter[str]] = {}
    for url in scan(metrics_url).shards:
        stage = basename(url).split("-", 1)[0]
        if stage not in STAGES:
            continue
        table = cache.columns(url, ("error_causes",))  # None: no such column (older file) or unreadable
        if table is None:
            continue
        counts = totals.setdefault(stage, Counter())
        for raw in table.column("error_causes").to_pylist():
            counts.update(_parse_causes(raw))
    return {stage: dict(sorted(counts.items(), key=lambda kv: (not kv[0].startswith("infra:"), -kv[1], kv[0])))
            for stage, counts in totals.items()}


def _parse_causes(raw: Any) -> dict[str, int]:
    """One `error_causes` value; a value that is not a JSON object of counts adds nothing."""
    try:
        causes = json.loads(raw) if isinstance(raw, str | bytes) else raw
    except ValueError:
        return {}
    if not isinstance(causes, dict):
        return {}
    return {str(k): int(v) for k, v in causes.items() if isinstance(v, int | float) and not isinstance(v, bool)}


# -------------------------------------------------------------------------------------------- rendering
def _ago(stamp: float | None, now: float) -> str:
    if not stamp:
        return "-"
    seconds = max(0.0, now - stamp)
    return f"{seconds:.0f}s ago" if seconds < 120 else f"{seconds / 60:.0f}m ago" if seconds < 7200 \
        else f"{seconds / 3600:.1f}h ago"


def render(state: dict[str, Any], stage_status: dict[str, str] | None = None) -> Any:
    """A compact Rich panel of `state`; `stage_status` (e.g. from `arlctl up`) adds a state column."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    now = state.get("time") or time.time()
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("stage")
    if stage_status is not None:
        table.add_column("state")
    for name in ("waiting shards/rows", "output", "last output", "errors"):
        table.add_column(name, justify="left" if name == "errors" else "right")
    for stage in STAGES:
        info = state["stages"][stage]
        if stage == "train":
            output = f"step {info['step'] if info['step'] is not None else '-'}"
        elif stage == "sync":
            output = f"v{info['version']}" if info["version"] is not None else "-"
        else:
            output = f"{info['output_shards']}/{info['output_rows']}"
        if "waiting_rows" in info:
            waiting = f"{info['waiting_shards']}/{info['waiting_rows']}"
        elif stage == "sync":
            waiting = "new ckpt" if info["waiting_shards"] else "0"
        else:
            waiting = "-"
        err = state.get("errors", {}).get(stage) or {}
        errors = str(err.get("errors") or 0) + (f"  {str(err['last_error'])[:50]}" if err.get("last_error") else "")
        cells = [stage] + ([stage_status.get(stage, "-")] if stage_status is not None else [])
        table.add_row(*cells, waiting, output, _ago(info.get("last_output_at"), now), errors)

    b, st = state["backlog"], state["staleness"]
    trained, waiting_lag = st["trained"], st["waiting"]
    rewards = [p["mean_reward"] for p in state["reward_trend"]["per_shard"] if p["mean_reward"] is not None]
    versions = state["reward_trend"]["per_version"][-4:]
    lines = [
        f"policy v{state['policy_version'] if state['policy_version'] is not None else '-'}   "
        f"trainer step {state['trainer_step'] if state['trainer_step'] is not None else '-'}   "
        f"backlog {b['total']} rows (rollouts {b['rollouts']}, rewarded {b['rewarded']}, batches {b['batches']}"
        + (f", in flight {b['in_flight']}" if b["in_flight"] else "") + ")",
        f"staleness trained: max {trained['max'] if trained['max'] is not None else '-'} "
        f"mean {_fmt(trained['mean'])} {_hist(trained['hist'])}   "
        f"waiting: max {waiting_lag['max'] if waiting_lag['max'] is not None else '-'} {_hist(waiting_lag['hist'])}",
        "reward recent shards: " + (" ".join(f"{r:.2f}" for r in rewards) or "-")
        + ("   by version: " + " ".join(f"v{p['policy_version']}={p['mean_reward']:.2f}" for p in versions)
           if versions else ""),
    ]
    lines += _cause_lines(state.get("error_causes") or {})
    if state.get("corrupt_shards"):
        lines.append(f"[red]corrupt shards: {', '.join(state['corrupt_shards'][:3])}[/]")
    parts: list[Any] = [table, *[Text.from_markup(line) for line in lines]]
    if len(state.get("by_env") or {}) > 1:
        parts.append(_by_env_table(state["by_env"]))
    return Panel(Group(*parts), title=f"arlctl run {state['run']}", title_align="left")


def _cause_lines(causes: dict[str, dict[str, int]]) -> list[str]:
    from rich.markup import escape

    return [f"error causes {stage}: " + escape(" ".join(f"{cause}={n}" for cause, n in counts.items()))
            for stage, counts in causes.items() if counts]


def _by_env_table(by_env: dict[str, dict[str, Any]]) -> Any:
    """env | rows written/waiting per shard directory | mean reward of recent rewarded rows."""
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, header_style="bold", title="by env", title_justify="left")
    for name in ("env", "rollouts", "rewarded", "batches", "recent reward"):
        table.add_column(name, justify="left" if name == "env" else "right")
    for env, info in by_env.items():
        dirs = [f"{info[d]['rows']}/{info[d]['waiting_rows']} waiting" for d in ("rollouts", "rewarded", "batches")]
        recent = info["recent_reward"]
        reward = "-" if recent["mean_reward"] is None else f"{recent['mean_reward']:.2f} ({recent['rows']})"
        table.add_row(Text(env), *dirs, reward)  # Text: env names come from shard data, never markup
    return table


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _hist(hist: dict[str, int]) -> str:
    return "{" + ", ".join(f"{k}:{v}" for k, v in hist.items()) + "}" if hist else ""


__all__ = ["Footer", "ShardCache", "backlog", "error_causes", "filter_last_pass", "published_policy", "render",
           "run_state", "train_lag", "trainer_progress"]
