"""The `hf` inference backend: transformers + torch on CPU, with continuous batching (DESIGN.md §8).

Many trajectory coroutines call `await policy.generate(...)` at once. Each call only appends a request to
a queue and awaits a future, so the event loop never blocks on the model. One background thread owns the
model and runs an iteration-level scheduler:

    loop:
      1. drop requests whose coroutine was cancelled
      2. admit waiting requests while there is room (`max_batch` rows, `max_batch_tokens` of prompt +
         max_new_tokens), prefill them together (left-padded) and sample their first token
      3. splice their KV cache into the running batch's (both left-padded to a common length)
      4. one decode step for every row in the batch, then per-row sampling
      5. hand each finished row back to its coroutine at once (loop.call_soon_threadsafe) and remove it
         from the batch and its cache; trim cache columns that are padding for every remaining row

So a new request joins at the next iteration rather than waiting for the batch to drain, and a short
answer is returned while long ones keep generating. Padding is correct because we build the 4D attention
mask ourselves (causal, key padding masked) and give every row its own position ids; pad query positions
attend only to themselves so no row of the softmax is fully masked (no NaNs leak into the cache).

Sampling is per request: temperature, top_p, max_new_tokens, stop ids (+ the model's EOS ids) and a
`torch.Generator` per request seeded from `seed`, so a seeded request draws the same tokens whatever else
is in the batch (up to float noise in the logits). The returned log-prob of each token is float32 under
the distribution it was sampled from: log_softmax(logits / T) restricted to the top-p nucleus and
renormalised. With temperature == 0 the token is the argmax and its log-prob is taken from the untempered
distribution log_softmax(logits) (a greedy "distribution" would be a one-hot with log-prob 0, which tells
a trainer nothing).

`reload()` loads new weights in a worker thread, then the scheduler stops admitting, lets the running
batch finish, swaps the weights and resumes: weights never change in the middle of a generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything we load is local; never contact a hub

import torch  # noqa: E402

from arlctl.errors import TerminalError, TransientError, UsageError  # noqa: E402
from arlctl.inference.base import MAX_BATCH, Generation, SamplingParams  # noqa: E402
from arlctl.inference.sampling_check import check_sampling  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def sampling_distribution(
    logits: torch.Tensor, temperature: float | torch.Tensor, top_p: float | torch.Tensor
) -> torch.Tensor:
    """Log-probs (float32, [..., V]) of the distribution we sample from: tempered, top-p filtered, renormalised.

    temperature and top_p are floats, or tensors broadcastable to [..., 1] (one per row).
    temperature == 0 gives the untempered log_softmax, top_p ignored (greedy decoding takes its argmax).
    Tokens outside the nucleus get -inf. The nucleus is the smallest set of most likely tokens whose mass
    reaches top_p; the most likely token is always in it.
    """
    logits = logits.float()
    temperature = torch.as_tensor(temperature, dtype=torch.float32)
    top_p = torch.as_tensor(top_p, dtype=torch.float32)
    greedy = temperature <= 0
    top_p = torch.where(greedy, torch.ones_like(top_p), top_p)  # greedy ignores top_p: argmax is always kept
    temperature = torch.where(greedy, torch.ones_like(temperature), temperature)
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    if bool((top_p >= 1.0).all()):
        return logprobs
    sorted_lp, order = torch.sort(logprobs, dim=-1, descending=True)
    sorted_p = sorted_lp.exp()
    mass_before = sorted_p.cumsum(dim=-1) - sorted_p  # mass of strictly more likely tokens
    drop_sorted = (mass_before >= top_p) & (top_p < 1.0)
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    logprobs = logprobs.masked_fill(drop, float("-inf"))
    return logprobs - torch.logsumexp(logprobs, dim=-1, keepdim=True)


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Inverse-CDF sampling of one index from `probs` [V] with one uniform from `generator`.

    Much cheaper than torch.multinomial over a 49k vocabulary, and a request's draws depend only on its
    own generator, never on the other rows of the batch.
    """
    cdf = probs.cumsum(dim=-1)  # [V]
    u = torch.rand((), generator=generator) * cdf[-1]
    # right=True: the first index whose cdf exceeds u, so a zero-probability token is never chosen.
    return min(int(torch.searchsorted(cdf, u.reshape(1), right=True)), probs.shape[-1] - 1)


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    stop: frozenset[int]
    max_new_tokens: int
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    generator: torch.Generator | None
    seed: int | None
    enqueued_at: float
    started_at: float = 0.0
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    cancelled: bool = False
    version: int = 0

    @property
    def budget(self) -> int:
        return len(self.prompt_ids) + self.max_new_tokens


