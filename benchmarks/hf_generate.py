"""Throughput of the hf backend: one request at a time vs N concurrent requests, continuously batched.

Prints generated tokens/s for batch 1 and for `--batch` concurrent requests of `--new-tokens` tokens each
on the embedded SmolLM2-135M (or `--policy`), measured in the same run, and their ratio.

  python benchmarks/hf_generate.py
  python benchmarks/hf_generate.py --batch 16 --new-tokens 128 --threads 2 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import torch

from arlctl.inference.base import SamplingParams
from arlctl.inference.loader import load_policy

QUESTIONS = [
    "What is 2+3?",
    "Write a short poem about the sea.",
    "Explain what a prime number is.",
    "List three colours and one fruit of each colour.",
    "How many legs does a spider have, and why?",
    "Describe the water cycle in a few sentences.",
    "What is 17 times 23? Show your steps.",
    "Give me a recipe for pancakes.",
]


def prompt_ids(tokenizer, i: int) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
        add_generation_prompt=True,
        tokenize=False,
    )
    return tokenizer(text, add_special_tokens=False).input_ids


async def timed(policy, prompts: list[list[int]], new_tokens: int) -> tuple[float, int]:
    """Run all prompts concurrently; return wall seconds and tokens generated."""
    params = [
        SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=i, ignore_eos=True)
        for i in range(len(prompts))
    ]
    started = time.perf_counter()
    results = await asyncio.gather(*(policy.generate(p, s) for p, s in zip(prompts, params, strict=True)))
    return time.perf_counter() - started, sum(len(r.ids) for r in results)


async def main(args: argparse.Namespace) -> dict:
    policy = load_policy(args.policy, max_batch=args.batch, num_threads=args.threads)
    try:
        prompts = [prompt_ids(policy.tokenizer, i) for i in range(args.batch)]
        await timed(policy, prompts[:2], 8)  # warm-up: first-call allocations
        single_s, single_tokens = 0.0, 0
        for prompt in prompts[: args.single_runs]:
            seconds, tokens = await timed(policy, [prompt], args.new_tokens)
            single_s += seconds
            single_tokens += tokens
        batch_s, batch_tokens = await timed(policy, prompts, args.new_tokens)
    finally:
        await policy.close()
    single_tps = single_tokens / single_s
    batch_tps = batch_tokens / batch_s
    return {
        "policy": args.policy,
        "threads": torch.get_num_threads(),
        "new_tokens": args.new_tokens,
        "batch1_tokens_per_s": round(single_tps, 1),
        f"batch{args.batch}_tokens_per_s": round(batch_tps, 1),
        "ratio": round(batch_tps / single_tps, 2),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--policy", default="default", help="policy spec (default: the embedded SmolLM2-135M)"
    )
    parser.add_argument("--batch", type=int, default=16, help="concurrent requests in the batched run")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens generated per request")
    parser.add_argument("--single-runs", type=int, default=2, help="requests timed one at a time")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    result = asyncio.run(main(parser.parse_args()))
    if result and parser.parse_args().json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>24}  {value}")
