"""The sync stage: publish the newest complete checkpoint as a policy version (DESIGN.md §10).

POLICYDIR/vNNNNNN/ (N = the checkpoint's step) holds the HF files of the checkpoint — config.json,
model.safetensors, tokenizer files and chat template — and version.json {version, step,
source_checkpoint, sha256 of model.safetensors, created_at}. It is copied into a hidden temporary
directory and renamed into place; then POLICYDIR/LATEST is replaced atomically to name it. Only the
newest --keep versions stay. Publishing is idempotent: a version that already exists is not rewritten.

The optimizer, scheduler and RNG files of a checkpoint are not published: inference never needs them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from arlctl.errors import TerminalError, UsageError
from arlctl.rl import checkpoint as ckpt

TRAINER_ONLY = {"optimizer.pt", "scheduler.pt", "rng.pt", ckpt.STATE_FILE}
VERSION_FILE = "version.json"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def list_versions(policy_dir: str | Path) -> list[tuple[int, Path]]:
    """Published versions (visible vNNNNNN dirs with a version.json), oldest first."""
    root = Path(policy_dir)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = ckpt.VERSION_RE.match(entry.name)
        if match and (entry / VERSION_FILE).is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def publish(source: Path, step: int, policy_dir: Path) -> tuple[Path, bool]:
    """Copy a checkpoint's HF files to policy_dir/vNNNNNN atomically. Returns (path, newly written)."""
    final = policy_dir / ckpt.version_dir_name(step)
    if (final / VERSION_FILE).is_file():
        return final, False
    weights = source / "model.safetensors"
    if not weights.is_file():
        raise TerminalError(f"{source} has no model.safetensors", hint="only train checkpoints can be published")
    policy_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=policy_dir))
    try:
        for entry in sorted(source.iterdir()):
            if entry.is_file() and entry.name not in TRAINER_ONLY and not entry.name.startswith("."):
                shutil.copy2(entry, tmp / entry.name)
        info = {"version": step, "step": step, "source_checkpoint": str(source.resolve()),
                "sha256": sha256_file(tmp / "model.safetensors"), "created_at": time.time()}
        ckpt.write_text_durable(tmp / VERSION_FILE, json.dumps(info, indent=1, sort_keys=True))
        if final.exists():  # a leftover without version.json: an interrupted manual copy
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final, True


def sync(ckpt_dir: str, policy_dir: str, keep: int = 3, dry_run: bool = False) -> dict[str, Any]:
    """Publish the newest complete checkpoint, point LATEST at it, prune old versions. Returns a summary."""
    if keep < 1:
        raise UsageError("--keep must be >= 1")
    latest = ckpt.latest_checkpoint(ckpt_dir)
    if latest is None:
        # Nothing trained yet is not a failure: a loop or cron run simply has nothing to publish.
        return {"version": None, "path": None, "source_checkpoint": None, "previous": ckpt.read_latest(Path(policy_dir)),
                "published": False, "latest_updated": False, "stale": False, "removed": [], "would_publish": False,
                "nothing_to_do": f"no complete checkpoint in {ckpt_dir}"}
    step, source = latest
    root = Path(policy_dir)
    name = ckpt.version_dir_name(step)
    current = ckpt.read_latest(root)
    summary: dict[str, Any] = {"version": step, "path": str(root / name), "source_checkpoint": str(source),
                               "previous": current, "published": False, "latest_updated": False, "stale": False,
                               "removed": []}
    if dry_run:
        summary["would_publish"] = not (root / name / VERSION_FILE).is_file()
        summary["would_update_latest"] = current != name
        return summary
    if current is not None and int(current[1:]) > step:
        # Never move LATEST backwards: a stale checkpoint dir must not roll inference back to older weights.
        summary["stale"] = True
        summary["removed"] = prune(root, keep)
        return summary
    _, summary["published"] = publish(source, step, root)
    if current != name:
        ckpt.replace_text_atomic(root / "LATEST", name + "\n")
        summary["latest_updated"] = True
    summary["removed"] = prune(root, keep)
    summary["sha256"] = json.loads((root / name / VERSION_FILE).read_text())["sha256"]
    return summary


def prune(policy_dir: Path, keep: int) -> list[str]:
    """Remove all but the newest `keep` versions; the one LATEST names is always kept."""
    latest = ckpt.read_latest(policy_dir)
    versions = list_versions(policy_dir)
    removed = []
    for _, path in versions[:-keep] if len(versions) > keep else []:
        if path.name == latest:
            continue
        # Rename first so a reader never sees a half-deleted version under its real name.
        doomed = policy_dir / f".{path.name}.deleting-{os.getpid()}"
        os.replace(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(path.name)
    return removed
