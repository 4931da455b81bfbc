"""Value rules of the trajectory schema: what a well-typed row may still hold that no stage should trust.

`trajectory.validate` checks types and nulls; this module checks the values inside a well-typed table,
row by row, because one hostile or broken row must be droppable without losing its shard:

  - token ids in prompt_ids / response_ids are >= 0 and below the vocabulary size when it is known
  - response_mask holds only 0 and 1; response_mask and response_logprobs are as long as response_ids
  - behaviour log-probs are finite and <= 0 (a hair above 0 is float rounding in a backend)
  - turn offsets (gen_start, gen_len, obs_len) are >= 0 and the turn lies inside the row's response
  - policy versions (row and turn) lie in [0, MAX_POLICY_VERSION]
  - reward, reward_components, advantage and weight are finite where not null; weight is >= 0
  - a per-turn row (finish_reason "continued", or a first turn index > 0: `rollout --history per-turn`)
    holds exactly one turn; a whole-trajectory row starts at turn 0

`find_bad_values` reports every offending row once per rule; readers either refuse the shard
(`check_values`, what `arlctl validate` and `read_shard` do by default) or drop the rows under the
counted filter rule `invalid_values`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from arlctl.schemas.trajectory import SchemaError

RULE = "invalid_values"  # the filter rule and the word every message starts with
MAX_POLICY_VERSION = 10**9  # one optimizer step per version: a billion is far past any real run
LOGPROB_TOLERANCE = 1e-3  # log-probs are <= 0; float32 log-softmax may round a sure token to +1e-7


@dataclass(frozen=True)
class BadValue:
    row: int
    column: str
    reason: str  # names the column and the offending value


@dataclass
class _Flat:
    """A list (or map) column flattened: `values` [V], and `starts` [N + 1] where row r owns
    values[starts[r]:starts[r + 1]] (a null row owns none)."""

    values: pa.Array
    starts: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.starts)  # [N]

    def rows_of(self, idx: np.ndarray) -> np.ndarray:
        """The row owning each value index; computed only for the few offending values."""
        return np.searchsorted(self.starts, idx, side="right") - 1


def _flat(column: pa.ChunkedArray | pa.Array) -> _Flat:
    if isinstance(column, pa.ChunkedArray):  # one chunk is the common case: no copy then
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    arr = column
    offsets = arr.offsets.to_numpy().astype(np.int64)  # [N + 1], already shifted by a slice's offset
    child = arr.items if isinstance(arr, pa.MapArray) else arr.values  # a map's items are its values
    values = child.slice(offsets[0], offsets[-1] - offsets[0])
    valid = arr.is_valid().to_numpy(zero_copy_only=False)  # [N]
    if not valid.all():  # a null list may still span child values: drop them
        keep = np.repeat(valid, np.diff(offsets))
        values = values.filter(pa.array(keep))
        return _Flat(values, np.concatenate([[0], np.cumsum(np.where(valid, np.diff(offsets), 0))]))
    return _Flat(values, offsets - offsets[0])


def _numbers(values: pa.Array) -> np.ndarray:
    """List items as numpy, zero-copy when there are no nulls; a null becomes NaN, which every rule rejects."""
    if values.null_count == 0:
        return values.to_numpy(zero_copy_only=False)
    return values.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)


def _first_per_row(bad: np.ndarray, flat: _Flat) -> Iterator[tuple[int, int]]:
    """(row, index of its first offending value) for every row with an offending value."""
    idx = np.flatnonzero(bad)
    rows, first = np.unique(flat.rows_of(idx), return_index=True)
    return zip(rows.tolist(), idx[first].tolist(), strict=True)


def _token_ids(table: pa.Table, vocab_size: int | None) -> Iterator[BadValue]:
    for name in ("prompt_ids", "response_ids"):
        flat = _flat(table.column(name))
        ids = _numbers(flat.values)  # [V]
        limit = vocab_size if vocab_size is not None else 2**31
        if ids.dtype == np.int32:  # one pass: a negative id viewed as uint32 is >= 2^31 > any limit
            bad = ids.view(np.uint32) >= limit
        else:
            bad = ~((ids >= 0) & (ids < limit))
        for row, i in _first_per_row(bad, flat):
            bound = f"vocabulary size {vocab_size}" if vocab_size is not None else "2^31"
            yield BadValue(row, name, f"{name} holds token id {ids[i]:.0f}, outside [0, {bound})")


def _response(table: pa.Table) -> Iterator[BadValue]:
    n_resp = _flat(table.column("response_ids")).lengths  # [N]
    for name in ("response_mask", "response_logprobs"):
        n = _flat(table.column(name)).lengths
        for row in np.flatnonzero(n != n_resp).tolist():
            yield BadValue(row, name, f"{name} has {n[row]} values but response_ids has {n_resp[row]}")
    flat = _flat(table.column("response_mask"))
    mask = _numbers(flat.values)  # [V]
    for row, i in _first_per_row(~((mask == 0) | (mask == 1)), flat):
        yield BadValue(row, "response_mask", f"response_mask holds {mask[i]:g}, not 0 or 1")
    flat = _flat(table.column("response_logprobs"))
    logprobs = _numbers(flat.values)  # [V]
    for row, i in _first_per_row(~np.isfinite(logprobs), flat):
        yield BadValue(row, "response_logprobs", f"response_logprobs holds {logprobs[i]}, not a finite log-prob")
    for row, i in _first_per_row(np.isfinite(logprobs) & (logprobs > LOGPROB_TOLERANCE), flat):
        yield BadValue(row, "response_logprobs", f"response_logprobs holds {logprobs[i]:g}: a log-prob is <= 0")


def _turns(table: pa.Table) -> Iterator[BadValue]:
    n_resp = _flat(table.column("response_ids")).lengths  # [N]
    flat = _flat(table.column("turns"))
    parents = np.repeat(np.arange(len(n_resp)), flat.lengths)  # [T]: turns are few, every one gets its row
    fields = dict(zip([f.name for f in flat.values.type], flat.values.flatten(), strict=True))
    start, gen, obs, version = (_numbers(fields[k].cast(pa.int64())) for k in
                                ("gen_start", "gen_len", "obs_len", "policy_version"))  # [T] each
    position = np.arange(len(parents)) - flat.starts[parents]  # [T] the turn's place in its row
    for row, i in _first_per_row(flat.values.is_null().to_numpy(zero_copy_only=False), flat):
        yield BadValue(row, "turns", f"turn {position[i]} is null")
    outside = (start < 0) | (gen < 0) | (obs < 0) | (start + gen + obs > n_resp[parents])
    for row, i in _first_per_row(outside, flat):
        yield BadValue(row, "turns", f"turn {position[i]} spans gen_start {start[i]:.0f}, gen_len {gen[i]:.0f}, "
                                     f"obs_len {obs[i]:.0f}: outside the row's {n_resp[row]} response tokens")
    for row, i in _first_per_row((version < 0) | (version > MAX_POLICY_VERSION), flat):
        yield BadValue(row, "turns", f"turn {position[i]} has policy_version {version[i]:.0f}, outside [0, 10^9]")
    if "advantage" in fields:  # schema v2: a per-turn advantage, where filter set one, must be finite
        advantage = fields["advantage"]
        present = advantage.is_valid().to_numpy(zero_copy_only=False)  # [T]
        for row, i in _first_per_row(present & ~np.isfinite(_numbers(advantage)), flat):
            yield BadValue(row, "turns", f"turn {position[i]} has advantage {advantage[i].as_py()}, not finite")


def _scalars(table: pa.Table) -> Iterator[BadValue]:
    for name in ("policy_version", "policy_version_last"):
        version = table.column(name).to_numpy()
        for row in np.flatnonzero((version < 0) | (version > MAX_POLICY_VERSION)).tolist():
            yield BadValue(row, name, f"{name} is {version[row]}, outside [0, 10^9]")
    for name in ("reward", "advantage", "weight"):
        col = table.column(name)
        present = col.is_valid().to_numpy(zero_copy_only=False)
        value = _numbers(col.combine_chunks())
        bad = present & ~np.isfinite(value)
        if name == "weight":
            bad |= present & (value < 0)
        for row in np.flatnonzero(bad).tolist():
            yield BadValue(row, name, f"{name} is {value[row]}: not a finite{' non-negative' * (name == 'weight')} number")
    flat = _flat(table.column("reward_components"))
    parts = _numbers(flat.values)
    for row, i in _first_per_row(~np.isfinite(parts), flat):
        yield BadValue(row, "reward_components", f"reward_components holds {parts[i]}, not a finite number")


def _per_turn(table: pa.Table) -> Iterator[BadValue]:
    """A per-turn row holds exactly one turn (arlctl/turn_rows.py): a "continued" row, or one whose first
    turn index is above 0, with any other number of turns is neither a per-turn nor a whole row."""
    flat = _flat(table.column("turns"))
    n_turns = flat.lengths  # [N]
    index = _numbers(flat.values.field("index").cast(pa.int64())) if len(flat.values) else np.zeros(0)  # [T]
    first = np.zeros(len(n_turns))
    has = n_turns > 0
    first[has] = index[flat.starts[:-1][has]]
    continued = np.asarray(table.column("finish_reason").to_pylist(), dtype=object) == "continued"  # [N]
    for row in np.flatnonzero((continued | (first > 0)) & (n_turns != 1)).tolist():
        why = "finish_reason 'continued'" if continued[row] else f"first turn index {first[row]:.0f}"
        yield BadValue(row, "turns", f"a per-turn row ({why}) holds {n_turns[row]} turns, not exactly 1")


def find_bad_values(table: pa.Table, vocab_size: int | None = None) -> list[BadValue]:
    """Every (row, rule) whose value is out of range or not finite, sorted by row. Needs a typed table."""
    if table.num_rows == 0:
        return []
    found = [*_token_ids(table, vocab_size), *_response(table), *_turns(table), *_per_turn(table),
             *_scalars(table)]
    return sorted(found, key=lambda b: b.row)


def bad_rows(problems: list[BadValue]) -> np.ndarray:
    """The distinct rows among `problems`, ascending."""
    return np.unique(np.array([p.row for p in problems], dtype=np.int64))


def describe(problems: list[BadValue], ids: list[str], limit: int = 3) -> str:
    """One line: `invalid_values: N rows; row 3 (trajectory_id X): <reason>; ...`."""
    rows = bad_rows(problems)
    first: dict[int, BadValue] = {}
    for p in problems:
        first.setdefault(p.row, p)
    # repr: an id is data from the shard; it must not carry terminal escapes into a message
    shown = "; ".join(f"row {r} (trajectory_id {ids[r]!r}): {first[r].reason}" for r in rows[:limit].tolist())
    more = f"; and {len(rows) - limit} more rows" if len(rows) > limit else ""
    return f"{RULE}: {len(rows)} bad row{'s' * (len(rows) != 1)}; {shown}{more}"


def check_values(table: pa.Table, vocab_size: int | None = None) -> None:
    """Raise SchemaError (column = the first offending one) when any row holds a bad value."""
    problems = find_bad_values(table, vocab_size)
    if problems:
        raise SchemaError(describe(problems, table.column("trajectory_id").to_pylist()), problems[0].column)
