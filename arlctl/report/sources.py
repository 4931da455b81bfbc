"""Where a report's inputs lie in a run directory, and one DuckDB connection with a view over each.

Views: `rollouts`, `rewarded`, `batches` (trajectory shards), `train_metrics` (RUN/metrics/train-step-*),
`rollout_metrics`, `reward_metrics` (one row per invocation), `eval_rows` (the rewarded shards beside each
complete eval summary). A view exists only when its files do; the
queries ask `has(view)` first and report "not recorded" otherwise, never a zero. Eval summaries are small
JSON files read as they are (RUN/evals/<name>/vNNNNNN/summary.json).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import duckdb

from arlctl.errors import UsageError
from arlctl.io.duck import literal_path
from arlctl.io.fs import basename, get_fs, is_local, to_url
from arlctl.io.run import RunLayout
from arlctl.io.shards import list_shards

METRIC_PREFIXES = {"train_metrics": "train-step-", "rollout_metrics": "rollout-", "reward_metrics": "reward-"}
EVAL_SUMMARY = "summary.json"


@dataclass
class RunFiles:
    """The files a report reads, listed once per render (a live run gains files between renders)."""

    run: str
    shards: dict[str, list[str]] = field(default_factory=dict)  # view name -> Parquet files
    evals: list[str] = field(default_factory=list)  # summary.json URLs

    def count(self) -> dict[str, int]:
        return {name: len(files) for name, files in self.shards.items()}


def list_run(run: str) -> RunFiles:
    """Every input of the report under `run` (a local path or an fsspec URL)."""
    fs, path = get_fs(run)
    if not fs.exists(path):
        raise UsageError(f"run directory {run} does not exist", hint="give the --run directory of the stages")
    layout = RunLayout(run)
    files = RunFiles(run=run)
    for view, folder in (("rollouts", layout.rollouts), ("rewarded", layout.rewarded), ("batches", layout.batches)):
        files.shards[view] = list_shards(folder)
    metrics = list_shards(layout.metrics)
    for view, prefix in METRIC_PREFIXES.items():
        files.shards[view] = [m for m in metrics if basename(m).startswith(prefix)]
    files.evals = _eval_summaries(layout.evals)
    files.shards["eval_rows"] = [shard for summary in files.evals for shard in list_shards(summary.rsplit("/", 1)[0])]
    return files


def _eval_summaries(evals: str) -> list[str]:
    """RUN/evals/*/v*/summary.json, sorted by name and version."""
    fs, path = get_fs(evals)
    fs.invalidate_cache(path)
    if not fs.exists(path):
        return []
    found = fs.glob(f"{path.rstrip('/')}/*/v*/{EVAL_SUMMARY}")
    return sorted(to_url(fs, p) for p in found)


def read_json(url: str) -> dict[str, Any] | None:
    """A small JSON object, or None when it is missing or not a JSON object (a summary being written)."""
    fs, path = get_fs(url)
    try:
        with fs.open(path, "rb") as fh:
            value = json.loads(fh.read())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


class RunViews:
    """An in-memory DuckDB connection with one view per non-empty file list of `files`."""

    def __init__(self, files: RunFiles):
        self.files = files
        self.con = duckdb.connect(":memory:")
        self.con.execute("SET threads TO 2")
        self._register(files.shards.values())
        self.views = {name for name, shards in files.shards.items() if shards}
        for name in self.views:
            paths = ", ".join("'" + literal_path(p).replace("'", "''") + "'" for p in files.shards[name])
            self.con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet([{paths}], filename = true, "
                             "union_by_name = true)")

    def _register(self, lists) -> None:
        registered: set[str] = set()
        for shards in lists:
            for shard in shards[:1]:
                fs, _ = get_fs(shard)
                proto = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
                if not is_local(fs) and proto not in registered:
                    self.con.register_filesystem(fs)
                    registered.add(proto)

    def has(self, view: str, *columns: str) -> bool:
        """The view exists and has every one of `columns` (metrics rows gain columns across versions)."""
        return view in self.views and all(c in self.columns(view) for c in columns)

    def columns(self, view: str) -> dict[str, str]:
        """Column name -> DuckDB type of a view."""
        if view not in self.views:
            return {}
        return {row[0]: row[1] for row in self.con.execute(f"DESCRIBE {view}").fetchall()}

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        cur = self.con.execute(sql, params or {})
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def one(self, sql: str) -> dict[str, Any]:
        rows = self.rows(sql)
        return rows[0] if rows else {}

    def close(self) -> None:
        self.con.close()
