"""Shard I/O: round trips, atomic commit under SIGKILL, lineage, corrupt input and quarantine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arlctl.errors import CorruptShardError, NoShardsError
from arlctl.io.ledger import consumed_inputs
from arlctl.io.shards import (
    Lineage,
    config_hash,
    list_shards,
    read_dirs,
    read_lineage,
    read_shard,
    read_shards,
    scan,
    shard_name,
    write_shard,
)
from arlctl.schemas.rows import TrajectoryRow, Turn, rows_to_table
from arlctl.synthetic import synthetic_table

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
small_int = st.integers(0, 49151)


@st.composite
def trajectory_rows(draw):
    n_turns = draw(st.integers(1, 4))
    ids, mask, lps, turns = [], [], [], []
    for t in range(n_turns):
        gen = draw(st.integers(1, 5))
        obs = draw(st.integers(0, 4))
        start = len(ids)
        ids += draw(st.lists(small_int, min_size=gen + obs, max_size=gen + obs))
        mask += [1] * gen + [0] * obs
        lps += draw(st.lists(st.floats(-20, 0, width=32), min_size=gen, max_size=gen)) + [0.0] * obs
        turns.append(Turn(index=t, gen_start=start, gen_len=gen, obs_len=obs, text=draw(text),
                          tool_calls=draw(st.lists(st.fixed_dictionaries({"name": text, "arguments": st.dictionaries(text, small_int, max_size=2)}), max_size=2)),
                          observation=draw(st.none() | text), policy_version=draw(st.integers(0, 10**9)),
                          gen_latency_s=draw(st.floats(0, 100, width=32)),
                          env_latency_s=draw(st.floats(0, 100, width=32)),
                          reward_step=draw(st.none() | st.floats(-1, 1, width=32)), error=draw(st.none() | text)))
    return TrajectoryRow(
        group_id=draw(text), sample_index=draw(st.integers(0, 100)), task_id=draw(text), env=draw(text),
        env_version=draw(text), task={"q": draw(text)}, policy=draw(text), prompt_text=draw(text),
        prompt_ids=draw(st.lists(small_int, max_size=10)), response_ids=ids, response_mask=mask,
        response_logprobs=lps, turns=turns, status=draw(st.sampled_from(["ok", "truncated", "aborted"])),
        finish_reason=draw(st.sampled_from(["stop", "submit", "max_turns"])),
        reward=draw(st.none() | st.floats(-1, 1, width=32)),
        reward_components=draw(st.none() | st.dictionaries(text, st.floats(0, 1, width=32), max_size=3)),
        advantage=draw(st.none() | st.floats(-5, 5, width=32)),
    )


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(trajectory_rows(), min_size=1, max_size=5))
def test_round_trip_equality_including_lists_and_structs(tmp_path, rows):
    table = rows_to_table(rows)
    path = str(tmp_path / shard_name("part"))
    write_shard(table, path, Lineage(stage="test"))
    back = read_shard(path)
    assert back.equals(table)
    assert back.schema.equals(table.schema, check_metadata=False)


def test_lineage_round_trip(tmp_path):
    table = synthetic_table(2, 2)
    lineage = Lineage(stage="reward", inputs=["/r/rollouts/part-a.parquet", "/r/rollouts/part-b.parquet"],
                      config_hash=config_hash({"reward": "math"}), extra={"reward_version": "math-1"})
    path = write_shard(table, str(tmp_path / "out" / "part-a.parquet"), lineage)
    back = read_lineage(path)
    assert back.stage == "reward" and back.inputs == lineage.inputs
    assert back.config_hash == config_hash({"reward": "math"}) != config_hash({"reward": "swe"})
    assert back.pid == os.getpid() and back.extra == {"reward_version": "math-1"}
    assert consumed_inputs(str(tmp_path / "out")) == {"part-a.parquet", "part-b.parquet"}
    assert consumed_inputs(str(tmp_path / "missing")) == set()


def test_hidden_and_stray_files_are_not_shards(tmp_path):
    write_shard(synthetic_table(1, 2), str(tmp_path / "part-1.parquet"), Lineage(stage="t"))
    (tmp_path / ".part-2.parquet.tmp").write_bytes(b"half")
    (tmp_path / "_quarantine").mkdir()
    (tmp_path / "_quarantine" / "x.parquet").write_bytes(b"bad")
    (tmp_path / "notes.txt").write_text("hello")
    listing = scan(str(tmp_path))
    assert [os.path.basename(s) for s in listing.shards] == ["part-1.parquet"]
    assert [os.path.basename(s) for s in listing.strays] == ["notes.txt"]


WRITER = textwrap.dedent("""
    import os, sys, time
    from arlctl.io import shards
    from arlctl.synthetic import synthetic_table
    table = synthetic_table(50, 4, seed=0)
    real_fsync = os.fsync
    def slow_fsync(fd):
        print("writing", flush=True)   # data is in the temp file, not yet renamed
        time.sleep(60)
        real_fsync(fd)
    os.fsync = slow_fsync
    shards.write_shard(table, sys.argv[1], shards.Lineage(stage="test"))
    print("committed", flush=True)
