"""Two ranks (torchrun, gloo on CPU) train the same steps as one process (issue 15).

Each batch shard's rows are split across the ranks by tokens (unequal row counts and lengths here), each
rank's loss carries the whole shard's token / sequence counts, and FSDP2 / DDP sum the ranks' gradients: so
after 3 optimizer steps the weights equal one process's, for every --loss-agg mode, with TIS, KL and per-row
weights on.
"""

from __future__ import annotations

import json

import pytest

from arlctl.io.ledger import latest_checkpoint
from arlctl.rl.config import TrainConfig
from arlctl.stages.train import train
from tests.distributed.common import make_uneven_batches, max_diff, small_init_model, torchrun, weights

pytestmark = pytest.mark.distributed

MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
TOL = 1e-5
SETTINGS = dict(lr=3e-4, kl_coef=0.05, tis_cap=2.0, eps_high=0.28, micro_tokens=160, save_every=3, max_steps=3)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The reference: one process, the same batches and settings, per mode."""
    root = tmp_path_factory.mktemp("equiv")
    model = small_init_model(root)
    batches = make_uneven_batches(root, model)
    for mode in MODES:
        summary = train(batches, str(model), str(root / "single" / mode),
                        TrainConfig(strategy="single", loss_agg=mode, device="cpu", **SETTINGS))
        assert summary["steps"] == 3
    return root, batches, model


@pytest.mark.parametrize("strategy", ["fsdp2", "ddp"])
def test_two_ranks_equal_one_process_for_every_loss_agg(single, strategy):
    root, batches, model = single
    out = root / strategy
    # FSDP2's ranks also run the LM head in chunks of 1 MiB of logits (5 rows of this vocabulary, each
    # recomputed in the backward) where the one process runs it in one piece: the weights must still agree.
    settings = {**SETTINGS, "head_chunk_mb": 1} if strategy == "fsdp2" else SETTINGS
    res = torchrun(["tests/distributed/worker.py", batches, str(model), str(out), strategy,
                    ",".join(MODES), json.dumps(settings)])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    reports = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert sorted((r["rank"], r["mode"], r["steps"], r["world_size"]) for r in reports) == \
        sorted((rank, m, 3, 2) for rank in (0, 1) for m in MODES)
    initial = weights(model)
    for mode in MODES:
        one = weights(latest_checkpoint(root / "single" / mode)[1])
        two = weights(latest_checkpoint(out / mode)[1])
        moved = max_diff(one, {k: initial[k] for k in one})
        assert moved > 50 * TOL, f"{mode}: the weights must move far more than the tolerance ({moved})"
        print(f"{strategy} {mode}: max |2 ranks - 1 process| = {max_diff(one, two):.2e}, moved {moved:.2e}")
        assert max_diff(one, two) < TOL, f"{strategy} {mode}: {max_diff(one, two)}"


def test_two_ranks_drop_poisoned_rows_like_one_process(single, tmp_path):
    """A -inf behaviour log-prob on a trained token and a NaN off the mask: every rank drops the same rows by
    the counted rules, the steps stay finite, and 2 ranks still equal one process."""
    import math
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from arlctl.io.shards import read_shard, scan, write_table_atomic

    root, batches, model = single
    poisoned = tmp_path / "batches"
    shutil.copytree(batches, poisoned)
    url = scan(str(poisoned)).shards[0]
    table = read_shard(url)
    rows = table.to_pylist()
    rows[0]["response_logprobs"][rows[0]["response_mask"].index(1)] = -math.inf  # trained: dropped, counted
    rows[1]["response_logprobs"][rows[1]["response_mask"].index(0)] = math.nan  # off the mask: a schema value rule
    # A hostile writer does not validate: the shard is replaced as it is, metadata kept.
    write_table_atomic(pa.Table.from_pylist(rows, schema=table.schema), url, pq.read_schema(url).metadata)
    settings = {**SETTINGS, "max_steps": 2}
    one = train(str(poisoned), str(model), str(tmp_path / "one"),
                TrainConfig(strategy="single", loss_agg="token-mean", device="cpu", **settings))
    assert one["rows_dropped_invalid"] == 2 and one["skipped_nonfinite"] == 0
    res = torchrun(["tests/distributed/worker.py", str(poisoned), str(model), str(tmp_path / "two"), "fsdp2",
                    "token-mean", json.dumps(settings)])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    w1 = weights(latest_checkpoint(tmp_path / "one")[1])
    w2 = weights(latest_checkpoint(tmp_path / "two" / "token-mean")[1])
    assert all(bool(v.isfinite().all()) for v in w2.values())
    print(f"poisoned rows, 2 ranks vs 1 process: {max_diff(w1, w2):.2e}")
    assert max_diff(w1, w2) < TOL
