"""DuckDB over trajectory shards: every query sees a view named `trajectories`.

Local shards are read by DuckDB directly; shards on any other fsspec filesystem (s3://, memory://)
are read through that filesystem registered with DuckDB, so the same SQL works everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb

from arlctl.errors import NoShardsError
from arlctl.io.fs import get_fs, is_local
from arlctl.io.shards import list_shards

VIEW = "trajectories"


def literal_path(path: str) -> str:
    """`path` as DuckDB must read it: exactly that file. read_parquet globs its arguments, so each glob
    metacharacter goes in a one-character class (a file named `*.parquet` must not read the directory)."""
    return "".join(f"[{c}]" if c in "*?[{" else c for c in path)


def _sql_list(paths: Sequence[str]) -> str:
    return "[" + ", ".join("'" + literal_path(p).replace("'", "''") + "'" for p in paths) + "]"


def connect(shards: Sequence[str], threads: int | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with `trajectories` as a view over the given shard files."""
    if not shards:
        raise NoShardsError("(no paths)")
    con = duckdb.connect(":memory:")
    if threads:
        con.execute(f"SET threads TO {int(threads)}")
    registered: set[str] = set()
    for shard in shards:
        fs, _ = get_fs(shard)
        if not is_local(fs):
            proto = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
            if proto not in registered:
                con.register_filesystem(fs)
                registered.add(proto)
    # union_by_name: v1, v2 and v3 shards (v2 adds turns[].advantage, v3 env_info) in one view, the missing field null.
    con.execute(f"CREATE VIEW {VIEW} AS SELECT * FROM read_parquet({_sql_list(shards)}, filename = true, "
                "union_by_name = true)")
    return con


def connect_paths(*paths: str) -> tuple[duckdb.DuckDBPyConnection, list[str]]:
    shards = list_shards(*paths)
    if not shards:
        raise NoShardsError(", ".join(paths))
    return connect(shards), shards
