"""Synthetic rows speak the schema's current vocabulary: a cut reply is finish_reason "length"."""

from __future__ import annotations

from arlctl.schemas import trajectory as T
from arlctl.synthetic import synthetic_table


def test_truncated_synthetic_rows_say_length_not_max_tokens():
    table = synthetic_table(40, 4, seed=3)
    pairs = list(zip(table.column("status").to_pylist(), table.column("finish_reason").to_pylist(), strict=True))
    cut = [reason for status, reason in pairs if status == "truncated"]
    assert cut and set(cut) == {"length"}  # "max_tokens" is only read, for shards written before it
    assert "max_tokens" not in {reason for _, reason in pairs}
    T.validate(table)
