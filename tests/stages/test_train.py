"""The train recipe on the tiny model (CPU): exact resume, consumption ledger, checkpoints, learning signal."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import typer
from safetensors.torch import load_file
from typer.testing import CliRunner

from arlctl.cli.train import register
from arlctl.io.ledger import latest_checkpoint, list_checkpoints, read_state
from arlctl.io.shards import Lineage, read_shard, scan, write_shard
from arlctl.models import tiny_model_dir
from arlctl.rl.batching import collate, score_tokens
from arlctl.rl.config import TrainConfig
from arlctl.rl.trainer_state import load_model
from arlctl.stages.configs import FilterConfig
from arlctl.stages.filter import run_filter
from arlctl.stages.train import forward_backward, train
from arlctl.synthetic import synthetic_table


def on_policy(table: pa.Table) -> pa.Table:
    """Replace the synthetic behaviour log-probs with the tiny model's own, as a rollout with it would record."""
    model = load_model(tiny_model_dir())
    mb = collate(table, list(range(table.num_rows)))
    with torch.no_grad():
        logp, _ = score_tokens(model, mb)  # [B, L-1]: position t scores token t + 1
    prompts = table.column("prompt_tokens").to_pylist()
    responses = table.column("response_tokens").to_pylist()
    rows = [logp[b, p - 1 : p - 1 + r].tolist() for b, (p, r) in enumerate(zip(prompts, responses, strict=True))]
    return set_column(table, "response_logprobs", pa.array(rows, pa.list_(pa.float32())))


def set_column(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, table.schema.field(name), values)


def make_batches(root: Path, n_batches: int, groups_per_batch: int = 1, seed: int = 0) -> str:
    """n_batches batch shards of groups of 2 short on-policy rows, made by the real filter stage."""
    table = synthetic_table(n_batches * groups_per_batch, group_size=2, seed=seed, mean_turns=2, tokens_per_turn=12)
    # Every group gets reward variance and status ok, so none is filtered out.
    table = set_column(table, "reward", pa.array([float(i % 2) for i in range(table.num_rows)], pa.float32()))
    table = set_column(table, "status", pa.array(["ok"] * table.num_rows))
    write_shard(on_policy(table), str(root / "rewarded" / "r.parquet"), Lineage("reward"))
    run_filter(str(root / "rewarded"), str(root / "batches"), FilterConfig(batch_groups=groups_per_batch), 0)
    assert len(scan(str(root / "batches")).shards) == n_batches
    return str(root / "batches")


CFG = dict(lr=1e-3, save_every=2, warmup_steps=1, lr_schedule="cosine", cosine_steps=6, kl_coef=0.05, eps_high=0.28,
           micro_tokens=600, loss_agg="seq-mean-token-mean")


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return load_file(str(ckpt / "model.safetensors"))


class Crash(Exception):
    pass


