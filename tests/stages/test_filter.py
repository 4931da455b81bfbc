"""The filter stage: each rule, advantages and packing, exactly-once consumption, the audit, the CLI."""

from __future__ import annotations

import json
import math

import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

import arlctl.stages.filter as filt
from arlctl.cli.filter import register
from arlctl.errors import CorruptShardError, UsageError
from arlctl.io.ledger import MANIFEST_DIR
from arlctl.io.shards import Lineage, read_lineage, read_shard, scan, write_shard
from arlctl.schemas.rows import TrajectoryRow, Turn, rows_to_table
from arlctl.stages.configs import FilterConfig
from arlctl.stages.filter import apply_rules, plan_invocation, run_filter
from arlctl.synthetic import synthetic_table


def row(group: str, idx: int, reward: float | None, status: str = "ok", version: int = 0,
        calls: list[str] | None = None, tid: str | None = None) -> TrajectoryRow:
    turns = [Turn(index=i, gen_start=i, gen_len=1, obs_len=0, text="", tool_calls=[{"name": c, "arguments": {}}])
             for i, c in enumerate(calls or [])]
    r = TrajectoryRow(group_id=group, sample_index=idx, task_id=group, env="test", env_version="1", task={},
                      policy="p", prompt_text="", prompt_ids=[1, 2], response_ids=[3] * max(1, len(turns)),
                      response_mask=[1] * max(1, len(turns)), response_logprobs=[-0.5] * max(1, len(turns)),
                      turns=turns, status=status, policy_version=version, policy_version_last=version,
                      num_tool_calls=len(turns), reward=reward)
    if tid:
        r.trajectory_id = tid
    return r


def kept_groups(table, cfg, version=0):
    res = apply_rules(table, cfg, version)
    return {g for g, k in zip(table.column("group_id").to_pylist(), res.keep, strict=True) if k}, res


def test_completeness_drops_unfinished_and_unrewarded_rows():
    table = rows_to_table([row("a", 0, 1.0), row("a", 1, 0.0), row("a", 2, 0.0, status="truncated"),
                           row("a", 3, None), row("a", 4, 1.0, status="timeout")])
    # A truncated row is --truncated's (default keep), not --keep-status's.
    _, res = kept_groups(table, FilterConfig())
    assert res.counts["completeness"] == 2  # the unrewarded row and the timeout
    assert res.keep.tolist() == [True, True, True, False, False]
    _, res = kept_groups(table, FilterConfig(truncated="drop"))
    assert (res.counts["truncated"], res.counts["completeness"]) == (1, 2)
    assert res.keep.tolist() == [True, True, False, False, False]


def test_group_integrity_keeps_whole_groups_only():
    table = rows_to_table([
        row("gap", 0, 1.0), row("gap", 2, 0.0),  # sample 1 missing from the input
        row("thin", 0, 1.0), row("thin", 1, 0.0, status="env_error"),  # one survivor: no baseline
        row("ok", 0, 1.0), row("ok", 1, 0.0),
    ])
    groups, res = kept_groups(table, FilterConfig())
    assert groups == {"ok"}
    assert res.counts == {**res.counts, "completeness": 1, "group_integrity": 3}


def test_zero_variance_groups_dropped_unless_kept_fraction():
    table = rows_to_table([row("same", 0, 0.0), row("same", 1, 0.0), row("mix", 0, 1.0), row("mix", 1, 0.0)])
    groups, res = kept_groups(table, FilterConfig())
    assert groups == {"mix"} and res.counts["zero_variance"] == 2
    groups, res = kept_groups(table, FilterConfig(keep_uniform=1.0))
    assert groups == {"same", "mix"} and res.counts["zero_variance"] == 0


def test_duplicate_ids_and_near_duplicate_actions():
    table = rows_to_table([
        row("a", 0, 1.0, tid="t1"), row("a", 1, 0.0, tid="t2"), row("a", 2, 0.5, tid="t1"),
        row("b", 0, 1.0, calls=["ls", "cat", "edit", "test"]),
        row("b", 1, 0.0, calls=["ls", "cat", "edit", "test"]),  # identical actions: Jaccard 1
        row("b", 2, 0.5, calls=["find", "grep", "edit", "submit"]),  # disjoint trigrams: Jaccard 0
    ])
    _, res = kept_groups(table, FilterConfig())
    assert res.counts["duplicate"] == 1 and res.keep.tolist() == [True, True, False, True, True, True]
    _, res = kept_groups(table, FilterConfig(dedupe_threshold=0.9))
    assert res.counts["duplicate"] == 2 and res.keep.tolist() == [True, True, False, True, False, True]


