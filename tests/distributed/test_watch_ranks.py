"""`train --watch` under torchrun (issue 15): 2 ranks poll together, train batches as they arrive with the
trainer kept in memory, and stop together on SIGTERM with a full checkpoint."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arlctl.io.ledger import latest_checkpoint, list_checkpoints, read_state
from arlctl.io.shards import scan
from arlctl.rl.config import TrainConfig
from arlctl.stages.train import train
from tests.distributed.common import REPO, make_uneven_batches, max_diff, small_init_model, weights

pytestmark = pytest.mark.distributed


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        assert proc.poll() is None, f"the trainer exited while waiting for {what}: {proc.stdout.read()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_watch_on_two_ranks_trains_arrivals_and_stops_on_sigterm(tmp_path):
    model = small_init_model(tmp_path)
    source = scan(make_uneven_batches(tmp_path, model, n_batches=4)).shards
    incoming, out = tmp_path / "incoming", tmp_path / "ckpt"
    incoming.mkdir()
    for url in source[:2]:
        shutil.copy(url, incoming / Path(url).name)
    settings = ["--lr", "3e-4", "--micro-tokens", "160", "--device", "cpu", "--publish-every", "1",
                "--save-every", "100"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "arlctl.cli.main", "train", "--nproc", "2", "--watch", "--poll",
                             "0.5", "--in", str(incoming), "--out", str(out), "--policy", str(model), *settings],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        steps = lambda: [s for s, _ in list_checkpoints(out)]  # noqa: E731
        wait_for(lambda: 2 in steps(), 300, "step 2", proc)
        for url in source[2:]:  # new batches arrive while it watches
            shutil.copy(url, incoming / Path(url).name)
        wait_for(lambda: 4 in steps(), 300, "step 4", proc)
        assert read_state(latest_checkpoint(out)[1])["full"] is False  # between cycles: weights only
        os.killpg(proc.pid, signal.SIGTERM)  # what torchrun, a Job or Slurm sends
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    state = read_state(latest_checkpoint(out)[1])
    assert state["step"] == 4 and state["full"] is True, output[-3000:]  # the watch ended with a full checkpoint
    assert state["world_size"] == 2 and len(state["consumed_batches"]) == 4
    assert not [p for p in out.iterdir() if p.name.startswith(".")], "no staging left behind"
    straight = tmp_path / "straight"
    train(str(incoming), str(model), str(straight), TrainConfig(lr=3e-4, micro_tokens=160, device="cpu"))
    diff = max_diff(weights(latest_checkpoint(straight)[1]), weights(latest_checkpoint(out)[1]))
    print(f"watch on 2 ranks, batches arriving, SIGTERM: max |w - straight| = {diff:.2e}")
    assert diff < 1e-5
