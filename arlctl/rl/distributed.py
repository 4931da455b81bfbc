"""Training past one process: the process group, the parallel strategy, and rows split across ranks (DESIGN.md §9).

`arlctl train` runs unchanged under torchrun: `init_dist` joins the process group torchrun describes in the
environment (NCCL on GPUs, gloo on CPU) or, with no torchrun, returns a world of one. Everything a stage
does distributed goes through `Dist`, whose methods are no-ops on one process, so the recipe reads the same
for one rank and for many.

Strategies (`--strategy`):
  single   one process; the model is whole on one device
  ddp      every rank holds the whole model (torch DistributedDataParallel); gradients are all-reduced once
           per optimizer step, in the backward of the last micro-batch
  fsdp2    `fully_shard` per decoder layer, then the root: parameters, gradients and optimizer state are
           sharded across ranks; `MixedPrecisionPolicy` with --precision bf16 (bf16 compute, fp32 reduction,
           fp32 sharded master weights); `CPUOffloadPolicy` with --offload
  auto     fsdp2 when the world has more than one rank, else single

One optimizer step is still one batch shard. Every rank reads the whole shard and applies the same row
rules (so all agree on the rows); `split_rows` gives each rank a token-balanced subset; the loss of a rank's
rows is divided by the *global* token / sequence counts of the shard, so the sum of the ranks' gradients is
the single-process gradient, for every --loss-agg mode, TIS, KL and per-row weights. The strategies'
collectives average over ranks, so each rank's loss is scaled by the world size (`loss_scale`). Ranks run the same number of micro-batches (a rank
with fewer rows pads with empty ones that contribute a zero gradient), because every micro-batch is a
collective under FSDP2.

`ScoringModel` wraps the causal LM so that the scoring forward (decoder, then the LM head only at trained
positions: arlctl/rl/batching.py `score_tokens`) is the root module's forward: FSDP2 gathers the root's
parameters (embeddings, final norm, head) in its root pre-forward hook, which a call into a submodule would
skip. The same wrapper is used by every strategy, so parameter names (and so checkpoints) are the same for
single, ddp and fsdp2.
"""

from __future__ import annotations

import datetime
import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from arlctl.errors import UsageError
from arlctl.rl.batching import HEAD_CHUNK_BYTES, MicroBatch, score_tokens

