"""LoRA for the trainer (peft): wrap a causal LM, score the base policy through it, publish merged or adapter weights.

`apply_lora` injects peft LoRA layers into a model's linear modules in place and freezes everything else;
the returned `PeftModel` still works with `score_tokens`: its `get_decoder()` and `get_output_embeddings()`
reach through peft to the HF model, whose modules are now the LoRA-wrapped ones.

`reference_scope` turns the adapters off for the KL reference: with LoRA the initial policy is the base
model itself, so no second copy of the weights is needed.

Publishing works from a full (gathered, unsharded) state dict of the peft model, so that rank 0 needs no
second model: `merged_state_dict` folds W + (alpha / rank) * B @ A into plain HF names, and
`adapter_state_dict` / `write_adapter_dir` write the directory `peft.PeftModel.from_pretrained` and vLLM's
LoRA loader read. State dict names (the peft model's `state_dict()`, or torch.distributed.checkpoint's
`get_model_state_dict` with full_state_dict=True, which gives the same names):

    base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight   -> model.layers.0.self_attn.q_proj.weight
    base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight   A: [rank, in]
    base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight   B: [out, rank]
    base_model.model.model.embed_tokens.weight                           -> model.embed_tokens.weight

Only linear layers are adapted (embeddings would need another merge rule), and not a tied LM head (the merge
would have to change the input embeddings too).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from arlctl.errors import UsageError
from arlctl.rl.streamed_export import LoraMerged

PEFT_PREFIX = "base_model.model."  # PeftModel -> LoraModel -> the HF model
_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[^.]+)?\.weight$")  # with or without ".default"


def apply_lora(model: nn.Module, rank: int, alpha: float, targets: list[str]) -> nn.Module:
    """Wrap an HF causal LM with peft LoRA on the linear modules named by `targets`; returns the PeftModel.

    A target matches a module whose name is the target or ends with "." + target (peft's rule), e.g.
    "q_proj" or "self_attn.q_proj". lora_dropout 0, no bias, scale alpha / rank. A is drawn from the torch
    RNG (seed it first for a reproducible init) and B is zero, so the wrapped model starts as the base
    model. Afterwards only the lora_A / lora_B weights require grad.
    """
    from peft import LoraConfig, get_peft_model

    if rank < 1:
        raise UsageError(f"LoRA rank must be >= 1, got {rank}")
    _check_targets(model, targets)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0, bias="none",
                        task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def file_key(name: str) -> str:
    """The weights file's name of a model's parameter: a peft LoRA model's base layers are the HF model's own
    (base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight -> model.layers.0.self_attn.q_proj.weight)."""
    if name.startswith(PEFT_PREFIX):
        name = name[len(PEFT_PREFIX):].replace(".base_layer.", ".")
    return name


def init_adapters(model: nn.Module, seed: int) -> int:
    """Draw every adapter's A again (kaiming uniform, peft's init) from a generator seeded with `seed`, in
    name order, and zero every B; returns how many adapters. An adapter on the meta device (peft made it
    beside a base built there for sharded loading) becomes a real CPU tensor first, so a sharded run starts
    from the very adapters one process draws, whatever else consumed the global RNG."""
    import math

    generator = torch.Generator().manual_seed(seed)
    count = 0
    for name, module in sorted(model.named_modules(), key=lambda item: item[0]):
        for attr in ("lora_A", "lora_B"):
            holder = getattr(module, attr, None)
            if not isinstance(holder, nn.ModuleDict) or name.endswith((".lora_A", ".lora_B")):
                continue
            for adapter in holder.values():
                weight = adapter.weight
                if weight.device.type == "meta":
                    weight = nn.Parameter(torch.empty(weight.shape, dtype=weight.dtype), requires_grad=weight.requires_grad)
                    adapter.weight = weight
                with torch.no_grad():
                    if attr == "lora_A":
                        nn.init.kaiming_uniform_(weight, a=math.sqrt(5), generator=generator)
                        count += 1
                    else:
                        weight.zero_()
    return count


def _check_targets(model: nn.Module, targets: list[str]) -> None:
    """UsageError unless every target names at least one linear module (and not a tied LM head)."""
    linear = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    available = ", ".join(sorted({name.rsplit(".", 1)[-1] for name in linear}))
    tied_head = None
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        head = model.get_output_embeddings()
        tied_head = next((name for name, module in model.named_modules() if module is head), None)
    for target in targets:
        matched = [name for name in linear if name == target or name.endswith("." + target)]
        if not matched:
            raise UsageError(f"LoRA target {target!r} names no linear module of {type(model).__name__} "
                             f"(its linear modules: {available})", hint="e.g. --lora-targets q_proj,v_proj")
        if tied_head in matched:
            raise UsageError(f"LoRA target {target!r} is the LM head, which is tied to the input embeddings "
                             f"(its linear modules: {available})", hint="adapt the other linear modules")


def is_lora(model: nn.Module) -> bool:
    """Whether `model` is a peft model (an FSDP2-sharded one included: fully_shard keeps the class)."""
    from peft import PeftModel

    return isinstance(model, PeftModel)


@contextmanager
def reference_scope(model: nn.Module) -> Iterator[None]:
    """Within the block `model` computes the base policy: the LoRA layers are disabled (peft's disable_adapter).

    Use it under torch.no_grad() for the KL reference. Adapters are enabled again on exit, with the same
    parameters requiring grad. A model without LoRA raises TypeError rather than passing silently: its
    "reference" would be the trained policy itself and the KL term would be zero.
    """
    if not is_lora(model):
        raise TypeError(f"reference_scope needs a peft LoRA model, got {type(model).__name__}")
    with model.disable_adapter():
        yield


def merged_state_dict(state_dict: dict[str, torch.Tensor], alpha: float, rank: int) -> dict[str, torch.Tensor]:
    """The plain HF state dict of a full peft-model state dict, with W' = W + (alpha / rank) * B @ A.

    The sum is computed in fp32 and returned in W's dtype. Every other tensor is passed through renamed
    (both embed_tokens and lm_head when the input has both, as a tied model's state_dict() does).
    """
    return {name: (t.whole() if isinstance(t, LoraMerged) else t)
            for name, t in merged_items(state_dict, alpha, rank).items()}


def merged_items(state_dict: dict[str, Any], alpha: float, rank: int) -> dict[str, Any]:
    """merged_state_dict's names, with each adapted weight a LoraMerged still to be summed: what the streamed
    export writes (one weight gathered and merged at a time), from a sharded or a whole state dict."""
    scale = alpha / rank
    lora = _lora_pairs(state_dict)
    merged: dict[str, Any] = {}
    for key, tensor in state_dict.items():
        if _LORA_KEY.match(key):
            continue
        name = key.removeprefix(PEFT_PREFIX)
        if ".base_layer." in name:
            module, _, param = name.rpartition(".base_layer.")
            name = f"{module}.{param}"
            if param == "weight" and PEFT_PREFIX + module in lora:
                a, b = lora.pop(PEFT_PREFIX + module)
                tensor = LoraMerged(tensor, a, b, scale)
        merged[name] = tensor
    if lora:
        raise ValueError(f"LoRA tensors without a base weight: {sorted(lora)[:3]}")
    return merged


def _lora_pairs(state_dict: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{module key: (A, B)} of every LoRA module in a state dict."""
    found: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in state_dict.items():
        if match := _LORA_KEY.match(key):
            found.setdefault(match["module"], {})[match["ab"]] = tensor
    incomplete = [module for module, ab in found.items() if len(ab) != 2]
    if incomplete:
        raise ValueError(f"LoRA modules without both A and B: {incomplete[:3]}")
    return {module: (ab["A"], ab["B"]) for module, ab in found.items()}


def adapter_state_dict(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Only the LoRA tensors, named as peft's save_pretrained names them in adapter_model.safetensors
    (`base_model.model.<module>.lora_A.weight`: the adapter name dropped). Idempotent."""
    adapter = {}
    for key, tensor in state_dict.items():
        if match := _LORA_KEY.match(key):
            adapter[f"{match['module']}.lora_{match['ab']}.weight"] = tensor
    if not adapter:
        raise ValueError("the state dict holds no LoRA tensors (lora_A / lora_B)")
    return adapter


def write_adapter_dir(directory: Path, state_dict: dict[str, torch.Tensor] | None, base_model_path: str, rank: int,
                      alpha: float, targets: list[str], weights_file: Path | None = None) -> None:
    """Write adapter_config.json and adapter_model.safetensors, as peft's save_pretrained does, from a full
    peft state dict (or its `adapter_state_dict`). `base_model_path` is recorded for loaders that follow it.

    Readable by `peft.PeftModel.from_pretrained(base, directory)` and vLLM's LoRA loader.
    """
    from peft import LoraConfig
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if weights_file is not None:  # adapter_state_dict's tensors, streamed into it already
        import shutil

        shutil.move(str(weights_file), str(directory / "adapter_model.safetensors"))
    else:
        tensors = {k: v.detach().cpu().contiguous() for k, v in adapter_state_dict(state_dict).items()}
        save_file(tensors, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0, bias="none",
                        task_type="CAUSAL_LM", base_model_name_or_path=base_model_path, inference_mode=True)
    config.save_pretrained(str(directory))  # adapter_config.json, the file peft's save_pretrained writes


__all__ = ["PEFT_PREFIX", "adapter_state_dict", "apply_lora", "file_key", "init_adapters", "is_lora", "merged_items", "merged_state_dict",
           "reference_scope", "write_adapter_dir"]
