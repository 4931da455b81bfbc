"""The trajectory schema, version 1: one row per trajectory (DESIGN.md §4).

Every stage writes this same schema; later stages fill columns that are null before them.
`validate(table)` never coerces: a column with the wrong type or a null where none is allowed is an
error that names the column. Readers reject unknown versions (see `check_version`).
Value rules (token id ranges, mask values, finite log-probs and rewards, turn offsets, sane versions)
are in schemas/values.py: a bad value condemns its row, not the whole shard.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_NAME = "trajectory"
SCHEMA_VERSION = 1

# One struct per turn. Offsets index into response_ids: the turn's generated tokens are
# response_ids[gen_start : gen_start + gen_len]; the observation tokens that follow them (mask 0)
# are the next obs_len ids.
TURN_TYPE = pa.struct(
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

# (name, type, nullable, description). The order is the column order in every shard.
_COLUMNS: list[tuple[str, pa.DataType, bool, str]] = [
    ("schema_version", pa.int16(), False, "schema version of this row (1)"),
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
    ("turns", pa.list_(TURN_TYPE), False, "per-turn records (offsets into response_ids)"),
    ("status", pa.string(), False, "ok, truncated, timeout, env_error, policy_error, aborted"),
    ("finish_reason", pa.string(), False,
     "stop, submit, max_turns, max_tokens, timeout, error; continued: a per-turn row before the last"),
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

SCHEMA_METADATA = {b"arlctl.schema": SCHEMA_NAME.encode(), b"arlctl.schema_version": str(SCHEMA_VERSION).encode()}

TRAJECTORY_SCHEMA = pa.schema(
    [pa.field(name, typ, nullable=nullable, metadata={b"doc": doc.encode()}) for name, typ, nullable, doc in _COLUMNS],
    metadata=SCHEMA_METADATA,
)

COLUMN_NAMES = [name for name, *_ in _COLUMNS]
STATUSES = ("ok", "truncated", "timeout", "env_error", "policy_error", "aborted")
# "continued": a row of `rollout --history per-turn` that is not its trajectory's last (arlctl/turn_rows.py).
FINISH_REASONS = ("stop", "submit", "max_turns", "max_tokens", "timeout", "error", "continued")


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

    What writers check: the structure and the token layout (mask and log-probs as long as response_ids).
    The value rules (ranges, finiteness) live in schemas/values.py: readers apply them row by row.
    """
    validate_structure(table)
    if table.num_rows:
        _check_token_layout(table)


def validate_structure(table: pa.Table) -> None:
    """Columns, types, nulls, version and the status vocabularies; no per-row value rules."""
    names = table.schema.names
    missing = [n for n in COLUMN_NAMES if n not in names]
    if missing:
        raise SchemaError(f"missing column {missing[0]!r}", missing[0])
    extra = [n for n in names if n not in COLUMN_NAMES]
    if extra:
        raise SchemaError(f"unknown column {extra[0]!r}", extra[0])
    if names != COLUMN_NAMES:
        raise SchemaError("columns are not in schema order", None)
    for field in TRAJECTORY_SCHEMA:
        actual = table.schema.field(field.name).type
        if not _types_equal(actual, field.type):
            raise SchemaError(f"column {field.name!r} has type {actual}, expected {field.type}", field.name)
        if not field.nullable and table.column(field.name).null_count:
            raise SchemaError(f"column {field.name!r} has nulls but is not nullable", field.name)
    if table.num_rows:
        versions = set(table.column("schema_version").to_pylist())
        if versions != {SCHEMA_VERSION}:
            raise SchemaError(f"column 'schema_version' holds {sorted(versions)}, expected {SCHEMA_VERSION}",
                              "schema_version")
        _check_vocabularies(table)


def _check_token_layout(table: pa.Table) -> None:
    """Cheap vectorised check: mask and log-probs align with response_ids in every row."""
    import pyarrow.compute as pc

    n_resp = pc.list_value_length(table.column("response_ids"))
    for name in ("response_mask", "response_logprobs"):
        if not pc.all(pc.equal(pc.list_value_length(table.column(name)), n_resp)).as_py():
            raise SchemaError(f"column {name!r} length differs from response_ids in some row", name)


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
    """Cast a table read back from Parquet to the exact schema object (field names, metadata).

    Only structural equivalents are accepted: call validate() first; this never changes values.
    """
    return table.select(COLUMN_NAMES).cast(TRAJECTORY_SCHEMA)


# Append-only registry of migrations: MIGRATIONS[v] upgrades a table of version v to v + 1.
# There is nothing beyond version 1 yet. A new version adds an entry here and never edits an old one.
MIGRATIONS: dict[int, object] = {}
KNOWN_VERSIONS = frozenset({SCHEMA_VERSION})


def check_version(version: int) -> None:
    if version not in KNOWN_VERSIONS and version not in MIGRATIONS:
        raise SchemaError(f"unknown schema version {version} (this arlctl reads {sorted(KNOWN_VERSIONS)})",
                          "schema_version")


def empty_table() -> pa.Table:
    return TRAJECTORY_SCHEMA.empty_table()