def test_jaccard_of_ngram_sets():
    # {ab, bc} vs {ab, bd}: |{ab}| / |{ab, bc, bd}| = 1/3
    assert filt.jaccard({("a", "b"), ("b", "c")}, {("a", "b"), ("b", "d")}) == pytest.approx(1 / 3)
    assert filt.jaccard(set(), set()) == 0.0


def test_staleness_drops_and_decays():
    table = rows_to_table([row("new", 0, 1.0, version=5), row("new", 1, 0.0, version=5),
                           row("mid", 0, 1.0, version=4), row("mid", 1, 0.0, version=4),
                           row("old", 0, 1.0, version=2), row("old", 1, 0.0, version=2)])
    groups, res = kept_groups(table, FilterConfig(max_lag=2, decay=0.5), version=5)
    assert groups == {"new", "mid"} and res.counts["staleness"] == 2
    # weight = exp(-0.5 * lag): lag 0 -> 1, lag 1 -> 0.606531
    assert res.weight[:4].tolist() == pytest.approx([1, 1, math.exp(-0.5), math.exp(-0.5)])


def test_where_predicate_and_fallout_of_small_groups():
    table = rows_to_table([row("a", 0, 1.0, calls=["x"]), row("a", 1, 0.0, calls=["y"]),
                           row("b", 0, 1.0, calls=["x"]), row("b", 1, 0.0)])
    groups, res = kept_groups(table, FilterConfig(where="num_tool_calls > 0"))
    # b's second row fails the predicate; its first row would be alone, so the group goes: 2 under "where"
    assert groups == {"a"} and res.counts["where"] == 2
    with pytest.raises(UsageError, match="--where"):
        apply_rules(table, FilterConfig(where="no_such_column > 1"), 0)


def test_balance_caps_positive_weight_share():
    # Advantages of [1, 1, 1, 0] in one group (mean .75): three positives (+.25), one negative (-.75).
    # Weights all 1: positive share 3/4 > 0.5 -> scale s with 3s / (3s + 1) = 0.5 -> s = 1/3.
    table = rows_to_table([row("g", i, r) for i, r in enumerate([1.0, 1.0, 1.0, 0.0])])
    plan = plan_invocation_from(table, FilterConfig(max_pos_frac=0.5, adv="group-mean"))
    weights = plan.batches[0].column("weight").to_pylist()
    assert weights == pytest.approx([1 / 3, 1 / 3, 1 / 3, 1.0])
    assert plan.counts["balance"] == 3


def plan_invocation_from(table, cfg, tmp_path_factory=None):
    import tempfile

    path = tempfile.mkdtemp() + "/in.parquet"
    write_shard(table, path, Lineage(stage="test"))
    return plan_invocation([path], cfg, 0)


def test_advantages_and_packing_into_batches(tmp_path):
    write_shard(synthetic_table(12, group_size=4, seed=1), str(tmp_path / "in" / "a.parquet"), Lineage("reward"))
    out = str(tmp_path / "batches")
    summary = run_filter(str(tmp_path / "in"), out, FilterConfig(batch_groups=3), 0,
                         metrics_url=str(tmp_path / "metrics"))
    shards = scan(out).shards
    assert len(shards) == len(summary["batches"]) == math.ceil(summary["groups_kept"] / 3)
    for i, shard in enumerate(shards):
        batch = read_shard(shard)
        groups = batch.column("group_id").to_pylist()
        assert len(set(groups)) == (3 if i < len(shards) - 1 else summary["groups_kept"] - 3 * i)
        assert batch.column("advantage").null_count == 0 and batch.column("weight").null_count == 0
        # group advantages sum to zero within each group
        adv = batch.column("advantage").to_pylist()
        for g in set(groups):
            assert sum(a for a, gg in zip(adv, groups, strict=True) if gg == g) == pytest.approx(0, abs=1e-5)
        assert read_lineage(shard).inputs == [str(tmp_path / "in" / "a.parquet")]


