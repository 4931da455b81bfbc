"""Each FSDP2 rank materialises only its own shard of the model, read tensor by tensor from the safetensors
files (DESIGN.md §9): no process ever holds the whole model.

    with meta_parameters():          # parameters on the meta device, buffers (rotary tables) real
        lm = AutoModelForCausalLM.from_config(config)
    ...wrap the model: fully_shard on meta...
    load_shards(module, model_dir, device)

`load_shards` keeps every tensor that is not on the meta device (the buffers, a value head made outside the
context), empties the module onto `device` (so each DTensor parameter gets only its local shard), then
fills each parameter's local shard with that slice of the file's tensor (WeightFile: only those rows'
bytes are read, straight into the shard) or of the kept tensor, and puts the kept buffers back. A parameter found in neither is an error
naming it. What was read is counted in LOAD_STATS (tests use it to show no rank read more than its share).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from arlctl.errors import TerminalError
from arlctl.rl.lora import file_key

# Bytes each call of load_shards read from the files, and the largest single read (tests, benchmarks).
LOAD_STATS: dict[str, int] = {"bytes_read": 0, "largest_read": 0, "tensors": 0}


@contextlib.contextmanager
def meta_parameters() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device and their buffers as usual (computed
    values such as rotary frequencies stay real: they are not in the files)."""
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            kind = type(module._parameters[name])
            module._parameters[name] = kind(module._parameters[name].to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def _weight_files(model_dir: Path) -> dict[str, Path]:
    """tensor name -> the safetensors file holding it (one file, or an index's weight_map)."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: model_dir / file for name, file in weight_map.items()}
    single = model_dir / "model.safetensors"
    if not single.is_file():
        raise TerminalError(f"no safetensors weights in {model_dir}",
                            hint="sharded loading reads model.safetensors or model.safetensors.index.json")
    header = WeightFile(single)  # its header only
    header.close()
    return dict.fromkeys(header.tensors, single)


_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


class WeightFile:
    """One safetensors file read by byte range: a shard of rows is one contiguous range, read with
    readinto straight into the shard (or a staging buffer when the dtype differs), so nothing but that
    range is ever in this process (a memory map would add every page it touched to the RSS too)."""

    def __init__(self, path: Path):
        self.path = path
        self.handle = open(path, "rb")  # noqa: SIM115 (closed by close())
        size = int.from_bytes(self.handle.read(8), "little")
        header = json.loads(self.handle.read(size))
        header.pop("__metadata__", None)
        self.base = 8 + size
        self.tensors: dict[str, dict[str, Any]] = header

    def close(self) -> None:
        self.handle.close()

    def read(self, name: str, box: tuple[slice, ...], out: torch.Tensor) -> int:
        """Fill `out` with tensor `name`[box]; returns the bytes read. A box that is not a range of whole
        rows (FSDP2 shards dim 0, so it always is) is read row by row."""
        info = self.tensors[name]
        dtype, shape = _DTYPES[info["dtype"]], list(info["shape"])
        start = self.base + int(info["data_offsets"][0])
        row = torch.Size(shape[1:]).numel() * torch.empty((), dtype=dtype).element_size()
        rows = box[0] if box else slice(0, 1)
        whole_rows = all(b.start == 0 and b.stop == n for b, n in zip(box[1:], shape[1:], strict=True))
        if not whole_rows:
            raise TerminalError(f"{name}: a shard that is not whole rows ({box}) cannot be read by range")
        count = (rows.stop - rows.start) * row
        direct = out.device.type == "cpu" and out.dtype == dtype and out.is_contiguous()
        target = out if direct else torch.empty(out.shape, dtype=dtype)
        self.handle.seek(start + rows.start * row)
        view = memoryview(target.view(torch.uint8).numpy() if target.dtype != torch.bool else target.numpy()).cast("B")
        got = self.handle.readinto(view)
        if got != count:
            raise TerminalError(f"{self.path}: {name} is cut short ({got} of {count} bytes)")
        if not direct:
            out.copy_(target.to(out.dtype))
        return count


def nonfinite_share(directory: Path, rank: int, world: int, chunk_bytes: int = 64 << 20) -> tuple[str, str] | None:
    """(name, what is wrong) of the first floating-point tensor in `directory`'s *.safetensors holding NaN
    or inf in this rank's share of its rows (dim 0 split evenly over `world` ranks), else None. Read by
    byte range, at most `chunk_bytes` of rows at a time: together the ranks check every value once, and
    none ever holds a whole tensor."""
    for path in sorted(directory.glob("*.safetensors")):
        fh = WeightFile(path)
        try:
            for name, info in fh.tensors.items():
                dtype = _DTYPES.get(info["dtype"])
                if dtype is None or not dtype.is_floating_point:
                    continue
                shape = list(info["shape"]) or [1]
                rows = shape[0]
                lo, hi = rows * rank // world, rows * (rank + 1) // world
                row_bytes = max(1, torch.Size(shape[1:]).numel() * torch.empty((), dtype=dtype).element_size())
                step = max(1, chunk_bytes // row_bytes)
                nan = inf = 0
                for start in range(lo, hi, step):
                    stop = min(hi, start + step)
                    box = (slice(start, stop), *(slice(0, n) for n in shape[1:]))  # a scalar: its one "row"
                    part = torch.empty((stop - start, *shape[1:]), dtype=dtype)
                    fh.read(name, box, part)
                    bad = ~torch.isfinite(part)
                    if bool(bad.any()):
                        n_nan = int(torch.isnan(part).sum())
                        nan, inf = nan + n_nan, inf + int(bad.sum()) - n_nan
                if nan or inf:
                    return name, f"{nan} NaN and {inf} inf in its rows {lo}..{hi - 1}"
        finally:
            fh.close()
    return None


def _local_box(param: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """(the tensor this rank fills, its offset in the global tensor): a DTensor's local shard, or the whole."""
    if hasattr(param, "to_local"):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        local = param.to_local()
        if tuple(local.shape) != tuple(shape):
            raise TerminalError(f"unexpected local shard shape {tuple(local.shape)} (expected {tuple(shape)})")
        return local, tuple(offset)
    return param.data, (0,) * param.dim()


def _slices(local: torch.Tensor, offset: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(o, o + n) for o, n in zip(offset, local.shape, strict=True))


def load_shards(module: nn.Module, model_dir: Path, device: torch.device, prefix: str = "lm.") -> dict[str, int]:
    """Materialise `module` (its parameters on meta, possibly FSDP2-sharded) on `device` from the
    safetensors in `model_dir`: each rank reads only its shard of each tensor. Parameter names under
    `prefix` are the files' names (ScoringModel keeps the HF model at .lm). Returns this call's counts."""
    kept = {name: t.detach().clone() for name, t in list(module.named_parameters()) + list(module.named_buffers())
            if _local_box(t)[0].device.type != "meta"}
    module.to_empty(device=device)
    files = _weight_files(model_dir)
    handles: dict[Path, WeightFile] = {}
    stats = {"bytes_read": 0, "largest_read": 0, "tensors": 0}
    try:
        with torch.no_grad():
            for name, param in module.named_parameters():
                local, offset = _local_box(param)
                if local.numel() == 0:
                    continue
                box = _slices(local, offset)
                key = file_key(name[len(prefix):]) if name.startswith(prefix) else None
                if name in kept:
                    source = kept[name]
                    local.copy_(_local_box(source)[0] if hasattr(source, "to_local") else source[box])
                elif key is not None and key in files:
                    path = files[key]
                    if path not in handles:
                        handles[path] = WeightFile(path)
                    shape = tuple(handles[path].tensors[key]["shape"])
                    if shape != tuple(param.shape):
                        raise TerminalError(f"{name}: the weights hold {shape} where the model has {tuple(param.shape)}",
                                            hint="the weights do not match the model's config")
                    read = handles[path].read(key, box, local)  # only this rank's rows
                    stats["bytes_read"] += read
                    stats["largest_read"] = max(stats["largest_read"], read)
                    stats["tensors"] += 1
                else:
                    raise TerminalError(f"parameter {name} is in neither {model_dir}'s weights nor the model as built",
                                        hint="the weights do not match the model's config")
            for name, buf in module.named_buffers():
                if name in kept:
                    buf.copy_(kept[name])
    finally:
        for handle in handles.values():
            handle.close()
    for key, value in stats.items():
        LOAD_STATS[key] = LOAD_STATS[key] + value if key != "largest_read" else max(LOAD_STATS[key], value)
    return stats


__all__ = ["LOAD_STATS", "WeightFile", "nonfinite_share", "load_shards", "meta_parameters"]
