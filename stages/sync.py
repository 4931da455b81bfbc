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

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arlctl.errors import TerminalError, UsageError
from arlctl.io import ledger, store
from arlctl.io.ledger import VERSION_FILE, list_versions, read_version_info, version_location
from arlctl.rl import checkpoint as ckpt
from arlctl.stages.configs import SyncConfig
from arlctl.stages.jobs import StageLoop, SyncOptions, loop_of
from arlctl.stages.results import SyncIO, SyncResult

TRAINER_ONLY = set(ckpt.TRAINER_ONLY)


def _hf_files(source: Path | str) -> dict[str, int]:
    """{name: size} of the files of a checkpoint that inference needs."""
    return {n: s for n, s in store.dir_files(source).items() if n not in TRAINER_ONLY}


def _source_name(source: Path | str) -> str:
    return str(Path(source).resolve()) if isinstance(source, Path) else str(source)


WEIGHT_FILES = ("model.safetensors", "adapter_model.safetensors")  # a whole model, or a LoRA adapter directory


def _weights_file(files: dict[str, int]) -> str | None:
    return next((n for n in WEIGHT_FILES if n in files), None)


def _weights_digest(source: Path | str, name: str = "model.safetensors") -> str:
    """sha256 of the checkpoint's weights: from its state.json manifest when there, else read once."""
    state = ledger.read_state(source) if store.is_committed(source, ledger.STATE_FILE) else {}
    digest = (state.get("sha256") or {}).get(name)
    return digest or store.sha256(store.child(source, name))


def publish(source: Path | str, step: int, policy_dir: Path | str) -> tuple[Path | str, bool]:
    """Copy a checkpoint's HF files to policy_dir/vNNNNNN, version.json last. Returns (path, newly written).

    Local: built hidden and renamed into place. Object store: the files under their final keys (a
    server-side copy from the same store), version.json last (arlctl/io/store.py commit_dir).
    """
    name = ledger.version_dir_name(step)
    final = store.child(policy_dir, name)
    if read_version_info(policy_dir, name) is not None:
        return final, False
    files = _hf_files(source)
    weights = _weights_file(files)
    if weights is None:
        raise TerminalError(f"{source} has no model.safetensors", hint="only train checkpoints can be published")
    info = {"version": step, "step": step, "source_checkpoint": _source_name(source),
            "sha256": _weights_digest(source, weights), "created_at": time.time()}
    if weights != "model.safetensors":  # train --publish-format adapter: vLLM loads it beside its base
        info["adapter"] = True

    def build(directory: Path) -> None:
        (directory / VERSION_FILE).write_text(json.dumps(info, indent=1, sort_keys=True))

    return store.commit_dir(build, final, VERSION_FILE, copy_from=(source, sorted(files))), True


def check_finite_weights(source: Path | str) -> None:
    """Raise TerminalError when a tensor in the checkpoint's safetensors holds NaN or inf."""
    weights = sorted(n for n in _hf_files(source) if n.endswith(".safetensors"))
    with store.scratch_copy(source, weights) as local:  # the weights must be read to be trusted
        bad = ckpt.nonfinite_weight(local)
    if bad is not None:
        raise TerminalError(f"refusing to publish {source}: {bad}; LATEST unchanged",
                            hint="these weights are broken; train on from an earlier checkpoint "
                                 "(move this one aside) and check the train metrics' last_error")


def sync(ckpt_dir: str, policy_dir: str, keep: int = 3, dry_run: bool = False) -> dict[str, Any]:
    """Publish the newest complete checkpoint, point LATEST at it, prune old versions. Returns a summary."""
    if keep < 1:
        raise UsageError("--keep must be >= 1")
    latest = ledger.latest_checkpoint(ckpt_dir)
    if latest is None:
        # Nothing trained yet is not a failure: a loop or cron run simply has nothing to publish.
        return {"version": None, "path": None, "source_checkpoint": None, "previous": ledger.read_latest(policy_dir),
                "published": False, "latest_updated": False, "stale": False, "removed": [], "would_publish": False,
                "nothing_to_do": f"no complete checkpoint in {ckpt_dir}"}
    step, source = latest
    root = store.location(policy_dir)
    name = ledger.version_dir_name(step)
    current = ledger.read_latest(root)
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
        ledger.write_latest(root, name)  # after the version is complete: readers never follow LATEST to a gap
        summary["latest_updated"] = True
    summary["removed"] = prune(root, keep)
    summary["sha256"] = read_version_info(root, name)["sha256"]
    return summary


