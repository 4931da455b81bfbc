"""`arlctl plan --model` against two real FSDP2 ranks (gloo): each rank's held bytes at the optimizer step
(parameters' local shards, gradients, AdamW moments, the sharded KL reference) within 15% of the plan's
per-rank state, for fp32 with the reference and for bf16 with its fp32 master."""

from __future__ import annotations

import json

import pytest

from arlctl.models import tiny_model_dir
from arlctl.rl.memory_plan import count_shape, plan_modes
from tests.distributed.common import torchrun
from tests.stages.test_train import make_batches

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("mode,settings", [("fsdp2-fp32", {"kl_coef": 0.05}), ("fsdp2-bf16", {"precision": "bf16"})])
def test_each_rank_holds_what_the_plan_says(mode, settings, tmp_path):
    batches = make_batches(tmp_path, 2, groups_per_batch=2)
    res = torchrun(["tests/distributed/memory_worker.py", batches, str(tiny_model_dir()), str(tmp_path / "ckpt"),
                    json.dumps({"strategy": "fsdp2", "lr": 1e-3, **settings})])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    reports = [json.loads(line) for line in res.stdout.splitlines() if line.startswith('{"rank"')]
    assert sorted(r["rank"] for r in reports) == [0, 1] and {r["strategy"] for r in reports} == {"fsdp2"}
    planned = {m.mode: m for m in plan_modes(count_shape(str(tiny_model_dir())), 2, kl="kl_coef" in settings)}[mode]
    for report in reports:
        [held] = report["held"]
        total = sum(held.values())
        print(f"\n{mode} rank {report['rank']}: held {total:,} B, planned {planned.state:,.0f} B "
              f"({total / planned.state:.3f}), {held}")
        assert abs(total - planned.state) <= 0.15 * planned.state, (held, planned.to_json())
        if "kl_coef" in settings:
            assert held["reference"] == pytest.approx(planned.reference, rel=0.15)
