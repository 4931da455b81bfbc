"""The filter's untrusted rule: rows whose reward_info says trusted: false go (counted), unless --keep-untrusted;
rewards that do not say (math, judges, synthetic rows) are never touched by it."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import typer
from typer.testing import CliRunner

from arlctl.audit import NAMED_RULES
from arlctl.cli.filter import register
from arlctl.io.shards import Lineage, write_shard
from arlctl.schemas.rows import TrajectoryRow, rows_to_table
from arlctl.stages.configs import FilterConfig
from arlctl.stages.filter import RULES, apply_rules

SWE_PROBE = {"mode": "probe", "trusted": True, "apply_ok": True}
SWE_INPROCESS = {"mode": "inprocess", "trusted": False, "records_authentic": True,
                 "untrusted_cause": "in-process grading: the row is not prepared"}
MATH = {"answer": "4", "parsed": "4"}  # no `trusted` key at all


def _row(group: str, idx: int, reward: float, info: object) -> TrajectoryRow:
    text = info if isinstance(info, str) or info is None else json.dumps(info)
    return TrajectoryRow(group_id=group, sample_index=idx, task_id=group, env="test", env_version="1", task={},
                         policy="p", prompt_text="", prompt_ids=[1, 2], response_ids=[3], response_mask=[1],
                         response_logprobs=[-0.5], turns=[], status="ok", policy_version=0, policy_version_last=0,
                         reward=reward, reward_info=text)


def _table():
    return rows_to_table([
        _row("probe", 0, 1.0, SWE_PROBE), _row("probe", 1, 0.0, SWE_PROBE),
        _row("inproc", 0, 1.0, SWE_INPROCESS), _row("inproc", 1, 0.0, SWE_INPROCESS),
        _row("math", 0, 1.0, MATH), _row("math", 1, 0.0, None),  # a null reward_info is kept too
        # a weighted sum: one part in-process is enough to make the total untrusted
        _row("sum", 0, 1.2, {"parts": {"swe": SWE_INPROCESS, "judge": {"score": 0.2}}, "weights": {}}),
        _row("sum", 1, 0.0, {"parts": {"swe": SWE_PROBE, "judge": {"score": 0.0}}, "weights": {}}),
        _row("garbled", 0, 1.0, "not json {"), _row("garbled", 1, 0.0, MATH),  # unreadable: fail closed
        _row("truthy", 0, 1.0, {"trusted": 0}), _row("truthy", 1, 0.0, {"trusted": "no"}),  # only `false` counts
    ])


def _kept(table, cfg):
    res = apply_rules(table, cfg, 0)
    rows = [(g, i) for g, i, k in zip(table.column("group_id").to_pylist(), table.column("sample_index").to_pylist(),
                                      res.keep, strict=True) if k]
    return rows, res


def test_untrusted_rows_are_dropped_and_counted_by_default():
    assert RULES.index("completeness") < RULES.index("untrusted") < RULES.index("group_integrity")
    assert "untrusted" in NAMED_RULES  # the audit accounts for the rule's drops
    kept, res = _kept(_table(), FilterConfig())
    assert res.counts["untrusted"] == 4  # inproc x2, the sum with an in-process part, the garbled row
    assert {(i, rule) for i, rule in res.drops if rule == "untrusted"} == {(2, "untrusted"), (3, "untrusted"),
                                                                          (6, "untrusted"), (8, "untrusted")}
    # their groups are left with one trajectory each: group_integrity takes the rest, as for any rule
    assert res.counts["group_integrity"] == 2
    assert kept == [("probe", 0), ("probe", 1), ("math", 0), ("math", 1), ("truthy", 0), ("truthy", 1)]


def test_keep_untrusted_keeps_them():
    kept, res = _kept(_table(), FilterConfig(keep_untrusted=True))
    assert res.counts["untrusted"] == 0 and res.counts["group_integrity"] == 0
    assert len(kept) == 12


def test_the_cli_reports_the_rule_and_keep_untrusted_keeps(tmp_path):
    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)
    runner = CliRunner()
    outcomes = {}
    for flag in ([], ["--keep-untrusted"]):
        run = tmp_path / ("keep" if flag else "default")
        write_shard(_table(), str(run / "rewarded" / "a.parquet"), Lineage("reward"))
        res = runner.invoke(app, ["filter", "--run", str(run), "--json", "--min-group-size", "1",
                                  "--keep-uniform", "1", *flag])
        assert res.exit_code == 0, res.output
        summary = json.loads(res.stdout.strip().splitlines()[-1])
        audit = pq.read_table(next((run / "metrics").glob("filter-*.parquet"))).to_pylist()
        outcomes[bool(flag)] = (summary["rules"]["untrusted"], summary["rows_kept"],
                                sorted(r["rule"] for r in audit if r["rule"] != "kept"))
        assert "untrusted" in res.output  # the table on stderr lists the rule with its count
    assert outcomes[False] == (4, 8, ["untrusted"] * 4)
    assert outcomes[True] == (0, 12, [])
