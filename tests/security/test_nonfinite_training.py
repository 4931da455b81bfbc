"""Hostile or broken numbers never reach the weights (DESIGN.md §9, issue 12 class 4).

A NaN or -inf behaviour log-prob (what `arlctl serve` records for `temperature: "nan"`), a NaN advantage,
an infinite weight or values large enough to overflow the gradient go through the real `arlctl train`
on the tiny Llama: the row is dropped or the step skipped, counted and visible, and every weight stays
finite. `arlctl sync` refuses a checkpoint whose safetensors hold NaN/inf, naming the tensor, with
LATEST unchanged. The loss pieces are checked against hand-computed values.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.io import ledger
from arlctl.io.shards import Lineage, read_shard, scan, write_shard, write_table_atomic
from arlctl.models import tiny_model_dir
from arlctl.rl.batching import batch_columns, collate, nonfinite_rows, score_tokens
from arlctl.rl.config import TrainConfig
from arlctl.rl.losses import (
    LossConfig,
    aggregate_loss,
    kl_k3,
    masked_mean,
    policy_loss,
    ppo_clip_loss,
    truncated_is_weights,
)
from arlctl.rl.trainer_state import load_model
from arlctl.stages.configs import FilterConfig
from arlctl.stages.filter import run_filter
from arlctl.stages.train import forward_backward
from arlctl.synthetic import synthetic_table

LN = math.log
NAN, INF = float("nan"), float("inf")
E20 = math.exp(20.0)  # the log-ratio clamp: exp(20) ~ 4.85e8


# ----------------------------------------------------------------------------------------------- loss math


def test_nan_or_inf_off_the_mask_does_not_change_the_loss_or_its_gradient():
    # Row 0: tokens 0, 1 trained with ratios 1.1 and 0.9 (behaviour 0), token 2 is an environment token.
    # Row 1: no trained token at all, so its advantage and weight are never read.
    # token-mean over 2 tokens with A = 1, eps 0.2 (both ratios inside the band):
    #   loss = -(1.1 * 1 + 0.9 * 1) / 2 = -1.0;  d loss / d logp = -A r / N = [-0.55, -0.45, 0]
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    cfg = LossConfig(loss_agg="token-mean")
    results = []
    for junk in (0.0, NAN, -INF, INF):
        logp = torch.tensor([[LN(1.1), LN(0.9), 0.0], [0.0, 0.0, 0.0]], requires_grad=True)
        behaviour = torch.tensor([[0.0, 0.0, junk], [junk, junk, junk]])
        advantages = torch.tensor([1.0, junk])
        weights = torch.tensor([1.0, junk])
        ref = torch.tensor([[LN(1.1), LN(0.9), junk], [junk, 0.0, 0.0]])
        loss, sums = policy_loss(logp, behaviour, advantages, mask, cfg, weights=weights, ref_logp=ref)
        loss.backward()
        results.append((loss.detach(), logp.grad.clone(), {k: v.clone() for k, v in sums.items()}))
    for loss, grad, sums in results:
        torch.testing.assert_close(loss, torch.tensor(-1.0), atol=1e-6, rtol=0)
        torch.testing.assert_close(grad, torch.tensor([[-0.55, -0.45, 0.0], [0.0, 0.0, 0.0]]), atol=1e-6, rtol=0)
        assert all(bool(torch.isfinite(v)) for v in sums.values()), sums
        assert torch.equal(grad, results[0][1]) and torch.equal(loss, results[0][0])


def test_aggregate_and_masked_mean_select_instead_of_multiplying_by_the_mask():
    # NaN and inf at mask-0 positions: the sums see only 1, 2 (row 0) and 4 (row 1).
    per_token = torch.tensor([[1.0, 2.0, NAN], [4.0, INF, -INF]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    torch.testing.assert_close(aggregate_loss(per_token, mask, "token-mean"), torch.tensor(7.0 / 3.0))  # 7 / 3
    torch.testing.assert_close(aggregate_loss(per_token, mask, "seq-mean-token-sum"), torch.tensor(3.5))  # 7 / 2
    # per row: (1 + 2) / 2 = 1.5 and 4 / 1 = 4 -> (1.5 + 4) / 2 = 2.75
    torch.testing.assert_close(aggregate_loss(per_token, mask, "seq-mean-token-mean"), torch.tensor(2.75))
    torch.testing.assert_close(masked_mean(per_token, mask), torch.tensor(7.0 / 3.0))


def test_a_minus_inf_behaviour_logprob_gives_a_clamped_finite_ratio():
    # logp = 0, behaviour = -inf: log-ratio +inf -> clamped to 20 -> r = e^20.
    #   A = +1: -min(e^20 * 1, 1.2 * 1) = -1.2   (clipped branch: no gradient)
    #   A = -1: -min(-e^20, -1.2)       = e^20   (the clamp also stops the gradient: d clamp = 0 outside)
    logp = torch.zeros(1, 2, requires_grad=True)
    loss, ratio = ppo_clip_loss(logp, torch.tensor([[-INF, -INF]]), torch.tensor([[1.0, -1.0]]))
    torch.testing.assert_close(ratio, torch.tensor([[E20, E20]]))
    torch.testing.assert_close(loss, torch.tensor([[-1.2, E20]]))
    loss.sum().backward()
    assert torch.equal(logp.grad, torch.zeros(1, 2))
    # behaviour = +inf: log-ratio -inf -> -20 -> r = e^-20; A = +1: -min(e^-20, 0.8) = -e^-20, gradient -r A
    logp = torch.zeros(1, 1, requires_grad=True)
    loss, _ = ppo_clip_loss(logp, torch.tensor([[INF]]), torch.tensor([[1.0]]))
    torch.testing.assert_close(loss, torch.tensor([[-math.exp(-20.0)]]))


def test_truncated_is_weights_and_k3_clamp_their_log_ratios():
    # TIS: exp(0 - (-inf)) -> e^20 -> capped at 2;  exp(0 - (+inf)) -> e^-20 ~ 2.06e-9
    w = truncated_is_weights(torch.zeros(2), torch.tensor([-INF, INF]), cap=2.0)
    torch.testing.assert_close(w, torch.tensor([2.0, math.exp(-20.0)]))
    # k3 with d = ref - logp = 0 - (-100) = 100 -> clamped to 20: e^20 - 20 - 1
    torch.testing.assert_close(kl_k3(torch.tensor([-100.0]), torch.tensor([0.0])), torch.tensor([E20 - 21.0]))
    # d = -inf -> -20: e^-20 + 20 - 1 ~ 19.0000000021
    torch.testing.assert_close(kl_k3(torch.tensor([0.0]), torch.tensor([-INF])), torch.tensor([19.0]))


def test_nonfinite_rows_names_each_bad_trained_input_and_ignores_off_mask_values():
    cols = {
        "advantage": [1.0, NAN, 1.0, 1.0, 1.0, 1.0, None, -INF],
        "weight": [1.0, 1.0, INF, 1.0, 1.0, 1.0, None, 1.0],
        "response_mask": [[1, 0], [1, 1], [1, 1], [1, 0, 1], [1, 1], [0, 1], [1], [1]],
        "response_logprobs": [[-1.0, NAN], [-1.0, -1.0], [-1.0, -1.0], [-1.0, 0.0, NAN], [-INF, -1.0],
                              [NAN, None], [-0.5], [-1.0]],
    }
    bad = nonfinite_rows(cols)
    assert sorted(bad) == [1, 2, 3, 4, 5, 7]  # row 0: NaN only off the mask; row 6: nulls mean 0 and 1
    assert bad[1] == "advantage nan" and bad[2] == "weight inf" and bad[7] == "advantage -inf"
    assert bad[3] == "behaviour log-prob nan at response token 2"
    assert bad[4] == "behaviour log-prob -inf at response token 0"
    assert bad[5] == "behaviour log-prob None at response token 1"


# ----------------------------------------------------------------------------------------------- helpers


def set_column(table: pa.Table, name: str, values: list) -> pa.Table:
    i = table.schema.get_field_index(name)
    field = table.schema.field(name)
    return table.set_column(i, field, pa.array(values, field.type))


def on_policy_logprobs(table: pa.Table) -> list[list[float]]:
    """The tiny model's own log-probs of each response token, as a rollout with it would record them."""
    model = load_model(tiny_model_dir())
    mb = collate(table, list(range(table.num_rows)))
    with torch.no_grad():
        logp, _ = score_tokens(model, mb)  # [B, L-1]: position t scores token t + 1
    prompts, responses = table.column("prompt_tokens").to_pylist(), table.column("response_tokens").to_pylist()
    return [logp[b, p - 1 : p - 1 + r].tolist() for b, (p, r) in enumerate(zip(prompts, responses, strict=True))]


