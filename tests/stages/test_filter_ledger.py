"""Filter's consumption rule has one reader (arlctl/io/ledger.py `read_filter_ledger`): filter decides what
not to read again from it, and status decides what still waits at rewarded/ from it, so the two agree on
forged lineage and differ only where they must, on an interrupted invocation (filter finishes it; status
counts its rows as waiting until every batch is there)."""

from __future__ import annotations

from pathlib import Path

from arlctl.io.ledger import filter_consumed, manifest_url, read_filter_ledger
from arlctl.io.shards import Lineage, list_shards, read_lineage, write_shard
from arlctl.runstate import backlog
from arlctl.stages.configs import FilterConfig
from arlctl.stages.filter import run_filter
from arlctl.synthetic import synthetic_table


def rewarded_shard(run: Path, groups: int = 2) -> str:
    (run / "rewarded").mkdir(parents=True, exist_ok=True)
    return write_shard(synthetic_table(groups, group_size=4, seed=3), str(run / "rewarded" / "a.parquet"),
                       Lineage("reward"))


def test_forged_filter_lineage_consumes_nothing_for_filter_or_status(tmp_path):
    run = tmp_path / "run"
    rewarded = rewarded_shard(run)
    (run / "batches").mkdir()
    # Names an invocation and its only part, but records no config: its hashes cannot recompute.
    forged = Lineage("filter", inputs=[rewarded], extra={"invocation": "x", "part": 0, "parts": 1})
    write_shard(synthetic_table(1, group_size=4), str(run / "batches" / "batch-forged.parquet"), forged)
    ledger = read_filter_ledger(str(run / "batches"))
    assert ledger.consumed == set() and ledger.untrusted == [
        "batch-forged.parquet: its invocation record is malformed"]
    assert backlog(str(run))["rewarded"] == 8  # status: a's rows still wait (it used to count them consumed)
    summary = run_filter(str(run / "rewarded"), str(run / "batches"), FilterConfig(), 0, dry_run=True)
    assert summary["inputs"] == ["a.parquet"]  # filter reads it: the same rule


def test_an_interrupted_invocation_is_consumed_for_filter_and_waiting_for_status(tmp_path):
    run = tmp_path / "run"
    rewarded_shard(run)
    batches = str(run / "batches")
    run_filter(str(run / "rewarded"), batches, FilterConfig(batch_groups=1, keep_uniform=1.0), 0)
    shards = list_shards(batches)
    assert len(shards) == 2 and filter_consumed(batches) == {"a.parquet"}
    # A crash after the first batch: no manifest, no second batch.
    invocation = read_lineage(shards[0]).extra["invocation"]
    Path(manifest_url(batches, invocation)).unlink()
    first, second = sorted(shards, key=lambda s: read_lineage(s).extra["part"])
    Path(second).unlink()
    ledger = read_filter_ledger(batches)
    assert ledger.consumed == {"a.parquet"} and ledger.drained() == set()  # not re-read; rows still to come
    assert list(ledger.unfinished) == [invocation] and backlog(str(run))["rewarded"] == 8
    summary = run_filter(str(run / "rewarded"), batches, FilterConfig(batch_groups=1, keep_uniform=1.0), 0)
    assert summary["inputs"] == [] and len(summary["recovered"]) == 2  # the invocation's batches, one new
    assert len(list_shards(batches)) == 2 and first in list_shards(batches)
    assert filter_consumed(batches) == {"a.parquet"} and backlog(str(run))["rewarded"] == 0


def test_the_filter_job_runs_as_the_command_does_and_checks_before_writing(tmp_path):
    import pytest

    from arlctl.errors import UsageError
    from arlctl.stages.filter import plan_filter
    from arlctl.stages.filter import run_job as run_filter_job
    from arlctl.stages.jobs import FilterOptions

    run = tmp_path / "run"
    rewarded_shard(run)
    with pytest.raises(UsageError, match="--batch-groups"):  # a wrong setting before the IO is looked at
        plan_filter(FilterConfig(batch_groups=0), FilterOptions(in_url=str(tmp_path / "nowhere"), out_url="x"))
    with pytest.raises(UsageError, match="--in and --out"):
        plan_filter(FilterConfig(), FilterOptions(in_url=str(run / "rewarded")))
    job = plan_filter(FilterConfig(batch_groups=1), FilterOptions(run=str(run)))
    assert (job.io.in_url, job.io.out) == (str(run / "rewarded"), str(run / "batches"))
    assert job.io.metrics == str(run / "metrics") and job.io.policy_dir == str(run / "policy")
    first, = run_filter_job(job)
    assert first.inputs and first.batches and sorted(Path(b).name for b in first.batches) == \
        sorted(p.name for p in (run / "batches").glob("batch-*.parquet"))
    again, = run_filter_job(job)  # everything consumed: nothing new, the same batches
    assert again.inputs == [] and again.batches == []
