"""The whole run directory on S3 (moto's server on 127.0.0.1): checkpoints, policy versions and the loop.

Object stores have no rename: a checkpoint is committed by its state.json, a policy version by its
version.json, both written last, and LATEST is one PUT after the version is complete. These tests check
that readers only ever see complete directories, that train resumes from S3 without training a batch
twice, and that rollout loads `--policy s3://...` through the local cache.
"""

from __future__ import annotations

import json
import re
import shutil

import fsspec
import pytest
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.inference.loader import latest_version, latest_version_dir, remote_cache_dir, resolve_policy
from arlctl.io import ledger
from arlctl.io.ledger import list_versions
from arlctl.io.shards import list_shards, read_shard, scan
from arlctl.models import tiny_model_dir
from arlctl.rl import checkpoint as ckpt
from arlctl.stages.sync import sync

runner = CliRunner()


def arlctl(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def s3() -> fsspec.AbstractFileSystem:
    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    return fs


def keys(url: str) -> list[str]:
    """Every object under url, relative to it."""
    root = url.removeprefix("s3://").rstrip("/")
    return sorted(k[len(root) + 1:] for k in s3().find(root))


def upload_fake_checkpoint(ckpt_url: str, step: int, complete: bool = True) -> None:
    """A checkpoint as train uploads it: the tiny model's HF files, trainer files, state.json last."""
    fs = s3()
    dest = f"{ckpt_url.removeprefix('s3://')}/step-{step:06d}"
    for path in sorted(tiny_model_dir().iterdir()):
        if path.is_file():
            fs.put_file(str(path), f"{dest}/{path.name}")
    fs.pipe_file(f"{dest}/optimizer.pt", b"trainer state")
    if complete:
        fs.pipe_file(f"{dest}/state.json", json.dumps({"step": step, "consumed_batches": []}).encode())


@pytest.mark.slow
def test_sync_between_s3_dirs_and_loader_cache(s3_bucket):
    ckpts, policy = f"{s3_bucket}/run/checkpoints", f"{s3_bucket}/run/policy"
    upload_fake_checkpoint(ckpts, 1)
    upload_fake_checkpoint(ckpts, 2, complete=False)  # no state.json: an upload in progress
    assert [s for s, _ in ledger.list_checkpoints(ckpts)] == [1]
    assert latest_version(policy) is None

    summary = sync(ckpts, policy)
    assert summary["published"] and summary["latest_updated"] and summary["version"] == 1
    assert keys(f"{policy}/v000001") == sorted(["version.json", *(p.name for p in tiny_model_dir().iterdir())])
    info = json.loads(s3().cat_file(f"{policy.removeprefix('s3://')}/v000001/version.json"))
    assert info["source_checkpoint"] == f"{ckpts}/step-000001" and len(info["sha256"]) == 64
    assert s3().cat_file(f"{policy.removeprefix('s3://')}/LATEST") == b"v000001\n"
    assert not sync(ckpts, policy)["published"]  # idempotent

    # The loader: LATEST -> a verified local cache entry; the policy dir stays a URL for reloads.
    cache = remote_cache_dir(policy)
    try:
        resolved = resolve_policy(policy)
        assert resolved.version == 1 and resolved.policy_dir == policy and resolved.name == policy
        assert resolved.path == cache / "v000001" and (resolved.path / "model.safetensors").is_file()
        assert (resolved.path / "model.safetensors").read_bytes() == (tiny_model_dir() / "model.safetensors").read_bytes()
        assert not (resolved.path / "optimizer.pt").exists()
        assert resolve_policy(f"{s3_bucket}/run").path == resolved.path  # the run dir works too
        assert [p.name for p in cache.iterdir()] == ["v000001"]  # no temp dirs left in the cache

        # --keep prunes on S3; LATEST moves on only after the new version is complete.
        for step in (2, 3):
            upload_fake_checkpoint(ckpts, step)
            sync(ckpts, policy, keep=2)
        assert [v for v, _ in list_versions(policy)] == [2, 3]
        assert not [k for k in keys(policy) if k.startswith("v000001")]
        assert latest_version(policy) == 3
        assert latest_version_dir(policy) == cache / "v000003"
    finally:
        shutil.rmtree(cache, ignore_errors=True)


@pytest.mark.integration
def test_loop_on_s3(s3_bucket):
    """rollout -> reward -> filter -> train -> sync -> rollout --policy s3://..., and resume from S3."""
    run = f"{s3_bucket}/run"

    def rollout(policy: str, i: int) -> dict:
        return arlctl("rollout", "--env", "first-token", "--tasks", f"builtin:first-token?n=12&seed={i}",
                      "--policy", policy, "--run", run, "-G", "4", "--max-turns", "1", "--max-new-tokens", "1",
                      "--seed", str(i), "--prefix", f"it{i:04d}", "--flush-groups", "1000", "-q")

    rollout("tiny", 0)
    assert arlctl("reward", "--run", run, "--reward", "first-token")["rows"] == 48
    arlctl("filter", "--run", run, "--batch-groups", "2", "--policy-dir", f"{run}/policy")
    batches = [u.rsplit("/", 1)[1] for u in scan(f"{run}/batches").shards]
    assert len(batches) >= 2, batches

    # One step now: the checkpoint is uploaded, state.json last.
    first = arlctl("train", "--run", run, "--policy", "tiny", "--lr", "1e-2", "--max-steps", "1")
    assert first["steps"] == 1 and first["checkpoint"] == f"{run}/checkpoints/step-000001"
    print(f"checkpoint upload of the tiny model to moto: {first['save_s']:.2f}s")
    synced = arlctl("sync", "--run", run)
    assert synced["published"] and synced["path"] == f"{run}/policy/v000001"
    print(f"sync S3 -> S3 (server-side copy): {synced['publish_s']:.2f}s")

    # The second rollout loads the published version from S3 and records it.
    cache = remote_cache_dir(f"{run}/policy")
    try:
        second = rollout(f"{run}/policy", 1)
        assert second["trajectories"] == 48
        table = read_shard([u for u in list_shards(f"{run}/rollouts") if "/it0001-" in u][0])
        assert set(table.column("policy_version").to_pylist()) == {1}
        assert set(table.column("policy").to_pylist()) == {f"{run}/policy"}
        assert (cache / "v000001" / "version.json").is_file()
    finally:
        shutil.rmtree(cache, ignore_errors=True)

    # Resume from S3: the rest of the batches, each once; then nothing at all.
    rest = arlctl("train", "--run", run, "--policy", "tiny", "--lr", "1e-2")
    assert rest["resumed_from"] == 1 and rest["steps"] == len(batches) - 1 and rest["batches"] == batches[1:]
    again = arlctl("train", "--run", run, "--policy", "tiny")
    assert again["steps"] == 0 and again["batches"] == []
    step, newest = ledger.latest_checkpoint(f"{run}/checkpoints")
    state = ledger.read_state(newest)
    assert step == len(batches) and state["consumed_batches"] == batches
    assert sorted(state["files"]) == [k for k in keys(newest) if k != "state.json"]  # the manifest is whole
    assert arlctl("sync", "--run", run, "--keep", "1")["removed"] == ["v000001"]
    assert resolve_policy(run).version == step
    shutil.rmtree(remote_cache_dir(f"{run}/policy"), ignore_errors=True)

    # Readers see only complete directories: no temp objects anywhere, every step/version has its marker.
    everything = keys(run)
    dcp_metadata = re.compile(r"^checkpoints/step-\d+/trainer/\.metadata$")  # torch.distributed.checkpoint's own name
    assert not [k for k in everything if any(part.startswith(".") for part in k.split("/"))
                and not dcp_metadata.match(k)], everything
    steps = {k.split("/")[1] for k in everything if k.startswith("checkpoints/step-")}
    assert steps == {f"step-{s:06d}" for s in range(1, step + 1)}
    assert all(f"checkpoints/{s}/state.json" in everything for s in steps)
    versions = {k.split("/")[1] for k in everything if k.startswith("policy/v")}
    assert versions == {f"v{step:06d}"} and f"policy/v{step:06d}/version.json" in everything
    assert s3().cat_file(f"{run.removeprefix('s3://')}/policy/LATEST").decode().strip() == f"v{step:06d}"


@pytest.mark.slow
def test_train_resume_from_s3_is_bit_exact(s3_bucket, tmp_path):
    """A crash after step 2's upload, then a resume that downloads it: the same weights as local, straight."""
    import torch
    from safetensors.torch import load_file
    from test_train import CFG, Crash, make_batches  # the train tests' own batch builder (same directory)

    from arlctl.rl.config import TrainConfig
    from arlctl.stages.train import train

    batches = make_batches(tmp_path, 4)
    policy = str(tiny_model_dir())
    straight = train(batches, policy, str(tmp_path / "straight"), TrainConfig(**CFG))
    out = f"{s3_bucket}/run/checkpoints"

    def crash(step, metrics):
        if step == 3:
            raise Crash

    with pytest.raises(Crash):
        train(batches, policy, out, TrainConfig(**CFG), on_step=crash)
    assert [s for s, _ in ledger.list_checkpoints(out)] == [2]
    resumed = train(batches, policy, out, TrainConfig(**CFG))
    assert resumed["resumed_from"] == 2 and resumed["steps"] == straight["steps"] - 2

    a = load_file(str(tmp_path / "straight" / "step-000004" / "model.safetensors"))
    with ckpt.local_copy(ledger.latest_checkpoint(out)[1]) as local:
        b = load_file(str(local / "model.safetensors"))
        assert ledger.read_state(local)["consumed_batches"] == [u.rsplit("/", 1)[1] for u in scan(batches).shards]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "resume from S3 must be bit-exact"
