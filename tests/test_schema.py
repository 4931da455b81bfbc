"""The trajectory schema is frozen: any change must be a new version with a named migration."""

from __future__ import annotations

import pyarrow as pa
import pytest

from arlctl.schemas import trajectory as T
from arlctl.schemas.rows import TrajectoryRow, Turn, rows_to_table, uuid7
from arlctl.synthetic import synthetic_table

# The golden copy of schema version 1: (name, type, nullable). Edit only together with a migration.
GOLDEN_V1 = [
    ("schema_version", "int16", False),
    ("trajectory_id", "string", False),
    ("group_id", "string", False),
    ("sample_index", "int16", False),
    ("task_id", "string", False),
    ("env", "string", False),
    ("env_version", "string", False),
    ("task", "string", False),
    ("policy", "string", False),
    ("policy_version", "int64", False),
    ("policy_version_last", "int64", False),
    ("prompt_text", "string", False),
    ("prompt_ids", "list<item: int32>", False),
    ("response_ids", "list<item: int32>", False),
    ("response_mask", "list<item: int8>", False),
    ("response_logprobs", "list<item: float>", False),
    ("turns", "list<item: struct<index: int16 not null, gen_start: int32 not null, gen_len: int32 not null, "
              "obs_len: int32 not null, text: string not null, tool_calls: string not null, observation: string, "
              "policy_version: int64 not null, gen_latency_s: float not null, env_latency_s: float not null, "
              "reward_step: float, error: string>>", False),
    ("status", "string", False),
    ("finish_reason", "string", False),
    ("num_turns", "int16", False),
    ("num_tool_calls", "int16", False),
    ("env_errors", "int16", False),
    ("retries", "int16", False),
    ("prompt_tokens", "int32", False),
    ("response_tokens", "int32", False),
    ("generated_tokens", "int32", False),
    ("wall_time_s", "float", False),
    ("gen_time_s", "float", False),
    ("env_time_s", "float", False),
    ("started_at", "timestamp[us, tz=UTC]", False),
    ("finished_at", "timestamp[us, tz=UTC]", False),
    ("final_state", "string", True),
    ("reward", "float", True),
    ("reward_components", "map<string, float>", True),
    ("reward_info", "string", True),
    ("reward_version", "string", True),
    ("advantage", "float", True),
    ("weight", "float", True),
    ("trace_id", "string", False),
]


# The golden copy of schema version 2: version 1 with turns[].advantage appended to the turn struct
# (migration MIGRATIONS[1]). Frozen: version 3 appends a column, it edits none of these.
TURNS_V2 = ("list<item: struct<index: int16 not null, gen_start: int32 not null, gen_len: int32 not null, "
            "obs_len: int32 not null, text: string not null, tool_calls: string not null, observation: string, "
            "policy_version: int64 not null, gen_latency_s: float not null, env_latency_s: float not null, "
            "reward_step: float, error: string, advantage: float>>")
GOLDEN_V2 = [(name, TURNS_V2 if name == "turns" else typ, nullable) for name, typ, nullable in GOLDEN_V1]

# The golden copy of schema version 3: version 2 with the nullable env_info column appended last
# (migration MIGRATIONS[2]). Edit only together with a migration to version 4.
GOLDEN_V3 = [*GOLDEN_V2, ("env_info", "string", True)]


def test_schema_matches_golden_copy():
    actual = [(f.name, str(f.type), f.nullable) for f in T.TRAJECTORY_SCHEMA]
    assert actual == GOLDEN_V3
    assert actual[:-1] == GOLDEN_V2  # one column appended at the end, nothing else changed
    assert [(f.name, str(f.type), f.nullable) for f in T.SCHEMAS[3]] == GOLDEN_V3


def test_version_2_stays_frozen():
    assert [(f.name, str(f.type), f.nullable) for f in T.SCHEMAS[2]] == GOLDEN_V2
    assert T.SCHEMAS[2].metadata[b"arlctl.schema_version"] == b"2"
    assert T.SCHEMAS[2].field("schema_version").metadata[b"doc"] == b"schema version of this row (2)"


def test_version_1_stays_frozen():
    assert [(f.name, str(f.type), f.nullable) for f in T.SCHEMAS[1]] == GOLDEN_V1
    assert T.SCHEMAS[1].metadata[b"arlctl.schema_version"] == b"1"