def prune(policy_dir: Path | str, keep: int) -> list[str]:
    """Remove all but the newest `keep` versions; the one LATEST names is always kept.

    version.json goes first (store.remove_dir): from then on no reader lists or follows the version."""
    latest = ledger.read_latest(policy_dir)
    versions = list_versions(policy_dir)
    removed = []
    for version, path in versions[:-keep] if len(versions) > keep else []:
        name = ledger.version_dir_name(version)
        if name == latest:
            continue
        ledger.remove_version(path)
        removed.append(name)
    return removed


def run(cfg: SyncConfig, io: SyncIO, stop: threading.Event | None = None) -> SyncResult:
    """The stage's entry point: one `sync` (a single publish is its unit, so `stop` has nothing to cut)."""
    cfg.check()
    return SyncResult.from_summary(sync(io.ckpt, io.policy_dir, keep=cfg.keep, dry_run=io.dry_run))


@dataclass(kw_only=True)
class SyncJob(StageLoop):
    """One `arlctl sync` invocation: the settings, the checkpoints it reads and the policy dir it writes, and
    how it runs."""

    cfg: SyncConfig
    io: SyncIO


def plan_sync(cfg: SyncConfig, opts: SyncOptions) -> SyncJob:
    """Check the settings, then the IO (--ckpt/--policy-dir or --run); nothing is written."""
    from arlctl.io.run import resolve_io

    if opts.run is None and (opts.ckpt is None or opts.policy_dir is None):
        raise UsageError("give --ckpt and --policy-dir, or --run RUN")
    cfg.check()  # a wrong setting is named before the IO is looked at
    ckpt_dir, policy_dir = resolve_io("sync", opts.run, opts.ckpt, opts.policy_dir, watch=opts.watch,
                                      flags=("--ckpt", "--policy-dir"))
    io = SyncIO(ckpt=ckpt_dir, policy_dir=policy_dir, dry_run=opts.dry_run)
    return SyncJob(cfg=cfg, io=io, **loop_of(opts))


def run_job(job: SyncJob, on_round: Callable[[SyncResult], None] | None = None) -> list[SyncResult]:
    """Publish what is new (with --watch: every --poll s until SIGTERM/SIGINT) under the run lock, then ask
    the --notify servers to load a version that became LATEST; each round's result, in order (`on_round`
    sees each as it ends, before a failed notify raises TransientError naming the servers that failed)."""
    from arlctl.io.stage_loop import run_stage

    results: list[SyncResult] = []

    def once(stop: Any) -> dict[str, Any]:
        result = run(job.cfg, job.io, stop)
        results.append(result)
        notify = (job.cfg.notify and result.version is not None and not job.io.dry_run and not result.stale
                  and (not job.watch or result.latest_updated))
        try:
            if notify:
                import asyncio

                from arlctl.inference.openai import notify_reload

                result.notified = asyncio.run(notify_reload(job.cfg.notify, str(result.path),
                                                            flavor=job.cfg.notify_flavor))
        finally:  # the publication is shown even when a server failed to reload it
            if on_round is not None:
                on_round(result)
        return result.to_json()

    run_stage(once, out=job.io.policy_dir, lock_name="sync", watch=job.watch, poll=job.poll,
              lock_wait=job.lock_wait, dry_run=job.io.dry_run,
              units=lambda summary: int(bool(summary.get("latest_updated"))))
    return results
