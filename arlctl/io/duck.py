"""DuckDB over trajectory shards: every query sees a view named `trajectories`.

No SQL text is ever built from a shard's path, name or contents. The shards are opened by pyarrow (through
fsspec, so local files, s3:// and memory:// alike) as one lazy `pyarrow.dataset` with the union of their
columns and a `filename` column, and that dataset is registered with DuckDB under a constant name. DuckDB
itself has no file access at all: `sealed()` turns external access off and locks the configuration, so
`COPY ... TO`, `read_csv('/etc/passwd')`, `ATTACH`, `INSTALL` and `LOAD` fail on every connection made
here, whatever SQL reaches it (the user's own SQL in `arlctl query` included).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyarrow.fs import FileSystem, FSSpecHandler, LocalFileSystem, PyFileSystem

from arlctl.errors import CorruptShardError, NoShardsError, TerminalError
from arlctl.io.fs import get_fs, is_local
from arlctl.io.shards import list_shards
from arlctl.schemas.trajectory import V1_COLUMN_NAMES

VIEW = "trajectories"
FILENAME = "filename"  # the column naming each row's shard, as DuckDB's read_parquet(filename = true) did

# Settings every connection starts with; lock_configuration makes them final (a `SET` cannot undo them).
SEALED = {
    "enable_external_access": False,  # no file, URL, ATTACH or extension directory is reachable
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "lock_configuration": True,
}


def sealed(threads: int | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection that can read only what is registered with it (Arrow objects)."""
    config: dict[str, object] = dict(SEALED)
    if threads:
        config["threads"] = int(threads)
    return duckdb.connect(":memory:", config=config)


def is_trajectory_schema(schema: pa.Schema) -> bool:
    """A trajectory shard of any readable version has every version-1 column; anything else is foreign."""
    return set(V1_COLUMN_NAMES) <= set(schema.names)


def shard_dataset(shards: Sequence[str], with_filename: bool = True,
                  foreign: list[str] | None = None) -> ds.Dataset:
    """The shards as one lazy dataset: the union of their columns by name (v1, v2 and v3 shards together,
    a missing field null, nested fields such as turns[].advantage included) and, unless asked not to, a
    `filename` column holding each row's shard URL exactly as listed.

    With a `foreign` list, Parquet files that are not trajectory shards (a metrics file, someone's own
    table) are named in it and left out when any trajectory shard is among them; when none is, they are
    all read as they are (the caller says so: `foreign` then names every file)."""
    if not shards:
        raise NoShardsError("(no paths)")
    filesystems: dict[str, FileSystem] = {}  # one pyarrow filesystem per fsspec protocol
    for shard in shards[:1]:
        _filesystem(shard, filesystems)
    if len(shards) < 8:
        opened = [_open(shard, filesystems) for shard in shards]
    else:  # footers are small reads, each a round trip on an object store: a few at a time
        with ThreadPoolExecutor(max_workers=min(16, len(shards))) as pool:
            opened = list(pool.map(lambda shard: _open(shard, filesystems), shards))
    if foreign is not None:  # the footers just read say which files are trajectory shards
        ours = [is_trajectory_schema(schema) for _, _, schema in opened]
        foreign.extend(shard for shard, mine in zip(shards, ours, strict=True) if not mine)
        if any(ours):
            shards = [shard for shard, mine in zip(shards, ours, strict=True) if mine]
            opened = [o for o, mine in zip(opened, ours, strict=True) if mine]
    schemas = [schema for _, _, schema in opened]
    try:
        schema = pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise TerminalError(f"the shards' columns do not agree: {_one_line(err)}",
                            hint="read shards of one run (or one schema version family) together") from None
    if with_filename:
        if FILENAME in schema.names:
            bad = next(shard for shard, (_, _, s) in zip(shards, opened, strict=True) if FILENAME in s.names)
            raise TerminalError(f"{bad}: has a column named {FILENAME!r}, which the reader adds itself",
                                hint="rename that column; every shard's rows carry their file in `filename`")
        schema = schema.append(pa.field(FILENAME, pa.string()))
    parts: dict[int, tuple[FileSystem, list[str], list[pc.Expression]]] = {}
    for shard, (fs, path, _) in zip(shards, opened, strict=True):
        _, paths, names = parts.setdefault(id(fs), (fs, [], []))
        paths.append(path)
        # A partition expression `filename == shard` is how pyarrow gives every row of a file a constant.
        names.append(pc.field(FILENAME) == pc.scalar(shard))
    datasets = [ds.FileSystemDataset.from_paths(paths, schema=schema, format=ds.ParquetFileFormat(),
                                                filesystem=fs, partitions=names if with_filename else None)
                for fs, paths, names in parts.values()]
    return datasets[0] if len(datasets) == 1 else ds.dataset(datasets)


def connect(shards: Sequence[str], threads: int | None = None,
            foreign: list[str] | None = None) -> duckdb.DuckDBPyConnection:
    """A sealed connection with `trajectories` registered over the given shard files (`foreign`: see
    shard_dataset)."""
    con = sealed(threads)
    con.register(VIEW, shard_dataset(shards, foreign=foreign))
    return con


def connect_paths(*paths: str) -> tuple[duckdb.DuckDBPyConnection, list[str]]:
    shards = list_shards(*paths)
    if not shards:
        raise NoShardsError(", ".join(paths))
    return connect(shards), shards


def _open(shard: str, filesystems: dict[str, FileSystem]) -> tuple[FileSystem, str, pa.Schema]:
    """(pyarrow filesystem, path in it, schema) of one shard."""
    arrow_fs, path = _filesystem(shard, filesystems)
    try:
        with arrow_fs.open_input_file(path) as fh:
            schema = pq.read_schema(fh)
    except FileNotFoundError:
        raise
    except Exception as err:
        raise CorruptShardError(shard, _one_line(err)) from None
    return arrow_fs, path, schema.remove_metadata()


def _filesystem(shard: str, filesystems: dict[str, FileSystem]) -> tuple[FileSystem, str]:
    """(pyarrow filesystem, path in it) of a shard; one filesystem per protocol, kept in `filesystems`."""
    fs, path = get_fs(shard)
    protocol = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
    if protocol not in filesystems:
        filesystems[protocol] = LocalFileSystem() if is_local(fs) else PyFileSystem(FSSpecHandler(fs))
    return filesystems[protocol], path


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300]
