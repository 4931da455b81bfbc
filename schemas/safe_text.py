"""Text that can always be written: every string of a row as valid UTF-8, every env field its schema type.

Python strings may hold lone surrogates (JSON's "\\ud800" escape, bytes decoded with surrogateescape) that
no UTF-8 writer accepts, and plugin envs may hand back dicts or bytes where text belongs. `safe_row` is
the one gate between a finished group and the sink, so a flush can never fail on a row's content and
take other groups' rows down with it.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from arlctl.schemas.rows import TrajectoryRow


def parquet_safe(text: str) -> str:
    """`text` as a string that encodes to valid UTF-8 (what Parquet/Arrow strings must be).

    Python strings may hold lone surrogates (JSON's "\\ud800" escape, bytes decoded with surrogateescape)
    that no UTF-8 writer accepts. Decision: a surrogate pair split over two code points is joined back
    into its character; every lone surrogate becomes U+FFFD. Lossy for those code points only, never an
    exception. Surrogates are the only code points UTF-8 cannot encode, so this covers every case.
    """
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def parquet_safe_value(value: Any) -> Any:
    """parquet_safe applied to every string (keys included) inside JSON-like lists and dicts."""
    if isinstance(value, str):
        return parquet_safe(value)
    if isinstance(value, dict):
        return {parquet_safe_value(k): parquet_safe_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [parquet_safe_value(v) for v in value]
    return value


def as_text(value: Any) -> str | None:
    """An env-supplied text field as a safe string (a plugin env may hand back a dict or bytes)."""
    if value is None or isinstance(value, str):
        return None if value is None else parquet_safe(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return parquet_safe(json.dumps(value, ensure_ascii=False, default=str))


def as_float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def safe_row(row: TrajectoryRow) -> TrajectoryRow:
    """Make every text of a row Parquet-safe and every env-supplied field its schema type, in place.

    The one gate between a finished group and the sink, so that the flush can never fail on a row's
    content and take other groups' rows down with it.
    """
    for f in fields(row):
        value = getattr(row, f.name)
        if isinstance(value, str | dict):
            setattr(row, f.name, parquet_safe_value(value))
    row.final_state = as_text(row.final_state)
    for turn in row.turns:
        turn.text = as_text(turn.text) or ""
        turn.observation = as_text(turn.observation)
        turn.error = as_text(turn.error)
        turn.tool_calls = parquet_safe_value(turn.tool_calls)
        turn.reward_step = as_float(turn.reward_step)
    return row

