"""Bounded inputs (issue 26 item 5): what a shard may cost a reader, and what one poison row may cost a stage.

A 30 KB shard can stand for 7.2 GB: one 100 KB string in a Parquet dictionary page, referenced by every
one of 72,000 rows through RLE indices (zstd shrinks the page itself to a few hundred bytes). Reading it
must stop at the caps (arlctl/io/shards.py ReadLimits) without expanding it, and `arlctl reward` must
then treat it as any unreadable shard: named, exit 1, the other shards rewarded; --quarantine moves it.
A row whose response_mask is shorter than its ids (which no writer accepts) is set aside with its cause
and its shard named; the shard's other rows are rewarded and written, and a re-run does not fail again.
The attacks run through the real CLI, as a subprocess that reports its own peak RSS (VmHWM).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from arlctl.errors import CorruptShardError
from arlctl.io.shards import LINEAGE_KEY, Lineage, ReadLimits, read_shard, write_table_atomic
from arlctl.schemas.rows import TrajectoryRow, Turn
from arlctl.schemas.trajectory import SCHEMA_METADATA, TRAJECTORY_SCHEMA

RSS_BOUND_KB = 1 << 20  # 1 GB: generous for a reader that never expands the 7.2 GB it is handed


def row(i: int, prompt_text: str = "p", answer: str = "2") -> dict:
    """A valid rollout row of the math env (3 response tokens, one turn), not yet rewarded."""
    return TrajectoryRow(group_id=f"g{i // 2}", sample_index=i % 2, task_id="t", env="math", env_version="math-1",
                         task={"task_id": "t", "question": "1+1?", "answer": "2"}, policy="p",
                         prompt_text=prompt_text, prompt_ids=[1, 2], response_ids=[3, 4, 5],
                         response_mask=[1, 1, 0], response_logprobs=[-0.1, -0.2, 0.0],
                         turns=[Turn(0, 0, 2, 1, "t", observation="o")], final_state=answer,
                         trajectory_id=f"id-{i}").to_arrow()


def meta() -> dict[bytes, bytes]:
    return {**SCHEMA_METADATA, LINEAGE_KEY: Lineage(stage="rollout").to_json().encode()}


def plant(rows: list[dict], path) -> str:
    """Write rows the way a broken or hostile writer would: the right metadata, no validation."""
    return write_table_atomic(pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA), str(path), meta())


def dictionary_bomb(path, rows: int = 72_000, text_bytes: int = 100_000) -> int:
    """`rows` rows sharing one `text_bytes` prompt_text through the dictionary: tens of KB on disk."""
    one = pa.Table.from_pylist([row(0, "A" * text_bytes)], schema=TRAJECTORY_SCHEMA)
    table = pa.concat_tables([one] * rows).replace_schema_metadata(meta())
    pq.write_table(table, str(path), compression="zstd", compression_level=19, row_group_size=rows,
                   dictionary_pagesize_limit=1 << 30)
    return os.path.getsize(path)


# The CLI under a wrapper that writes the process's own peak RSS (VmHWM of /proc/self/status) at exit.
# Neither os.wait4's ru_maxrss nor getrusage can be used: Linux carries the forking parent's high-water mark
# into the child across fork and exec, so under a large pytest process they report pytest's peak.
_MEASURED = """
import atexit, runpy, sys
out = sys.argv.pop(1)
def peak():
    with open("/proc/self/status") as status, open(out, "w") as sink:
        sink.write(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
atexit.register(peak)
runpy.run_module("arlctl.cli.main", run_name="__main__", alter_sys=True)
"""


def run_cli(*args, env: dict[str, str] | None = None) -> tuple[int, str, str, int]:
    """(exit code, stdout, stderr, peak RSS in KB) of `arlctl ARGS` in its own process."""
    import tempfile

    with tempfile.NamedTemporaryFile("r", suffix=".hwm") as hwm:
        proc = subprocess.run([sys.executable, "-c", _MEASURED, hwm.name, *map(str, args)], capture_output=True,
                              env={**os.environ, "COLUMNS": "250", **(env or {})}, text=True)
        peak = hwm.read().strip()
    assert peak.isdigit(), f"the CLI did not report its peak RSS (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return proc.returncode, proc.stdout, proc.stderr, int(peak)


@pytest.mark.e2e  # the peak RSS of a real `arlctl reward` process is what is asserted
def test_a_dictionary_bomb_is_refused_by_reward_without_expanding_it(tmp_path):
    rollouts = tmp_path / "rollouts"
    rollouts.mkdir()
    size = dictionary_bomb(rollouts / "part-bomb.parquet")
    assert size < 64_000, size  # 72,000 x 100 KB = 7.2 GB decoded, from this many bytes on disk
    plant([row(0), row(1)], rollouts / "part-good.parquet")
    args = ("reward", "--in", rollouts, "--out", tmp_path / "rewarded", "--reward", "math", "--json")
    code, out, err, rss_kb = run_cli(*args)
    assert code == 1, err
    assert "part-bomb.parquet" in err and "ARLCTL_MAX_SHARD_BYTES" in err and "over the" in err
    assert rss_kb < RSS_BOUND_KB, f"peak RSS {rss_kb} KB: the bomb was expanded"
    assert (tmp_path / "rewarded" / "part-good.parquet").is_file(), "the good shard waited on the bomb"

    code, out, err, rss_kb = run_cli(*args, "--quarantine")
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["skipped_consumed"] == 1 and len(summary["corrupt"]) == 1
    cause = summary["corrupt"][0]
    assert "part-bomb.parquet" in cause and "decodes to" in cause and "2147483648-byte cap" in cause
    assert (rollouts / "_quarantine" / "part-bomb.parquet").is_file()
    assert not (rollouts / "part-bomb.parquet").exists()
    assert rss_kb < RSS_BOUND_KB


@pytest.mark.slow
def test_the_row_cap_names_the_row_and_the_caps_can_be_raised(tmp_path):
    """ARLCTL_MAX_ROW_BYTES refuses the one long row (named by index); raised, the shard reads as written."""
    path = plant([row(0), row(1, "B" * 50_000), row(2)], tmp_path / "part-1.parquet")
    with pytest.raises(CorruptShardError, match=r"row 1 decodes to 5\d{4} bytes, over the 40000-byte cap"):
        read_shard(path, limits=ReadLimits(max_row_bytes=40_000))
    with pytest.raises(CorruptShardError, match="ARLCTL_MAX_SHARD_BYTES"):
        read_shard(path, limits=ReadLimits(max_shard_bytes=20_000))
    table = read_shard(path, limits=ReadLimits(max_row_bytes=60_000, max_shard_bytes=70_000))
    assert table.column("prompt_text").to_pylist() == ["p", "B" * 50_000, "p"]
    assert table.schema.field("prompt_text").type == pa.string()  # expanded back to the schema's own type

    rollouts = tmp_path / "rollouts"
    plant([row(0), row(1, "B" * 50_000)], rollouts / "part-1.parquet")
    args = ("reward", "--in", rollouts, "--out", tmp_path / "rewarded", "--reward", "math")
    code, _, err, _ = run_cli(*args, env={"ARLCTL_MAX_ROW_BYTES": "40000"})
    assert code == 1 and "row 1 decodes to" in err and "ARLCTL_MAX_ROW_BYTES" in err
    code, _, err, _ = run_cli(*args, env={"ARLCTL_MAX_ROW_BYTES": "lots"})
    assert code == 2 and "ARLCTL_MAX_ROW_BYTES" in err and "not a positive number" in err
    code, _, err, _ = run_cli(*args, env={"ARLCTL_MAX_ROW_BYTES": "60000"})
    assert code == 0, err
    assert read_shard(str(tmp_path / "rewarded" / "part-1.parquet")).column("reward").to_pylist() == [1.0, 1.0]


def test_the_footer_alone_refuses_pages_over_the_cap(tmp_path):
    """Plain (not dictionary) pages: their uncompressed size is in the footer, summed before decoding."""
    path = tmp_path / "part-plain.parquet"
    table = pa.Table.from_pylist([row(i, "C" * 300_000) for i in range(4)], schema=TRAJECTORY_SCHEMA)
    pq.write_table(table.replace_schema_metadata(meta()), str(path), compression="zstd", use_dictionary=False)
    with pytest.raises(CorruptShardError, match=r"the shard \(by its footer\) decodes to"):
        read_shard(str(path), limits=ReadLimits(max_shard_bytes=1_000_000))
    assert read_shard(str(path), limits=ReadLimits(max_shard_bytes=2_000_000)).num_rows == 4


def test_bounded_reading_gives_the_same_table_as_parquet(tmp_path):
    """The dictionary-kept decode, expanded, is the table pyarrow reads: same types, values and metadata."""
    from arlctl.io.shards import write_shard
    from arlctl.schemas.trajectory import conform
    from arlctl.synthetic import synthetic_table

    path = write_shard(synthetic_table(20, 4, seed=3), str(tmp_path / "part-s.parquet"), Lineage("rollout"))
    ours = read_shard(path)
    theirs = conform(pq.read_table(path))
    assert ours.equals(theirs) and ours.schema.equals(theirs.schema, check_metadata=True)


def poison_rows() -> list[dict]:
    rows = [row(i) for i in range(6)]
    rows[1]["response_mask"] = [1, 1]  # shorter than its 3 ids: what aborted every retry at write
    rows[4]["response_logprobs"] = [-0.1, -0.2, 0.0, -0.3]  # longer than its ids
    rows[5]["final_state"] = "3"  # a wrong answer: an ordinary 0, not an error
    return rows


@pytest.mark.slow
def test_a_poison_row_is_set_aside_and_the_rest_of_its_shard_is_rewarded(tmp_path):
    rollouts = tmp_path / "rollouts"
    plant(poison_rows(), rollouts / "part-1.parquet")
    plant([row(0), row(1)], rollouts / "part-2.parquet")
    args = ("reward", "--in", rollouts, "--out", tmp_path / "rewarded", "--reward", "math", "--json")
    code, out, err, _ = run_cli(*args)
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["shards_written"] == 2 and summary["rows"] == 8 and summary["error_causes"] == {"invalid_row": 2}
    first, second = summary["row_errors"]
    assert first.startswith("part-1.parquet row 1 (trajectory_id 'id-1'): quarantined: response_mask has 2 values")
    assert second.startswith("part-1.parquet row 4 (trajectory_id 'id-4'): quarantined: response_logprobs has 4")
    assert "part-1.parquet row 1" in err  # named on stderr too

    written = read_shard(str(tmp_path / "rewarded" / "part-1.parquet")).to_pylist()
    assert [r["trajectory_id"] for r in written] == ["id-0", "id-2", "id-3", "id-5"]
    assert [r["reward"] for r in written] == [1.0, 1.0, 1.0, 0.0]
    aside = pq.read_table(str(rollouts / "_quarantine" / "part-1.rows.parquet"))
    assert aside.column("trajectory_id").to_pylist() == ["id-1", "id-4"]
    assert aside.column("response_mask").to_pylist()[0] == [1, 1]  # kept as it was read, never coerced
    lineage = json.loads(aside.schema.metadata[LINEAGE_KEY])
    assert lineage["inputs"] == [str(rollouts / "part-1.parquet")] and len(lineage["extra"]["quarantined_rows"]) == 2
    assert (rollouts / "part-1.parquet").is_file()  # the shard itself stays; its output vouches for it

    code, out, err, _ = run_cli(*args)  # consumed: a re-run neither fails nor scores it again
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["skipped_consumed"] == 2


@pytest.mark.slow
def test_a_shard_of_only_poison_rows_fails_the_command_after_writing(tmp_path):
    """Nothing got a reward: exit 1 naming the first cause (the project's rule), output still committed."""
    rows = poison_rows()[1:2]
    plant(rows, tmp_path / "rollouts" / "part-1.parquet")
    code, _, err, _ = run_cli("reward", "--in", tmp_path / "rollouts", "--out", tmp_path / "rewarded",
                              "--reward", "math")
    assert code == 1 and "no row got a reward" in err and "quarantined: response_mask" in err
    assert read_shard(str(tmp_path / "rewarded" / "part-1.parquet")).num_rows == 0
    assert (tmp_path / "rollouts" / "_quarantine" / "part-1.rows.parquet").is_file()


@pytest.mark.slow
def test_dry_run_names_the_poison_row_and_writes_nothing(tmp_path):
    plant(poison_rows(), tmp_path / "rollouts" / "part-1.parquet")
    code, out, err, _ = run_cli("reward", "--in", tmp_path / "rollouts", "--out", tmp_path / "rewarded",
                                "--reward", "math", "--dry-run", "--json")
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["error_causes"] == {"invalid_row": 2}
    assert not (tmp_path / "rollouts" / "_quarantine").exists() and not (tmp_path / "rewarded").exists()
