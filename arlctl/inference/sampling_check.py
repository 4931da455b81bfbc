"""The one check every sampling parameter passes before it reaches a model (issue 12, class 4).

A NaN or infinite temperature turns every sampled log-prob into NaN, and one NaN log-prob in a training
batch poisons the whole checkpoint; a zero or negative top_p empties the nucleus (NaN again); a seed
that is not an integer crashes the backend's generator. So the values are checked at each edge that
receives them — `arlctl serve` (a 400), every backend's `generate` (a UsageError), `arlctl rollout`'s
options (exit 2) — all through `check_sampling` here, so the edges cannot disagree on what is valid.

The ranges:
- temperature: a finite number, 0 (greedy) or in [MIN_TEMPERATURE, MAX_TEMPERATURE]. Below 1e-5 vLLM
  silently switches to greedy while the hf backend divides logits by it (overflow to inf, then NaN);
  above 100 the distribution is uniform to float32 precision, so nothing useful is lost.
- top_p: a finite number in [MIN_TOP_P, 1]. A positive top_p that rounds to 0 in float32 would drop the
  most likely token too and leave an empty nucleus.
- max_new_tokens: an integer in [0, MAX_NEW_TOKENS] (0 asks for nothing and gets an empty "length"
  generation; the endpoints that take max_tokens from clients ask for at least 1 themselves).
- seed: None or an integer in [0, 2**63) (what torch, vLLM and SGLang all accept).
- stop_ids: non-negative integers, at most MAX_STOP_IDS of them.
- ignore_eos: a bool.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

from arlctl.errors import UsageError
from arlctl.inference.base import SamplingParams

MIN_TEMPERATURE = 1e-5
MAX_TEMPERATURE = 100.0
MIN_TOP_P = 1e-6
MAX_NEW_TOKENS = 1 << 20  # far beyond any context window: larger is a mistake or an attack
SEED_LIMIT = 1 << 63
MAX_STOP_IDS = 1024


def is_int(value: Any) -> bool:
    """An integer that is not a bool (JSON `true` must never pass as the token id 1)."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def finite_number(name: str, value: Any) -> float:
    """`value` as a float when it is a finite real number (not a bool, not a string); else UsageError."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise UsageError(f"{name} must be a number, got {type(value).__name__} {value!r:.40}")
    number = float(value)
    if not math.isfinite(number):
        raise UsageError(f"{name} must be finite, got {number}")
    return number


def check_int(name: str, value: Any, low: int, high: int) -> int:
    """`value` when it is an integer in [low, high]; else UsageError naming the field and the range."""
    if not is_int(value):
        raise UsageError(f"{name} must be an integer, got {type(value).__name__} {value!r:.40}")
    if not low <= value <= high:
        raise UsageError(f"{name} must be in [{low}, {high}], got {value}")
    return int(value)


def check_temperature(value: Any, name: str = "temperature") -> float:
    temperature = finite_number(name, value)
    if temperature != 0 and not MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE:
        raise UsageError(f"{name} must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}], "
                         f"got {temperature}")
    return temperature


def check_top_p(value: Any, name: str = "top_p") -> float:
    top_p = finite_number(name, value)
    if not MIN_TOP_P <= top_p <= 1.0:
        raise UsageError(f"{name} must be in (0, 1] (at least {MIN_TOP_P:g}), got {top_p}")
    return top_p


def check_seed(value: Any, name: str = "seed") -> int | None:
    return None if value is None else check_int(name, value, 0, SEED_LIMIT - 1)


def check_sampling(sampling: SamplingParams) -> SamplingParams:
    """Return `sampling` unchanged when every field is in range; else raise UsageError naming the field."""
    check_temperature(sampling.temperature)
    check_top_p(sampling.top_p)
    check_int("max_new_tokens", sampling.max_new_tokens, 0, MAX_NEW_TOKENS)
    check_seed(sampling.seed)
    stop_ids = sampling.stop_ids
    if not isinstance(stop_ids, (tuple, list)) or len(stop_ids) > MAX_STOP_IDS:
        raise UsageError(f"stop_ids must be a sequence of at most {MAX_STOP_IDS} token ids")
    for token in stop_ids:
        check_int("stop_ids[]", token, 0, SEED_LIMIT - 1)
    if not isinstance(sampling.ignore_eos, bool):
        raise UsageError(f"ignore_eos must be a bool, got {type(sampling.ignore_eos).__name__}")
    return sampling


def sampling_params(*, temperature: Any = 1.0, top_p: Any = 1.0, max_new_tokens: Any = 256,
                    seed: Any = None) -> SamplingParams:
    """Checked SamplingParams from raw values (a JSON body, CLI options): floats normalised, ints kept."""
    return check_sampling(SamplingParams(
        temperature=check_temperature(temperature), top_p=check_top_p(top_p),
        max_new_tokens=check_int("max_new_tokens", max_new_tokens, 0, MAX_NEW_TOKENS), seed=check_seed(seed)))