@pytest.mark.slow
def test_resume_after_a_crash_gives_identical_weights(tmp_path):
    batches = make_batches(tmp_path, 4)
    policy = str(tiny_model_dir())
    straight = train(batches, policy, str(tmp_path / "straight"), TrainConfig(**CFG))
    assert straight["steps"] == len(scan(batches).shards)

    # Crash during step 3, after its update but before its checkpoint: step 2 is the newest on disk.
    def crash(step, metrics):
        if step == 3:
            raise Crash

    with pytest.raises(Crash):
        train(batches, policy, str(tmp_path / "resumed"), TrainConfig(**CFG), on_step=crash)
    assert latest_checkpoint(tmp_path / "resumed")[0] == 2
    resumed = train(batches, policy, str(tmp_path / "resumed"), TrainConfig(**CFG))
    assert resumed["resumed_from"] == 2 and resumed["steps"] == straight["steps"] - 2

    a = weights(latest_checkpoint(tmp_path / "straight")[1])
    b = weights(latest_checkpoint(tmp_path / "resumed")[1])
    initial = load_file(str(Path(policy) / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "resume must be bit-exact"
    assert any(not torch.equal(a[k], initial[k]) for k in a), "training must change the weights"
    sa = read_state(latest_checkpoint(tmp_path / "straight")[1])
    sb = read_state(latest_checkpoint(tmp_path / "resumed")[1])
    assert sa["consumed_batches"] == sb["consumed_batches"] == [Path(u).name for u in scan(batches).shards]


@pytest.mark.slow
def test_only_unconsumed_batches_are_trained_and_checkpoints_are_complete(tmp_path):
    batches = make_batches(tmp_path, 3)
    out, metrics = tmp_path / "ckpt", str(tmp_path / "metrics")
    first = train(batches, str(tiny_model_dir()), str(out), TrainConfig(lr=1e-4, save_every=2, max_steps=2),
                  metrics_url=metrics)
    assert first["steps"] == 2 and [s for s, _ in list_checkpoints(out)] == [2]
    rest = train(batches, None, str(out), TrainConfig(lr=1e-4, save_every=2))  # resumes; --policy not needed
    n = len(scan(batches).shards)
    assert rest["steps"] == n - 2 and rest["step"] == n
    assert train(batches, None, str(out), TrainConfig(lr=1e-4))["steps"] == 0

    step, ckpt = latest_checkpoint(out)
    state = read_state(ckpt)
    assert state["step"] == step == n and len(state["consumed_batches"]) == n
    # HF files for sync; the trainer's sharded state (torch.distributed.checkpoint) under trainer/
    for name in ("model.safetensors", "config.json", "tokenizer.json", "scheduler.pt", "trainer/.metadata",
                 "trainer/__0_0.distcp", "trainer/rng-0.pt"):
        assert (ckpt / name).is_file(), name
    assert state["full"] is True and set(state["files"]) >= {"trainer/.metadata", "model.safetensors"}
    assert not [p for p in out.iterdir() if p.name.startswith(".")], "no temp dirs left behind"
    load_model(ckpt)  # a loadable HF directory
    rows = pq.read_table(metrics).to_pylist()
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("loss", "clip_frac_low", "clip_frac_high", "approx_kl", "entropy", "grad_norm", "ratio_mean",
                "tokens_per_s", "reward_mean", "advantage_mean"):
        assert all(r[key] == r[key] for r in rows), key  # present and not NaN


@pytest.mark.slow
def test_keep_checkpoints_prunes_old_steps_and_resume_still_skips_consumed_batches(tmp_path):
    batches = make_batches(tmp_path, 4)
    out = tmp_path / "ckpt"
    first = train(batches, str(tiny_model_dir()), str(out), TrainConfig(lr=1e-4, keep_checkpoints=2, max_steps=3))
    assert first["step"] == 3 and [s for s, _ in list_checkpoints(out)] == [2, 3]
    assert sorted(p.name for p in out.iterdir()) == ["step-000002", "step-000003"]  # step 1 is gone, not hidden
    rest = train(batches, None, str(out), TrainConfig(lr=1e-4, keep_checkpoints=2))
    assert rest["steps"] == 1 and [s for s, _ in list_checkpoints(out)] == [3, 4]
    assert len(read_state(latest_checkpoint(out)[1])["consumed_batches"]) == 4  # the ledger spans pruned steps
    with pytest.raises(Exception, match="keep-checkpoints"):
        TrainConfig(keep_checkpoints=-1).check()


@pytest.mark.slow
def test_no_resume_refuses_to_overwrite(tmp_path):
    batches = make_batches(tmp_path, 1)
    train(batches, str(tiny_model_dir()), str(tmp_path / "c"), TrainConfig(max_steps=1))
    with pytest.raises(Exception, match="--no-resume"):
        train(batches, str(tiny_model_dir()), str(tmp_path / "c"), TrainConfig(), resume=False)


def test_micro_batch_size_does_not_change_the_gradient(tmp_path):
    batch = read_shard(scan(make_batches(tmp_path, 1, groups_per_batch=3)).shards[0])
    model = load_model(tiny_model_dir())
    grads = []
    for micro_tokens in (100_000, 1):  # one micro-batch vs one row per micro-batch
        model.zero_grad(set_to_none=True)
        out = forward_backward(model, None, batch, TrainConfig(micro_tokens=micro_tokens, loss_agg="token-mean"))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert out["micro_batches"] == batch.num_rows
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def test_a_step_raises_the_probability_of_positive_advantage_tokens(tmp_path):
    batch = read_shard(scan(make_batches(tmp_path, 1, groups_per_batch=3)).shards[0])
    model = load_model(tiny_model_dir())
    mb = collate(batch, list(range(batch.num_rows)))
    with torch.no_grad():
        before, _ = score_tokens(model, mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    model.zero_grad()
    forward_backward(model, None, batch, TrainConfig(precision="bf16"))  # bf16 autocast path
    optimizer.step()
    with torch.no_grad():
        after, _ = score_tokens(model, mb)
    delta = ((after - before) * mb.loss_mask).sum(-1)  # [B] change in summed log-prob per row
    pos, neg = mb.advantages > 0, mb.advantages < 0
    assert delta[pos].mean() > 0 > delta[neg].mean()


@pytest.mark.slow
def test_cli_trains_and_prints_json(tmp_path):
    run = tmp_path / "run"
    make_batches(run, 1)
    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)
    res = CliRunner().invoke(app, ["train", "--run", str(run), "--policy", str(tiny_model_dir()), "--json",
                                   "--max-steps", "1"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 1 and Path(summary["checkpoint"]).is_dir()
    assert list((run / "metrics").glob("train-*.parquet"))
    bad = CliRunner().invoke(app, ["train", "--run", str(run), "--loss-agg", "sum"])
    assert bad.exit_code == 2


@pytest.mark.slow
def test_the_job_checks_before_writing_and_trains_what_is_pending(tmp_path):
    from arlctl.errors import UsageError
    from arlctl.stages.jobs import TrainOptions
    from arlctl.stages.train_job import plan_train, run_job

    with pytest.raises(UsageError, match="--loss-agg"):  # a wrong setting before the IO is looked at
        plan_train(TrainConfig(loss_agg="sum"), TrainOptions(in_url=str(tmp_path / "nowhere"), out="x"))
    with pytest.raises(UsageError, match="--in and --out"):
        plan_train(TrainConfig(), TrainOptions(in_url=str(tmp_path)))
    with pytest.raises(UsageError, match="--nproc"):
        plan_train(TrainConfig(), TrainOptions(run=str(tmp_path), nproc=-1))
    with pytest.raises(UsageError, match="does not exist"):  # a typo'd run is not created
        plan_train(TrainConfig(), TrainOptions(run=str(tmp_path / "typo")))
    assert not (tmp_path / "typo").exists()
    run = tmp_path / "run"
    make_batches(run, 2)
    opts = dict(run=str(run), policy=str(tiny_model_dir()))
    planned, = run_job(plan_train(TrainConfig(max_steps=1), TrainOptions(**opts, dry_run=True)))
    assert planned.steps == 0 and len(planned.batches) == 1 and not (run / "checkpoints").exists()
    job = plan_train(TrainConfig(max_steps=1), TrainOptions(**opts))
    assert (job.io.in_url, job.io.out, job.io.metrics) == (str(run / "batches"), str(run / "checkpoints"),
                                                           str(run / "metrics"))
    steps, rounds = [], []
    first, = run_job(job, on_step=lambda step, m: steps.append(step), on_round=rounds.append)
    assert first.steps == 1 and steps == [1] and rounds == [first] and Path(first.checkpoint).is_dir()
    assert list((run / "metrics").glob("train-*.parquet"))
    second, = run_job(job)  # the next pending batch, resumed from the first's checkpoint
    assert second.steps == 1 and second.resumed_from == 1 and second.batches != first.batches
    third, = run_job(job)
    assert third.steps == 0 and third.batches == []
