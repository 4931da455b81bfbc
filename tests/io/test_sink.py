"""The buffered group writer: a failed shard write loses no row; the next flush writes them all."""

from __future__ import annotations

import asyncio

import pytest

from arlctl.io.shards import Lineage, read_shard
from arlctl.io.sink import GroupShardWriter
from arlctl.schemas.rows import TrajectoryRow


def _group(name: str, size: int = 2) -> list[TrajectoryRow]:
    return [TrajectoryRow(group_id=name, sample_index=i, task_id=name, env="test", env_version="1", task={},
                          policy="p", prompt_text="q", prompt_ids=[1, 2], response_ids=[3], response_mask=[1],
                          response_logprobs=[-0.5]) for i in range(size)]


def test_a_failed_write_keeps_the_rows_for_the_next_flush(tmp_path):
    out = tmp_path / "out"
    out.write_text("a file where the output directory should be\n")  # every write under it fails

    async def main():
        writer = GroupShardWriter(str(out), lambda: Lineage(stage="rollout"), flush_groups=1)
        with pytest.raises(OSError):
            await writer.add_group(_group("a"))
        out.unlink()  # the cause goes away (disk freed, path fixed) ...
        out.mkdir()
        await writer.add_group(_group("b"))  # ... and the next flush writes both groups
        return writer

    writer = asyncio.run(main())
    assert writer.rows_written == 4 and len(writer.written) == 1
    table = read_shard(writer.written[0])
    assert sorted(table.column("group_id").to_pylist()) == ["a", "a", "b", "b"]


def test_a_group_the_schema_refuses_fails_alone(tmp_path):
    """A bad group (a bool where a token id goes) raises when it is added and is never buffered, so the
    groups before and after it are written."""
    out = tmp_path / "out"

    async def main():
        writer = GroupShardWriter(str(out), lambda: Lineage(stage="rollout"), flush_groups=2)
        await writer.add_group(_group("a"))
        bad = _group("bad")
        bad[0].response_ids = [True]
        with pytest.raises(Exception, match="bool|integer"):
            await writer.add_group(bad)
        await writer.add_group(_group("b"))
        return writer

    writer = asyncio.run(main())
    table = read_shard(writer.written[0])
    assert sorted(table.column("group_id").to_pylist()) == ["a", "a", "b", "b"]
