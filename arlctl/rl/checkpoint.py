"""Trainer checkpoints and policy directories on disk (DESIGN.md §5, §10).

A checkpoint `CKPTDIR/step-NNNNNN/` is a loadable HF directory (config.json, model.safetensors, tokenizer
files) plus the trainer's state (arlctl/rl/trainer_state.py: DCP shards under `trainer/` and `scheduler.pt`;
older checkpoints hold `optimizer.pt` and `rng.pt`) and `state.json` {step, consumed_batches, config, files}.
It is built in a hidden temporary directory beside it and renamed into place, so a visible step directory
is always complete; `state.json` is also written last, which is what "complete" means on object stores.

On an object store (any fsspec URL: s3://, gs://, ...) there is no rename: the checkpoint is built in a
local scratch directory, its files are uploaded under their final keys, and `state.json` goes last with a
manifest of the files (sizes, sha256 of the weights). A step directory without state.json is an upload in
progress or an interrupted one: every reader ignores it, and the next save of that step overwrites it.
Resuming downloads the newest complete checkpoint into a scratch directory (`local_copy`).

A policy directory `POLICYDIR/vNNNNNN/` holds the HF files and `version.json`; `POLICYDIR/LATEST` names
the current version and is replaced atomically (one PUT on object stores). `resolve_policy_path` turns
any `--policy` spec into an HF directory: a policy dir (follows LATEST), a checkpoint or HF dir, the
embedded model's name, or a URL of any of these (downloaded into the loader's cache).

Non-finite weights are never written or published: the trainer (arlctl/rl/trainer_state.py `save`) refuses
a model with a NaN or inf parameter, and `nonfinite_weight` finds the first such tensor in a directory's
safetensors for `sync`. The trainer builds checkpoints; this module holds what readers and writers share.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arlctl.errors import TerminalError, UsageError
from arlctl.io import store
from arlctl.io.ledger import (
    STATE_FILE,
    list_checkpoints,
    read_latest,
    read_state,
    remove_checkpoint,
)
from arlctl.models import sha256_file

TRAINER_ONLY = ("optimizer.pt", "scheduler.pt", "rng.pt", STATE_FILE)
HF_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt", "added_tokens.json")


def prune_checkpoints(ckpt_dir: str | Path, keep: int) -> list[int]:
    """Delete all but the newest `keep` complete checkpoints; returns the steps removed.

    The newest *full* checkpoint always stays (a resume needs its optimizer state), even when newer
    weights-only ones (`train --publish-every`) fill the `keep` newest.
    Safe for every reader: a resume, `arlctl sync` and `arlctl filter` only ever use the newest complete
    checkpoint, and each checkpoint's state.json lists every batch consumed since step 0. The state file
    goes first, so a checkpoint interrupted half-way through deletion is already "incomplete" and ignored.
    """
    if keep < 1:
        raise UsageError("keep at least 1 checkpoint")
    removed = []
    found = list_checkpoints(ckpt_dir)
    newest_full = next((step for step, location in reversed(found) if read_state(location).get("full", True)), None)
    for step, location in found[:-keep]:
        if step == newest_full:  # weights-only checkpoints after it cannot be resumed from: it stays
            continue
        remove_checkpoint(location)
        removed.append(step)
    return removed


@contextmanager
def local_copy(ckpt: Path | str | None) -> Iterator[Path | None]:
    """A local directory with the files of `ckpt`: itself when local, else a scratch download (removed after).

    The files listed in its state.json manifest are downloaded (all visible files for an older checkpoint)
    and their sizes checked, so a checkpoint overwritten or pruned during the download is an error, not a
    silent mix of two checkpoints.
    """
    if ckpt is None:
        yield None
        return
    state = read_state(ckpt)
    expected = state.get("files") or {n: s for n, s in store.dir_files(ckpt).items() if n != STATE_FILE}
    with store.scratch_copy(ckpt, sorted(expected), sizes=expected) as local:
        if not (local / STATE_FILE).is_file():  # a scratch download: the manifest is not among its files
            (local / STATE_FILE).write_text(json.dumps(state, indent=1, sort_keys=True, default=str))
        yield local


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def first_nonfinite(tensors: Iterable[tuple[str, torch.Tensor]]) -> tuple[str, str] | None:
    """(name, what is wrong) of the first floating-point tensor holding NaN or inf, else None."""
    for name, tensor in tensors:
        if not tensor.is_floating_point():
            continue
        finite = torch.isfinite(tensor)
        if not bool(finite.all()):
            nan = int(torch.isnan(tensor).sum())
            return name, f"{nan} NaN and {int((~finite).sum()) - nan} inf of {tensor.numel()} values"
    return None


def nonfinite_weight(directory: Path) -> str | None:
    """A one-line description of the first non-finite tensor in `directory`'s *.safetensors, else None.

    Tensors are read one at a time (safetensors maps the file), so a large model needs little memory.
    """
    from safetensors import safe_open

    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as fh:
            names = fh.keys()  # a list, in the file's (sorted) order
            bad = first_nonfinite((name, fh.get_tensor(name)) for name in names)
        if bad is not None:
            return f"tensor {bad[0]} in {path.name} holds {bad[1]}"
    return None


def write_manifest(directory: Path, state: dict[str, Any], extra_files: dict[str, int] | None = None) -> None:
    """Write `state.json` into a checkpoint being built: `state` plus the manifest a reader checks.

    The manifest lists every file with its size (the ones in `directory`, and `extra_files` that the
    commit brings in from elsewhere: the ranks' DCP shards) and the sha256 of the weights, so `sync`
    need not read them again. It is the last file written: its presence is what "complete" means.
    """
    names = sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())
    files = {n: (directory / n).stat().st_size for n in names}
    files.update(extra_files or {})
    manifest = {**state, "files": files,
                "sha256": {n: sha256_file(directory / n) for n in names if n.endswith(".safetensors")}}
    (directory / STATE_FILE).write_text(json.dumps(manifest, indent=1, sort_keys=True, default=str))


def resolve_policy_path(spec: str) -> Path:
    """An HF model directory for a --policy spec: policy dir (LATEST), HF/checkpoint dir, or model name.

    Anything else (a URL such as s3://bucket/run/policy) is resolved by the inference loader, which
    downloads it into its local cache.
    """
    path = Path(spec).expanduser()
    if path.is_dir():
        latest = read_latest(path)
        if latest is not None:
            return path / latest
        if (path / "config.json").is_file():
            return path
        raise TerminalError(f"{spec} is neither a policy directory (no LATEST) nor an HF model directory",
                            hint="pass a model directory with config.json, or RUN/policy after `arlctl sync`")
    from arlctl import models

    if spec == "tiny":
        return models.tiny_model_dir()
    try:
        resolved = models.model_path(spec)
    except TerminalError:  # not an embedded model's name: a URL, or nothing the loader knows either
        from arlctl.inference.loader import resolve_policy

        return resolve_policy(spec).path
    if not (resolved / "config.json").is_file():
        raise TerminalError(f"model {spec!r} is not available locally", hint="run `arlctl model pull` first")
    return resolved


__all__ = ["HF_FILES", "TRAINER_ONLY", "first_nonfinite", "local_copy", "nonfinite_weight", "prune_checkpoints",
           "resolve_policy_path", "rng_state", "set_rng_state", "write_manifest"]
