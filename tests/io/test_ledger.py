"""The run ledger (arlctl/io/ledger.py): LATEST, complete checkpoints and versions, and consumption."""

from __future__ import annotations

import json

import pytest

from arlctl.io import ledger, store
from arlctl.io.fs import join
from arlctl.io.run import RunLayout, resolve_io
from arlctl.io.shards import Lineage, write_shard
from arlctl.synthetic import synthetic_table


@pytest.fixture(params=["local", "s3"])
def run(request, tmp_path) -> RunLayout:
    if request.param == "local":
        return RunLayout(str(tmp_path / "run"))
    return RunLayout(join(request.getfixturevalue("s3_bucket"), f"ledger-{tmp_path.name}"))


def commit(parent: str, name: str, marker: str, content: dict) -> None:
    def build(directory):
        (directory / "model.safetensors").write_bytes(b"w")
        (directory / marker).write_text(json.dumps(content))

    store.commit_dir(build, join(parent, name), marker)


@pytest.mark.slow
def test_checkpoints_versions_and_latest(run):
    commit(run.checkpoints, ledger.step_dir_name(1), ledger.STATE_FILE, {"step": 1, "consumed_batches": ["b1"]})
    commit(run.checkpoints, ledger.step_dir_name(2), ledger.STATE_FILE, {"step": 2, "consumed_batches": ["b1", "b2"]})
    commit(run.checkpoints, ledger.step_dir_name(3), "not-the-marker", {})  # an upload in progress
    assert [s for s, _ in ledger.list_checkpoints(run.checkpoints)] == [1, 2]
    assert ledger.checkpoint_dirs(run.checkpoints) == 3
    step, location = ledger.latest_checkpoint(run.checkpoints)
    assert step == 2 and ledger.read_state(location)["consumed_batches"] == ["b1", "b2"]
    assert ledger.trained_batches(run.checkpoints) == ["b1", "b2"]

    assert ledger.read_latest(run.policy) is None and ledger.latest_version(run.policy) is None
    commit(run.policy, ledger.version_dir_name(2), ledger.VERSION_FILE, {"version": 2})
    ledger.write_latest(run.policy, "v000002")
    assert ledger.read_latest(run.policy) == "v000002" and ledger.latest_version(run.policy) == 2
    assert [v for v, _ in ledger.list_versions(run.policy)] == [2]
    assert ledger.read_version_info(run.policy, "v000002") == {"version": 2}
    assert ledger.read_version_info(run.policy, "v000001") is None
    ledger.remove_version(ledger.list_versions(run.policy)[0][1])
    assert ledger.list_versions(run.policy) == []


@pytest.mark.slow
def test_latest_naming_garbage_is_no_version(run):
    store.write_file(ledger.latest_url(run.policy), "../elsewhere\n")
    assert ledger.read_latest_raw(run.policy) == "../elsewhere"
    assert ledger.read_latest(run.policy) is None and ledger.latest_version(run.policy) is None


def test_consumed_by_lineage_and_filter_manifests(run):
    table = synthetic_table(2, 2, seed=1)
    write_shard(table, join(run.rewarded, "part-1.parquet"), Lineage("reward", inputs=["part-1.parquet"]))
    write_shard(table, join(run.rewarded, "other.parquet"), Lineage("reward", inputs=["part-2.parquet"]))
    assert ledger.consumed_inputs(run.rewarded) == {"part-1.parquet", "part-2.parquet"}
    assert ledger.consumed_inputs(run.rewarded, same_name=True) == {"part-1.parquet"}  # the 1:1 rule

    # One filter invocation of two batches: its inputs count once both batches are there, or its manifest is.
    extra = {"invocation": "inv1", "parts": 2}
    write_shard(table, join(run.batches, "batch-a.parquet"), Lineage("filter", ["r1.parquet"], extra={**extra, "part": 0}))
    assert ledger.filter_consumed(run.batches) == set()
    ledger.write_filter_manifest(run.batches, "inv1", {"invocation": "inv1", "inputs": ["r1.parquet"]})
    assert ledger.filter_consumed(run.batches) == {"r1.parquet"}
    assert [name for name, _ in ledger.read_filter_manifests(run.batches)] == ["inv1.json"]
    assert ledger.manifest_url(run.batches, "inv1") == join(run.filter_manifests, "inv1.json")


def test_run_layout_fills_stage_defaults():
    layout = RunLayout("s3://bucket/run")
    assert layout.stage_io("filter") == ("s3://bucket/run/rewarded", "s3://bucket/run/batches")
    assert resolve_io("sync", "s3://bucket/run", None, "elsewhere") == ("s3://bucket/run/checkpoints", "elsewhere")
    assert layout.logs == "logs" and RunLayout("/r").logs == "/r/logs"  # log files must be local
    assert layout.locks("sync") == "s3://bucket/run/policy/_locks"
