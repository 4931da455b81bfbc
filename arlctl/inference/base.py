"""The Policy protocol every inference backend implements (DESIGN.md §8)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop_ids: tuple[int, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False  # stop only on stop_ids or max_new_tokens (benchmarks, fixed-length probes)


@dataclass
class Generation:
    """What one generate call returns.

    ids: the sampled token ids, in order, including a sampled stop id if generation ended on one.
    logprobs: float32 log-prob of each sampled id under the distribution actually sampled from
        (after temperature and top_p), one per id.
    finish_reason: "stop" (a stop id or EOS was sampled) or "length" (max_new_tokens reached).
    version: the policy version that produced these tokens.
    """

    ids: list[int]
    logprobs: list[float]
    finish_reason: str
    version: int = 0
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Policy(Protocol):
    name: str  # model name or path, recorded in the `policy` column
    version: int  # current policy version; recorded per turn
    tokenizer: Any  # a transformers PreTrainedTokenizerBase with a chat template

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation: ...

    async def reload(self, policy_dir: str, version: int) -> None:
        """Load new weights; takes effect for generate calls that start after it returns."""
        ...

    async def close(self) -> None: ...
