"""A checkpoint written by N ranks resumes on M (issue 15): 2 -> 1 with a rank SIGKILLed mid-run, and 1 -> 2.
Micro-batches are packed in all of them (--pack auto, issue 29).

Every checkpoint holds the model and optimizer as torch.distributed.checkpoint shards (one file per rank
that wrote it), resharded on load; so 2 steps on 2 ranks, a crash, then 2 steps on 1 process give the
weights of 4 steps straight on 1 process, and the same the other way round.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from arlctl.io.ledger import latest_checkpoint, list_checkpoints, read_state
from arlctl.rl.config import TrainConfig
from arlctl.stages.train import train
from tests.distributed.common import make_uneven_batches, max_diff, small_init_model, torchrun, weights

pytestmark = pytest.mark.distributed

TOL = 1e-5
SETTINGS = dict(lr=3e-4, kl_coef=0.05, eps_high=0.28, micro_tokens=160, save_every=1, loss_agg="token-mean")


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """4 steps on one process: the weights both resumed runs must reach."""
    root = tmp_path_factory.mktemp("resume")
    model = small_init_model(root)
    batches = make_uneven_batches(root, model, n_batches=4)
    out = root / "straight"
    assert train(batches, str(model), str(out), TrainConfig(strategy="single", device="cpu", **SETTINGS))["steps"] == 4
    return root, batches, model, weights(latest_checkpoint(out)[1])


def worker(batches: str, model: Path, out: Path, strategy: str, **extra) -> list[str]:
    return ["tests/distributed/worker.py", batches, str(model), str(out), strategy, "token-mean",
            json.dumps({k: v for k, v in {**SETTINGS, **extra}.items() if k != "loss_agg"})]


def rank_pids(parent: int) -> dict[int, int]:
    """{rank: pid} of torchrun's worker processes (read from their environment)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat[1]) == parent:
            for item in env:
                if item.startswith(b"RANK="):
                    found[int(item[5:])] = int(entry.name)
    return found


def test_two_ranks_killed_mid_run_resume_on_one_process(straight):
    root, batches, model, expected = straight
    out = root / "two-then-one"
    # 2 steps on 2 ranks (FSDP2), committed.
    res = torchrun(worker(batches, model, out, "fsdp2", max_steps=2))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert [s for s, _ in list_checkpoints(out / "token-mean")] == [1, 2]
    assert read_state(latest_checkpoint(out / "token-mean")[1])["world_size"] == 2
    # 2 ranks again; rank 1 is SIGKILLed as soon as rank 0 has computed step 3, before it is committed.
    proc = torchrun(worker(batches, model, out, "fsdp2"), wait=False)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    deadline, killed = time.monotonic() + 240, False
    while time.monotonic() < deadline and proc.poll() is None:
        if any(line.startswith("trained step 3") for line in lines):
            ranks = rank_pids(proc.pid)
            os.kill(ranks[1], signal.SIGKILL)
            killed = True
            break
        time.sleep(0.01)
    proc.wait(timeout=300)
    reader.join(timeout=10)
    output = "".join(lines)
    assert killed, "rank 1 was never seen training: " + output[-2000:]
    assert proc.returncode != 0, "a dead rank must take the step down"
    done = [s for s, _ in list_checkpoints(out / "token-mean")]
    assert max(done) < 4, f"the run was killed before its end, checkpoints {done}"
    # Resume on one process: the remaining steps, then the weights of 4 steps straight.
    summary = train(batches, None, str(out / "token-mean"), TrainConfig(strategy="single", device="cpu", **SETTINGS))
    assert summary["resumed_from"] == max(done) and summary["step"] == 4
    diff = max_diff(expected, weights(latest_checkpoint(out / "token-mean")[1]))
    print(f"2 ranks -> SIGKILL -> 1 process: max |w - straight| = {diff:.2e}")
    assert diff < TOL


def test_one_process_resumes_on_two_ranks(straight):
    root, batches, model, expected = straight
    out = root / "one-then-two"
    assert train(batches, str(model), str(out / "token-mean"),
                 TrainConfig(strategy="single", device="cpu", max_steps=2, **SETTINGS))["steps"] == 2
    res = torchrun(worker(batches, model, out, "ddp"))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    state = read_state(latest_checkpoint(out / "token-mean")[1])
    assert state["step"] == 4 and state["world_size"] == 2 and state["strategy"] == "ddp"
    diff = max_diff(expected, weights(latest_checkpoint(out / "token-mean")[1]))
    print(f"1 process -> 2 ranks (ddp): max |w - straight| = {diff:.2e}")
    assert diff < TOL


def reports(res) -> list[dict]:
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]


def test_a_packed_run_resumed_on_the_same_ranks_is_bit_exact(straight):
    """Across world sizes the ranks' gradient sums add in another order, so 2 -> 1 meets the straight run to
    1e-5 (above); on the same two ranks a stop and resume must change nothing at all."""
    root, batches, model, _ = straight
    whole = torchrun(worker(batches, model, root / "packed-whole", "fsdp2"))
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    assert {r["packing"] for r in reports(whole)} == {"packed"}
    for part in ({"max_steps": 2}, {}):
        res = torchrun(worker(batches, model, root / "packed-split", "fsdp2", **part))
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert {r["steps"] for r in reports(res)} == {2} and {r["packing"] for r in reports(res)} == {"packed"}
    a = weights(latest_checkpoint(root / "packed-whole" / "token-mean")[1])
    b = weights(latest_checkpoint(root / "packed-split" / "token-mean")[1])
    assert a.keys() == b.keys()
    unequal = [name for name in a if not torch.equal(a[name], b[name])]
    assert not unequal, f"{len(unequal)} tensors differ after the resume, first {unequal[:1]}: {max_diff(a, b):.2e}"