# The env torchrun sets for each rank.
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class Dist:
    """This process's place in the world. On one process every collective is a no-op."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str | None = None  # None: no process group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over ranks (float64 on the wire)."""
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values: list[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.MAX)

    def min(self, values: list[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.MIN)

    def any(self, flag: bool) -> bool:
        """True on every rank when it is true on any (e.g. SIGTERM seen by one rank before the others)."""
        return bool(self.max([float(flag)])[0])

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank (a picklable object: the list of batches to train, a path, ...)."""
        if not self.active:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0, device=self._comm_device())
        return box[0]

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def _reduce(self, values: list[float], op: Any) -> list[float]:
        if not self.active:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(tensor, op=op)
        return tensor.tolist()

    def _comm_device(self) -> torch.device:
        return self.device if self.backend == "nccl" else torch.device("cpu")


def launched_by_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def init_dist(device: str = "auto", timeout_s: float = 1800.0) -> Dist:
    """Join the process group torchrun describes (idempotent), or a world of one without torchrun.

    device: `--device`; "auto" takes this rank's GPU (LOCAL_RANK) when CUDA is there, else the CPU.
    """
    world = int(os.environ.get("WORLD_SIZE", "1")) if launched_by_torchrun() else 1
    rank = int(os.environ.get("RANK", "0")) if world > 1 else 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0")) if world > 1 else 0
    if device == "auto":
        dev = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    else:
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world == 1:
        return Dist(device=dev)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    return Dist(rank=rank, world=world, local_rank=local_rank, device=dev, backend=backend)


@functools.cache
def _libc() -> Any:
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl, macOS): nothing to tune
        return None


def cpu_heap(world: int) -> str:
    """Keep a CPU trainer's heap from holding freed tensors; returns the policy taken ("fixed", "trim" or
    "" where the C library is not glibc). GPU memory has its own allocator; this is for the host's.

    By default glibc raises its mmap threshold each time an mmapped block is freed, up to 32 MiB, and from
    then on blocks of that size come from the heap, which is not returned to the system while anything above
    them lives. A trainer allocates and frees tensors of every size each step, so the RSS kept growing:
    two FSDP2 ranks training SmolLM2 went from 2.3 B/param after loading to 18 after one step and 22 after
    two, against 7 held; one process held 4.85 GB after 4 steps where its state is 2.07.

    - Ranks (world > 1), where memory per rank is the point: the threshold is fixed at 128 KiB (mallopt),
      so blocks over it are unmapped when freed. The two ranks hold 6.9 B/param after each step and peak at
      11.9 inside it. It costs speed: every large tensor faults in fresh pages, 32% on one process's step.
    - One process: glibc keeps its own threshold, so a step reuses its freed blocks, and `release_heap`
      gives them back after each step (malloc_trim). It holds 2.07 GB too, for 10% (7.0 s against 6.4 s a
      step, where the fixed threshold takes 8.4). On ranks it would peak at 17.5-18.8 B/param inside the
      step, so they keep the fixed threshold. (benchmarks/train_scale.py measures the ranks' bytes.)
    """
    libc = _libc()
    if libc is None:
        return ""
    if world > 1:
        libc.mallopt(-3, 128 << 10)  # M_MMAP_THRESHOLD, fixed: no longer moved by frees
        return "fixed"
    return "trim"


def release_heap(policy: str) -> None:
    """After a step under the "trim" policy: return the heap's free pages to the system."""
    if policy == "trim" and (libc := _libc()) is not None:
        libc.malloc_trim(0)


def resolve_strategy(strategy: str, world: int) -> str:
    """The strategy to run: auto -> fsdp2 on more than one rank, else single; single on many ranks is refused."""
    if strategy == "auto":
        return "fsdp2" if world > 1 else "single"
    if strategy == "single" and world > 1:
        raise UsageError(f"--strategy single cannot run on {world} ranks",
                         hint="use --strategy fsdp2 or ddp under torchrun, or run one process")
    return strategy


def split_rows(lengths: list[int], world: int) -> list[list[int]]:
    """Row indices per rank, balanced by tokens: longest row first to the least-loaded rank (ties: lower rank).

    Deterministic, so every rank computes the same split. Each rank's list is in ascending row order.
    """
    loads = [0] * world
    parts: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        r = min(range(world), key=lambda r: (loads[r], r))
        parts[r].append(i)
        loads[r] += lengths[i]
    return [sorted(p) for p in parts]


class ScoringModel(nn.Module):
    """The causal LM with the scoring pass as its forward (see the module docstring).

    value_head: PPO's critic, a linear map of the last hidden state to one value (`train --value-coef`). It
    starts at zero (V = 0 everywhere, no random draw), lives in the root module, so FSDP2 shards it with the
    root and checkpoints hold it beside the policy, and is never part of the published HF weights.
    """

    def __init__(self, lm: nn.Module, value_head: bool = False, head_chunk_bytes: int | None = None) -> None:
        super().__init__()
        self.lm = lm
        self.head_chunk_bytes = HEAD_CHUNK_BYTES if head_chunk_bytes is None else head_chunk_bytes
        self.value_head: nn.Linear | None = None
        if value_head:
            with torch.random.fork_rng(devices=[]):  # the zero init below needs no draw: leave the RNG as it was
                self.value_head = nn.Linear(lm.config.hidden_size, 1)
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)

    def forward(self, mb: MicroBatch, with_entropy: bool = False, temperature: float = 1.0,
                with_values: bool = False) -> tuple[torch.Tensor, ...]:
        """(logp, entropy) of the trained tokens, and their values third with `with_values`."""
        head = self.value_head if with_values else None
        if with_values and head is None:
            raise ValueError("this model has no value head (train --value-coef)")
        return score_tokens(self.lm, mb, with_entropy=with_entropy, temperature=temperature, value_head=head,
                            head_chunk_bytes=self.head_chunk_bytes)