""")


@pytest.mark.slow
def test_sigkill_mid_write_leaves_no_visible_shard(tmp_path):
    target = tmp_path / "out" / "part-x.parquet"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not target.exists()
    leftovers = os.listdir(tmp_path / "out")
    assert leftovers == [".part-x.parquet.tmp"]  # only the hidden temp file
    assert list_shards(str(tmp_path / "out")) == []
    with pytest.raises(NoShardsError):
        read_dirs(str(tmp_path / "out"))


def test_rewrite_same_name_replaces_never_duplicates(tmp_path):
    path = str(tmp_path / "part-1.parquet")
    write_shard(synthetic_table(1, 2, seed=1), path, Lineage(stage="t"))
    write_shard(synthetic_table(2, 2, seed=2), path, Lineage(stage="t"))
    assert read_shard(path).num_rows == 4
    assert os.listdir(tmp_path) == ["part-1.parquet"]


def _corrupt_cases(tmp_path):
    good = str(tmp_path / "good.parquet")
    write_shard(synthetic_table(4, 2), good, Lineage(stage="t"))
    data = Path(good).read_bytes()
    (tmp_path / "truncated.parquet").write_bytes(data[: len(data) // 2])
    (tmp_path / "random.parquet").write_bytes(os.urandom(4096))
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "wrong-schema.parquet")
    table = synthetic_table(1, 2)
    meta = dict(table.schema.metadata)
    meta[b"arlctl.schema_version"] = b"99"
    pq.write_table(table.replace_schema_metadata(meta), tmp_path / "wrong-version.parquet")
    return good


@pytest.mark.parametrize("name,reason", [
    ("truncated.parquet", "Parquet"),
    ("random.parquet", "Parquet"),
    ("wrong-schema.parquet", "not an arlctl trajectory shard"),
    ("wrong-version.parquet", "unknown schema version 99"),
])
def test_corrupt_shard_error_names_the_file(tmp_path, name, reason):
    _corrupt_cases(tmp_path)
    path = str(tmp_path / name)
    with pytest.raises(CorruptShardError) as err:
        read_shard(path)
    message = str(err.value)
    assert path in message and reason in message
    assert "\n" not in message


def test_quarantine_moves_bad_shards_and_keeps_good(tmp_path):
    good = _corrupt_cases(tmp_path)
    table, errors = read_shards(list_shards(str(tmp_path)), on_corrupt="quarantine")
    assert table.num_rows == read_shard(good).num_rows
    assert len(errors) == 4
    assert sorted(os.listdir(tmp_path / "_quarantine")) == [
        "random.parquet", "truncated.parquet", "wrong-schema.parquet", "wrong-version.parquet"]
    assert list_shards(str(tmp_path)) == [good]


def test_memory_filesystem_write_list_read():
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.rm("/arlctl-test", recursive=True) if fs.exists("/arlctl-test") else None
    table = synthetic_table(3, 2)
    url = write_shard(table, "memory://arlctl-test/rollouts/part-1.parquet", Lineage(stage="t", inputs=["a"]))
    shards = list_shards("memory://arlctl-test/rollouts")
    assert shards == [url]
    assert read_shard(url).equals(table)
    assert consumed_inputs("memory://arlctl-test/rollouts") == {"a"}


def test_duckdb_reads_a_glob_named_file_as_that_file_alone(tmp_path):
    """read_parquet globs its arguments: a shard literally named `a[1].parquet` or `*.parquet` must be
    read as that one file, not as the files the pattern would match."""
    from arlctl.io.duck import connect

    table = synthetic_table(n_groups=1, group_size=2, seed=0)
    for name in ("a1.parquet", "a[1].parquet", "*.parquet", "b.parquet"):
        pq.write_table(table, tmp_path / name)
    for name in ("a[1].parquet", "*.parquet"):
        con = connect([str(tmp_path / name)])
        files = con.execute("select distinct filename from trajectories").fetchall()
        assert files == [(str(tmp_path / name),)]
        assert con.execute("select count(*) from trajectories").fetchone()[0] == 2
