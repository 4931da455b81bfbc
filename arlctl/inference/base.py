"""The Policy protocol every inference backend implements (DESIGN.md §8), and `as_policy` for others.

`Policy` declares every member its callers use. The backends (hf.py, vllm.py, openai.py) and the swe
oracle implement all of it; `as_policy` gives any other object with name, version, tokenizer and async
generate/reload/close (a test double, an out-of-tree backend) the defaults for the rest, by wrapping it.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

# The trajectory a generate call belongs to, set by the agent loop in each trajectory's task (contextvars
# are per task): a fleet backend routes every turn with one key to the engine holding its KV prefix,
# in O(1), however long the context (arlctl/inference/openai.py; other backends ignore it).
route_key: contextvars.ContextVar[str | None] = contextvars.ContextVar("arlctl_route_key", default=None)


MAX_BATCH = 32  # sequences per forward pass: the hf backend's default and every command's --max-batch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop_ids: tuple[int, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False  # stop only on stop_ids or max_new_tokens (benchmarks, fixed-length probes)


DEFAULT_SAMPLING = SamplingParams()  # the sampling defaults of rollout's and eval's options


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

    @property
    def vocab_size(self) -> int:
        """Sampled ids lie in [0, vocab_size): ids the tokenizer can decode."""
        ...

    @property
    def max_context(self) -> int | None:
        """Prompt plus response tokens the model attends over; None when the backend does not know."""
        ...

    def metrics(self) -> dict[str, Any]:
        """Backend counters for RUN/metrics (tokens/s, idle share, ...); {} when it keeps none."""
        ...

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation: ...

    async def reload(self, policy_dir: str, version: int) -> None:
        """Load new weights; takes effect for generate calls that start after it returns."""
        ...

    async def close(self) -> None: ...


class _AdaptedPolicy:
    """Another object seen as a full Policy: its own members where it has them, defaults elsewhere.

    `version` is read and written through (reload sets it on the wrapped object); the optional members
    are read on every access, as the wrapped object may change them.
    """

    def __init__(self, policy: Any):
        self.wrapped = policy

    @property
    def name(self) -> str:
        return self.wrapped.name

    @property
    def version(self) -> int:
        return self.wrapped.version

    @version.setter
    def version(self, value: int) -> None:
        self.wrapped.version = value

    @property
    def tokenizer(self) -> Any:
        return self.wrapped.tokenizer

    @property
    def vocab_size(self) -> int:
        # `or`: a backend that reports 0 or None does not know; the tokenizer's size is the safe bound
        return int(getattr(self.wrapped, "vocab_size", None) or len(self.wrapped.tokenizer))

    @property
    def max_context(self) -> int | None:
        return getattr(self.wrapped, "max_context", None)

    def metrics(self) -> dict[str, Any]:
        own = getattr(self.wrapped, "metrics", None)
        return own() if own is not None else {}

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        return await self.wrapped.generate(prompt_ids, sampling)

    async def reload(self, policy_dir: str, version: int) -> None:
        await self.wrapped.reload(policy_dir, version)

    async def close(self) -> None:
        await self.wrapped.close()


def as_policy(obj: Any) -> Policy:
    """`obj` as a full Policy: itself when it already is one (every backend), else wrapped with defaults.

    The defaults: vocab_size = len(tokenizer), max_context None (the caller's own limit applies),
    metrics() -> {}.
    """
    if isinstance(obj, Policy | _AdaptedPolicy):  # runtime_checkable: every member present
        return obj
    return _AdaptedPolicy(obj)
