"""The resume's NaN/inf check of a checkpoint's weights (sharded_load.nonfinite_share): each rank reads
its share of every tensor's rows by byte range, in chunks, so together the ranks check every value once
and none reads a whole tensor."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from arlctl.rl.sharded_load import nonfinite_share


@pytest.fixture
def weights(tmp_path):
    def write(**tensors: torch.Tensor):
        save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
        return tmp_path

    return write


def test_the_rank_whose_rows_hold_the_nan_finds_it_and_the_others_do_not(weights):
    w = torch.zeros(10, 6)
    w[9, 3] = float("nan")
    w[8, 0] = float("inf")
    directory = weights(**{"a.weight": torch.zeros(4, 4), "b.weight": w, "c.ids": torch.arange(5)})
    assert nonfinite_share(directory, 0, 2, chunk_bytes=24) is None  # rows 0..4: clean
    assert nonfinite_share(directory, 1, 2, chunk_bytes=24) == ("b.weight", "1 NaN and 1 inf in its rows 5..9")
    assert nonfinite_share(directory, 0, 1, chunk_bytes=24) == ("b.weight", "1 NaN and 1 inf in its rows 0..9")


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_value_is_some_ranks_and_bf16_and_scalars_are_read(weights, world):
    rows = 7
    for row in range(rows):
        bad = torch.ones(rows, 3, dtype=torch.bfloat16)
        bad[row, 2] = float("-inf")
        directory = weights(**{"scale": torch.tensor(1.0), "w": bad})
        found = [nonfinite_share(directory, rank, world, chunk_bytes=6) for rank in range(world)]
        assert sum(f is not None for f in found) == 1, (row, found)  # exactly one rank's rows hold it
    directory = weights(scale=torch.tensor(float("nan")), w=torch.ones(2, 2))
    found = [nonfinite_share(directory, rank, world) for rank in range(world)]
    assert [f for f in found if f] == [("scale", "1 NaN and 0 inf in its rows 0..0")]