def test_exactly_once_and_the_audit_accounts_for_every_trajectory(tmp_path):
    inp, out, metrics = tmp_path / "in", str(tmp_path / "batches"), str(tmp_path / "metrics")
    first = synthetic_table(10, seed=2)
    write_shard(first, str(inp / "a.parquet"), Lineage("reward"))
    cfg = FilterConfig(batch_groups=4)
    s1 = run_filter(str(inp), out, cfg, 0, metrics_url=metrics)
    assert s1["batches"] and run_filter(str(inp), out, cfg, 0, metrics_url=metrics)["inputs"] == []
    second = synthetic_table(6, seed=3)
    write_shard(second, str(inp / "b.parquet"), Lineage("reward"))
    s2 = run_filter(str(inp), out, cfg, 0, metrics_url=metrics)
    assert s2["inputs"] == ["b.parquet"]
    audit = pq.read_table(metrics).to_pylist()
    all_ids = first.column("trajectory_id").to_pylist() + second.column("trajectory_id").to_pylist()
    assert sorted(r["trajectory_id"] for r in audit) == sorted(all_ids)  # each exactly once
    trained = [t for s in scan(out).shards for t in read_shard(s).column("trajectory_id").to_pylist()]
    assert sorted(trained) == sorted(r["trajectory_id"] for r in audit if r["rule"] == "kept")
    assert len(trained) == len(set(trained))
    dropped = {r["rule"] for r in audit if r["rule"] != "kept"}
    assert "completeness" in dropped  # synthetic data has truncated/timeout rows


