"""`prune_checkpoints` (train --keep-checkpoints) on a local directory and on a real S3 endpoint (moto)."""

from __future__ import annotations

import fsspec
import pytest

from arlctl.io.fs import join
from arlctl.io.ledger import STATE_FILE, list_checkpoints
from arlctl.rl.checkpoint import prune_checkpoints


def _make(fs: fsspec.AbstractFileSystem, root: str, step: int, complete: bool = True) -> None:
    d = join(root, f"step-{step:06d}")
    fs.pipe_file(join(d, "model.safetensors"), b"weights")
    if complete:
        fs.pipe_file(join(d, STATE_FILE), b'{"step": %d}' % step)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", "s3"])
def test_prune_keeps_the_newest_complete_checkpoints_and_leaves_incomplete_ones(where, tmp_path, request):
    root = str(tmp_path / "ckpt") if where == "local" else join(request.getfixturevalue("s3_bucket"), "run/ckpt")
    fs = (fsspec.filesystem("file", auto_mkdir=True) if where == "local"
          else fsspec.filesystem("s3", skip_instance_cache=True))
    for step in (1, 2, 3, 4):
        _make(fs, root, step)
    _make(fs, root, 5, complete=False)  # being written (remote) or interrupted: not a checkpoint yet

    assert prune_checkpoints(root, keep=2) == [1, 2]
    fs.invalidate_cache()
    assert [s for s, _ in list_checkpoints(root)] == [3, 4]
    left = {p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root)}
    assert left == {"step-000003", "step-000004", "step-000005"}  # gone entirely; step 5 untouched
    assert prune_checkpoints(root, keep=2) == []
    with pytest.raises(Exception, match="keep at least 1"):
        prune_checkpoints(root, keep=0)