def test_schema_metadata_and_docs():
    meta = T.TRAJECTORY_SCHEMA.metadata
    assert meta[b"arlctl.schema"] == b"trajectory"
    assert meta[b"arlctl.schema_version"] == b"3"
    assert all(f.metadata and f.metadata[b"doc"] for f in T.TRAJECTORY_SCHEMA)
    assert T.TRAJECTORY_SCHEMA.field("env_info").metadata[b"doc"] == (
        b"where the environment ran: sandbox kind, engine/host, container; null when the env has no sandbox")


def test_migration_registry_is_append_only():
    assert T.SCHEMA_VERSION == 3
    assert sorted(T.MIGRATIONS) == [1, 2]  # one entry per older version: v -> v + 1
    T.check_version(1)
    T.check_version(2)
    T.check_version(3)
    with pytest.raises(T.SchemaError, match=r"unknown schema version 4 \(this arlctl reads \[1, 2, 3\]\)"):
        T.check_version(4)
    with pytest.raises(T.SchemaError, match="unknown schema version 0"):
        T.check_version(0)


def as_v1(table: pa.Table) -> pa.Table:
    """The same rows as a version-1 writer wrote them: no turns[].advantage, no env_info, schema_version 1."""
    rows = table.to_pylist()
    for row in rows:
        row["schema_version"] = 1
        assert row.pop("env_info") is None
        for turn in row["turns"]:
            assert turn.pop("advantage") is None
    return pa.Table.from_pylist(rows, schema=T.SCHEMAS[1])


def as_v2(table: pa.Table) -> pa.Table:
    """The same rows as a version-2 writer wrote them: no env_info column, schema_version 2."""
    rows = table.to_pylist()
    for row in rows:
        row["schema_version"] = 2
        assert row.pop("env_info") is None
    return pa.Table.from_pylist(rows, schema=T.SCHEMAS[2])


def test_migration_1_to_2_adds_a_null_turn_advantage_and_changes_nothing_else():
    table = synthetic_table(3, 2, seed=4)
    old = as_v1(table)
    T.validate_structure(old)  # a reader accepts version 1 as it is ...
    upgraded = T.conform(old)  # ... and upgrades it
    assert upgraded.schema.equals(T.TRAJECTORY_SCHEMA, check_metadata=True)
    assert upgraded.equals(table)  # every value, schema_version 3, null advantages and env_info included
    turns = [t for row in upgraded.column("turns").to_pylist() for t in row]
    assert turns and all(t["advantage"] is None for t in turns)
    # A slice (offset chunks) and a table of several chunks migrate the same way.
    assert T.conform(old.slice(2, 3)).equals(table.slice(2, 3))
    assert T.conform(pa.concat_tables([old.slice(0, 2), old.slice(2)])).equals(table)


def test_writers_refuse_version_1_and_readers_refuse_mixed_versions():
    old = as_v1(synthetic_table(1, 2, seed=5))
    with pytest.raises(T.SchemaError, match="this table is schema version 1; writers write version 3"):
        T.validate(old)
    # A v1 table whose metadata says 2 is neither: the turn struct is checked against what it claims.
    claims_v2 = old.replace_schema_metadata(T.SCHEMAS[2].metadata)
    with pytest.raises(T.SchemaError, match="column 'turns' has type"):
        T.validate_structure(claims_v2)
    # A v1 table whose metadata says 3 lacks the column v3 appended.
    with pytest.raises(T.SchemaError, match="missing column 'env_info'"):
        T.validate_structure(old.replace_schema_metadata(T.SCHEMA_METADATA))


def test_a_version_1_shard_is_read_as_version_3(tmp_path):
    import pyarrow.parquet as pq

    from arlctl.io.shards import read_shard

    table = synthetic_table(2, 2, seed=6)
    path = tmp_path / "v1.parquet"
    pq.write_table(as_v1(table), path)  # a shard as a version-1 arlctl committed it
    assert pq.read_schema(path).metadata[b"arlctl.schema_version"] == b"1"
    assert read_shard(str(path)).equals(table)