def test_crash_between_batches_is_recovered_without_duplicates(tmp_path, monkeypatch):
    inp, out = tmp_path / "in", str(tmp_path / "batches")
    table = synthetic_table(12, seed=4)
    write_shard(table, str(inp / "a.parquet"), Lineage("reward"))
    cfg = FilterConfig(batch_groups=2)
    real_write, calls = filt.write_shard, []

    def crash_on_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        return real_write(*args, **kwargs)

    monkeypatch.setattr(filt, "write_shard", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        run_filter(str(inp), out, cfg, 0)
    monkeypatch.setattr(filt, "write_shard", real_write)
    assert len(scan(out).shards) == 1
    summary = run_filter(str(inp), out, cfg, 0)
    assert summary["recovered"] and summary["inputs"] == []
    reference = plan_invocation([str(inp / "a.parquet")], cfg, 0)
    trained = [t for s in scan(out).shards for t in read_shard(s).column("trajectory_id").to_pylist()]
    expected = [t for b in reference.batches for t in b.column("trajectory_id").to_pylist()]
    assert sorted(trained) == sorted(expected) and len(trained) == len(set(trained))


def test_min_groups_waits_and_dry_run_writes_nothing(tmp_path):
    inp, out = tmp_path / "in", str(tmp_path / "batches")
    write_shard(synthetic_table(4, seed=5), str(inp / "a.parquet"), Lineage("reward"))
    waiting = run_filter(str(inp), out, FilterConfig(min_groups=100), 0)
    assert waiting["waiting"] and scan(out).shards == []
    dry = run_filter(str(inp), out, FilterConfig(), 0, dry_run=True)
    assert dry["batches_planned"] >= 1 and scan(out).shards == []
    assert not (tmp_path / "batches" / MANIFEST_DIR).exists()


def test_all_rows_dropped_still_marks_inputs_consumed(tmp_path):
    inp, out = tmp_path / "in", str(tmp_path / "batches")
    write_shard(rows_to_table([row("u", 0, 0.0), row("u", 1, 0.0)]), str(inp / "a.parquet"), Lineage("reward"))
    s = run_filter(str(inp), out, FilterConfig(), 0)
    assert s["batches"] == [] and s["rules"]["zero_variance"] == 2
    assert run_filter(str(inp), out, FilterConfig(), 0)["inputs"] == []


def test_cli_dry_run_and_json(tmp_path):
    run = tmp_path / "run"
    write_shard(synthetic_table(6, seed=6), str(run / "rewarded" / "a.parquet"), Lineage("reward"))
    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)  # a second command keeps typer from collapsing to a single command
    runner = CliRunner()
    dry = runner.invoke(app, ["filter", "--run", str(run), "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    assert not (run / "batches").exists()
    res = runner.invoke(app, ["filter", "--run", str(run), "--batch-groups", "2", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(summary["batches"]) == len(scan(str(run / "batches")).shards) > 0
    assert list((run / "metrics").glob("filter-*.parquet"))
    bad = runner.invoke(app, ["filter", "--run", str(run), "--adv", "nope"])
    assert bad.exit_code == 2


def test_corrupt_input_fails_or_is_quarantined(tmp_path):
    inp, out = tmp_path / "in", str(tmp_path / "batches")
    write_shard(synthetic_table(4, seed=7), str(inp / "a.parquet"), Lineage("reward"))
    (inp / "b.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(CorruptShardError, match="b.parquet"):
        run_filter(str(inp), out, FilterConfig(), 0)
    summary = run_filter(str(inp), out, FilterConfig(), 0, quarantine_bad=True)
    assert summary["quarantined"] == ["b.parquet"] and summary["inputs"] == ["a.parquet"]
    assert (inp / "_quarantine" / "b.parquet").is_file() and summary["batches"]


def test_an_exact_duplicate_row_does_not_condemn_its_group():
    # A rollout retry wrote sample 1 twice (same id): integrity passes, the copy goes under "duplicate".
    table = rows_to_table([row("g", 0, 1.0, tid="x0"), row("g", 1, 0.0, tid="x1"), row("g", 1, 0.0, tid="x1")])
    groups, res = kept_groups(table, FilterConfig())
    assert groups == {"g"} and res.counts["group_integrity"] == 0 and res.counts["duplicate"] == 1


def test_an_aborted_member_replaced_by_a_resumed_rollout_leaves_its_group_whole(tmp_path):
    # Rollout resumes per sample: run 1 was stopped while sample 1 ran (aborted, id a1); run 2 wrote it again (b1).
    rows = [row("g", 0, 1.0, tid="x0"), row("g", 1, 0.0, status="aborted", tid="a1"), row("g", 2, 0.0, tid="x2"),
            row("g", 1, 0.0, tid="b1"), row("h", 0, 1.0), row("h", 1, 0.0)]
    groups, res = kept_groups(rows_to_table(rows), FilterConfig())
    assert groups == {"g", "h"} and res.counts["group_integrity"] == 0 and res.counts["completeness"] == 1
    # Kept by --keep-status, the replaced try still is not a member: it goes, and only it.
    table = rows_to_table(rows)
    _, res = kept_groups(table, FilterConfig(keep_status=["ok", "aborted"]))
    assert res.keep.tolist() == [True, False, True, True, True, True] and res.counts["group_integrity"] == 1
    # Packed: the group's batch holds each sample index once, the aborted try in none.
    write_shard(table, str(tmp_path / "in" / "a.parquet"), Lineage("reward"))
    summary = run_filter(str(tmp_path / "in"), str(tmp_path / "batches"), FilterConfig(), 0)
    packed = [r for shard in scan(str(tmp_path / "batches")).shards
              for r in read_shard(shard, columns=["trajectory_id", "group_id", "sample_index"]).to_pylist()]
    assert summary["groups_kept"] == 2 and "a1" not in {r["trajectory_id"] for r in packed}
    assert sorted(r["sample_index"] for r in packed if r["group_id"] == "g") == [0, 1, 2]


def test_a_replacement_does_not_hide_a_gap_or_a_second_completed_sample():
    # Sample 1 replaced, sample 2 never written: the group is not whole.
    gap = [row("g", 0, 1.0), row("g", 1, None, status="aborted", tid="a1"), row("g", 1, 0.0), row("g", 3, 0.0)]
    # Two completed samples at one index (distinct ids) are no replacement either.
    twice = [row("t", 0, 1.0), row("t", 1, 0.0), row("t", 1, 1.0), row("t", 2, 0.0)]
    # Stopped twice at sample 1 and not re-run yet: one index tried twice, no gap; both tries go (completeness).
    pending = [row("p", 0, 1.0), row("p", 1, None, status="aborted"), row("p", 1, None, status="aborted"),
               row("p", 2, 0.0)]
    groups, res = kept_groups(rows_to_table(gap + twice + pending), FilterConfig())
    # completeness: the 3 aborted rows (no reward); group_integrity: the other 3 rows of "g" and 4 of "t".
    assert groups == {"p"} and res.counts["group_integrity"] == 7 and res.counts["completeness"] == 3
