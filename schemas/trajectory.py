"""The trajectory schema, version 3: one row per trajectory (DESIGN.md §4).

Every stage writes this same schema; later stages fill columns that are null before them.
`validate(table)` never coerces: a column with the wrong type or a null where none is allowed is an
error that names the column. Readers reject unknown versions (see `check_version`) and upgrade older
ones through the append-only MIGRATIONS registry (`conform`), so every stage reads a v1 or v2 shard as v3.

Versions:
  1  the original schema
  2  turns[].advantage (float32, nullable): the per-turn advantage `filter --adv turn` writes; train gives
     it to that turn's sampled tokens. It sits in the turn struct, beside the gen_start / gen_len offsets it
     applies to and the reward_step it is computed from, so there is no second list to keep aligned with
     `turns`. Null (every v1 row, every other --adv mode): the row's `advantage` applies to all its tokens.
  3  env_info (string, nullable), the last column: JSON object saying where the environment ran (sandbox
     kind, engine or host, container; `replaced_from` when the work moved off a failed sandbox or engine).
     Written by rollout from the env's `env_info()`; null for envs without a sandbox and in every v1/v2 row.
Value rules (token id ranges, mask values, finite log-probs and rewards, turn offsets, sane versions)
are in schemas/values.py: a bad value condemns its row, not the whole shard.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SCHEMA_NAME = "trajectory"
SCHEMA_VERSION = 3

# One struct per turn. Offsets index into response_ids: the turn's generated tokens are
# response_ids[gen_start : gen_start + gen_len]; the observation tokens that follow them (mask 0)
# are the next obs_len ids. Frozen as of version 1: a new version appends fields (TURN_TYPE below).
_TURN_FIELDS_V1 = (
    [
        pa.field("index", pa.int16(), nullable=False),  # 0-based turn number
        pa.field("gen_start", pa.int32(), nullable=False),  # offset of this turn's first sampled token
        pa.field("gen_len", pa.int32(), nullable=False),  # sampled tokens in this turn (mask 1)
        pa.field("obs_len", pa.int32(), nullable=False),  # environment/template tokens after it (mask 0)
        pa.field("text", pa.string(), nullable=False),  # decoded generation of this turn
        pa.field("tool_calls", pa.string(), nullable=False),  # JSON list of {name, arguments, id}
        pa.field("observation", pa.string(), nullable=True),  # what the env returned (null on the last turn)
        pa.field("policy_version", pa.int64(), nullable=False),  # version that generated this turn
        pa.field("gen_latency_s", pa.float32(), nullable=False),
        pa.field("env_latency_s", pa.float32(), nullable=False),
        pa.field("reward_step", pa.float32(), nullable=True),  # per-step reward if the env gives one
        pa.field("error", pa.string(), nullable=True),  # tool / parse / timeout error of this turn
    ]
)
TURN_TYPE_V1 = pa.struct(_TURN_FIELDS_V1)
# Version 2 appends the per-turn advantage (null unless `filter --adv turn` wrote it).
TURN_TYPE = pa.struct([*_TURN_FIELDS_V1, pa.field("advantage", pa.float32(), nullable=True)])

# (name, type, nullable, description). The order is the column order in every shard. Names, types and
# nullability frozen as of version 1 (versions 1 and 2 have exactly these columns; only the turn struct
# differs); a new version appends columns (_COLUMNS below) and never edits these.
_COLUMNS_V1: list[tuple[str, pa.DataType, bool, str]] = [
    ("schema_version", pa.int16(), False, "schema version of this row (3)"),
    ("trajectory_id", pa.string(), False, "unique, time-ordered id (uuid7)"),
    ("group_id", pa.string(), False, "shared by the G samples of one task in one rollout (GRPO group)"),
    ("sample_index", pa.int16(), False, "0..G-1 within the group"),
    ("task_id", pa.string(), False, "id of the attempted task"),
    ("env", pa.string(), False, "environment name (math, swe, code, ...)"),
    ("env_version", pa.string(), False, "environment version"),
    ("task", pa.string(), False, "JSON of the task as given"),
    ("policy", pa.string(), False, "model name or path"),
    ("policy_version", pa.int64(), False, "policy version at the first turn"),
    ("policy_version_last", pa.int64(), False, "policy version at the last turn"),
    ("prompt_text", pa.string(), False, "rendered prompt (chat template applied)"),
    ("prompt_ids", pa.list_(pa.int32()), False, "prompt tokens"),
    ("response_ids", pa.list_(pa.int32()), False, "every token after the prompt: generated and env tokens"),
    ("response_mask", pa.list_(pa.int8()), False, "1 = sampled by the policy (trained), 0 = env/template"),
    ("response_logprobs", pa.list_(pa.float32()), False, "behaviour log-prob per response token; 0 where mask=0"),
    ("turns", pa.list_(TURN_TYPE), False, "per-turn records (offsets into response_ids; v2: per-turn advantage)"),
    ("status", pa.string(), False, "ok, truncated, timeout, env_error, policy_error, aborted"),
    ("finish_reason", pa.string(), False,
     "stop, submit, max_turns, length (a token budget or the context cut the last reply; max_tokens in "
     "older rows), timeout, error; continued: a per-turn row before the last"),
    ("num_turns", pa.int16(), False, "assistant turns"),
    ("num_tool_calls", pa.int16(), False, "tool calls parsed and executed"),
    ("env_errors", pa.int16(), False, "tool errors, parse errors and step timeouts"),
    ("retries", pa.int16(), False, "inference retries"),
    ("prompt_tokens", pa.int32(), False, "len(prompt_ids)"),
    ("response_tokens", pa.int32(), False, "len(response_ids)"),
    ("generated_tokens", pa.int32(), False, "mask-1 tokens"),
    ("wall_time_s", pa.float32(), False, "trajectory wall time"),
    ("gen_time_s", pa.float32(), False, "time waiting on the policy"),
    ("env_time_s", pa.float32(), False, "time waiting on the environment"),
    ("started_at", pa.timestamp("us", tz="UTC"), False, "when the trajectory started"),
    ("finished_at", pa.timestamp("us", tz="UTC"), False, "when it ended"),
    ("final_state", pa.string(), True, "env artifact for grading: the diff (swe), the answer (math)"),
    ("reward", pa.float32(), True, "null until `reward`"),
    ("reward_components", pa.map_(pa.string(), pa.float32()), True, "named reward parts"),
    ("reward_info", pa.string(), True, "JSON details of the grading"),
    ("reward_version", pa.string(), True, "reward function name and version"),
    ("advantage", pa.float32(), True, "null until `filter`"),
    ("weight", pa.float32(), True, "null until `filter` (staleness decay x balance)"),
    ("trace_id", pa.string(), False, "one id across every stage's logs for this trajectory"),
]
# Version 3 appends env_info (null where the env has no sandbox, and in every row read from v1 or v2).
_COLUMNS = [*_COLUMNS_V1, ("env_info", pa.string(), True, "where the environment ran: sandbox kind, engine/host, "
                                                              "container; null when the env has no sandbox")]


def _metadata(version: int) -> dict[bytes, bytes]:
    return {b"arlctl.schema": SCHEMA_NAME.encode(), b"arlctl.schema_version": str(version).encode()}


def _schema(version: int, turn_type: pa.DataType, docs: dict[str, str] | None = None,
            columns: list[tuple[str, pa.DataType, bool, str]] = _COLUMNS) -> pa.Schema:
    docs = docs or {}
    return pa.schema(
        [pa.field(name, turn_type if name == "turns" else typ, nullable=nullable,
                  metadata={b"doc": docs.get(name, doc).encode()}) for name, typ, nullable, doc in columns],
        metadata=_metadata(version),
    )


SCHEMA_METADATA = _metadata(SCHEMA_VERSION)
TRAJECTORY_SCHEMA = _schema(SCHEMA_VERSION, pa.list_(TURN_TYPE))
# Every version this arlctl can read, as written then: validation of a shard before its migration.
SCHEMAS: dict[int, pa.Schema] = {
    1: _schema(1, pa.list_(TURN_TYPE_V1), {"schema_version": "schema version of this row (1)",
                                           "turns": "per-turn records (offsets into response_ids)"}, _COLUMNS_V1),
    2: _schema(2, pa.list_(TURN_TYPE), {"schema_version": "schema version of this row (2)"}, _COLUMNS_V1),
    SCHEMA_VERSION: TRAJECTORY_SCHEMA,
}

COLUMN_NAMES = [name for name, *_ in _COLUMNS]
V1_COLUMN_NAMES = [name for name, *_ in _COLUMNS_V1]  # what every readable version has: a trajectory shard's mark
STATUSES = ("ok", "truncated", "timeout", "env_error", "policy_error", "aborted")
# "continued": a row of `rollout --history per-turn` that is not its trajectory's last (arlctl/turn_rows.py).
# "length": a token budget (--max-new-tokens, --max-tokens) or the context cut the last reply; rows written
# before it say "max_tokens" for the --max-tokens case, and stay readable (CUT_REASONS holds both).
FINISH_REASONS = ("stop", "submit", "max_turns", "length", "max_tokens", "timeout", "error", "continued")
CUT_REASONS = ("length", "max_tokens")


class SchemaError(ValueError):
    """A table that does not match the trajectory schema; `column` names the offending column."""

    def __init__(self, message: str, column: str | None = None):
        super().__init__(message)
        self.column = column


def _types_equal(actual: pa.DataType, expected: pa.DataType) -> bool:
    # Parquet round-trips rename list item fields ("item" vs "element"); compare structure, not names,
    # and ignore nested nullability differences introduced by readers.
    if pa.types.is_list(expected):
        return pa.types.is_list(actual) and _types_equal(actual.value_type, expected.value_type)
    if pa.types.is_map(expected):
        return (
            pa.types.is_map(actual)
            and _types_equal(actual.key_type, expected.key_type)
            and _types_equal(actual.item_type, expected.item_type)
        )
    if pa.types.is_struct(expected):
        if not pa.types.is_struct(actual) or actual.num_fields != expected.num_fields:
            return False
        return all(
            actual.field(i).name == expected.field(i).name
            and _types_equal(actual.field(i).type, expected.field(i).type)
            for i in range(expected.num_fields)
        )
    return actual.equals(expected)


def validate(table: pa.Table) -> None:
    """Raise SchemaError naming the first offending column; return None when the table conforms.

    What writers check: the structure of the current version (writers write only SCHEMA_VERSION) and the
    token layout (mask and log-probs as long as response_ids). The value rules (ranges, finiteness) live
    in schemas/values.py: readers apply them row by row.
    """
    version = table_version(table)
    if version != SCHEMA_VERSION:
        raise SchemaError(f"this table is schema version {version}; writers write version {SCHEMA_VERSION} "
                          "(conform() upgrades a table read from an older shard)", "schema_version")
    _check_structure(table, SCHEMA_VERSION)
    if table.num_rows:
        _check_token_layout(table)


def validate_structure(table: pa.Table) -> None:
    """Columns, types, nulls, version and the status vocabularies of the version the table declares
    (any readable one: `conform` upgrades it after); no per-row value rules."""
    _check_structure(table, table_version(table))


def table_version(table: pa.Table) -> int:
    """The version a table declares: its `arlctl.schema_version` metadata, else its schema_version column,
    else (no metadata, no rows) the current one. An unreadable version raises SchemaError."""
    raw = (table.schema.metadata or {}).get(b"arlctl.schema_version")
    if raw is not None:
        try:
            version = int(raw)
        except ValueError:
            raise SchemaError(f"schema version {raw[:20]!r} is not a number", "schema_version") from None
    elif table.num_rows and "schema_version" in table.schema.names:
        versions = table.column("schema_version").unique().to_pylist()
        version = versions[0] if len(versions) == 1 and versions[0] is not None else SCHEMA_VERSION
    else:
        version = SCHEMA_VERSION
    check_version(version)
    return version


def _check_structure(table: pa.Table, version: int) -> None:
    expected = SCHEMAS[version]
    names, expected_names = table.schema.names, expected.names
    missing = [n for n in expected_names if n not in names]
    if missing:
        raise SchemaError(f"missing column {missing[0]!r}", missing[0])
    extra = [n for n in names if n not in expected_names]
    if extra:
        raise SchemaError(f"unknown column {extra[0]!r} (schema version {version})", extra[0])
    if names != expected_names:
        raise SchemaError("columns are not in schema order", None)
    for field in expected:
        actual = table.schema.field(field.name).type
        if not _types_equal(actual, field.type):
            raise SchemaError(f"column {field.name!r} has type {actual}, expected {field.type} "
                              f"(schema version {version})", field.name)
        if not field.nullable and table.column(field.name).null_count:
            raise SchemaError(f"column {field.name!r} has nulls but is not nullable", field.name)
    if table.num_rows:
        versions = set(table.column("schema_version").to_pylist())
        if versions != {version}:
            raise SchemaError(f"column 'schema_version' holds {sorted(versions)}, expected {version}",
                              "schema_version")
        _check_vocabularies(table)


def _check_token_layout(table: pa.Table) -> None:
    """Cheap vectorised check: mask and log-probs align with response_ids in every row."""
    problems = token_layout_problems(table)
    if problems:
        row, name, _ = problems[0]
        raise SchemaError(f"column {name!r} length differs from response_ids in some row (row {row})", name)


def token_layout_problems(table: pa.Table) -> list[tuple[int, str, str]]:
    """(row, column, cause) for every row a writer refuses (`validate`): response_mask or
    response_logprobs not as long as response_ids. A reader that must write what it read (reward) sets
    these rows aside with this cause instead of failing its whole shard at write."""
    n_resp = pc.fill_null(pc.list_value_length(table.column("response_ids")), -1)
    problems = []
    for name in ("response_mask", "response_logprobs"):
        n = pc.fill_null(pc.list_value_length(table.column(name)), -1)
        for row in pc.indices_nonzero(pc.not_equal(n, n_resp)).to_pylist():
            problems.append((row, name, f"{name} has {n[row].as_py()} values but response_ids has "
                                        f"{n_resp[row].as_py()}: no writer may write this row"))
    return sorted(problems)


def _check_vocabularies(table: pa.Table) -> None:
    statuses = set(table.column("status").unique().to_pylist())
    if not statuses <= set(STATUSES):
        raise SchemaError(f"column 'status' holds unknown values {sorted(statuses - set(STATUSES))}", "status")
    reasons = set(table.column("finish_reason").unique().to_pylist())
    if not reasons <= set(FINISH_REASONS):
        raise SchemaError(
            f"column 'finish_reason' holds unknown values {sorted(reasons - set(FINISH_REASONS))}", "finish_reason"
        )


def conform(table: pa.Table) -> pa.Table:
    """The table in the exact current schema object (field names, metadata), upgraded from the version it
    declares through MIGRATIONS first.

    Only structural equivalents are accepted: call validate_structure() first. A migration only adds what
    its version added (null); no value the table holds is changed, except schema_version itself.
    """
    version = table_version(table)
    while version < SCHEMA_VERSION:
        table = MIGRATIONS[version](table.select(SCHEMAS[version].names).cast(SCHEMAS[version]))
        version += 1
    return table.select(COLUMN_NAMES).cast(TRAJECTORY_SCHEMA)


def _v1_to_v2(table: pa.Table) -> pa.Table:
    """Version 2 appends turns[].advantage to the turn struct: null in every v1 turn."""
    v2_turns = SCHEMAS[2].field("turns")  # the frozen v2 type, whatever later versions add
    turns = pa.chunked_array([_with_advantage(chunk, None, v2_turns.type) for chunk in table.column("turns").chunks],
                             v2_turns.type)
    table = table.set_column(table.schema.get_field_index("turns"), v2_turns, turns)
    version = pa.array([2] * table.num_rows, pa.int16())
    table = table.set_column(0, SCHEMAS[2].field("schema_version"), version)
    return table.replace_schema_metadata({**(table.schema.metadata or {}), **_metadata(2)})


def _v2_to_v3(table: pa.Table) -> pa.Table:
    """Version 3 appends the env_info column: null in every v2 row (where its env ran was not recorded)."""
    table = table.append_column(SCHEMAS[3].field("env_info"), pa.nulls(table.num_rows, pa.string()))
    version = pa.array([3] * table.num_rows, pa.int16())
    table = table.set_column(0, SCHEMAS[3].field("schema_version"), version)
    return table.replace_schema_metadata({**(table.schema.metadata or {}), **_metadata(3)})


def set_turn_advantages(table: pa.Table, values: list[float | None]) -> pa.Table:
    """`table` (current version) with turns[].advantage replaced: `values` holds one entry per turn, rows in
    order and each row's turns in order. Nothing else changes."""
    turns = table.column("turns").combine_chunks()
    total = int(pc.sum(pc.list_value_length(turns)).as_py() or 0)
    if len(values) != total:
        raise ValueError(f"{len(values)} turn advantages for {total} turns")
    field = TRAJECTORY_SCHEMA.field("turns")
    column = _with_advantage(turns, pa.array(values, pa.float32()), field.type)
    return table.set_column(table.schema.get_field_index("turns"), field, column)


