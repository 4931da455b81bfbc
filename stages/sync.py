"""The sync stage: publish the newest complete checkpoint as a policy version (DESIGN.md §10).

POLICYDIR/vNNNNNN/ (N = the checkpoint's step) holds the HF files of the checkpoint — config.json,
model.safetensors, tokenizer files and chat template — and version.json {version, step,
source_checkpoint, sha256 of model.safetensors, created_at}. It is copied into a hidden temporary
directory and renamed into place; then POLICYDIR/LATEST is replaced atomically to name it. Only the
newest --keep versions stay. Publishing is idempotent: a version that already exists is not rewritten.

On an object store (POLICYDIR = s3://bucket/run/policy, or any fsspec URL) there is no rename: the HF
files are copied under vNNNNNN/ (server-side when the checkpoint is on the same store), version.json is
written last and is what makes a version visible, and LATEST is one small PUT after it. Pruning deletes
version.json first, so a version being removed is never half-visible. Checkpoints and policy directory
may be on different stores (local checkpoints, S3 policy; or the reverse).

The optimizer, scheduler and RNG files of a checkpoint are not published: inference never needs them.

Non-finite weights are never published (DESIGN.md §9): before a version is written or LATEST moves, every
tensor of the checkpoint's safetensors is checked, and one holding NaN or inf is a TerminalError naming
the checkpoint and the tensor; LATEST keeps naming the last good version. (A checkpoint on an object
store is downloaded for this check: the weights must be read to be trusted.)
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
from arlctl.io.fs import download_dir, get_fs, is_remote, join, list_files, read_bytes_or_none, upload_dir
from arlctl.rl import checkpoint as ckpt

TRAINER_ONLY = set(ckpt.TRAINER_ONLY)
VERSION_FILE = "version.json"


def sha256_file(path: Path) -> str:
    return ckpt.sha256_file(path)


def list_versions(policy_dir: str | Path) -> list[tuple[int, Path | str]]:
    """Published versions (visible vNNNNNN dirs with a version.json), oldest first. URLs on object stores."""
    if is_remote(policy_dir):
        return ckpt.list_complete_dirs(str(policy_dir), ckpt.VERSION_RE, VERSION_FILE)
    root = Path(policy_dir)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = ckpt.VERSION_RE.match(entry.name)
        if match and (entry / VERSION_FILE).is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def version_location(policy_dir: str | Path, name: str) -> str:
    return join(str(policy_dir), name) if is_remote(policy_dir) else str(Path(policy_dir) / name)


def read_version_info(policy_dir: str | Path, name: str) -> dict[str, Any] | None:
    """version.json of a published version, or None when that version is not (completely) published."""
    if is_remote(policy_dir):
        raw = read_bytes_or_none(join(str(policy_dir), name, VERSION_FILE))
        return json.loads(raw) if raw is not None else None
    path = Path(policy_dir) / name / VERSION_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _hf_files(source: Path | str) -> dict[str, int]:
    """{name: size} of the files of a checkpoint that inference needs."""
    if is_remote(source):
        files = list_files(str(source))
    else:
        files = {e.name: e.stat().st_size for e in Path(source).iterdir() if e.is_file()}
    return {n: s for n, s in files.items()
            if n not in TRAINER_ONLY and not os.path.basename(n).startswith(".") and "/" not in n}


def _source_name(source: Path | str) -> str:
    return str(source) if is_remote(source) else str(Path(source).resolve())


def publish(source: Path | str, step: int, policy_dir: Path | str) -> tuple[Path | str, bool]:
    """Copy a checkpoint's HF files to policy_dir/vNNNNNN atomically. Returns (path, newly written)."""
    if is_remote(policy_dir):
        return _publish_to_store(source, step, str(policy_dir))
    policy_dir = Path(policy_dir)
    final = policy_dir / ckpt.version_dir_name(step)
    if (final / VERSION_FILE).is_file():
        return final, False
    files = _hf_files(source)
    if "model.safetensors" not in files:
        raise TerminalError(f"{source} has no model.safetensors", hint="only train checkpoints can be published")
    policy_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=policy_dir))
    try:
        if is_remote(source):
            download_dir(str(source), tmp, sorted(files))
        else:
            for name in sorted(files):
                shutil.copy2(Path(source) / name, tmp / name)
        info = {"version": step, "step": step, "source_checkpoint": _source_name(source),
                "sha256": sha256_file(tmp / "model.safetensors"), "created_at": time.time()}
        ckpt.write_text_durable(tmp / VERSION_FILE, json.dumps(info, indent=1, sort_keys=True))
        if final.exists():  # a leftover without version.json: an interrupted manual copy
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final, True


