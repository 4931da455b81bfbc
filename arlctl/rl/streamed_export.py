"""The consolidated HF weights of an FSDP2 model, written tensor by tensor (DESIGN.md §9).

Every rank walks the model's state dict in the same order; each sharded tensor is gathered alone
(`full_tensor`, one collective), rank 0 writes it into model.safetensors and drops it before the next,
so no process ever holds more than one whole tensor. The file's header is written first: the names,
shapes and dtypes are known before any tensor is gathered. A tensor that holds NaN/inf is named in the
result (every rank gets it), so the caller refuses the checkpoint as it does a gathered one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}

# The most bytes of whole tensors rank 0 held at once in the last export (tests read it).
EXPORT_STATS: dict[str, int] = {"largest_held": 0, "tensors": 0, "bytes_written": 0}


def export_dtype(t: torch.Tensor, publish: torch.dtype) -> torch.dtype:
    return publish if t.is_floating_point() else t.dtype


def stream_weights(state: dict[str, Any], path: Path | None, publish: torch.dtype, broadcast: Any) -> tuple[str, str] | None:
    """Write `state` (HF names -> tensors, DTensors gathered one at a time) to the safetensors file `path`
    on the rank that passes one (None on the others, which still take part in each gather). Returns the
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
            whole = t.full_tensor() if hasattr(t, "full_tensor") else t  # a collective for a DTensor
            if out is None:
                del whole
                continue
            whole = whole.detach().to("cpu", export_dtype(t, publish)).contiguous()
            if bad is None:
                bad = first_nonfinite([(name, whole)])
            data = whole.view(torch.uint8).numpy() if whole.dtype != torch.bool else whole.numpy()
            out.write(memoryview(data).cast("B"))
            stats["largest_held"] = max(stats["largest_held"], whole.numel() * whole.element_size())
            stats["tensors"] += 1
            stats["bytes_written"] += whole.numel() * whole.element_size()
            del whole, data
    finally:
        if out is not None:
            out.close()
    if path is not None:
        EXPORT_STATS.update(stats)
    return broadcast(bad)


__all__ = ["EXPORT_STATS", "stream_weights"]
