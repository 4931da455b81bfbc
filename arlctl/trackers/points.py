"""What `arlctl export` sends: a run's numeric metrics as points, each on its own stream's x-axis.

A *source* is one unit the exporter tracks (one metrics file or one eval summary); reading it gives one
point per row. Streams and their x-axes:

  train        RUN/metrics/train-step-NNNNNN.parquet     the optimizer step (the row's `step`)
  rollout      RUN/metrics/rollout-<utc>-<rand>.parquet   the invocation's ordinal: 1, 2, ... in the order
  reward       RUN/metrics/reward-<utc>-<rand>.parquet    the exporter first sent them (kept in its cursor)
  eval/<name>  RUN/evals/<name>/vNNNNNN/summary.json      the policy version evaluated (nested keys joined
                                                          with "/": eval/gsm8k/greedy/correct_rate)

Filter files (filter-<invocation>.parquet) are per-row audits, not metrics: they are listed as skipped.
Only finite numbers are sent (strings, booleans, nulls and NaN/inf are not metrics); NaN/inf are counted.
"""

from __future__ import annotations

import calendar
import json
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

from arlctl.io.fs import basename, get_fs, join
from arlctl.io.ledger import parse_version
from arlctl.io.run import RunLayout
from arlctl.io.shards import scan
from arlctl.io.store import child, list_committed, list_names, read_file

EVAL_SUMMARY = "summary.json"
TRAIN_FILE = re.compile(r"^train-step-(\d{6,})\.parquet$")
INVOCATION_FILE = re.compile(r"^(rollout|reward)-(\d{8}T\d{6})(\d{6})Z-[0-9a-f]{8}\.parquet$")
COUNTER_STREAMS = ("rollout", "reward")  # x-axis: an ordinal the cursor hands out
AXIS = {"train": "step", "rollout": "invocation", "reward": "invocation"}  # evals: "policy_version"
NOT_METRICS = {"train": ("step", "time")}  # the x-axis and the wall time are not sent as values
EVAL_NOT_METRICS = ("version", "policy_version", "created_at", "time")  # the x-axis and the wall time


@dataclass(frozen=True)
class Source:
    """One metrics file or eval summary. `key` identifies it in a cursor: the step for train, the version
    for an eval, the file name for a rollout or reward invocation."""

    stream: str
    key: int | str
    url: str
    wall_time: float | None = None  # from the file name, where it carries one


@dataclass(frozen=True)
class Point:
    """One row of a source: its numeric values at `step` of its stream's x-axis."""

    stream: str
    step: int
    wall_time: float
    values: dict[str, float]

    @property
    def axis(self) -> str:
        """The x-axis' name (a W&B step metric is `<stream>/<axis>`)."""
        return AXIS.get(self.stream, "policy_version")


@dataclass
class Listing:
    sources: list[Source]
    skipped: list[str] = field(default_factory=list)  # metrics files that are not metric streams


@dataclass
class Read:
    """A source's rows as points (step None for counter streams: the cursor assigns it) and what was
    left out of them."""

    points: list[Point]
    nonfinite: int = 0


def list_sources(run: str) -> Listing:
    """Every source the run holds now: metrics files in name order, then eval summaries by name and version."""
    layout = RunLayout(run)
    listing = Listing([])
    for url in scan(layout.metrics).shards:
        name = basename(url)
        if m := TRAIN_FILE.match(name):
            listing.sources.append(Source("train", int(m.group(1)), url))
        elif m := INVOCATION_FILE.match(name):
            stamp = calendar.timegm(time.strptime(m.group(2), "%Y%m%dT%H%M%S")) + int(m.group(3)) / 1e6
            listing.sources.append(Source(m.group(1), name, url, stamp))
        else:
            listing.skipped.append(name)
    for name in list_names(layout.evals):
        for version_name, location in list_committed(join(layout.evals, name), EVAL_SUMMARY):
            version = parse_version(version_name)
            if version is not None:
                listing.sources.append(Source(f"eval/{name}", version, str(child(location, EVAL_SUMMARY))))
    return listing


def read_source(source: Source) -> Read:
    """The source's points. Raises (OSError, ValueError, ArrowInvalid) when it cannot be read."""
    if source.stream.startswith("eval/"):
        summary = json.loads(read_file(source.url) or b"null")
        if not isinstance(summary, dict):
            raise ValueError(f"{source.url} is not a JSON object")
        values, nonfinite = numeric({k: v for k, v in flatten(summary).items() if k not in EVAL_NOT_METRICS})
        stamps = [summary.get(k) for k in ("created_at", "time")]
        wall = next((v for v in stamps if isinstance(v, int | float) and not isinstance(v, bool)), time.time())
        return Read([Point(source.stream, int(source.key), float(wall), values)], nonfinite)
    rows = _parquet_rows(source.url)
    points, nonfinite = [], 0
    for row in rows:
        skip = NOT_METRICS.get(source.stream, ())
        values, bad = numeric({k: v for k, v in row.items() if k not in skip})
        nonfinite += bad
        step = int(row.get("step", source.key)) if source.stream == "train" else -1  # -1: the cursor assigns
        wall = row.get("time") if isinstance(row.get("time"), int | float) else source.wall_time
        points.append(Point(source.stream, step, float(wall if wall is not None else time.time()), values))
    return Read(points, nonfinite)


def flatten(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a/b": 1}: nested eval summaries become metric names."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}/"))
        else:
            out[name] = value
    return out


def numeric(row: dict[str, Any]) -> tuple[dict[str, float], int]:
    """The finite numbers of `row` as floats, and how many numbers were NaN or infinite."""
    values, nonfinite = {}, 0
    for key, value in row.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            values[key] = float(value)
        else:
            nonfinite += 1
    return values, nonfinite


def _parquet_rows(url: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    fs, path = get_fs(url)
    with fs.open(path, "rb") as fh:
        return pq.read_table(fh).to_pylist()


__all__ = ["AXIS", "COUNTER_STREAMS", "Listing", "Point", "Read", "Source", "list_sources", "read_source"]
