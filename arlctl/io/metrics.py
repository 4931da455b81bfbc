"""RUN/metrics rows: each stage invocation (or train step) writes one small Parquet file there, atomically.

`status`, `report` and DuckDB read the directory as one table per stage prefix. The name decides what a
replay does: a per-invocation name (shard_name: time + random) adds a row, a deterministic one
(train-step-000012.parquet) overwrites the row of the same step.
"""

from __future__ import annotations

from typing import Any


def write_metrics_row(row: dict[str, Any], metrics_dir: str, name: str, schema: Any = None) -> str:
    """Write `row` as a one-row Parquet file METRICS_DIR/NAME (a pyarrow schema fixes the column types,
    else they are inferred); returns the URL written."""
    import pyarrow as pa

    from arlctl.io.fs import join
    from arlctl.io.shards import write_table_atomic

    return write_table_atomic(pa.Table.from_pylist([row], schema=schema), join(metrics_dir, name))
