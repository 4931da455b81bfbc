"""The consolidated HF export of an FSDP2 run streams tensor by tensor (issue 29): rank 0 writes each
gathered tensor into model.safetensors and drops it, holding at most one whole tensor, never the state
dict. On two gloo ranks the file equals, tensor for tensor, the full state dict it replaced, in fp32 and
with --publish-dtype bf16, LoRA's merged weights (W + scale B A, summed a weight at a time) and its adapter
file, and with --offload (shards on the CPU); the distributed equivalence tests read these files too."""

from __future__ import annotations

import json

import pytest

from arlctl.models import tiny_model_dir
from tests.distributed.common import torchrun
from tests.stages.test_train import make_batches

pytestmark = pytest.mark.distributed


LORA = {"lora_rank": 4, "lora_alpha": 8.0, "lora_targets": "q_proj,v_proj"}


@pytest.mark.parametrize(("publish", "mode"), [("fp32", {}), ("bf16", {}), ("fp32", LORA),
                                               ("bf16", {**LORA, "publish_format": "adapter"}),
                                               ("fp32", {"offload": True})],
                         ids=["fp32", "bf16", "lora-merged", "lora-adapter", "offload"])
def test_the_streamed_export_equals_the_gathered_state_dict(publish, mode, tmp_path):
    batches = make_batches(tmp_path, 1, groups_per_batch=2)
    res = torchrun(["tests/distributed/export_worker.py", batches, str(tiny_model_dir()), str(tmp_path / "ckpt"),
                    json.dumps({"strategy": "fsdp2", "lr": 1e-3, "publish_dtype": publish, **mode})])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    [report] = [json.loads(x) for x in res.stdout.splitlines() if x.startswith('{"streamed"')]
    print(f"\n{publish}: wrote {report['bytes_written']:,} B in {report['tensors']} tensors, holding at most "
          f"{report['largest_held']:,} B at once")
    assert report["streamed"] and report["keys_equal"] and report["different"] == [], report
    assert report["dtypes"] == (["torch.bfloat16"] if publish == "bf16" else ["torch.float32"])
    assert report["bytes_written"] == report["total"]
    assert report["largest_held"] == report["largest_tensor"] < report["total"]  # one tensor at a time