def test_migration_2_to_3_appends_a_null_env_info_and_changes_nothing_else():
    table = synthetic_table(3, 2, seed=10)
    rows = table.to_pylist()
    rows[1]["turns"][0]["advantage"] = 0.25  # a v2 value the migration must carry over untouched
    table = pa.Table.from_pylist(rows, schema=T.TRAJECTORY_SCHEMA)
    old = as_v2(table)
    assert old.schema.names == T.COLUMN_NAMES[:-1] and "env_info" not in old.schema.names
    T.validate_structure(old)  # a reader accepts version 2 as it is ...
    upgraded = T.conform(old)  # ... and upgrades it
    assert upgraded.schema.equals(T.TRAJECTORY_SCHEMA, check_metadata=True)
    assert upgraded.schema.names[-1] == "env_info"
    assert upgraded.column("env_info").null_count == table.num_rows
    assert upgraded.column("schema_version").to_pylist() == [3] * table.num_rows
    assert upgraded.equals(table)  # every other value as it was, the v2 turn advantage included
    assert T.conform(old.slice(1, 4)).equals(table.slice(1, 4))
    assert T.conform(pa.concat_tables([old.slice(0, 3), old.slice(3)])).equals(table)
    with pytest.raises(T.SchemaError, match="this table is schema version 2; writers write version 3"):
        T.validate(old)
    # A v2 table carrying an env_info column is not version 2: readers name the stray column.
    stray = old.append_column("env_info", pa.nulls(old.num_rows, pa.string()))
    with pytest.raises(T.SchemaError, match=r"unknown column 'env_info' \(schema version 2\)"):
        T.validate_structure(stray)


def test_a_version_2_shard_is_read_as_version_3_with_env_info_null(tmp_path):
    import pyarrow.parquet as pq

    from arlctl.io.shards import read_shard

    table = synthetic_table(2, 2, seed=11)
    path = tmp_path / "v2.parquet"
    pq.write_table(as_v2(table), path)  # a shard as a version-2 arlctl committed it
    assert pq.read_schema(path).metadata[b"arlctl.schema_version"] == b"2"
    assert "env_info" not in pq.read_schema(path).names
    got = read_shard(str(path))
    assert got.equals(table)
    assert got.column("env_info").to_pylist() == [None] * 4
    assert read_shard(str(path), columns=["env_info"]).num_columns == 1


def test_env_info_round_trips_through_the_row_builder_and_a_shard(tmp_path):
    import json

    from arlctl.io.shards import Lineage, read_shard, shard_name, write_shard

    placed = {"sandbox": "docker", "engine": "unix:///run/b.sock", "container": "0123456789ab",
              "replaced_from": [{"sandbox": "docker", "engine": "unix:///run/a.sock", "cause": "health_check"}]}
    rows = [TrajectoryRow(group_id="g", sample_index=i, task_id="t", env="swe", env_version="swe-1", task={},
                          policy="p", prompt_text="x", prompt_ids=[1], env_info=info)
            for i, info in enumerate([placed, None, {"sandbox": "bwrap", "host": "h\u00e9"}])]
    table = rows_to_table(rows)
    assert table.schema.field("env_info").type == pa.string()
    written = write_shard(table, str(tmp_path / shard_name("rollout")), Lineage(stage="rollout"))
    got = read_shard(written).column("env_info").to_pylist()
    assert got[1] is None  # no sandbox: null, not "null"
    assert json.loads(got[0]) == placed and json.loads(got[2]) == {"sandbox": "bwrap", "host": "h\u00e9"}


def test_validate_names_the_offending_column():
    table = synthetic_table(2, 2, seed=1)
    bad = table.set_column(table.schema.get_field_index("reward"), "reward",
                           table.column("reward").cast(pa.float64()))
    with pytest.raises(T.SchemaError) as err:
        T.validate(bad)
    assert err.value.column == "reward"
    with pytest.raises(T.SchemaError, match="missing column 'trace_id'"):
        T.validate(table.drop(["trace_id"]))
    nulls = table.set_column(table.schema.get_field_index("task_id"), pa.field("task_id", pa.string()),
                             pa.array([None] * table.num_rows, pa.string()))
    with pytest.raises(T.SchemaError, match="'task_id' has nulls"):
        T.validate(nulls)


def test_validate_checks_token_layout():
    row = TrajectoryRow(group_id="g", sample_index=0, task_id="t", env="math", env_version="1", task={},
                        policy="p", prompt_text="x", prompt_ids=[1, 2], response_ids=[3, 4, 5],
                        response_mask=[1, 1], response_logprobs=[-0.1, -0.2, 0.0])
    with pytest.raises(T.SchemaError, match="response_mask"):
        rows_to_table([row])


def test_turn_advantage_round_trips_through_the_row_builder():
    row = TrajectoryRow(group_id="g", sample_index=0, task_id="t", env="math", env_version="1", task={},
                        policy="p", prompt_text="x", prompt_ids=[1], response_ids=[2, 3], response_mask=[1, 1],
                        response_logprobs=[-0.1, -0.2],
                        turns=[Turn(0, 0, 1, 0, "a", advantage=0.5), Turn(1, 1, 1, 0, "b")])
    got = rows_to_table([row]).column("turns").to_pylist()[0]
    assert [t["advantage"] for t in got] == [0.5, None]


