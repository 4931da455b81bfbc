"""The hf backend on the tiny random Llama: batching correctness, log-prob exactness, sampling, concurrency, reload."""

from __future__ import annotations

import asyncio
import math
import threading

import pytest
import torch

from arlctl.errors import TerminalError, TransientError, UsageError
from arlctl.inference.base import Generation, SamplingParams
from arlctl.inference.hf import HFPolicy, sampling_distribution
from arlctl.models import make_tiny, tiny_model_dir

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


@pytest.fixture(scope="module")
def policy():
    pol = HFPolicy(tiny_model_dir(), name="tiny", max_batch=16)
    yield pol
    asyncio.run(pol.close())


@pytest.fixture(scope="module")
def reference_model():
    """The same weights loaded plainly, for re-scoring with one unpadded forward pass."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        tiny_model_dir(), local_files_only=True, dtype=torch.float32
    ).eval()


def prompts(policy, n: int) -> list[list[int]]:
    """n chat prompts of clearly different lengths."""
    out = []
    for i in range(n):
        text = " ".join(["count", "to"] + [str(j) for j in range(3 * i + 1)])
        ids = policy.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        out.append(list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids))
    assert len({len(p) for p in out}) == n
    return out


def run(coro):
    return asyncio.run(coro)


def test_sampling_distribution_hand_computed():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    # top_p 0.8: mass of strictly more likely tokens is [0, .5, .8, .95]; keep those < .8 -> tokens 0, 1,
    # renormalised: .5/.8 = .625, .3/.8 = .375
    got = sampling_distribution(logits, 1.0, 0.8).exp()
    assert torch.allclose(got, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=1e-6)
    # top_p 0.81 also keeps token 2: [.5, .3, .15] / .95
    got = sampling_distribution(logits, 1.0, 0.81).exp()
    assert torch.allclose(got, torch.tensor([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0]), atol=1e-6)
    # temperature 2: p^(1/2) renormalised; sqrt = [.70711, .54772, .38730, .22361], sum 1.86574
    got = sampling_distribution(logits, 2.0, 1.0).exp()
    assert torch.allclose(got, torch.tensor([0.37900, 0.29357, 0.20758, 0.11985]), atol=1e-4)
    # temperature 0 (greedy): the untempered distribution
    assert torch.allclose(sampling_distribution(logits, 0.0, 0.5).exp(), torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert sampling_distribution(logits, 1.0, 0.8).dtype == torch.float32


@pytest.mark.slow
def test_batched_greedy_matches_one_at_a_time(policy):
    batch = prompts(policy, 6)

    async def go():
        alone = [await policy.generate(p, GREEDY) for p in batch]
        together = await asyncio.gather(*(policy.generate(p, GREEDY) for p in batch))
        return alone, together

    alone, together = run(go())
    for a, t in zip(alone, together, strict=True):
        assert a.ids == t.ids
        assert len(a.ids) == len(a.logprobs) > 0
        assert a.logprobs == pytest.approx(t.logprobs, abs=1e-4)
    assert len({tuple(a.ids) for a in alone}) > 1  # different prompts, different answers


@pytest.mark.slow
def test_request_joins_a_running_batch(policy):
    long_prompt, short_prompt = prompts(policy, 2)
    long_params = SamplingParams(temperature=0.0, max_new_tokens=200, ignore_eos=True)
    short_params = SamplingParams(temperature=0.0, max_new_tokens=5)

    async def go():
        expected_short = await policy.generate(short_prompt, short_params)
        steps_before = policy.stats["decode_steps"]
        long_task = asyncio.create_task(policy.generate(long_prompt, long_params))
        while policy.stats["decode_steps"] < steps_before + 5:  # the long one is mid-generation
            await asyncio.sleep(0.001)
        short = await policy.generate(short_prompt, short_params)
        long_done_when_short_returned = long_task.done()
        return expected_short, short, long_done_when_short_returned, await long_task

    expected, short, long_was_done, long = run(go())
    assert short.ids == expected.ids  # joining mid-batch (cache spliced with padding) changes nothing
    assert not long_was_done  # it was handed back without waiting for the long one to drain
    assert long.finish_reason == "length" and len(long.ids) == 200


def rescored_logprobs(
    model, prompt: list[int], gen: Generation, temperature: float, top_p: float
) -> list[float]:
    """Independent re-scoring: one plain forward over prompt + ids, then the tempered top-p transform."""
    ids = torch.tensor([prompt + gen.ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()  # [n, V] predicts each sampled id
    out = []
    for row, token in zip(logits, gen.ids, strict=True):
        probs = torch.softmax(row / temperature, dim=-1)
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=0)
        keep_n = int((cumulative < top_p).sum()) + 1  # smallest prefix whose mass reaches top_p
        nucleus = order[:keep_n]
        assert token in nucleus.tolist()  # the sampled token was allowed
        out.append(math.log(float(probs[token]) / float(sorted_probs[:keep_n].sum())))
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_logprobs_match_rescoring(policy, reference_model, temperature, top_p):
    batch = prompts(policy, 4)
    params = [
        SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=16, seed=i) for i in range(4)
    ]

    async def go():
        return await asyncio.gather(*(policy.generate(p, s) for p, s in zip(batch, params, strict=True)))

    for prompt, gen in zip(batch, run(go()), strict=True):
        assert len(gen.ids) == len(gen.logprobs)
        assert gen.logprobs == pytest.approx(
            rescored_logprobs(reference_model, prompt, gen, temperature, top_p), abs=2e-4
        )


def test_greedy_logprob_is_untempered_log_softmax(policy, reference_model):
    prompt = prompts(policy, 1)[0]
    gen = run(policy.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=6)))
    assert gen.logprobs == pytest.approx(rescored_logprobs(reference_model, prompt, gen, 1.0, 1.0), abs=2e-4)


def test_stop_id_ends_generation_and_is_included(policy):
    prompt = prompts(policy, 3)[2]
    free = run(policy.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=12)))
    # the first position whose token did not already occur earlier
    k = next(i for i in range(2, len(free.ids)) if free.ids[i] not in free.ids[:i])
    stopped = run(
        policy.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=12, stop_ids=(free.ids[k],)))
    )
    assert stopped.ids == free.ids[: k + 1]
    assert stopped.finish_reason == "stop"
    assert len(stopped.logprobs) == k + 1


def test_max_new_tokens_gives_length(policy):
    gen = run(
        policy.generate(prompts(policy, 1)[0], SamplingParams(temperature=1.0, max_new_tokens=7, seed=3))
    )
    assert len(gen.ids) == 7 and gen.finish_reason == "length"
    zero = run(policy.generate(prompts(policy, 1)[0], SamplingParams(max_new_tokens=0)))
    assert zero.ids == [] and zero.finish_reason == "length"


def test_seeds_reproducible_across_batch_composition(policy):
    batch = prompts(policy, 5)
    seeded = SamplingParams(temperature=1.0, max_new_tokens=16, seed=1234)

    async def go():
        alone = await policy.generate(batch[0], seeded)
        others = [
            policy.generate(p, SamplingParams(temperature=1.0, max_new_tokens=24, seed=i))
            for i, p in enumerate(batch[1:])
        ]
        crowded, *_ = await asyncio.gather(policy.generate(batch[0], seeded), *others)
        other_seed = await policy.generate(
            batch[0], SamplingParams(temperature=1.0, max_new_tokens=16, seed=99)
        )
        return alone, crowded, other_seed

    alone, crowded, other_seed = run(go())
    assert alone.ids == crowded.ids
    assert alone.info["seed"] == 1234
    assert other_seed.ids != alone.ids


@pytest.mark.slow
def test_many_concurrent_trajectories_never_block_the_loop(policy):
    batch = prompts(policy, 16)
    params = SamplingParams(temperature=1.0, max_new_tokens=32)
    rows_before = policy.stats["max_rows"]
    policy.stats["max_rows"] = 0

    async def trajectory(i: int) -> int:
        ids = list(batch[i])
        for _turn in range(3):
            gen = await policy.generate(ids, params)
            ids += gen.ids
            if i % 2:  # half of them wait on a "tool" between turns
                await asyncio.sleep(0.05)
            ids += batch[0][-3:]  # a tool/next-turn segment
        return len(ids) - len(batch[i])

    # Instrument the real model (a forward hook, not a stand-in): which thread runs each forward, and
    # whether the event loop gets to run while one is in progress.
    forward_threads: set[int] = set()
    in_forward = threading.Event()

    def before(_module, _args):
        forward_threads.add(threading.get_ident())
        in_forward.set()

    def after(_module, _args, _output):
        in_forward.clear()

    async def go():
        ticks_during_forward = 0
        stop = asyncio.Event()

        async def ticker():
            nonlocal ticks_during_forward
            while not stop.is_set():
                await asyncio.sleep(0.001)
                ticks_during_forward += in_forward.is_set()

        tick = asyncio.create_task(ticker())
        # A generous bound against a hang; the assertions below are about behaviour, not time.
        lengths = await asyncio.wait_for(asyncio.gather(*(trajectory(i) for i in range(16))), timeout=600)
        stop.set()
        await tick
        return lengths, ticks_during_forward, threading.get_ident()

    hooks = [policy._model.register_forward_pre_hook(before), policy._model.register_forward_hook(after)]
    try:
        lengths, ticks_during_forward, loop_thread = run(go())
    finally:
        for hook in hooks:
            hook.remove()
    assert len(lengths) == 16 and all(n > 9 for n in lengths)
    assert policy.stats["max_rows"] > 1  # requests were really batched together
    policy.stats["max_rows"] = max(rows_before, policy.stats["max_rows"])
    # The model never ran on the event loop's thread, and the loop kept running while it computed: if
    # generate blocked the loop, no tick could land inside a forward.
    assert forward_threads and loop_thread not in forward_threads
    assert ticks_during_forward > 0


def test_cancelled_request_does_not_break_the_policy(policy):
    prompt = prompts(policy, 1)[0]

    async def go():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(
                policy.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=4000)), 0.2
            )
        return await policy.generate(prompt, GREEDY)

    assert len(run(go()).ids) > 0


def test_bad_prompts_are_usage_errors(policy):
    with pytest.raises(UsageError):
        run(policy.generate([], GREEDY))
    with pytest.raises(UsageError, match="prompt ids"):
        run(policy.generate([1, 49152], GREEDY))  # the vocabulary is 0..49151


def test_a_failing_forward_fails_its_rows_and_the_worker_goes_on(monkeypatch):
    # Fault injection: the first model call raises, as an out-of-memory error would.
    pol = HFPolicy(tiny_model_dir(), name="tiny")
    real_forward = pol._forward
    calls = {"n": 0}

    def flaky_forward(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("simulated allocation failure")
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(pol, "_forward", flaky_forward)
    prompt = prompts(pol, 1)[0]

    async def go():
        try:
            with pytest.raises(TransientError, match="simulated allocation failure"):
                await pol.generate(prompt, GREEDY)
            return await pol.generate(prompt, GREEDY)
        finally:
            await pol.close()

    assert len(run(go()).ids) > 0


def test_close_fails_waiting_requests():
    pol = HFPolicy(tiny_model_dir(), name="tiny")
    prompt = prompts(pol, 1)[0]

    async def go():
        task = asyncio.create_task(pol.generate(prompt, SamplingParams(max_new_tokens=4000, ignore_eos=True)))
        await asyncio.sleep(0.1)
        await pol.close()
        with pytest.raises(TerminalError, match="closed"):
            await task
        with pytest.raises(TerminalError, match="closed"):
            await pol.generate(prompt, GREEDY)

    run(go())


@pytest.mark.slow
def test_reload_changes_outputs_and_version(tmp_path):
    other = make_tiny(tmp_path / "v000007", seed=1)
    pol = HFPolicy(tiny_model_dir(), name="tiny")
    prompt = prompts(pol, 2)[1]

    async def go():
        before = await pol.generate(prompt, GREEDY)
        running = asyncio.create_task(
            pol.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=40))
        )
        await asyncio.sleep(0.05)
        await pol.reload(str(other), 7)
        finished_before_swap = running.done()
        after = await pol.generate(prompt, GREEDY)
        old_weights_run = await running
        await pol.close()
        return before, after, old_weights_run, finished_before_swap

    before, after, old_run, finished_before_swap = run(go())
    assert pol.version == 7
    assert before.version == 0 and after.version == 7
    assert after.ids != before.ids
    # the generation in flight when reload was called finished on the old weights before the swap
    assert finished_before_swap and old_run.version == 0
    assert old_run.ids[: len(before.ids)] == before.ids
