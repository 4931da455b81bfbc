"""The one trajectory builder (schemas/builder.py): its invariants hold for any sequence of moves.

Hypothesis drives random sequences of generations, observations and truncations (what rollout and the
serve recorder do), and after each sequence the row must satisfy every invariant the schema relies on,
and `rows_to_table` must accept it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arlctl.schemas.builder import TrajectoryBuilder
from arlctl.schemas.rows import TrajectoryRow, rows_to_table


def new_row() -> TrajectoryRow:
    return TrajectoryRow(group_id="g", sample_index=0, task_id="t", env="e", env_version="", task={},
                         policy="p", prompt_text="p", prompt_ids=[1, 2, 3])


generation = st.tuples(
    st.just("gen"),
    st.lists(st.integers(0, 1000), max_size=6),  # ids
    st.integers(0, 5),  # policy version
    st.lists(st.sampled_from(["a", "b"]), max_size=3),  # tool-call names
    st.floats(0, 2, allow_nan=False),  # latency
)
observation = st.tuples(st.just("obs"), st.lists(st.integers(0, 1000), max_size=6), st.text(max_size=5))
undo = st.tuples(st.just("undo"), st.integers(0, 100))


def check_invariants(row: TrajectoryRow, calls: int, latencies: float) -> None:
    n = len(row.response_ids)
    assert len(row.response_mask) == len(row.response_logprobs) == n
    position = 0
    for index, turn in enumerate(row.turns):
        assert turn.index == index and turn.gen_start == position
        assert row.response_mask[position: position + turn.gen_len] == [1] * turn.gen_len
        end = position + turn.gen_len + turn.obs_len
        assert row.response_mask[position + turn.gen_len: end] == [0] * turn.obs_len
        position = end
    assert position == n  # turns tile the response
    assert all(lp == 0.0 for m, lp in zip(row.response_mask, row.response_logprobs) if m == 0)
    assert row.num_tool_calls == calls == sum(len(t.tool_calls) for t in row.turns)
    assert row.gen_time_s == pytest.approx(latencies)
    if row.turns:
        assert (row.policy_version, row.policy_version_last) == (row.turns[0].policy_version,
                                                                 row.turns[-1].policy_version)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(generation, observation, undo), max_size=12))
def test_any_sequence_of_moves_keeps_the_row_consistent(moves):
    builder = TrajectoryBuilder(new_row())
    row = builder.row
    calls, latencies = 0, 0.0
    for move in moves:
        if move[0] == "gen":
            _, ids, version, names, latency = move
            logprobs = [-0.5 - (i % 3) for i in range(len(ids))]
            turn = builder.add_generation(ids, logprobs, version, "text", [{"name": n} for n in names], latency)
            assert turn is row.turns[-1]
            calls, latencies = calls + len(names), latencies + latency
        elif move[0] == "obs" and row.turns:
            builder.add_observation(move[1], move[2])
        elif move[0] == "undo" and row.turns:
            # back to the end of the last turn's sampled span plus part of its observation, as serve does
            last = row.turns[-1]
            keep = min(move[1], last.obs_len)
            builder.truncate(last.gen_start + last.gen_len + keep, (keep, last.observation))
        check_invariants(row, calls, latencies)
    builder.finish("ok", "stop")
    rows_to_table([row])  # the schema's own checks accept whatever the builder made


def test_observation_without_a_generation_and_mismatched_logprobs_are_refused():
    builder = TrajectoryBuilder(new_row())
    with pytest.raises(ValueError, match="needs a generation"):
        builder.add_observation([1], "x")
    with pytest.raises(ValueError, match="2 log-probs for 3"):
        builder.add_generation([1, 2, 3], [0.0, 0.0], 0, "t")
    assert builder.row.response_ids == [] and builder.row.turns == []


def test_observations_accumulate_into_the_open_turn():
    builder = TrajectoryBuilder(new_row())
    builder.add_generation([5, 6], [-1.0, -2.0], 3, "hi", [{"name": "calc"}], 0.25)
    builder.add_observation([7], "a")
    builder.add_observation([8, 9], "b")
    turn = builder.row.turns[0]
    # 2 sampled + 1 + 2 observation ids: obs_len 3, texts joined in order
    assert (turn.gen_len, turn.obs_len, turn.observation) == (2, 3, "ab")
    assert builder.row.response_mask == [1, 1, 0, 0, 0]
    assert builder.row.response_logprobs == [-1.0, -2.0, 0.0, 0.0, 0.0]