def make_run(root: Path, n_batches: int, groups_per_batch: int = 2) -> list[str]:
    """RUN/batches with n_batches shards of groups of 2 on-policy rows, made by the real filter stage."""
    table = synthetic_table(n_batches * groups_per_batch, group_size=2, seed=0, mean_turns=2, tokens_per_turn=12)
    table = set_column(table, "reward", [float(i % 2) for i in range(table.num_rows)])
    table = set_column(table, "status", ["ok"] * table.num_rows)
    table = set_column(table, "response_logprobs", on_policy_logprobs(table))
    write_shard(table, str(root / "rewarded" / "r.parquet"), Lineage("reward"))
    run_filter(str(root / "rewarded"), str(root / "batches"), FilterConfig(batch_groups=groups_per_batch), 0)
    shards = scan(str(root / "batches")).shards
    assert len(shards) == n_batches
    return shards


def rewrite(url: str, edit) -> None:
    """Replace a batch shard in place with edit(rows), keeping its metadata: a hostile writer does not validate."""
    table = read_shard(url)
    rows = table.to_pylist()
    edit(rows)
    bad = pa.Table.from_pylist(rows, schema=table.schema)
    write_table_atomic(bad, url, pq.read_schema(url).metadata)


def positions(row: dict, mask_value: int) -> list[int]:
    """Response positions whose mask is mask_value (1: sampled and trained, 0: environment tokens)."""
    return [t for t, m in enumerate(row["response_mask"]) if m == mask_value]