def _publish_to_store(source: Path | str, step: int, policy_dir: str) -> tuple[str, bool]:
    """publish() onto an object store: HF files under their final keys, version.json last."""
    name = ckpt.version_dir_name(step)
    final = join(policy_dir, name)
    if read_version_info(policy_dir, name) is not None:
        return final, False
    files = _hf_files(source)
    if "model.safetensors" not in files:
        raise TerminalError(f"{source} has no model.safetensors", hint="only train checkpoints can be published")
    names = sorted(files)
    fs, dest = get_fs(final)
    scratch = Path(tempfile.mkdtemp(prefix="arlctl-sync-"))
    try:
        if is_remote(source) and get_fs(str(source))[0] is fs:
            # Same store: a server-side copy; the digest comes from the checkpoint's manifest when it has one.
            src = get_fs(str(source))[1].rstrip("/")
            fs.copy([f"{src}/{n}" for n in names], [f"{dest}/{n}" for n in names])
            digest = ckpt.read_state(source).get("sha256", {}).get("model.safetensors")
            if digest is None:
                with fs.open(f"{src}/model.safetensors", "rb") as fh:
                    digest = hashlib.file_digest(fh, "sha256").hexdigest()
        else:
            local = Path(source)
            if is_remote(source):  # another store: through this machine
                download_dir(str(source), scratch, names)
                local = scratch
            upload_dir(local, final, names)
            digest = sha256_file(local / "model.safetensors")
        info = {"version": step, "step": step, "source_checkpoint": _source_name(source), "sha256": digest,
                "created_at": time.time()}
        (scratch / VERSION_FILE).write_text(json.dumps(info, indent=1, sort_keys=True))
        upload_dir(scratch, final, [VERSION_FILE])  # last: the version is visible from here on
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final, True


def check_finite_weights(source: Path | str) -> None:
    """Raise TerminalError when a tensor in the checkpoint's safetensors holds NaN or inf."""
    if is_remote(source):
        scratch = Path(tempfile.mkdtemp(prefix="arlctl-sync-check-"))
        try:
            download_dir(str(source), scratch, sorted(n for n in _hf_files(source) if n.endswith(".safetensors")))
            bad = ckpt.nonfinite_weight(scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    else:
        bad = ckpt.nonfinite_weight(Path(source))
    if bad is not None:
        raise TerminalError(f"refusing to publish {source}: {bad}; LATEST unchanged",
                            hint="these weights are broken; train on from an earlier checkpoint "
                                 "(move this one aside) and check the train metrics' last_error")


def sync(ckpt_dir: str, policy_dir: str, keep: int = 3, dry_run: bool = False) -> dict[str, Any]:
    """Publish the newest complete checkpoint, point LATEST at it, prune old versions. Returns a summary."""
    if keep < 1:
        raise UsageError("--keep must be >= 1")
    latest = ckpt.latest_checkpoint(ckpt_dir)
    if latest is None:
        # Nothing trained yet is not a failure: a loop or cron run simply has nothing to publish.
        return {"version": None, "path": None, "source_checkpoint": None, "previous": ckpt.read_latest(policy_dir),
                "published": False, "latest_updated": False, "stale": False, "removed": [], "would_publish": False,
                "nothing_to_do": f"no complete checkpoint in {ckpt_dir}"}
    step, source = latest
    root = policy_dir if is_remote(policy_dir) else Path(policy_dir)
    name = ckpt.version_dir_name(step)
    current = ckpt.read_latest(root)
    summary: dict[str, Any] = {"version": step, "path": version_location(root, name), "source_checkpoint": str(source),
                               "previous": current, "published": False, "latest_updated": False, "stale": False,
                               "removed": []}
    stale = current is not None and int(current[1:]) > step
    published = read_version_info(root, name) is not None
    if not stale and not (published and current == name):
        check_finite_weights(source)  # before anything is written: LATEST stays on the last good version
    if dry_run:
        summary["would_publish"] = not published
        summary["would_update_latest"] = current != name
        return summary
    if stale:
        # Never move LATEST backwards: a stale checkpoint dir must not roll inference back to older weights.
        summary["stale"] = True
        summary["removed"] = prune(root, keep)
        return summary
    started = time.perf_counter()
    _, summary["published"] = publish(source, step, root)
    summary["publish_s"] = time.perf_counter() - started
    if current != name:
        ckpt.write_latest(root, name)  # after the version is complete: readers never follow LATEST to a gap
        summary["latest_updated"] = True
    summary["removed"] = prune(root, keep)
    summary["sha256"] = read_version_info(root, name)["sha256"]
    return summary


def prune(policy_dir: Path | str, keep: int) -> list[str]:
    """Remove all but the newest `keep` versions; the one LATEST names is always kept."""
    latest = ckpt.read_latest(policy_dir)
    versions = list_versions(policy_dir)
    removed = []
    for _, path in versions[:-keep] if len(versions) > keep else []:
        name = os.path.basename(str(path).rstrip("/"))
        if name == latest:
            continue
        if is_remote(policy_dir):
            # version.json first: from then on no reader lists or follows this version, then the rest.
            ckpt.store_remove(join(str(path), VERSION_FILE))
            ckpt.store_remove(str(path), recursive=True)
        else:
            # Rename first so a reader never sees a half-deleted version under its real name.
            doomed = Path(policy_dir) / f".{name}.deleting-{os.getpid()}"
            os.replace(path, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
        removed.append(name)
    return removed
