"""Issue 12, class 4: non-finite or out-of-range sampling parameters never reach a model.

One check (arlctl.inference.sampling_check) at every edge: each backend's `generate` (UsageError before
any token is sampled: the real hf backend on the tiny model, the openai backend before any request), and
`arlctl rollout`'s options (a real process: exit 2, one line, nothing written). `arlctl serve`'s 400s
are in tests/serve/test_serve_hardening.py.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace

import pytest
from inprocess import arlctl

from arlctl.errors import UsageError
from arlctl.inference.base import SamplingParams
from arlctl.inference.sampling_check import MAX_NEW_TOKENS, check_sampling, sampling_params
from arlctl.models import tiny_model_dir

NAN, INF = float("nan"), float("inf")

# (field, hostile value, what the error names) — each one is a value a client or a typo can produce.
BAD = [
    ("temperature", NAN, "temperature must be finite"),
    ("temperature", INF, "temperature must be finite"),
    ("temperature", -INF, "temperature must be finite"),
    ("temperature", -1.0, "temperature must be 0"),
    ("temperature", 1e-30, "temperature must be 0"),  # logits / 1e-30 overflow float32: NaN log-probs
    ("temperature", 1e9, "temperature must be 0"),
    ("temperature", "0.7", "temperature must be a number"),
    ("temperature", True, "temperature must be a number"),
    ("temperature", None, "temperature must be a number"),
    ("top_p", 0.0, "top_p must be in (0, 1]"),
    ("top_p", -0.5, "top_p must be in (0, 1]"),
    ("top_p", 2.0, "top_p must be in (0, 1]"),
    ("top_p", 1e-50, "top_p must be in (0, 1]"),  # rounds to 0 in float32: an empty nucleus
    ("top_p", NAN, "top_p must be finite"),
    ("top_p", "1", "top_p must be a number"),
    ("max_new_tokens", -1, "max_new_tokens must be in [0,"),
    ("max_new_tokens", MAX_NEW_TOKENS + 1, "max_new_tokens must be in [0,"),
    ("max_new_tokens", 10**30, "max_new_tokens must be in [0,"),
    ("max_new_tokens", 4.0, "max_new_tokens must be an integer"),
    ("max_new_tokens", True, "max_new_tokens must be an integer"),
    ("seed", "abc", "seed must be an integer"),
    ("seed", 1.5, "seed must be an integer"),
    ("seed", -1, "seed must be in [0,"),
    ("seed", 2**64, "seed must be in [0,"),
    ("stop_ids", (-1,), "stop_ids[] must be in [0,"),
    ("stop_ids", ("a",), "stop_ids[] must be an integer"),
    ("stop_ids", tuple(range(2000)), "stop_ids must be a sequence"),
    ("ignore_eos", "yes", "ignore_eos must be a bool"),
]


@pytest.mark.parametrize(("field", "value", "message"), BAD, ids=[f"{f}={v!r:.20}" for f, v, _ in BAD])
def test_check_sampling_rejects_each_hostile_value(field, value, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        check_sampling(replace(SamplingParams(), **{field: value}))


def test_check_sampling_accepts_the_valid_edges():
    for params in (SamplingParams(), SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=0, seed=0),
                   SamplingParams(temperature=1e-5, top_p=1e-6, max_new_tokens=MAX_NEW_TOKENS, seed=2**63 - 1,
                                  stop_ids=(0, 2), ignore_eos=True),
                   SamplingParams(temperature=100, top_p=1)):
        assert check_sampling(params) is params
    built = sampling_params(temperature=1, top_p=0.9, max_new_tokens=8, seed=3)
    assert built == SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=8, seed=3)
    assert isinstance(built.temperature, float)


HOSTILE = [SamplingParams(temperature=NAN, max_new_tokens=4), SamplingParams(temperature=INF, max_new_tokens=4),
           SamplingParams(temperature=-1.0, max_new_tokens=4), SamplingParams(top_p=2.0, max_new_tokens=4),
           SamplingParams(top_p=0.0, max_new_tokens=4), SamplingParams(max_new_tokens=-3),
           SamplingParams(max_new_tokens=4, seed="7")]  # type: ignore[arg-type]


def test_hf_backend_rejects_hostile_sampling_before_generating():
    from arlctl.inference.hf import HFPolicy

    policy = HFPolicy(tiny_model_dir(), name="tiny", max_batch=2)

    async def go():
        prompt = policy.tokenizer("hello", add_special_tokens=False)["input_ids"]
        for params in HOSTILE:
            with pytest.raises(UsageError):
                await policy.generate(prompt, params)
        # Before the check, temperature NaN sampled a token with a NaN log-prob: now a valid request
        # afterwards still gets finite log-probs (the backend was not poisoned either).
        gen = await policy.generate(prompt, SamplingParams(temperature=1.0, max_new_tokens=4, seed=1))
        assert len(gen.ids) == 4 and all(math.isfinite(lp) for lp in gen.logprobs)
        await policy.close()

    asyncio.run(go())


def test_openai_backend_rejects_hostile_sampling_before_any_request():
    from arlctl.inference.openai import OpenAIPolicy

    # Port 9 (discard) on localhost: nothing listens, so reaching the network would be a TransientError.
    policy = OpenAIPolicy(["http://127.0.0.1:9/v1"], str(tiny_model_dir()), name="tiny", retries=0)

    async def go():
        for params in HOSTILE:
            with pytest.raises(UsageError):
                await policy.generate([1, 2, 3], params)
        assert policy.stats["requests"] == 0 and policy.stats["failovers"] == 0
        await policy.close()

    asyncio.run(go())


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--temperature", "nan", "--temperature must be finite"),
    ("--temperature", "-1", "--temperature must be 0"),
    ("--top-p", "2", "--top-p must be in (0, 1]"),
    ("--max-new-tokens", "0", "--max-new-tokens must be in [1,"),
])
def test_rollout_rejects_hostile_sampling_options_with_exit_2(tmp_path, option, value, message):
    out = tmp_path / "rollouts"
    result = arlctl("rollout", "--env", "math", "--tasks", "builtin:math?n=2&seed=0", "--policy", "tiny",
                    "--out", str(out), "-G", "1", "-q", option, value)
    assert result.returncode == 2, result.stderr
    assert message in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr
    assert not out.exists() or not list(out.glob("*.parquet"))
