"""The consolidated HF weights of a model, written tensor by tensor (DESIGN.md §9), whatever its strategy.

Every rank walks the model's state dict in the same order; each sharded tensor is gathered alone
(`full_tensor`, one collective; an --offload shard is moved to its mesh's device first), rank 0 writes it
into the safetensors file and drops it before the next, so no process ever holds more than one whole
tensor. A LoRA model's merged export sums W + scale * B @ A one weight at a time (LoraMerged); its
adapter export is the A and B tensors alone. The file's header is written first: the names,
shapes and dtypes are known before any tensor is gathered. A tensor that holds NaN/inf is named in the
result (every rank gets it), so the caller refuses the checkpoint as it does a gathered one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}

# The most bytes of whole tensors rank 0 held at once in the last export (tests read it).
EXPORT_STATS: dict[str, int] = {"largest_held": 0, "tensors": 0, "bytes_written": 0}


@dataclass
class LoraMerged:
    """A LoRA-adapted weight as the merged export writes it: W + scale * B @ A, summed in fp32 when written,
    from W, A and B gathered one after the other (only this one weight is ever whole)."""

    base: Any
    a: Any
    b: Any
    scale: float

    @property
    def shape(self) -> torch.Size:
        return self.base.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.base.dtype

    def numel(self) -> int:
        return self.base.numel()

    def is_floating_point(self) -> bool:
        return True

    def whole(self) -> torch.Tensor:
        w, a, b = whole(self.base), whole(self.a), whole(self.b)
        return (w.float() + self.scale * (b.float() @ a.float())).to(w.dtype)


def whole(t: Any) -> torch.Tensor:
    """The whole tensor of a DTensor (a collective: every rank calls it), a LoraMerged's sum, or `t`. A
    shard offloaded to the CPU (--offload) is moved to its mesh's device first, which NCCL needs."""
    if isinstance(t, LoraMerged):
        return t.whole()
    if not hasattr(t, "full_tensor"):
        return t
    local = t.to_local()
    mesh_device = t.device_mesh.device_type
    if local.device.type != mesh_device:
        from torch.distributed.tensor import DTensor

        t = DTensor.from_local(local.to(mesh_device), t.device_mesh, t.placements, shape=t.shape, stride=t.stride())
    return t.full_tensor()


def sharded(t: Any) -> bool:
    return hasattr(t, "full_tensor") or (isinstance(t, LoraMerged) and hasattr(t.base, "full_tensor"))


def export_dtype(t: Any, publish: torch.dtype) -> torch.dtype:
    return publish if t.is_floating_point() else t.dtype


def stream_weights(state: dict[str, Any], path: Path | None, publish: torch.dtype, broadcast: Any) -> tuple[str, str] | None:
    """Write `state` (HF names -> tensors, DTensors gathered one at a time, LoraMerged summed one at a time)
    to the safetensors file `path` on the rank that passes one (None on the others, which still take part in
    each gather; with plain tensors, as one process or DDP holds them, they do nothing). Returns the
    first (name, 'NaN'|'inf') found, on every rank (`broadcast`: rank 0's value to all), or None."""
    from arlctl.rl.checkpoint import first_nonfinite

    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, t in state.items():
        dtype = export_dtype(t, publish)
        size = t.numel() * torch.empty((), dtype=dtype).element_size()
        header[name] = {"dtype": _NAMES[dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    bad = None
    stats = {"largest_held": 0, "tensors": 0, "bytes_written": 0}
    out = open(path, "wb") if path is not None else None  # noqa: SIM115 (closed below)
    try:
        if out is not None:
            out.write(len(raw).to_bytes(8, "little"))
            out.write(raw)
        for name, t in state.items():
            if out is None:
                if sharded(t):
                    whole(t)  # this rank's part of the gather, dropped
                continue
            tensor = whole(t).detach().to("cpu", export_dtype(t, publish)).contiguous()
            if bad is None:
                bad = first_nonfinite([(name, tensor)])
            data = tensor.view(torch.uint8).numpy() if tensor.dtype != torch.bool else tensor.numpy()
            out.write(memoryview(data).cast("B"))
            stats["largest_held"] = max(stats["largest_held"], tensor.numel() * tensor.element_size())
            stats["tensors"] += 1
            stats["bytes_written"] += tensor.numel() * tensor.element_size()
            del tensor, data
    finally:
        if out is not None:
            out.close()
    if path is not None:
        EXPORT_STATS.update(stats)
    return broadcast(bad)


__all__ = ["EXPORT_STATS", "LoraMerged", "stream_weights", "whole"]