@dataclass
class _Batch:
    """The running rows and their KV cache; tensors are row-aligned with `rows`."""

    rows: list[_Request]
    cache: Any  # a transformers DynamicCache; per layer keys, values [B, H, L, D]
    mask: torch.Tensor  # [B, L] 1 = real token in the cache, 0 = left padding
    next_pos: torch.Tensor  # [B] position id of the next input token (= real tokens so far)
    last: torch.Tensor  # [B] the token each row feeds next (its last sampled one)


class HFPolicy:
    """A Policy backed by a transformers causal LM on CPU, batching concurrent generate calls."""

    def __init__(
        self,
        path: str | Path,
        *,
        name: str | None = None,
        version: int = 0,
        dtype: str = "float32",
        max_batch: int = MAX_BATCH,
        max_batch_tokens: int = 65536,
        num_threads: int | None = None,
    ):
        from transformers import AutoTokenizer

        if dtype not in DTYPES:
            raise UsageError(f"unknown dtype {dtype!r}", hint=f"choose one of {', '.join(DTYPES)}")
        if max_batch < 1:
            raise UsageError("max_batch must be at least 1")
        if num_threads:
            torch.set_num_threads(num_threads)
        self.path = str(path)
        self.name = name or self.path
        self.version = version
        self.dtype = DTYPES[dtype]
        self.max_batch = max_batch
        self.max_batch_tokens = max_batch_tokens
        self.tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        self._model = self._load_model(self.path)
        self._eos_ids = _eos_ids(self._model, self.tokenizer)
        self._vocab_size = int(self._model.config.vocab_size)
        self._pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self._cache_kwarg = (
            "cache" if "cache" in inspect.signature(self._model.forward).parameters else "past_key_values"
        )
        self._cond = threading.Condition()
        self._pending: deque[_Request] = deque()
        self._swap: tuple[Any, int, asyncio.Future, asyncio.AbstractEventLoop] | None = None
        self._closed = False
        self.stats = {"generated_tokens": 0, "prefill_tokens": 0, "decode_steps": 0, "max_rows": 0, "busy_s": 0.0}
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="arlctl-hf-policy", daemon=True)
        self._thread.start()

    def metrics(self) -> dict[str, Any]:
        """Backend counters for RUN/metrics: tokens/s and the share of time the model sat idle."""
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        return {**self.stats, "tokens_per_s": self.stats["generated_tokens"] / elapsed,
                "idle_ratio": max(0.0, 1.0 - self.stats["busy_s"] / elapsed),
                "waiting": len(self._pending)}

    @property
    def vocab_size(self) -> int:
        """Sampled ids must decode: the tokenizer's size, not the model's (possibly padded) embedding rows."""
        return len(self.tokenizer)

    @property
    def max_context(self) -> int:
        """Prompt plus response tokens the model can attend over."""
        return int(getattr(self._model.config, "max_position_embeddings", 0) or 1 << 30)

    # ---- the Policy protocol (called on the event loop; never blocks it) ----

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        check_sampling(sampling)  # NaN/inf/out-of-range values never reach the model
        if not prompt_ids:
            raise UsageError("generate needs at least one prompt token")
        if min(prompt_ids) < 0 or max(prompt_ids) >= self._vocab_size:
            raise UsageError(f"prompt ids must lie in [0, {self._vocab_size}) for {self.name}")
        limit = int(getattr(self._model.config, "max_position_embeddings", 0) or 1 << 30)
        if len(prompt_ids) >= limit:
            raise TerminalError(f"prompt of {len(prompt_ids)} tokens does not fit the {limit}-token context")
        max_new = min(sampling.max_new_tokens, limit - len(prompt_ids))
        if max_new <= 0:
            return Generation(ids=[], logprobs=[], finish_reason="length", version=self.version)
        loop = asyncio.get_running_loop()
        seed = sampling.seed
        generator = None
        if sampling.temperature > 0:
            # An unseeded request still gets its own generator, with the seed recorded in info for replay.
            seed = seed if seed is not None else random.getrandbits(63)
            generator = torch.Generator().manual_seed(seed)
        request = _Request(
            prompt_ids=list(prompt_ids),
            sampling=sampling,
            stop=frozenset(sampling.stop_ids) | (frozenset() if sampling.ignore_eos else self._eos_ids),
            max_new_tokens=max_new,
            future=loop.create_future(),
            loop=loop,
            generator=generator,
            seed=seed,
            enqueued_at=time.monotonic(),
        )
        with self._cond:
            if self._closed:
                raise TerminalError("the policy is closed")
            self._pending.append(request)
            self._cond.notify()
        try:
            return await request.future
        except asyncio.CancelledError:
            request.cancelled = True  # the worker drops it at the next iteration
            raise

    async def reload(self, policy_dir: str, version: int) -> None:
        """Load new weights (off the loop), then swap them in once the running batch has drained."""
        model = await asyncio.to_thread(self._load_model, str(policy_dir))
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        with self._cond:
            if self._closed:
                raise TerminalError("the policy is closed")
            self._swap = (model, version, done, loop)
            self._cond.notify()
        await done
        self.path = str(policy_dir)

    async def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        await asyncio.to_thread(self._thread.join)

    # ---- the scheduler (runs on the worker thread) ----

    def _load_model(self, path: str) -> Any:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # stderr belongs to our own progress display
        try:
            model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=self.dtype)
        except OSError as err:
            raise TerminalError(
                f"cannot load a model from {path}: {err}", hint="is it an HF model directory?"
            ) from err
        model.eval()
        return model

    def _run(self) -> None:
        batch: _Batch | None = None
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not self._closed and not self._pending and batch is None and self._swap is None:
                        self._cond.wait()
                    if self._closed:
                        self._fail_all(batch.rows if batch else [], TerminalError("the policy was closed"))
                        return
                    if self._swap is not None and batch is None:
                        self._do_swap()
                        continue
                    # While a swap waits, admit nothing: the running rows drain, then the weights change.
                    admitted = [] if self._swap is not None else self._take_admissible(batch)
                t_step = time.perf_counter()
                try:
                    batch = self._step(batch, admitted)
                    self.stats["busy_s"] += time.perf_counter() - t_step
                except Exception as err:  # a failed forward must not kill the worker: fail its rows, go on
                    with self._cond:
                        self._fail_all((batch.rows if batch else []) + admitted, err, pending=False)
                    batch = None

    def _take_admissible(self, batch: _Batch | None) -> list[_Request]:
        rows = len(batch.rows) if batch else 0
        tokens = sum(r.budget for r in batch.rows) if batch else 0
        admitted: list[_Request] = []
        while self._pending and rows < self.max_batch:
            request = self._pending[0]
            # The token budget bounds the KV cache; an empty batch always takes one request so nothing starves.
            if rows and tokens + request.budget > self.max_batch_tokens:
                break
            self._pending.popleft()
            if request.cancelled or request.future.cancelled():
                continue
            admitted.append(request)
            rows += 1
            tokens += request.budget
        return admitted

    def _do_swap(self) -> None:
        model, version, done, loop = self._swap  # type: ignore[misc]
        self._model = model
        self.version = version
        self._swap = None
        _resolve(loop, done, None)

    def _step(self, batch: _Batch | None, admitted: list[_Request]) -> _Batch | None:
        if batch is not None:
            batch = self._drop(batch, [r.cancelled or r.future.cancelled() for r in batch.rows])
        if admitted:
            fresh = self._prefill(admitted)
            fresh = self._finish_done(fresh)
            batch = _merge(batch, fresh)
        if batch is not None:
            batch = self._decode(batch)
            batch = self._finish_done(batch)
        return batch

    def _forward(
        self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> Any:
        """One model call over [B, q] new tokens given a cache whose key padding is `mask` [B, L + q].

        The model appends the new keys and values to `cache` in place; the cache object is kept from step
        to step and only rebuilt when rows join or leave.
        """
        attention = _attention_bias(mask, input_ids.shape[1], self.dtype)  # [B, 1, q, L + q]
        out = self._model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kwarg: cache},
        )
        new_cache = getattr(out, "cache", None)
        if new_cache is None:
            new_cache = out.past_key_values
        return out.logits[:, -1, :].float(), new_cache  # [B, V]

    def _prefill(self, rows: list[_Request]) -> _Batch:
        width = max(len(r.prompt_ids) for r in rows)
        ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)  # [B, T]
        mask = torch.zeros((len(rows), width), dtype=torch.long)  # [B, T]
        for i, request in enumerate(rows):
            n = len(request.prompt_ids)
            ids[i, width - n :] = torch.tensor(request.prompt_ids, dtype=torch.long)
            mask[i, width - n :] = 1
            request.started_at = time.monotonic()
            request.version = self.version
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, T]
        logits, cache = self._forward(ids, mask, positions, _build_cache([]))
        self.stats["prefill_tokens"] += int(mask.sum())
        last = self._sample(rows, logits)
        return _Batch(rows=list(rows), cache=cache, mask=mask, next_pos=mask.sum(-1), last=last)

    def _decode(self, batch: _Batch) -> _Batch:
        rows = len(batch.rows)
        mask = torch.cat([batch.mask, torch.ones((rows, 1), dtype=torch.long)], dim=1)  # [B, L + 1]
        logits, cache = self._forward(batch.last[:, None], mask, batch.next_pos[:, None], batch.cache)
        self.stats["decode_steps"] += 1
        self.stats["max_rows"] = max(self.stats["max_rows"], rows)
        last = self._sample(batch.rows, logits)
        return _Batch(rows=batch.rows, cache=cache, mask=mask, next_pos=batch.next_pos + 1, last=last)

    def _sample(self, rows: list[_Request], logits: torch.Tensor) -> torch.Tensor:
        """Sample one token per row from its own distribution and generator; record ids and log-probs."""
        temperature = torch.tensor([[r.sampling.temperature] for r in rows])  # [B, 1]
        top_p = torch.tensor([[r.sampling.top_p] for r in rows])  # [B, 1]
        logprobs = sampling_distribution(logits, temperature, top_p)  # [B, V]
        probs = logprobs.exp()  # [B, V]
        chosen = torch.empty(len(rows), dtype=torch.long)
        for i, request in enumerate(rows):
            if request.sampling.temperature <= 0:
                token = int(torch.argmax(logprobs[i]))
            else:
                token = draw(probs[i], request.generator)
            request.ids.append(token)
            request.logprobs.append(float(logprobs[i, token]))
            chosen[i] = token
        self.stats["generated_tokens"] += len(rows)
        return chosen

    def _finish_done(self, batch: _Batch) -> _Batch | None:
        finished = []
        for request in batch.rows:
            reason = None
            if request.ids and request.ids[-1] in request.stop:
                reason = "stop"
            elif len(request.ids) >= request.max_new_tokens:
                reason = "length"
            finished.append(reason is not None)
            if reason is not None:
                now = time.monotonic()
                info = {
                    "queue_s": request.started_at - request.enqueued_at,
                    "generate_s": now - request.started_at,
                    "seed": request.seed,
                    "prompt_tokens": len(request.prompt_ids),
                }
                result = Generation(request.ids, request.logprobs, reason, version=request.version, info=info)
                _resolve(request.loop, request.future, result)
        return self._drop(batch, finished)

    def _drop(self, batch: _Batch, drop: list[bool]) -> _Batch | None:
        if not any(drop):
            return batch
        keep = [i for i, d in enumerate(drop) if not d]
        if not keep:
            return None
        index = torch.tensor(keep, dtype=torch.long)
        mask = batch.mask[index]
        # Columns that are padding for every remaining row can go: nothing attends to them.
        first = int((mask.sum(0) > 0).nonzero()[0]) if mask.numel() else 0
        kv = [(k[index, :, first:], v[index, :, first:]) for k, v in _cache_tensors(batch.cache)]
        return _Batch(
            rows=[batch.rows[i] for i in keep],
            cache=_build_cache(kv),
            mask=mask[:, first:],
            next_pos=batch.next_pos[index],
            last=batch.last[index],
        )

    def _fail_all(self, requests: list[_Request], err: BaseException, pending: bool = True) -> None:
        """Fail these requests (and, when closing, everything still queued). Call with the lock held."""
        requests = list(requests)
        if pending:
            requests += list(self._pending)
            self._pending.clear()
        if not isinstance(err, (TerminalError, TransientError)):
            err = TransientError(f"hf backend failed: {type(err).__name__}: {err}")
        for request in requests:
            _resolve(request.loop, request.future, err)
        if self._swap is not None and self._closed:
            _resolve(self._swap[3], self._swap[2], err)
            self._swap = None


