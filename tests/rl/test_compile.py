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
    eager = train(batches, str(model), str(tmp_path / "eager"), TrainConfig(**settings))
    compiled = train(batches, str(model), str(tmp_path / "compiled"), TrainConfig(compile=True, **settings))
    assert eager["steps"] == compiled["steps"] == 2 and compiled["packing"] == "packed"
    gap = max_diff(weights(latest_checkpoint(tmp_path / "eager")[1]),
                   weights(latest_checkpoint(tmp_path / "compiled")[1]))
    print(f"2 steps compiled vs eager: max |w| gap {gap:.2e}")
    assert gap < 1e-5
