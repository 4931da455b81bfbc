"""Per-turn rows (`rollout --history per-turn`): how a stage recognises them and groups them back.

A trajectory of n assistant turns may be written as n rows sharing trajectory_id (contract of issue 13):
row k holds exactly one Turn with index k; rows 0..n-2 have finish_reason "continued" and the last
carries the trajectory's real finish_reason and final_state. Whole-trajectory rows (the default) are the
n = 1 case of the same picture: one row, first turn index 0, not "continued".

  is_turn_row(row)        finish_reason == "continued" or turns[0].index > 0
  row_key(row)            (trajectory_id, first turn index): a row's identity, also for whole rows
  trajectories(table)     trajectory_id -> its row indices ordered by turn index, in order of first row
  incomplete_reason(...)  why a trajectory's rows are not complete (indices 0..n-1, only the last final)

Stages that score or weigh a trajectory (reward, filter, train) use these so that a trajectory split into
rows is still scored once, kept or dropped whole, and weighted once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

CONTINUED = "continued"


def first_turn_index(row: Mapping[str, Any]) -> int:
    turns = row.get("turns") or []
    return int(turns[0]["index"]) if turns else 0


def is_turn_row(row: Mapping[str, Any]) -> bool:
    """True for a row of a per-turn trajectory (any of its rows, the last included when its index > 0)."""
    return row.get("finish_reason") == CONTINUED or first_turn_index(row) > 0


def row_key(row: Mapping[str, Any]) -> tuple[str, int]:
    """(trajectory_id, first turn index): per-turn siblings differ; a real repeat does not."""
    return str(row["trajectory_id"]), first_turn_index(row)


@dataclass
class Trajectory:
    """The rows of one trajectory in a table, ordered by turn index."""

    trajectory_id: str
    rows: list[int]  # table row indices, by turn index
    indices: list[int]  # first turn index of each of those rows
    continued: list[bool]  # finish_reason == "continued" of each

    @property
    def last(self) -> int | None:
        """The row holding the trajectory's outcome (not "continued"), when there is exactly one."""
        finals = [r for r, c in zip(self.rows, self.continued, strict=True) if not c]
        return finals[0] if len(finals) == 1 else None

    def incomplete_reason(self) -> str | None:
        """None when the rows are complete: indices 0..n-1, each once, and exactly the last is final."""
        n = len(self.rows)
        if self.indices != list(range(n)):
            return f"turn rows {self.indices} of trajectory {self.trajectory_id!r} are not 0..{n - 1}"
        finals = [i for i, c in zip(self.indices, self.continued, strict=True) if not c]
        if finals != [n - 1]:
            what = "no final row" if not finals else f"final rows at turn {finals}"
            return f"trajectory {self.trajectory_id!r} has {what} (expected only turn {n - 1} not 'continued')"
        return None


def trajectories(table: pa.Table) -> dict[str, Trajectory]:
    """trajectory_id -> Trajectory, in order of each trajectory's first row in the table."""
    ids = table.column("trajectory_id").to_pylist()
    reasons = table.column("finish_reason").to_pylist()
    first = first_turn_indices(table)
    found: dict[str, list[tuple[int, int, bool]]] = {}
    for row, (tid, idx, reason) in enumerate(zip(ids, first, reasons, strict=True)):
        found.setdefault(tid, []).append((idx, row, reason == CONTINUED))
    out = {}
    for tid, members in found.items():
        members.sort()
        out[tid] = Trajectory(tid, [m[1] for m in members], [m[0] for m in members], [m[2] for m in members])
    return out


def first_turn_indices(table: pa.Table) -> list[int]:
    """turns[0].index per row (0 for a row without turns), without materialising every turn."""
    import pyarrow.compute as pc

    turns = table.column("turns")
    out = []
    for chunk in turns.chunks:
        lengths = pc.list_value_length(chunk).to_pylist()
        index = pc.struct_field(chunk.flatten(), "index").to_pylist()
        pos = 0
        for n in lengths:
            n = n or 0
            out.append(int(index[pos]) if n else 0)
            pos += n
    return out