def _with_advantage(turns: pa.ListArray, advantage: pa.Array | None, target: pa.ListType) -> pa.ListArray:
    """The list of turn structs as `target` (a list of turn structs with an `advantage` field), with
    `advantage` (aligned with the turns of the rows in order) or null in that field; every other field of
    `target` is taken from `turns` by name."""
    lengths = pc.fill_null(pc.list_value_length(turns), 0).to_numpy(zero_copy_only=False)
    structs = turns.flatten()  # the rows' turns in order, whatever the chunk's offset
    fields = list(target.value_type)
    value = pa.nulls(len(structs), pa.float32()) if advantage is None else advantage
    children = [value if f.name == "advantage" else structs.field(f.name) for f in fields]
    merged = pa.StructArray.from_arrays(children, fields=fields, mask=structs.is_null() if structs.null_count else None)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]), pa.int32())
    return pa.ListArray.from_arrays(offsets, merged, type=target, mask=turns.is_null() if turns.null_count else None)


# Append-only registry of migrations: MIGRATIONS[v] upgrades a table of version v (in SCHEMAS[v]) to v + 1.
# A new version adds an entry here and a frozen copy in tests/test_schema.py, and never edits an old one.
MIGRATIONS: dict[int, Callable[[pa.Table], pa.Table]] = {1: _v1_to_v2, 2: _v2_to_v3}
KNOWN_VERSIONS = frozenset({SCHEMA_VERSION})  # written and read as they are
READABLE_VERSIONS = frozenset(KNOWN_VERSIONS | set(MIGRATIONS))  # read, the older ones through MIGRATIONS


def check_version(version: int) -> None:
    if version not in READABLE_VERSIONS:
        raise SchemaError(f"unknown schema version {version} (this arlctl reads {sorted(READABLE_VERSIONS)})",
                          "schema_version")


def empty_table() -> pa.Table:
    return TRAJECTORY_SCHEMA.empty_table()
