"""Trainer checkpoints and policy directories on disk (DESIGN.md §5, §10).

A checkpoint `CKPTDIR/step-NNNNNN/` is a loadable HF directory (config.json, model.safetensors, tokenizer
files) plus `optimizer.pt`, `scheduler.pt`, `rng.pt` and `state.json` {step, consumed_batches, config, ...}.
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

Non-finite weights are never written or published: `save_checkpoint` refuses a model with a NaN or inf
parameter, and `nonfinite_weight` finds the first such tensor in a directory's safetensors for `sync`.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arlctl.errors import TerminalError, TransientError, UsageError
from arlctl.io.fs import (
    download_dir,
    fsync_dir,
    get_fs,
    is_remote,
    join,
    list_files,
    read_bytes_or_none,
    upload_dir,
    write_bytes_whole,
)
from arlctl.models import sha256_file

STEP_RE = re.compile(r"^step-(\d{6,})$")
VERSION_RE = re.compile(r"^v(\d{6,})$")
STATE_FILE = "state.json"
TRAINER_ONLY = ("optimizer.pt", "scheduler.pt", "rng.pt", STATE_FILE)
HF_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt", "added_tokens.json")


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def version_dir_name(version: int) -> str:
    return f"v{version:06d}"


def checkpoint_location(ckpt_dir: str | Path, step: int) -> str:
    """Where step `step` lives: a local path or a URL."""
    if is_remote(ckpt_dir):
        return join(str(ckpt_dir), step_dir_name(step))
    return str(Path(ckpt_dir) / step_dir_name(step))


def list_complete_dirs(url: str, pattern: re.Pattern[str], marker: str) -> list[tuple[int, str]]:
    """On an object store: (number, URL) of the directories whose name matches and that hold `marker`."""
    found = []
    for rel in list_files(url):
        parts = rel.split("/")
        match = pattern.match(parts[0])
        if match and len(parts) == 2 and parts[1] == marker:
            found.append((int(match.group(1)), join(url, parts[0])))
    return sorted(found)


def list_checkpoints(ckpt_dir: str | Path) -> list[tuple[int, Path | str]]:
    """Complete checkpoints (visible name and a state.json), oldest first. URLs for object stores."""
    if is_remote(ckpt_dir):
        return list_complete_dirs(str(ckpt_dir), STEP_RE, STATE_FILE)
    root = Path(ckpt_dir)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = STEP_RE.match(entry.name)
        if match and (entry / STATE_FILE).is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def prune_checkpoints(ckpt_dir: str | Path, keep: int) -> list[int]:
    """Delete all but the newest `keep` complete checkpoints; returns the steps removed.

    Safe for every reader: a resume, `arlctl sync` and `arlctl filter` only ever use the newest complete
    checkpoint, and each checkpoint's state.json lists every batch consumed since step 0. The state file
    goes first, so a checkpoint interrupted half-way through deletion is already "incomplete" and ignored.
    """
    if keep < 1:
        raise UsageError("keep at least 1 checkpoint")
    removed = []
    for step, location in list_checkpoints(ckpt_dir)[:-keep]:
        if is_remote(ckpt_dir):
            store_remove(join(str(location), STATE_FILE))
            store_remove(str(location), recursive=True)
        else:
            (Path(location) / STATE_FILE).unlink(missing_ok=True)
            shutil.rmtree(location, ignore_errors=True)
        removed.append(step)
    return removed


def latest_checkpoint(ckpt_dir: str | Path) -> tuple[int, Path | str] | None:
    found = list_checkpoints(ckpt_dir)
    return found[-1] if found else None


def read_state(ckpt: Path | str) -> dict[str, Any]:
    if is_remote(ckpt):
        raw = read_bytes_or_none(join(str(ckpt), STATE_FILE))
        if raw is None:
            raise TerminalError(f"{ckpt} has no {STATE_FILE}: not a complete checkpoint")
        return json.loads(raw)
    return json.loads((Path(ckpt) / STATE_FILE).read_text())


@contextmanager
def local_copy(ckpt: Path | str | None) -> Iterator[Path | None]:
    """A local directory with the files of `ckpt`: itself when local, else a scratch download (removed after).

    The files listed in its state.json manifest are downloaded (all visible files for an older checkpoint)
    and their sizes checked, so a checkpoint overwritten or pruned during the download is an error, not a
    silent mix of two checkpoints.
    """
    if ckpt is None or not is_remote(ckpt):
        yield None if ckpt is None else Path(ckpt)
        return
    url = str(ckpt)
    state = read_state(url)
    expected = state.get("files") or {n: s for n, s in list_files(url).items() if n != STATE_FILE}
    names = sorted(expected)
    scratch = Path(tempfile.mkdtemp(prefix="arlctl-ckpt-"))
    try:
        download_dir(url, scratch, names)
        for name in names:
            if (scratch / name).stat().st_size != expected[name]:
                raise TransientError(f"{url}/{name} changed while it was downloaded",
                                    hint="another process rewrote this checkpoint; retry")
        (scratch / STATE_FILE).write_text(json.dumps(state, indent=1, sort_keys=True, default=str))
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


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


def save_checkpoint(ckpt_dir: str | Path, step: int, model: Any, tokenizer: Any, optimizer: Any, scheduler: Any,
                    state: dict[str, Any]) -> Path | str:
    """Write step-NNNNNN atomically: build a hidden temp dir, fsync, rename. Returns the final path.

    On an object store: build locally, upload, state.json last (see the module docstring); returns the URL.
    A model with a non-finite parameter is refused (TerminalError): such weights must never reach sync.
    """
    bad = first_nonfinite(model.state_dict().items())
    if bad is not None:
        raise TerminalError(f"refusing to save {step_dir_name(step)}: weight {bad[0]} holds {bad[1]}",
                            hint="the newest complete checkpoint is unchanged; lower --lr or --grad-clip")
    if is_remote(ckpt_dir):
        return _save_remote(str(ckpt_dir), step, model, tokenizer, optimizer, scheduler, state)
    root = Path(ckpt_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
    try:
        _write_files(tmp, model, tokenizer, optimizer, scheduler)
        write_text_durable(tmp / STATE_FILE, json.dumps(state, indent=1, sort_keys=True, default=str))
        if final.exists():  # a re-run after a crash between rename and the next step: same content
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(root)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _write_files(directory: Path, model: Any, tokenizer: Any, optimizer: Any, scheduler: Any) -> None:
    model.save_pretrained(directory, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    torch.save(optimizer.state_dict(), directory / "optimizer.pt")
    torch.save(scheduler.state_dict(), directory / "scheduler.pt")
    torch.save(rng_state(), directory / "rng.pt")


def _save_remote(ckpt_dir: str, step: int, model: Any, tokenizer: Any, optimizer: Any, scheduler: Any,
                 state: dict[str, Any]) -> str:
    final = join(ckpt_dir, step_dir_name(step))
    scratch = Path(tempfile.mkdtemp(prefix="arlctl-ckpt-"))
    try:
        _write_files(scratch, model, tokenizer, optimizer, scheduler)
        names = sorted(str(p.relative_to(scratch)) for p in scratch.rglob("*") if p.is_file())
        # The manifest: what a reader must find, and the weights' digest so sync need not download them.
        state = {**state, "files": {n: (scratch / n).stat().st_size for n in names},
                 "sha256": {n: sha256_file(scratch / n) for n in names if n.endswith(".safetensors")}}
        (scratch / STATE_FILE).write_text(json.dumps(state, indent=1, sort_keys=True, default=str))
        # A complete checkpoint of this step already there (a replay after a crash): make it invisible first.
        store_remove(join(final, STATE_FILE))
        upload_dir(scratch, final, [*names, STATE_FILE], last=STATE_FILE)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final


def store_remove(url: str, recursive: bool = False) -> None:
    """Delete an object (or a whole prefix) on a store; a missing one is fine."""
    fs, path = get_fs(url)
    try:
        fs.rm(path, recursive=recursive)
    except FileNotFoundError:
        pass
    fs.invalidate_cache(path)




def write_text_durable(path: Path, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def replace_text_atomic(path: Path, text: str) -> None:
    """Write `path` via a hidden temp file and os.replace: readers see the old or the new text, never half."""
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    write_text_durable(tmp, text)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_latest(policy_dir: str | Path, name: str) -> None:
    """Point POLICYDIR/LATEST at version `name`: os.replace locally, one PUT on an object store."""
    if is_remote(policy_dir):
        write_bytes_whole(join(str(policy_dir), "LATEST"), (name + "\n").encode())
    else:
        replace_text_atomic(Path(policy_dir) / "LATEST", name + "\n")


def read_latest(policy_dir: str | Path) -> str | None:
    """The version directory name in POLICYDIR/LATEST, or None when nothing is published."""
    if is_remote(policy_dir):
        raw = read_bytes_or_none(join(str(policy_dir), "LATEST"))
        name = raw.decode(errors="replace").strip() if raw is not None else ""
        return name if VERSION_RE.match(name) else None
    latest = Path(policy_dir) / "LATEST"
    if not latest.is_file():
        return None
    name = latest.read_text().strip()
    return name if VERSION_RE.match(name) else None


def resolve_policy_path(spec: str) -> Path:
    """An HF model directory for a --policy spec: policy dir (LATEST), HF/checkpoint dir, or model name.

    A URL (s3://bucket/run/policy) is resolved by the inference loader into its local cache.
    """
    if is_remote(spec):
        from arlctl.inference.loader import resolve_policy

        return resolve_policy(spec).path
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
    resolved = models.model_path(spec)
    if not (resolved / "config.json").is_file():
        raise TerminalError(f"model {spec!r} is not available locally", hint="run `arlctl model pull` first")
    return resolved
