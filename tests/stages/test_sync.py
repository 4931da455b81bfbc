"""The sync stage: publish vN + version.json, LATEST replaced atomically, --keep, idempotence, the CLI."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import typer
from typer.testing import CliRunner

from arlctl.cli.sync import register
from arlctl.io.ledger import list_versions, read_latest, trainer_version
from arlctl.models import tiny_model_dir
from arlctl.rl.checkpoint import resolve_policy_path
from arlctl.stages.sync import sync


def fake_checkpoint(ckpt_dir: Path, step: int, complete: bool = True) -> Path:
    """A checkpoint directory as train writes it: the tiny model's HF files plus trainer-only files."""
    path = ckpt_dir / f"step-{step:06d}"
    shutil.copytree(tiny_model_dir(), path)
    for name in ("optimizer.pt", "scheduler.pt", "rng.pt"):
        (path / name).write_bytes(b"trainer state")
    if complete:
        (path / "state.json").write_text(json.dumps({"step": step, "consumed_batches": []}))
    return path


def test_publish_newest_checkpoint(tmp_path):
    ckpts, policy = tmp_path / "checkpoints", tmp_path / "policy"
    fake_checkpoint(ckpts, 1)
    fake_checkpoint(ckpts, 2)
    fake_checkpoint(ckpts, 3, complete=False)  # no state.json: still being written
    summary = sync(str(ckpts), str(policy))
    assert summary["published"] and summary["latest_updated"] and summary["version"] == 2
    version = policy / "v000002"
    assert (policy / "LATEST").read_text() == "v000002\n"
    info = json.loads((version / "version.json").read_text())
    assert info["version"] == info["step"] == 2
    assert info["source_checkpoint"] == str((ckpts / "step-000002").resolve())
    assert info["sha256"] == hashlib.sha256((version / "model.safetensors").read_bytes()).hexdigest()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (version / name).is_file(), name
    assert not any((version / n).exists() for n in ("optimizer.pt", "scheduler.pt", "rng.pt", "state.json"))
    assert not [p for p in policy.iterdir() if p.name.startswith(".")], "no temp dirs left behind"
    assert resolve_policy_path(str(policy)) == version
    assert trainer_version(str(policy), None) == 2


def test_sync_is_idempotent(tmp_path):
    ckpts, policy = tmp_path / "checkpoints", tmp_path / "policy"
    fake_checkpoint(ckpts, 4)
    sync(str(ckpts), str(policy))
    stamp = (policy / "v000004" / "version.json").stat().st_mtime_ns
    again = sync(str(ckpts), str(policy))
    assert not again["published"] and not again["latest_updated"]
    assert (policy / "v000004" / "version.json").stat().st_mtime_ns == stamp


def test_keep_prunes_old_versions_and_latest_never_moves_back(tmp_path):
    ckpts, policy = tmp_path / "checkpoints", tmp_path / "policy"
    for step in range(1, 5):
        fake_checkpoint(ckpts, step)
        sync(str(ckpts), str(policy), keep=2)
    assert [v for v, _ in list_versions(policy)] == [3, 4]
    assert read_latest(policy) == "v000004"
    # A checkpoint directory that went back in time (restored from an older copy) must not roll back LATEST.
    shutil.rmtree(ckpts)
    fake_checkpoint(ckpts, 2)
    summary = sync(str(ckpts), str(policy), keep=2)
    assert summary["stale"] and not summary["published"] and read_latest(policy) == "v000004"
    assert "v000004" in [p.name for _, p in list_versions(policy)]


def test_no_checkpoint_is_nothing_to_do(tmp_path):
    summary = sync(str(tmp_path / "none"), str(tmp_path / "policy"))
    assert summary["version"] is None and not summary["published"] and not summary["latest_updated"]
    assert "no complete checkpoint" in summary["nothing_to_do"]
    assert not (tmp_path / "policy" / "LATEST").exists()
    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)
    (tmp_path / "empty").mkdir()  # a checkpoint directory train has not written a step into yet
    result = CliRunner().invoke(app, ["sync", "--ckpt", str(tmp_path / "empty"), "--policy-dir", str(tmp_path / "p")])
    assert result.exit_code == 0 and "nothing to do" in result.output
    # A --ckpt that does not exist is a mistake (issue 27: a missing input is a usage error), and makes nothing.
    result = CliRunner().invoke(app, ["sync", "--ckpt", str(tmp_path / "none"), "--policy-dir", str(tmp_path / "q")])
    assert result.exit_code == 2 and "does not exist" in result.output and not (tmp_path / "q").exists()


def test_cli(tmp_path):
    run = tmp_path / "run"
    fake_checkpoint(run / "checkpoints", 7)
    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)
    runner = CliRunner()
    dry = runner.invoke(app, ["sync", "--run", str(run), "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout.strip().splitlines()[-1])["would_publish"] and not (run / "policy").exists()
    res = runner.invoke(app, ["sync", "--run", str(run), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout.strip().splitlines()[-1])["published"]
    assert read_latest(run / "policy") == "v000007"
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    notify = runner.invoke(app, ["sync", "--run", str(run), "--notify", dead])
    # the publish stands; the unreachable server is a transient failure (exit 75) that names it
    assert notify.exit_code == 75 and dead in notify.output
    assert read_latest(run / "policy") == "v000007"


def test_the_job_checks_before_writing_and_a_failed_notify_still_shows_the_publication(tmp_path):
    import pytest

    from arlctl.errors import TransientError, UsageError
    from arlctl.stages.configs import SyncConfig
    from arlctl.stages.jobs import SyncOptions
    from arlctl.stages.sync import plan_sync, run_job

    with pytest.raises(UsageError, match="--keep"):  # a wrong setting before the IO is looked at
        plan_sync(SyncConfig(keep=0), SyncOptions(ckpt=str(tmp_path / "nowhere"), policy_dir="x"))
    with pytest.raises(UsageError, match="--notify-flavor"):
        plan_sync(SyncConfig(notify_flavor="tgi"), SyncOptions(ckpt=str(tmp_path), policy_dir="x"))
    with pytest.raises(UsageError, match="--ckpt and --policy-dir"):
        plan_sync(SyncConfig(), SyncOptions(ckpt=str(tmp_path)))
    with pytest.raises(UsageError, match="does not exist"):
        plan_sync(SyncConfig(), SyncOptions(run=str(tmp_path / "typo")))
    assert not (tmp_path / "typo").exists()
    run = tmp_path / "run"
    fake_checkpoint(run / "checkpoints", 1)
    job = plan_sync(SyncConfig(), SyncOptions(run=str(run)))
    assert (job.io.ckpt, job.io.policy_dir) == (str(run / "checkpoints"), str(run / "policy"))
    first, = run_job(job)
    assert first.version == 1 and first.latest_updated and read_latest(run / "policy") == "v000001"
    again, = run_job(job)
    assert not again.published and not again.latest_updated
    fake_checkpoint(run / "checkpoints", 2)
    seen = []
    dead = plan_sync(SyncConfig(notify=["http://127.0.0.1:9"]), SyncOptions(run=str(run)))  # nothing listens
    with pytest.raises(TransientError, match="127.0.0.1:9"):
        run_job(dead, on_round=seen.append)
    assert [r.version for r in seen] == [2] and seen[0].notified is None
    assert read_latest(run / "policy") == "v000002"  # published; the server that failed is named
