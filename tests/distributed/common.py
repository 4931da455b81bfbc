"""Batch shards, launching torchrun, and comparing weights, for the tests of training on many ranks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import torch
from safetensors.torch import load_file

from arlctl.io.shards import Lineage, read_shard, scan, write_shard
from arlctl.rl.distributed import split_rows
from arlctl.stages.configs import FilterConfig
from arlctl.stages.filter import run_filter
from arlctl.synthetic import synthetic_table

REPO = Path(__file__).resolve().parents[2]


def set_column(table: pa.Table, name: str, values: list) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, table.schema.field(name), pa.array(values, table.schema.field(name).type))


def near_policy(table: pa.Table, model_dir: Path, noise: float = 0.1, seed: int = 0) -> pa.Table:
    """Behaviour log-probs = the model's own scores of the rows + noise: ratios near 1, so the PPO / TIS terms
    carry real gradient (random synthetic log-probs clip nearly every token and leave gradients at AdamW's eps)."""
    from arlctl.rl.batching import collate, score_tokens
    from arlctl.rl.trainer_state import load_model

    model = load_model(model_dir)
    mb = collate(table, list(range(table.num_rows)))
    with torch.no_grad():
        logp, _ = score_tokens(model, mb)  # [B, L-1]: position t scores token t + 1
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for b, (p, r) in enumerate(zip(table.column("prompt_tokens").to_pylist(),
                                   table.column("response_tokens").to_pylist(), strict=True)):
        scores = logp[b, p - 1 : p - 1 + r]
        rows.append((scores + noise * torch.randn(scores.shape, generator=gen)).clamp(max=0.0).tolist())
    return set_column(table, "response_logprobs", rows)


def make_uneven_batches(root: Path, model_dir: Path, n_batches: int = 4, groups: int = 3, seed: int = 3) -> str:
    """Batch shards whose rows differ in length and whose 2-rank split gives the ranks unequal row counts,
    with per-row weights != 1 and behaviour log-probs near the policy's (so clipping, TIS and KL all act)."""
    table = synthetic_table(n_batches * groups, group_size=3, seed=seed, mean_turns=3, tokens_per_turn=16)
    table = near_policy(table, model_dir)
    n = table.num_rows
    table = set_column(table, "reward", [float((i * 7) % 3 == 0) for i in range(n)])
    table = set_column(table, "status", ["ok"] * n)
    write_shard(table, str(root / "rewarded" / "r.parquet"), Lineage("reward"))
    run_filter(str(root / "rewarded"), str(root / "filtered"), FilterConfig(batch_groups=groups), 0)
    out = root / "batches"
    uneven = 0
    for k, url in enumerate(scan(str(root / "filtered")).shards):
        batch = read_shard(url)
        rows = batch.num_rows
        batch = set_column(batch, "weight", [0.5 + 0.25 * ((i + k) % 4) for i in range(rows)])
        lengths = [p + r for p, r in zip(batch.column("prompt_tokens").to_pylist(),
                                         batch.column("response_tokens").to_pylist(), strict=True)]
        parts = split_rows(lengths, 2)
        uneven += len(parts[0]) != len(parts[1])
        write_shard(batch, str(out / Path(url).name), Lineage("filter"))
    assert uneven, "the fixture must give the two ranks unequal row counts in some batch"
    return str(out)


def torchrun(args: list[str], nproc: int = 2, timeout: float = 600, env: dict | None = None,
             wait: bool = True) -> subprocess.CompletedProcess | subprocess.Popen:
    """`python -m torch.distributed.run --standalone --nproc-per-node N args...` on CPU (gloo)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "",
                **(env or {})}
    if not wait:
        return subprocess.Popen(cmd, env=full_env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
    return subprocess.run(cmd, env=full_env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return load_file(str(ckpt / "model.safetensors"))


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def small_init_model(root: Path) -> Path:
    """The tiny test model's shape and tokenizer with HF's default init scale (0.02, where the cached tiny
    model uses 0.2 for livelier samples). Where gradients sit near AdamW's eps (a peaked softmax over the
    tied 49k-row head, behaviour log-probs far off the policy), float summation order alone moves weights by
    ~1e-4 in 3 steps: two single-process runs with different micro-batch plans differ that much. With this
    init and near-policy rows (`near_policy`) gradients are far from that floor, so a 1e-5 comparison
    measures the distributed reduction, not rounding."""
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    from arlctl.models import tiny_model_dir

    dest = root / "small-init"
    if (dest / "model.safetensors").is_file():
        return dest
    config = AutoConfig.from_pretrained(tiny_model_dir())
    config.initializer_range = 0.02
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(dest)
    AutoTokenizer.from_pretrained(tiny_model_dir()).save_pretrained(dest)
    return dest
