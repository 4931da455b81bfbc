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

import pyarrow as pa
import pyarrow.dataset as ds

from arlctl.errors import UsageError
from arlctl.io.duck import sealed, shard_dataset
from arlctl.io.fs import basename, get_fs, to_url
from arlctl.io.run import RunLayout
from arlctl.io.shards import list_shards

METRIC_PREFIXES = {"train_metrics": "train-step-", "rollout_metrics": "rollout-", "reward_metrics": "reward-"}
VIEWS = ("rollouts", "rewarded", "batches", *METRIC_PREFIXES, "eval_rows")
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


SAMPLE_SOURCE = "sample_source"  # the view sample rows are picked from: `rewarded`, else `rollouts`
SAMPLE_FILES = "sample_files"  # whole rows of the picked samples (token lists included), only their files


class RunViews:
    """A sealed in-memory DuckDB connection (arlctl.io.duck.sealed: no file access at all) with one
    registered dataset per non-empty file list of `files`, under the constant view names above. No path,
    column name or value of the run ever becomes SQL text: the queries are constants with bound parameters."""

    def __init__(self, files: RunFiles):
        self.files = files
        self.con = sealed(threads=2)
        self.datasets: dict[str, ds.Dataset] = {}
        for name, shards in files.shards.items():
            if shards and name in VIEWS:
                self.datasets[name] = shard_dataset(shards)
                self.con.register(name, self.datasets[name])
        self.schemas = {name: dataset.schema for name, dataset in self.datasets.items()}
        self.views = set(self.schemas)
        source = "rewarded" if "rewarded" in self.views else "rollouts" if "rollouts" in self.views else None
        self.sample_view = source
        if source is not None:
            self.con.register(SAMPLE_SOURCE, self.datasets[source])  # the same dataset: footers read once

    def register_samples(self, shards: list[str]) -> None:
        """`sample_files`: the whole rows of these shards, without the reader's `filename` column."""
        self.con.register(SAMPLE_FILES, shard_dataset(shards, with_filename=False))

    def has(self, view: str, *columns: str) -> bool:
        """The view exists and has every one of `columns` (metrics rows gain columns across versions)."""
        return view in self.views and all(c in self.columns(view) for c in columns)

    def columns(self, view: str) -> dict[str, pa.DataType]:
        """Column name -> Arrow type of a view (read from the shards' footers, not by SQL)."""
        schema = self.schemas.get(view)
        return {} if schema is None else {f.name: f.type for f in schema}

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        cur = self.con.execute(sql, params or {})
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def one(self, sql: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        rows = self.rows(sql, params)
        return rows[0] if rows else {}

    def arrow(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table:
        return self.con.sql(sql, params=params or None).to_arrow_table()

    def table(self, view: str) -> pa.Table:
        """A view's rows read by pyarrow, no SQL at all: every column under its exact name (DuckDB would
        rename an empty name and cut one at a NUL)."""
        return self.datasets[view].to_table()

    def close(self) -> None:
        self.con.close()