def test_row_builder_derives_counters():
    row = TrajectoryRow(group_id="g", sample_index=1, task_id="t", env="math", env_version="math-1",
                        task={"q": 1}, policy="p", prompt_text="x", prompt_ids=[1, 2, 3],
                        response_ids=[4, 5, 6, 7], response_mask=[1, 1, 0, 1],
                        response_logprobs=[-0.5, -0.25, 0.0, -1.0],
                        turns=[Turn(0, 0, 2, 1, "ab"), Turn(1, 3, 1, 0, "c")])
    got = rows_to_table([row]).to_pylist()[0]
    assert (got["prompt_tokens"], got["response_tokens"], got["generated_tokens"], got["num_turns"]) == (3, 4, 3, 2)
    assert got["trace_id"] == got["trajectory_id"]
    assert got["task"] == '{"q": 1}'


def test_uuid7_is_time_ordered_and_versioned():
    import time
    import uuid

    a = uuid7()
    time.sleep(0.002)
    b = uuid7()
    assert a < b
    assert uuid.UUID(a).version == 7
    assert len({uuid7() for _ in range(1000)}) == 1000


def test_synthetic_rows_are_realistic():
    table = synthetic_table(8, 4, seed=3)
    rows = table.to_pylist()
    assert table.num_rows == 32
    assert len({r["group_id"] for r in rows}) == 8
    mean_turns = sum(r["num_turns"] for r in rows) / len(rows)
    mean_tokens = sum(r["response_tokens"] for r in rows) / len(rows)
    assert 14 <= mean_turns <= 26
    assert 6_000 <= mean_tokens <= 14_000
    for r in rows:
        assert set(r["response_mask"]) <= {0, 1}
        # mask-0 positions carry log-prob 0; turn offsets point at mask-1 spans
        assert all(lp == 0.0 for lp, m in zip(r["response_logprobs"], r["response_mask"]) if m == 0)
        for t in r["turns"]:
            assert all(r["response_mask"][t["gen_start"] + i] == 1 for i in range(t["gen_len"]))
    assert synthetic_table(8, 4, seed=3).equals(table)


def test_duckdb_reads_v1_v2_and_v3_shards_in_one_view(tmp_path):
    import pyarrow.parquet as pq

    from arlctl.io.duck import VIEW, connect

    v2 = synthetic_table(2, 2, seed=7)
    rows = v2.to_pylist()
    rows[0]["turns"][0]["advantage"] = 0.5
    pq.write_table(as_v2(pa.Table.from_pylist(rows, schema=T.TRAJECTORY_SCHEMA)), tmp_path / "b-v2.parquet")
    pq.write_table(as_v1(synthetic_table(2, 2, seed=8)), tmp_path / "a-v1.parquet")  # read first
    v3 = synthetic_table(1, 2, seed=12).to_pylist()
    v3[0]["env_info"] = '{"sandbox": "bwrap", "host": "node-7"}'
    pq.write_table(pa.Table.from_pylist(v3, schema=T.TRAJECTORY_SCHEMA), tmp_path / "c-v3.parquet")
    con = connect(sorted(str(p) for p in tmp_path.glob("*.parquet")))
    got = con.execute(f"SELECT schema_version, turns[1].advantage, json_extract_string(env_info, '$.host') "
                      f"FROM {VIEW} ORDER BY 1, 2 NULLS LAST, 3 NULLS LAST").fetchall()
    # 2 groups x 2 rows in each of the v1 and v2 shards, 1 group x 2 rows in the v3 one
    assert got == [(1, None, None)] * 4 + [(2, 0.5, None)] + [(2, None, None)] * 3 + [(3, None, "node-7"),
                                                                                      (3, None, None)]


def test_a_non_finite_turn_advantage_is_a_bad_value():
    from arlctl.schemas.values import find_bad_values

    rows = synthetic_table(2, 2, seed=9).to_pylist()
    rows[1]["turns"][-1]["advantage"] = float("nan")
    rows[0]["turns"][0]["advantage"] = 1.25  # finite: fine
    problems = find_bad_values(pa.Table.from_pylist(rows, schema=T.TRAJECTORY_SCHEMA))
    assert [(p.row, p.column) for p in problems] == [(1, "turns")]
    assert "advantage nan, not finite" in problems[0].reason
