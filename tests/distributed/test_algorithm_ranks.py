"""GAE with a critic and on-policy distillation under 2-rank FSDP2 (gloo): equal to one process, and resumed
exactly (issue 32).

GAE runs a no-gradient pass of the critic over each rank's rows and whitens the advantages with statistics
summed over both ranks; distillation scores each rank's rows with an FSDP2-sharded teacher. So 3 steps on 2
ranks must give one process's weights (to 1e-5), and 2 steps, a new trainer loaded from the checkpoint on
disk (value head, optimizer, RNG), then 1 step must give the 3 straight steps' weights bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arlctl.io.ledger import latest_checkpoint
from arlctl.io.shards import Lineage, read_shard, scan, write_shard
from arlctl.rl.config import TrainConfig
from arlctl.stages.train import train
from tests.distributed.common import make_uneven_batches, max_diff, small_init_model, torchrun, weights

pytestmark = pytest.mark.distributed

TOL = 1e-5
BASE = dict(lr=3e-4, eps_high=0.28, micro_tokens=160, save_every=1, max_steps=3)
SETTINGS = {"gae": dict(BASE, value_coef=0.5, value_clip=0.2, gae_lambda=0.95),
            "distill": dict(BASE, distill_coef=1.0, distill_task_coef=0.5, teacher_kl_coef=0.05)}


def relabel(batches: str, dest: Path, adv: str) -> str:
    """The same batch shards, their lineage saying they were filtered with --adv `adv`."""
    for url in scan(batches).shards:
        write_shard(read_shard(url), str(dest / Path(url).name), Lineage("filter", extra={"config": {"adv": adv}}))
    return str(dest)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("algo-ranks")
    model = small_init_model(root)
    batches = make_uneven_batches(root, model, n_batches=3)
    from arlctl.models import tiny_model_dir  # the teacher: another model of the same shape and tokenizer

    cases = {name: {"batches": relabel(batches, root / name, name),
                    "settings": {**s, **({"teacher": str(tiny_model_dir())} if name == "distill" else {})}}
             for name, s in SETTINGS.items()}
    for name, case in cases.items():
        summary = train(case["batches"], str(model), str(root / "single" / name),
                        TrainConfig(strategy="single", device="cpu", **case["settings"]))
        assert summary["steps"] == 3
    return root, model, cases


def test_gae_and_distillation_on_two_ranks_equal_one_process_and_resume_exactly(setup):
    root, model, cases = setup
    res = torchrun(["tests/distributed/algo_worker.py", str(root / "fsdp2"), str(model), json.dumps(cases)])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    reports = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert sorted((r["rank"], r["case"], r["straight"], r["first"], r["rest"], r["resumed_from"], r["world_size"])
                  for r in reports) == sorted((rank, c, 3, 2, 1, 2, 2) for rank in (0, 1) for c in cases)
    initial = weights(model)
    for name in cases:
        one = weights(latest_checkpoint(root / "single" / name)[1])
        two = weights(latest_checkpoint(root / "fsdp2" / f"{name}-straight")[1])
        split = weights(latest_checkpoint(root / "fsdp2" / f"{name}-split")[1])
        moved = max_diff(one, {k: initial[k] for k in one})
        assert moved > 50 * TOL, f"{name}: the weights must move far more than the tolerance ({moved})"
        print(f"{name}: max |2 ranks - 1 process| = {max_diff(one, two):.2e}, moved {moved:.2e}, "
              f"resumed vs straight {max_diff(two, split):.1e}")
        assert max_diff(one, two) < TOL, f"{name}: {max_diff(one, two)}"
        assert max_diff(two, split) == 0.0, f"{name}: the resumed run differs by {max_diff(two, split)}"
