"""Backpressure: with train stopped, `rollout --watch` halts at --max-pending; it resumes when the
pipeline catches up, waits while the trainer is more than --max-staleness versions ahead, and picks up
the published version. Staleness is observed through arlctl.runstate (what `arlctl status` shows).

Bounds (README "Running as daemons"): a group starts only when backlog + G <= --max-pending, so the
backlog of untrained rows never exceeds it; and only when the lag its rows would have when trained
(trainer_version + steps queued in front of the trainer - policy_version) <= K.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.runstate import backlog, run_state

# A real `rollout --watch` subprocess driven through a whole daemon cycle: the integration tier.
pytestmark = pytest.mark.integration

ARLCTL = [sys.executable, "-m", "arlctl.cli.main"]
MAX_PENDING, K, G = 8, 1, 2


def arlctl(*args: str) -> dict:
    """The catching-up stages run in this process (cheaper than a fresh interpreter each on 2 cores)."""
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def catch_up(run: str) -> None:
    """reward -> filter -> train (one checkpoint at the end: the trainer jumps two versions at once)."""
    arlctl("reward", "--run", run, "--reward", "first-token")
    arlctl("filter", "--run", run, "--batch-groups", "2", "--keep-uniform", "1", "--adv", "batch")
    arlctl("train", "--run", run, "--policy", "tiny", "--lr", "1e-3", "--save-every", "100")


def wait_until(predicate, log, timeout=180.0, what=""):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}; rollout log:\n{log.read_text()[-3000:]}")


def test_rollout_halts_at_the_bound_and_resumes_when_train_catches_up(tmp_path):
    run = str(tmp_path / "run")
    log = tmp_path / "rollout.log"
    proc = subprocess.Popen(
        [*ARLCTL, "rollout", "--watch", "--env", "first-token", "--tasks", "builtin:first-token?n=64",
         "--policy", "tiny", "--run", run, "-G", str(G), "-c", "4", "--max-new-tokens", "4", "--seed", "0",
         "--flush-groups", "3", "--poll", "0.3", "--max-pending", str(MAX_PENDING), "--max-staleness", str(K),
         "--json"], stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    seen: list[int] = []

    def total() -> int:
        seen.append(backlog(run)["total"])
        return seen[-1]

    try:
        # 1. Train is stopped: the rollout fills the backlog up to the bound, then halts there. (With
        #    --flush-groups 3 the 4th group stays buffered until the waiting gate commits it.)
        wait_until(lambda: total() == MAX_PENDING and "waiting: backlog" in log.read_text(), log,
                   what="the backlog bound")
        for _ in range(8):  # several poll periods: the backlog stays at the bound
            time.sleep(0.4)
            assert total() == MAX_PENDING
        assert run_state(run)["stages"]["rollout"]["output_rows"] == MAX_PENDING

        # 2. The pipeline catches up, except sync: the backlog empties, but the trainer is now 2 versions
        #    ahead of the rollout's v0 > K, so it still waits.
        catch_up(run)
        state = run_state(run)
        assert state["trainer_step"] == 2 and state["backlog"]["total"] == 0
        wait_until(lambda: "lag at train time would be 2 > max-staleness 1" in log.read_text(), log,
                   what="the staleness wait")
        time.sleep(1.5)
        assert run_state(run)["stages"]["rollout"]["output_rows"] == MAX_PENDING

        # 3. sync publishes v2: the rollout reloads it and resumes, up to the bound again.
        arlctl("sync", "--run", run)
        wait_until(lambda: total() == MAX_PENDING and run_state(run)["stages"]["rollout"]["output_rows"]
                   == 2 * MAX_PENDING, log, what="the resumed rollout")
        assert "policy reloaded: v0 -> v2" in log.read_text()

        # 4. One more round trains the v2 rows; every trained row's staleness is within K.
        catch_up(run)
        state = run_state(run)
        assert state["trainer_step"] == 4
        trained = state["staleness"]["trained"]
        assert trained["rows"] == 2 * MAX_PENDING and trained["max"] <= K
        assert state["backlog"]["total"] == 0  # v2 is now 2 behind step 4: the rollout waits for sync again
    finally:
        proc.send_signal(signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert max(seen) <= MAX_PENDING  # the backlog never exceeded the bound
    summary = json.loads(stdout)
    print({k: summary[k] for k in ("rows_written", "max_backlog", "max_staleness_at_start", "backlog_waits",
                                    "staleness_waits", "backlog_wait_s", "staleness_wait_s", "reloads")},
          "backlog samples", Counter(seen))
    assert summary["max_backlog"] <= MAX_PENDING and summary["max_staleness_at_start"] <= K
    assert summary["backlog_waits"] >= 2 and summary["staleness_waits"] >= 1
    assert summary["backpressure_wait_s"] > 0 and summary["reloads"] == 1
    versions = {v["policy_version"] for v in run_state(run)["reward_trend"]["per_version"]}
    assert versions == {0, 2}