def cli(*args: str):
    return CliRunner().invoke(app, [*map(str, args)])


def train_cli(run: Path, *extra: str):
    return cli("train", "--run", run, "--policy", tiny_model_dir(), "--lr", "1e-3", "--json", *extra)


def summary_of(result) -> dict:
    return json.loads(result.stdout.strip().splitlines()[-1])


def all_finite(weights: dict[str, torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in weights.values())


def weights_of(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(str(directory / "model.safetensors"))


INITIAL = None


def initial_weights() -> dict[str, torch.Tensor]:
    global INITIAL
    if INITIAL is None:
        INITIAL = weights_of(tiny_model_dir())
    return INITIAL


# ----------------------------------------------------------------------------------------------- train


@pytest.mark.slow
def test_cli_train_drops_rows_with_nan_or_minus_inf_trained_logprobs_and_stays_finite(tmp_path):
    run = tmp_path / "run"
    first, second = make_run(run, 2)

    def nan_on_a_trained_token(rows):
        rows[0]["response_logprobs"][positions(rows[0], 1)[0]] = NAN  # what serve records for temperature "nan"

    def minus_inf_on_a_trained_token(rows):
        rows[1]["response_logprobs"][positions(rows[1], 1)[-1]] = -INF

    rewrite(first, nan_on_a_trained_token)
    rewrite(second, minus_inf_on_a_trained_token)
    res = train_cli(run)
    assert res.exit_code == 0, res.output
    summary = summary_of(res)
    assert summary["steps"] == 2 and summary["rows_dropped_invalid"] == 2 and summary["skipped_nonfinite"] == 0
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning: step")]
    assert len(warnings) == 2, res.stderr
    assert warnings[0].startswith("warning: step 1: dropped 1 of 4 rows with a bad value (row 0:") and "nan" in warnings[0]
    assert warnings[1].startswith("warning: step 2: dropped 1 of 4 rows with a bad value (row 1:") and "-inf" in warnings[1]

    step, location = ledger.latest_checkpoint(run / "checkpoints")
    trained = weights_of(location)
    assert all_finite(trained)
    assert any(not torch.equal(trained[k], initial_weights()[k]) for k in trained), "the good rows still train"
    state = ledger.read_state(location)
    assert state["bad_values"]["rows_dropped"] == 2 and state["bad_values"]["steps_skipped"] == 0
    assert [e["batch"] for e in state["bad_values"]["events"]] == [Path(first).name, Path(second).name]
    rows = pq.read_table(run / "metrics" / "train-step-000002.parquet").to_pylist()
    assert rows[0]["rows_dropped_invalid"] == 1 and rows[0]["errors"] == 2 and rows[0]["rows"] == 3
    assert math.isfinite(rows[0]["loss"]) and math.isfinite(rows[0]["grad_norm"])

    status = cli("status", run, "--json")  # the counted rule is visible where an operator looks
    assert status.exit_code == 0, status.output
    errors = json.loads(status.stdout)["errors"]["train"]
    assert errors["errors"] == 2 and "-inf" in errors["last_error"]


def test_nan_or_inf_off_the_mask_trains_exactly_like_zero(tmp_path):
    [url] = make_run(tmp_path, 1)
    clean = read_shard(url)
    rows = clean.to_pylist()
    env_tokens = 0
    for row in rows:
        for t in positions(row, 0):  # environment tokens: never trained
            row["response_logprobs"][t] = (NAN, -INF, INF)[env_tokens % 3]
            env_tokens += 1
    assert env_tokens > 10
    dirty = pa.Table.from_pylist(rows, schema=clean.schema)
    assert not nonfinite_rows(batch_columns(dirty)), "off-mask junk is not a reason to drop a row"

    model = load_model(tiny_model_dir())
    grads, losses = [], []
    for table in (clean, dirty):
        model.zero_grad(set_to_none=True)
        out = forward_backward(model, None, table, TrainConfig(micro_tokens=300))
        losses.append(out["loss"])
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert math.isfinite(losses[0]) and losses[0] == losses[1]
    assert torch.equal(grads[0], grads[1]) and bool(torch.isfinite(grads[1]).all())


@pytest.mark.slow
@pytest.mark.parametrize("column, value", [("advantage", 1e38), ("weight", 1e38), ("advantage", 3e38)])
def test_a_gradient_that_overflows_skips_the_step_and_keeps_the_weights(tmp_path, column, value):
    # Finite but absurd: r * A (* w) overflows float32 in the loss or its backward pass.
    run = tmp_path / "run"
    poisoned, good = make_run(run, 2)

    def absurd(rows):
        for row in rows:
            row[column] = value if column == "weight" else math.copysign(value, row[column] or 1.0)

    rewrite(poisoned, absurd)
    assert not nonfinite_rows(batch_columns(read_shard(poisoned))), "finite inputs: only the gradient check can act"
    res = train_cli(run, "--save-every", "1")
    assert res.exit_code == 0, res.output
    summary = summary_of(res)
    assert summary["steps"] == 2 and summary["skipped_nonfinite"] == 1 and summary["rows_dropped_invalid"] == 0
    assert "warning: step 1: optimizer step skipped: non-finite" in res.stderr

    skipped = weights_of(run / "checkpoints" / "step-000001")
    assert all(torch.equal(skipped[k], initial_weights()[k]) for k in skipped), "a skipped step changes nothing"
    trained = weights_of(run / "checkpoints" / "step-000002")
    assert all_finite(trained) and any(not torch.equal(trained[k], skipped[k]) for k in trained)
    state = ledger.read_state(run / "checkpoints" / "step-000002")
    assert state["consumed_batches"] == [Path(poisoned).name, Path(good).name]  # consumed: never retried
    assert state["bad_values"]["steps_skipped"] == 1 and state["bad_values"]["events"][0]["skipped"]
    row = pq.read_table(run / "metrics" / "train-step-000001.parquet").to_pylist()[0]
    assert row["skipped_nonfinite"] == 1 and not (math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"]))
    again = train_cli(run)
    assert again.exit_code == 0 and summary_of(again)["steps"] == 0, "the poisoned batch is not replayed"


def test_a_batch_with_no_finite_row_is_skipped_not_crash_looped(tmp_path):
    run = tmp_path / "run"
    [url] = make_run(run, 1)

    def every_row_broken(rows):
        rows[0]["advantage"] = NAN
        rows[1]["weight"] = INF
        rows[2]["advantage"] = -INF
        rows[3]["response_logprobs"][positions(rows[3], 1)[0]] = NAN

    rewrite(url, every_row_broken)
    res = train_cli(run)
    assert res.exit_code == 0, res.output
    summary = summary_of(res)
    assert summary["skipped_nonfinite"] == 1 and summary["rows_dropped_invalid"] == 4
    assert "no row left to train on" in res.stderr
    _, location = ledger.latest_checkpoint(run / "checkpoints")
    kept = weights_of(location)
    assert all(torch.equal(kept[k], initial_weights()[k]) for k in kept)
    assert ledger.read_state(location)["consumed_batches"] == [Path(url).name]
    assert summary_of(train_cli(run))["steps"] == 0


def test_rows_the_model_cannot_read_are_dropped_not_crash_looped(tmp_path):
    # A token id past the vocabulary would raise inside the embedding on every retry of the step.
    run = tmp_path / "run"
    [url] = make_run(run, 1)

    def unreadable(rows):
        rows[0]["response_ids"][positions(rows[0], 1)[0]] = 10**9  # far outside the 49152-token vocabulary
        rows[1]["response_mask"][positions(rows[1], 1)[0]] = 2  # a mask is 0 or 1

    rewrite(url, unreadable)
    res = train_cli(run)
    assert res.exit_code == 0, res.output
    summary = summary_of(res)
    assert summary["rows_dropped_invalid"] == 2 and summary["skipped_nonfinite"] == 0 and summary["steps"] == 1
    assert all_finite(weights_of(ledger.latest_checkpoint(run / "checkpoints")[1]))


@pytest.mark.parametrize("option, value", [("--lr", "inf"), ("--lr", "nan"), ("--grad-clip", "nan"),
                                           ("--temperature", "0"), ("--eps-high", "-inf"), ("--tis-cap", "nan")])
def test_train_rejects_non_finite_or_out_of_range_options(tmp_path, option, value):
    res = cli("train", "--run", tmp_path / "run", "--policy", tiny_model_dir(), option, value)
    assert res.exit_code == 2 and option in res.output, res.output


@pytest.mark.slow
def test_the_trainer_refuses_to_save_non_finite_weights(tmp_path):
    from arlctl.rl import distributed as dd
    from arlctl.rl.trainer_state import TrainerState

    trainer = TrainerState.open(str(tmp_path / "c"), None, {"step": 0}, tiny_model_dir(), TrainConfig(), dd.Dist())
    with torch.no_grad():
        next(trainer.module.parameters()).view(-1)[0] = NAN
    for full in (True, False):
        with pytest.raises(Exception, match="refusing to save step-000001: weight .* 1 NaN"):
            trainer.save(str(tmp_path / "c"), {"step": 1, "consumed_batches": []}, full=full)
    assert ledger.latest_checkpoint(tmp_path / "c") is None and not (tmp_path / "c").exists()  # refused up front


# ----------------------------------------------------------------------------------------------- sync


def poison(checkpoint: Path, how: str) -> str:
    """Edit a checkpoint's safetensors in place: one tensor all NaN, or one +inf element. Returns its name."""
    path = checkpoint / "model.safetensors"
    tensors = load_file(str(path))
    name = sorted(tensors)[len(tensors) // 2]
    if how == "nan":
        tensors[name] = torch.full_like(tensors[name], NAN)
    else:
        tensors[name].view(-1)[-1] = INF
    save_file(tensors, str(path), metadata={"format": "pt"})
    return name


@pytest.mark.slow
@pytest.mark.parametrize("how", ["nan", "one inf"])
def test_sync_refuses_to_publish_non_finite_weights(tmp_path, how):
    run = tmp_path / "run"
    make_run(run, 2)
    assert train_cli(run, "--max-steps", "1").exit_code == 0
    assert cli("sync", "--run", run).exit_code == 0
    assert ledger.read_latest(run / "policy") == "v000001"
    assert train_cli(run).exit_code == 0
    tensor = poison(run / "checkpoints" / "step-000002", how)

    for extra in ([], ["--dry-run"]):
        res = cli("sync", "--run", run, *extra)
        assert res.exit_code == 1, res.output
        line = res.output.splitlines()[0]
        assert "refusing to publish" in line and "step-000002" in line and f"tensor {tensor} " in line
        assert ("NaN" if how == "nan" else "1 inf") in line, line
    assert ledger.read_latest(run / "policy") == "v000001", "LATEST still names the last good version"
    assert sorted(p.name for p in (run / "policy").iterdir() if p.name != "_locks") == ["LATEST", "v000001"]


def test_sync_from_an_object_store_checks_the_weights_too(s3_bucket, tmp_path):
    # The checkpoint lives on S3 (moto): sync must read the weights it would otherwise copy server-side.
    local = tmp_path / "step-000003"
    local.mkdir()
    for path in tiny_model_dir().iterdir():
        if path.is_file():
            (local / path.name).write_bytes(path.read_bytes())
    tensor = poison(local, "nan")
    ckpts, policy = f"{s3_bucket}/run/checkpoints", f"{s3_bucket}/run/policy"
    fs = fsspec.filesystem("s3")
    dest = f"{ckpts.removeprefix('s3://')}/step-000003"
    for path in sorted(local.iterdir()):
        fs.put_file(str(path), f"{dest}/{path.name}")
    fs.pipe_file(f"{dest}/state.json", json.dumps({"step": 3, "consumed_batches": []}).encode())

    res = cli("sync", "--ckpt", ckpts, "--policy-dir", policy)
    assert res.exit_code == 1 and f"tensor {tensor} " in res.output.splitlines()[0], res.output
    assert ledger.read_latest(policy) is None and ledger.latest_checkpoint(ckpts)[0] == 3
    fs.invalidate_cache()
    assert not fs.exists(f"{policy.removeprefix('s3://')}/v000003/version.json")


@pytest.mark.slow
def test_train_refuses_to_resume_from_non_finite_weights(tmp_path):
    # A checkpoint written before this defence (or edited): training on would only skip every step.
    run = tmp_path / "run"
    make_run(run, 2)
    assert train_cli(run, "--max-steps", "1").exit_code == 0
    tensor = poison(run / "checkpoints" / "step-000001", "nan")
    res = train_cli(run)
    assert res.exit_code == 1 and f"weight {tensor} holds" in res.output and "step-000001" in res.output, res.output
    assert [s for s, _ in ledger.list_checkpoints(run / "checkpoints")] == [1]
