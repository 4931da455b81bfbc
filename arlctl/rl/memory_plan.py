"""Per-rank memory of `arlctl train` for a model, before anything is loaded: `arlctl plan --model`.

The model is built from its config.json on the meta device (transformers' own classes, so every
architecture it knows is counted exactly, tied embeddings included, and no weight is read). From the
parameter count P, the largest decoder layer and the config's widths, each training mode's bytes on one
rank of N follow from what the trainer holds (arlctl/rl/trainer_state.py, distributed.py):

    mode         weights          grads            AdamW (2 moments)  other
    single fp32  4P               4P               8P
    single bf16  4P (fp32 master) 4P               8P                 a bf16 compute copy: 2P (its grads
                                                                     go to the master in the backward)
    ddp fp32     4P               4P               8P                 DDP's gradient buckets: 4P
    fsdp2 fp32   4P/N             4P/N             8P/N               one layer gathered (+ the next, prefetched)
    fsdp2 bf16   4P/N (master)    4P/N             8P/N               the gathered layers in bf16
    lora         base 4P (/N under fsdp2) frozen; the adapters' A params take 16A (/N)

plus the KL reference when --kl-coef is set (a frozen fp32 copy, sharded like the model; nothing for LoRA,
whose reference is the model with its adapters off), and activations per micro-batch token: with
--grad-checkpoint one hidden state per layer kept, else every saved tensor of a layer (q, k, v, the
attention output, the MLP's gate/up/activation, norms and residuals), and the log-prob pass's fp32
logits over the vocabulary, one chunk of --head-chunk-mb's default at a time. Attention is taken to be
linear in tokens (SDPA/flash on CUDA); CPU eager attention adds a seq x seq term per head that this
leaves out.

`load_peak` is the most a rank holds while the model loads. Under FSDP2 each rank builds the model on the
meta device and reads only its shards (arlctl/rl/sharded_load.py): 4P/N, the reference's 4P/N (LoRA: the
adapters' instead), and one tensor's shard again as FSDP2 initialises it. DDP and one process build the
whole fp32 model first: 4P on the device.

These are the tensors' own bytes. A real process adds the CUDA context, the allocator's fragmentation and
NCCL buffers: `--reserve-gb` (default 6) is set aside for them before anything is called a fit.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from arlctl.errors import UsageError
from arlctl.rl.config import HEAD_CHUNK_MB

GiB = 1 << 30
MODES = ("single-fp32", "single-bf16", "ddp-fp32", "fsdp2-fp32", "fsdp2-bf16", "lora-fsdp2")
PREFETCH_LAYERS = 2  # FSDP2 holds the layer it computes and the next one it gathers


@dataclass(frozen=True)
class Shape:
    """What the plan needs of a model: counted on the meta device from its config."""

    name: str
    params: int  # distinct parameters (a tied embedding once)
    layer_params: int  # the largest decoder layer's
    largest_tensor: int  # the most elements in one parameter (an embedding, usually)
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    lora_params: int  # trainable parameters of a LoRA of the given rank on the default targets
    lora_rank: int


@dataclass
class ModePlan:
    mode: str
    ranks: int
    weights: float
    grads: float
    optimizer: float
    other: float  # held copies: DDP's buckets, bf16's compute copy
    reference: float
    activations_per_token: float
    micro_tokens: int
    load_peak: float
    transient: float = 0.0  # alive only inside the step: FSDP2's gathered layers and one layer's full grads
    head: float = 0.0  # the LM head's logits of one chunk of trained tokens, and their log-softmax
    notes: list[str] = field(default_factory=list)

    @property
    def state(self) -> float:
        """Bytes held at the optimizer step (weights, gradients, AdamW state, extra copies, the reference)."""
        return self.weights + self.grads + self.optimizer + self.other + self.reference

    @property
    def step_peak(self) -> float:
        return self.state + self.transient + self.activations_per_token * self.micro_tokens + self.head

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "state": self.state, "step_peak": self.step_peak}


def config_path(model: str) -> Path:
    """config.json of `model`: a model directory, a config.json, or a model `arlctl model pull` keeps."""
    path = Path(model).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return path
    from arlctl.models import model_path

    try:
        pulled = model_path(model) / "config.json" if "/" not in model else None
    except Exception:  # not a name `arlctl model` knows
        pulled = None
    if pulled is None or not pulled.is_file():
        raise UsageError(f"no model config at {model}",
                         hint="give a model directory (with config.json), a config.json, or a pulled model's name")
    return pulled


def count_shape(model: str, lora_rank: int = 16, lora_targets: list[str] | None = None) -> Shape:
    """Build the model on the meta device from its config and count what the plan needs (once per config
    file's contents and LoRA settings in a process)."""
    path = config_path(model)
    return _count(str(model), str(path), path.stat().st_mtime_ns, lora_rank, tuple(lora_targets or ()))


@functools.lru_cache(maxsize=32)
def _count(model: str, config_file: str, _mtime: int, lora_rank: int, lora_targets: tuple[str, ...]) -> Shape:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(config_file)
    try:
        raw = json.loads(path.read_text())
        config = AutoConfig.for_model(**raw) if "model_type" in raw else AutoConfig.from_pretrained(path.parent)
    except (ValueError, KeyError, OSError) as err:
        raise UsageError(f"cannot read the model config {path}: {err}") from err
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in lm.parameters())  # parameters() yields a tied tensor once
    from arlctl.rl.distributed import decoder_layers

    layers = decoder_layers(lm)
    layer_params = max(sum(p.numel() for p in layer.parameters()) for layer in layers)
    text = getattr(config, "text_config", None) or config
    hidden = int(text.hidden_size)
    heads = int(text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
    targets = list(lora_targets) or ["q_proj", "k_proj", "v_proj", "o_proj"]
    lora = 0
    for name, module in lm.named_modules():
        if name.split(".")[-1] in targets and isinstance(module, torch.nn.Linear):
            lora += lora_rank * (module.in_features + module.out_features)
    largest = max(p.numel() for p in lm.parameters())
    return Shape(name=str(model), params=params, layer_params=layer_params, largest_tensor=largest,
                 layers=len(layers), hidden=hidden,
                 intermediate=int(getattr(text, "intermediate_size", 4 * hidden)), heads=heads,
                 kv_heads=int(getattr(text, "num_key_value_heads", None) or heads), head_dim=head_dim,
                 vocab=int(text.vocab_size), lora_params=lora, lora_rank=lora_rank)


def activation_bytes_per_token(shape: Shape, compute_bytes: int, grad_checkpoint: bool) -> float:
    """Bytes of saved activations per token of a micro-batch (the LM head's logits are head_bytes')."""
    h, i = shape.hidden, shape.intermediate
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    per_layer = 6 * h + 2 * q + 2 * kv + 3 * i  # norms, residuals, q/k/v, attention out, gate/up/act
    kept = shape.layers * h + per_layer if grad_checkpoint else shape.layers * per_layer
    return kept * compute_bytes


def head_bytes(shape: Shape, micro_tokens: int, chunk_bytes: int = HEAD_CHUNK_MB << 20) -> float:
    """The log-prob pass's fp32 logits and their log-softmax, alive for one chunk of the trained tokens at a
    time (batching.head_logprobs: chunks of `chunk_bytes` of logits, recomputed in the backward)."""
    rows = micro_tokens if chunk_bytes <= 0 else min(micro_tokens, max(1, chunk_bytes // (4 * shape.vocab)))
    return 2 * 4 * shape.vocab * rows


def plan_modes(shape: Shape, ranks: int, micro_tokens: int = 8192, kl: bool = False,
               grad_checkpoint: bool = False) -> list[ModePlan]:
    """Each mode's per-rank bytes on `ranks` ranks (single-* only on one rank)."""
    p, n, layer = float(shape.params), ranks, float(shape.layer_params)
    out = []
    for mode in MODES:
        if mode.startswith("single") and n != 1:
            continue
        sharded = mode.endswith("fsdp2") or mode.startswith("fsdp2")
        div = n if sharded else 1
        bf16 = mode.endswith("bf16")
        notes: list[str] = []
        other = 0.0
        if mode == "lora-fsdp2":
            a = float(shape.lora_params)
            weights, grads, optimizer = (4 * p + 4 * a) / div, 4 * a / div, 8 * a / div
            reference = 0.0
            notes.append(f"rank {shape.lora_rank} on q/k/v/o: {shape.lora_params:,} trainable")
        else:
            weights, grads, optimizer = 4 * p / div, 4 * p / div, 8 * p / div
            reference = 4 * p / div if kl else 0.0
        if mode == "single-bf16":  # its bf16 gradients live only until the backward copies them to the master
            other = 2 * p
            notes.append("a bf16 compute copy")
        if mode == "ddp-fp32":
            other = 4 * p
            notes.append("DDP's gradient buckets")
        transient = 0.0
        if sharded and n > 1:  # one rank trains unsharded (--strategy auto is single there)
            transient = PREFETCH_LAYERS * layer * (2 if bf16 else 4) + layer * 4  # gathered params, a layer's grads
            notes.append("two layers gathered at a time")
        act = activation_bytes_per_token(shape, 2 if bf16 else 4, grad_checkpoint)
        if mode == "lora-fsdp2":  # the base's shards and the adapters' (drawn whole, then sharded)
            load_peak = 4 * p / n + 4 * float(shape.lora_params) / n + 4 * shape.largest_tensor / n
        elif sharded:  # its shards, the reference's, one tensor's shard again
            load_peak = 4 * p / n + (4 * p / n if reference else 0.0) + 4 * shape.largest_tensor / n
        else:  # the whole fp32 model first (and the reference whole, once the model is in place)
            load_peak = max(4 * p, weights + grads + optimizer + other + 4 * p) if reference else 4 * p
        out.append(ModePlan(mode=mode, ranks=n, weights=weights, grads=grads, optimizer=optimizer, other=other,
                            reference=reference, activations_per_token=act, micro_tokens=micro_tokens,
                            load_peak=load_peak, transient=transient, head=head_bytes(shape, micro_tokens),
                            notes=notes))
    return out


def largest_params(plan: ModePlan, shape: Shape, gpu_bytes: float, reserve_bytes: float) -> int:
    """The most parameters a model of this shape's proportions can have and still train in the mode (state
    and the gathered layers scale with P; the activations of the micro-batch are held fixed)."""
    budget = gpu_bytes - reserve_bytes - plan.activations_per_token * plan.micro_tokens
    per_param = (plan.state + plan.transient) / shape.params
    return max(int(budget / per_param), 0) if per_param > 0 else 0


def plan(model: str, gpus: int, gpu_mem_gb: float, micro_tokens: int = 8192, kl: bool = False,
         grad_checkpoint: bool = False, lora_rank: int = 16, reserve_gb: float = 6.0) -> dict[str, Any]:
    """The whole `arlctl plan --model` answer, as data."""
    if gpus < 1:
        raise UsageError("--gpus must be >= 1")
    if gpu_mem_gb <= 0 or reserve_gb < 0 or reserve_gb >= gpu_mem_gb:
        raise UsageError("--gpu-mem must be > 0 and more than --reserve-gb")
    if micro_tokens < 1:
        raise UsageError("--micro-tokens must be >= 1")
    shape = count_shape(model, lora_rank=lora_rank)
    gpu, reserve = gpu_mem_gb * GiB, reserve_gb * GiB
    modes = [{**m.to_json(), "trains": m.step_peak <= gpu - reserve, "loads": m.load_peak <= gpu - reserve,
              "largest_params": largest_params(m, shape, gpu, reserve)}
             for m in plan_modes(shape, gpus, micro_tokens, kl, grad_checkpoint)]
    return {"model": asdict(shape), "gpus": gpus, "gpu_mem_gb": gpu_mem_gb, "reserve_gb": reserve_gb,
            "micro_tokens": micro_tokens, "kl": kl, "grad_checkpoint": grad_checkpoint, "modes": modes,
            "fits": [m["mode"] for m in modes if m["trains"] and m["loads"]],
            "trains_but_does_not_load": [m["mode"] for m in modes if m["trains"] and not m["loads"]]}


def held_bytes(trainer: Any) -> dict[str, int]:
    """What a TrainerState holds on this rank, by distinct storage (a tied weight once, a DTensor's local
    shard): weights (the optimizer's and a compute copy's), gradients, AdamW state, the KL reference. Taken
    at the optimizer step it is what ModePlan.state predicts."""
    import torch

    seen: set[tuple[int, int]] = set()

    def size(tensors: Any) -> int:
        total = 0
        for t in tensors:
            if t is None:
                continue
            t = t.to_local() if hasattr(t, "to_local") else t
            if t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key = (storage.data_ptr(), storage.nbytes())
            if key not in seen:
                seen.add(key)
                total += storage.nbytes()
        return total

    params = list(trainer.master.parameters())
    compute = list(trainer.module.parameters()) if trainer.master_copy else []
    ref = trainer.ref if isinstance(trainer.ref, torch.nn.Module) else None
    return {
        "weights": size(params + compute),
        "grads": size(p.grad for p in params + compute),
        "optimizer": size(v for state in trainer.optimizer.state.values() for v in state.values()
                          if isinstance(v, torch.Tensor) and v.dim() > 0),
        "reference": size(ref.parameters()) if ref is not None else 0,
    }


def _gb(value: float) -> str:
    return f"{value / GiB:,.1f}"


def render(result: dict[str, Any]) -> Any:
    """The plan as one Rich table, a row per mode, and a line saying what fits."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    shape = result["model"]
    table = Table(title=f"per-rank memory, GiB: {shape['name']} ({shape['params'] / 1e9:.2f}B params) on "
                        f"{result['gpus']} x {result['gpu_mem_gb']:g} GiB", title_justify="left")
    # Narrow enough for 80 columns: weights + gradients + AdamW are one "state" figure (--json has each).
    table.add_column("mode", no_wrap=True)
    for name in ("state", "extra", "ref", "activ.", "peak", "load", "fits", "max"):
        table.add_column(name, justify="right", no_wrap=True)
    for m in result["modes"]:
        table.add_row(m["mode"], _gb(m["weights"] + m["grads"] + m["optimizer"]), _gb(m["other"] + m["transient"]),
                      _gb(m["reference"]), _gb(m["activations_per_token"] * m["micro_tokens"] + m["head"]),
                      _gb(m["step_peak"]),
                      _gb(m["load_peak"]), "yes" if m["trains"] and m["loads"] else "load" if m["trains"] else "no",
                      f"{m['largest_params'] / 1e9:,.1f}B")
    lines = ["state: weights + gradients + AdamW; extra: copies and gathered layers; peak: all of it with the "
             "activations; load: the most held while loading; fits: yes, no, or load (trains, but does not load); max: the "
             "largest model of these proportions that trains",
             f"activations: {result['micro_tokens']:,} tokens a micro-batch"
             f"{', grad checkpointing' if result['grad_checkpoint'] else ''}, the LM head in {HEAD_CHUNK_MB} MiB "
             "chunks; "
             f"{result['reserve_gb']:g} GiB a rank set aside (CUDA context, allocator, NCCL)"
             f"{'; KL reference held' if result['kl'] else ''}"]
    if result["fits"]:
        lines.append(f"trains and loads: {', '.join(result['fits'])}")
    if result["trains_but_does_not_load"]:
        lines.append(f"trains, but does not load (the whole fp32 model is built on each rank first): "
                     f"{', '.join(result['trains_but_does_not_load'])}")
    if not result["fits"] and not result["trains_but_does_not_load"]:
        lines.append("no mode fits: more GPUs, --grad-checkpoint, fewer --micro-tokens, or LoRA")
    return Group(table, *(Text(line) for line in lines))


__all__ = ["MODES", "ModePlan", "Shape", "activation_bytes_per_token", "count_shape", "held_bytes", "largest_params", "plan",
           "plan_modes", "render"]
