"""Sharded loading (issue 29): under FSDP2 each rank builds the model on the meta device and reads only its
shard of each tensor from the safetensors files, the KL reference too. Shown on two gloo ranks: the bytes
each rank read are its share of the file and every shard equals that slice of the file's tensor (the
tiny model); on a 1.1 GB random Llama, each rank's peak RSS grows by its share of the weights plus a
stated overhead while the trainer and its reference load, where loading each whole cost 2.2 GB."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from arlctl.models import tiny_model_dir
from tests.distributed.common import torchrun

pytestmark = pytest.mark.distributed

# What a rank may allocate while loading besides its shards: one tensor's shard again (FSDP2 copies each
# parameter's local shard into its padded storage as it lazily initialises) and 128 MiB (python objects,
# gloo, FSDP2's state). Measured here: 1,262 MiB for 1,052 MiB of shards.
FIXED_OVERHEAD = 128 << 20


def run_workers(policy: Path, out: Path, settings: dict, *extra: str, nproc: int = 2) -> list[dict]:
    res = torchrun(["tests/distributed/load_worker.py", str(policy), str(out), json.dumps(settings), *extra],
                   nproc=nproc)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    reports = sorted((json.loads(x) for x in res.stdout.splitlines() if x.startswith('{"rank"')), key=lambda r: r["rank"])
    assert [r["rank"] for r in reports] == list(range(nproc)) and {r["strategy"] for r in reports} == {"fsdp2"}
    return reports


def file_bytes(model_dir: Path) -> tuple[int, int]:
    """(all weight bytes in fp32, the largest tensor's), from the file's header alone."""
    from safetensors import safe_open

    total = largest = 0
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as fh:
        for name in fh.keys():  # noqa: SIM118
            n = fh.get_slice(name).get_shape()
            size = 4 * int(torch.tensor(n).prod()) if n else 4
            total, largest = total + size, max(largest, size)
    return total, largest


def test_each_rank_reads_its_share_and_holds_the_files_values(tmp_path):
    policy = tiny_model_dir()
    total, largest = file_bytes(policy)
    reports = run_workers(policy, tmp_path / "ckpt", {"strategy": "fsdp2", "kl_coef": 0.05}, "--check")
    for r in reports:
        assert r["wrong"] == [] and r["reference"], r
        # The model and its reference, each read once across the ranks: half each here.
        assert r["bytes_read"] == total, r  # 2 models x total / 2 ranks
        assert r["largest_read"] <= largest // 2, r  # no rank ever read a whole tensor
    print(f"\ntiny model, 2 ranks: each read {reports[0]['bytes_read']:,} B of 2 x {total:,} B")


def test_a_lora_base_is_read_by_shard_and_its_adapters_are_one_processs(tmp_path):
    """LoRA under FSDP2: the frozen base is read by shard like any model, and the adapters, drawn on every
    rank from their own seeded generator before sharding, are the ones a single process draws."""
    policy = tiny_model_dir()
    total, largest = file_bytes(policy)
    reports = run_workers(policy, tmp_path / "ckpt", {"strategy": "fsdp2", "lora_rank": 4, "lora_alpha": 8.0,
                                                      "kl_coef": 0.05}, "--check")
    for r in reports:
        assert r["lora"] and r["wrong"] == [] and r["adapters"] == 2 * 4 * 2, r  # A and B, 4 targets, 2 layers
        assert r["bytes_read"] == total // 2, r  # the base once (the reference is the base, adapters off)
        assert r["largest_read"] <= largest // 2, r


@pytest.fixture(scope="module")
def big_model(tmp_path_factory) -> Path:
    """A random Llama of 1.1 GB in fp32 (275M parameters: hidden 1024, 12 layers, an untied 64k vocabulary),
    written tensor by tensor from its config built on the meta device, with the tiny model's tokenizer."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from arlctl.rl.sharded_load import meta_parameters

    root = tmp_path_factory.mktemp("big") / "model"
    config = AutoConfig.from_pretrained(tiny_model_dir())
    config.update({"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 12, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 65536, "tie_word_embeddings": False})
    with meta_parameters():
        model = AutoModelForCausalLM.from_config(config)
    generator = torch.Generator().manual_seed(0)
    weights = {name: (torch.randn(p.shape, generator=generator) * 0.02 if p.dim() > 1 else torch.ones(p.shape))
               for name, p in model.named_parameters()}
    root.mkdir(parents=True)
    save_file(weights, str(root / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(root)
    AutoTokenizer.from_pretrained(tiny_model_dir()).save_pretrained(root)
    return root


def gathered_bytes(model_dir: Path) -> int:
    """fp32 bytes FSDP2 holds whole inside a step besides the shards: the root group (embeddings, final norm,
    head), gathered for the forward and kept to the end of the backward, and one decoder layer's."""
    from safetensors import safe_open

    root = layer = 0
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as fh:
        for name in fh.keys():  # noqa: SIM118
            size = 4 * int(torch.tensor(fh.get_slice(name).get_shape()).prod())
            if ".layers." not in name:
                root += size
            elif ".layers.0." in name:
                layer += size
    return root + layer


@pytest.mark.parametrize("nproc", [2, 4])
def test_a_ranks_memory_loading_and_training_is_its_share_of_the_state(big_model, tmp_path, nproc):
    total, largest = file_bytes(big_model)
    assert total > 1 << 30
    reports = run_workers(big_model, tmp_path / "ckpt", {"strategy": "fsdp2", "kl_coef": 0.05}, "--step",
                          nproc=nproc)
    gathered = gathered_bytes(big_model)
    for r in reports:
        start = max(r["rss_before"], r["peak_before"])  # the most held before loading
        grown, trained = r["peak"] - start, r["step_peak"] - start
        share = 2 * total // nproc  # the model's shard and the reference's
        # Training: weights, gradients and both AdamW moments (4 x 4 bytes a parameter) and the reference
        # (4), all over N; besides them only what FSDP2 holds whole inside a step (a group's gathered
        # parameters, and its unsharded gradients until they are reduce-scattered), and FIXED_OVERHEAD x 2.
        state = (16 + 4) * (total // 4) // nproc
        print(f"\n{nproc} ranks, rank {r['rank']}: peak RSS grew {grown / 2**20:,.0f} MiB loading the model and "
              f"its reference ({share / 2**20:,.0f} MiB of shards, {2 * total / 2**20:,.0f} MiB whole), "
              f"{trained / 2**20:,.0f} MiB by the end of a packed step ({state / 2**20:,.0f} MiB of state over N, "
              f"{gathered / 2**20:,.0f} MiB gathered)")
        assert r["bytes_read"] == share, r
        assert grown <= share + largest // nproc + FIXED_OVERHEAD, (grown, share)  # + one tensor's shard
        assert grown < 2 * total * 0.75  # far from the whole model and reference: what loading cost before
        assert r["packed"] == 1 and r["skipped"] == 0, r
        assert trained <= state + 2 * gathered + 2 * FIXED_OVERHEAD, (trained, state, gathered)
        assert trained < (16 + 4) * (total // 4) * 0.6  # far from every rank holding the whole state
