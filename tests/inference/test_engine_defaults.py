"""The vLLM engine's dtype and CUDA-graph defaults (issue 29): fp32 and eager on CPU, where rollouts are
token-exact against the fp32 trainer; the checkpoint's dtype and CUDA graphs on a GPU; what a user passes wins."""

from __future__ import annotations

from arlctl.inference.vllm import engine_defaults


def test_cpu_keeps_fp32_and_eager():
    assert engine_defaults(on_cpu=True) == {"dtype": "float32", "enforce_eager": True}


def test_gpu_takes_the_checkpoints_dtype_and_cuda_graphs():
    assert engine_defaults(on_cpu=False) == {"dtype": "auto", "enforce_eager": False}


def test_what_the_user_passes_wins_on_either():
    assert engine_defaults(on_cpu=False, dtype="float16", enforce_eager=True) == {"dtype": "float16",
                                                                                 "enforce_eager": True}
    assert engine_defaults(on_cpu=True, dtype="bfloat16", enforce_eager=False) == {"dtype": "bfloat16",
                                                                                  "enforce_eager": False}