def has_value_head(module: Any) -> bool:
    """The trainer's module carries a critic (a ScoringModel built with a value head)."""
    inner = unwrap(module) if isinstance(module, nn.Module) else None
    return isinstance(inner, ScoringModel) and inner.value_head is not None


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of an HF model: modules whose class is in its `_no_split_modules`."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise UsageError(f"cannot find the decoder layers of {type(model).__name__} to shard",
                         hint="use --strategy ddp for this model")
    return layers


def wrap(scorer: ScoringModel, strategy: str, d: Dist, precision: str = "fp32", offload: bool = False,
         frozen: bool = False) -> nn.Module:
    """Apply the strategy to a model already on its device. Returns the module to call for the forward.

    frozen: a model only ever run without a gradient (the KL reference, a teacher). FSDP2 keeps the root's
    gathered parameters after a forward, for the backward that a trained model runs next; a frozen model
    has none, so that whole gathered group (the embeddings and the head: most of a small model, 1B params
    of an 8B one) stayed on every rank for good. frozen reshards every module after its forward."""
    if strategy == "single":
        return scorer
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        if offload:
            raise UsageError("--offload needs --strategy fsdp2")
        ids = [d.device.index] if d.device.type == "cuda" else None
        return DistributedDataParallel(scorer, device_ids=ids)
    if strategy != "fsdp2":
        raise UsageError(f"unknown --strategy {strategy!r}")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mesh = init_device_mesh(d.device.type, (d.world,))
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if precision == "bf16" else MixedPrecisionPolicy())
    offload_policy = CPUOffloadPolicy(pin_memory=d.device.type == "cuda") if offload else OffloadPolicy()
    kwargs = {"mesh": mesh, "mp_policy": mp, "offload_policy": offload_policy}
    if frozen:
        kwargs["reshard_after_forward"] = True  # given, not left to FSDP2's root heuristic
    for layer in decoder_layers(scorer):
        fully_shard(layer, **kwargs)
    fully_shard(scorer, **kwargs)
    return scorer


def grad_sync_scope(module: nn.Module, last: bool) -> Any:
    """Context for one micro-batch's backward: gradients are reduced across ranks only on the last one."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(module, DistributedDataParallel):
        return nullcontext() if last else module.no_sync()
    if isinstance(module, FSDPModule):
        module.set_requires_gradient_sync(last)
    return nullcontext()


def loss_scale(module: nn.Module, d: Dist) -> float:
    """The factor on each rank's loss that turns the strategy's gradient reduction into a sum: DDP and FSDP2
    average over ranks (a custom divide factor needs PREMUL_SUM, which gloo lacks), and each rank's loss
    already carries the whole batch's denominators."""
    return float(d.world)


def unwrap(module: nn.Module) -> ScoringModel:
    """The ScoringModel under a DDP wrapper (FSDP2 shards in place: the module is its own)."""
    return getattr(module, "module", module)


def total_norm(norm: torch.Tensor) -> torch.Tensor:
    """clip_grad_norm_'s result as a plain tensor (under FSDP2 it is a DTensor)."""
    full = getattr(norm, "full_tensor", None)
    return full() if callable(full) else norm


def empty_micro_batch(packed: bool = False) -> MicroBatch:
    """A one-token-pair micro-batch with nothing trained: its loss is 0 and its gradient exactly zero, but it
    runs every layer forward and backward, so a rank with fewer rows still joins each collective."""
    from arlctl.rl.batching import collate

    cols = {"prompt_ids": [[0]], "response_ids": [[0]], "response_mask": [[0]], "response_logprobs": [[0.0]],
            "advantage": [0.0], "weight": [0.0]}
    return collate(cols, [0], packed=packed)


@contextmanager
def maybe_destroy(d: Dist) -> Iterator[None]:
    """Tear the process group down at the end of the command (torchrun's processes exit right after)."""
    try:
        yield
    finally:
        if d.active and dist.is_initialized():
            dist.destroy_process_group()
