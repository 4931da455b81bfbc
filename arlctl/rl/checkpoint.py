"""Trainer checkpoints and policy directories on disk (DESIGN.md §5, §10).

A checkpoint `CKPTDIR/step-NNNNNN/` is a loadable HF directory (config.json, model.safetensors, tokenizer
files) plus `optimizer.pt`, `scheduler.pt`, `rng.pt` and `state.json` {step, consumed_batches, config, ...}.
It is built in a hidden temporary directory beside it and renamed into place, so a visible step directory
is always complete; `state.json` is also written last, which is what "complete" means on object stores.

A policy directory `POLICYDIR/vNNNNNN/` holds the HF files and `version.json`; `POLICYDIR/LATEST` names
the current version and is replaced atomically. `resolve_policy_path` turns any `--policy` spec into an HF
directory: a policy dir (follows LATEST), a checkpoint or HF dir, or the embedded model's name.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arlctl.errors import TerminalError
from arlctl.io.fs import fsync_dir

STEP_RE = re.compile(r"^step-(\d{6,})$")
VERSION_RE = re.compile(r"^v(\d{6,})$")
STATE_FILE = "state.json"
HF_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt", "added_tokens.json")


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def version_dir_name(version: int) -> str:
    return f"v{version:06d}"


def list_checkpoints(ckpt_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints (visible name and a state.json), oldest first."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = STEP_RE.match(entry.name)
        if match and (entry / STATE_FILE).is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def latest_checkpoint(ckpt_dir: str | Path) -> tuple[int, Path] | None:
    found = list_checkpoints(ckpt_dir)
    return found[-1] if found else None


def read_state(ckpt: Path) -> dict[str, Any]:
    return json.loads((ckpt / STATE_FILE).read_text())


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


def save_checkpoint(ckpt_dir: str | Path, step: int, model: Any, tokenizer: Any, optimizer: Any, scheduler: Any,
                    state: dict[str, Any]) -> Path:
    """Write step-NNNNNN atomically: build a hidden temp dir, fsync, rename. Returns the final path."""
    root = Path(ckpt_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        write_text_durable(tmp / STATE_FILE, json.dumps(state, indent=1, sort_keys=True, default=str))
        if final.exists():  # a re-run after a crash between rename and the next step: same content
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(root)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


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


def read_latest(policy_dir: str | Path) -> str | None:
    """The version directory name in POLICYDIR/LATEST, or None when nothing is published."""
    latest = Path(policy_dir) / "LATEST"
    if not latest.is_file():
        return None
    name = latest.read_text().strip()
    return name if VERSION_RE.match(name) else None


def resolve_policy_path(spec: str) -> Path:
    """An HF model directory for a --policy spec: policy dir (LATEST), HF/checkpoint dir, or model name."""
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