def _merge(batch: _Batch | None, fresh: _Batch | None) -> _Batch | None:
    """Stack two batches' rows, left-padding the shorter cache with masked zero columns."""
    if batch is None or fresh is None:
        return batch if fresh is None else fresh
    width = max(batch.mask.shape[1], fresh.mask.shape[1])

    def pad(t: torch.Tensor, dim: int) -> torch.Tensor:
        missing = width - t.shape[dim]
        if missing == 0:
            return t
        shape = list(t.shape)
        shape[dim] = missing
        return torch.cat([t.new_zeros(shape), t], dim=dim)

    kv = [
        (torch.cat([pad(k1, 2), pad(k2, 2)]), torch.cat([pad(v1, 2), pad(v2, 2)]))
        for (k1, v1), (k2, v2) in zip(_cache_tensors(batch.cache), _cache_tensors(fresh.cache), strict=True)
    ]
    return _Batch(
        rows=batch.rows + fresh.rows,
        cache=_build_cache(kv),
        mask=torch.cat([pad(batch.mask, 1), pad(fresh.mask, 1)]),
        next_pos=torch.cat([batch.next_pos, fresh.next_pos]),
        last=torch.cat([batch.last, fresh.last]),
    )


def _attention_bias(key_mask: torch.Tensor, q_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive 4D mask [B, 1, q, L]: causal over the last q keys, key padding masked.

    A query at a padded position would see no key at all (a fully masked softmax row gives NaN that then
    leaks into the cache), so it is allowed to attend to itself; its output is never used.
    """
    rows, keys = key_mask.shape
    q_index = torch.arange(keys - q_len, keys)[:, None]  # [q, 1] absolute key index of each query
    k_index = torch.arange(keys)[None, :]  # [1, L]
    allowed = (k_index <= q_index)[None] & key_mask.bool()[:, None, :]  # [B, q, L]
    allowed |= (k_index == q_index)[None]
    bias = torch.zeros((rows, 1, q_len, keys), dtype=dtype)
    return bias.masked_fill(~allowed[:, None], torch.finfo(dtype).min)


def _build_cache(kv: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache()
    for layer, (keys, values) in enumerate(kv):
        cache.update(keys, values, layer)
    return cache


def _cache_tensors(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    if hasattr(cache, "key_cache"):  # transformers < 4.56
        return list(zip(cache.key_cache, cache.value_cache, strict=True))
    return [(k, v) for k, v in cache]


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (config_eos, getattr(model.config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return frozenset(ids)


def _resolve(loop: asyncio.AbstractEventLoop, future: asyncio.Future, value: Any) -> None:
    """Complete an asyncio future from the worker thread (with a result, or an exception)."""

    def complete() -> None:
        if future.done():
            return
        if isinstance(value, BaseException):
            future.set_exception(value)
        else:
            future.set_result(value)

    with contextlib.suppress(RuntimeError):  # the caller's loop is already closed: nobody is waiting
        loop.call_soon_threadsafe(complete)
