"""train --compile (issue 29): each decoder layer compiled by torch.compile (inductor, on this CPU) trains to
the eager run's weights, packed, with the KL reference."""

from __future__ import annotations

import pytest

from arlctl.io.ledger import latest_checkpoint
from arlctl.rl.config import TrainConfig
from arlctl.stages.train import train
from tests.distributed.common import make_uneven_batches, max_diff, small_init_model, weights

pytestmark = pytest.mark.slow


def test_compiled_layers_train_to_the_eager_weights(tmp_path):
    model = small_init_model(tmp_path)
    batches = make_uneven_batches(tmp_path, model, n_batches=2)
    settings = dict(device="cpu", lr=3e-4, kl_coef=0.05, micro_tokens=160)
    from torch._dynamo.utils import counters

    counters.clear()
    eager = train(batches, str(model), str(tmp_path / "eager"), TrainConfig(**settings))
    assert not counters["stats"]["unique_graphs"]  # nothing compiled without --compile
    compiled = train(batches, str(model), str(tmp_path / "compiled"), TrainConfig(compile=True, **settings))
    assert counters["stats"]["unique_graphs"] >= 1, dict(counters["stats"])  # dynamo traced the layers
    assert eager["steps"] == compiled["steps"] == 2 and compiled["packing"] == "packed"
    gap = max_diff(weights(latest_checkpoint(tmp_path / "eager")[1]),
                   weights(latest_checkpoint(tmp_path / "compiled")[1]))
    print(f"2 steps compiled vs eager: max |w| gap {gap:.2e}")
    assert gap < 1e-5
