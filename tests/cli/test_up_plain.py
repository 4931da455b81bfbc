"""`arlctl up` off a terminal and its idle reasons (issue 27 items 5 and 6): piped, it writes timestamped
plain lines as they happen, never a frame, with the summary on its own line; the dashboard says why a
stage is idle (waiting on input, backpressure, staleness, what the filter dropped) and the lag at train time.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.cli.up import Dashboard, idle_reasons
from arlctl.io.shards import Lineage, shard_name, write_shard
from arlctl.runstate import run_state
from arlctl.supervisor import Supervisor, parse_recipe
from arlctl.synthetic import synthetic_table

ARLCTL = [sys.executable, "-m", "arlctl.cli.main"]
STAMP = re.compile(r"^\d\d:\d\d:\d\d ")


@pytest.mark.e2e
def test_up_piped_writes_timestamped_lines_while_it_runs(tmp_path):
    """stdout and stderr go to a file (no TTY, no --no-dashboard): the first lines are in the file while
    `up` still runs; every line is stamped; the summary is a line of its own; no frame is drawn."""
    code = "import time; print('ready', flush=True); time.sleep(120)"  # a child that idles until SIGTERM
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"run": str(tmp_path / "run"), "command": [sys.executable, "-c", code],
                                    "refresh_s": 0.5, "stop_grace_s": 5, "stages": {"sync": {}, "train": {}}}))
    out = tmp_path / "up.out"
    with open(out, "w") as fh:
        proc = subprocess.Popen([*ARLCTL, "up", str(path), "--for", "300"], stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.time() + 120
        while '"stages"' not in out.read_text() and time.time() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None  # still running, and already written out
        during = out.read_text().splitlines()
        assert any("sync-0: started pid" in line for line in during), during
        assert any('"stages"' in line for line in during), during
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines = out.read_text().splitlines()
    assert lines[-1].startswith("arlctl up: stopped (signal SIGTERM) after"), lines[-1]
    # GracefulStop's own notice (arlctl/io/watch.py, shared by every daemon) is the one unstamped line
    assert all(STAMP.match(line) or line.startswith("SIGTERM received") for line in lines[:-1]), lines
    assert sum(bool(STAMP.match(line)) for line in lines) >= 5
    assert not any(ch in out.read_text() for ch in "┏┃│━"), "a frame was drawn"


def test_idle_reasons_name_the_filters_drops_and_rollouts_bound(tmp_path):
    """A real filter pass over two groups whose rewards are all equal keeps nothing: the filter and the
    trainer are idle, and the dashboard says why. Eight queued batch shards hold rollout back on
    staleness at trainer lead 0."""
    run = tmp_path / "run"
    table = synthetic_table(2, group_size=4)
    table = table.set_column(table.schema.get_field_index("reward"), "reward", pa.array([0.0] * 8, pa.float32()))
    table = table.set_column(table.schema.get_field_index("status"), "status", pa.array(["ok"] * 8))
    write_shard(table, str(run / "rewarded" / shard_name("part")), Lineage(stage="reward"))
    result = CliRunner().invoke(app, ["filter", "--run", str(run)])
    assert result.exit_code == 0, result.output
    recipe = parse_recipe({"run": str(run), "max-staleness": 2, "stages": {
        "rollout": {"args": {"env": "math", "policy": "tiny", "group-size": 4}},
        "filter": {}, "train": {"args": {"policy": "tiny"}}}})
    statuses = {"rollout": "running", "filter": "running", "train": "running"}
    idle = idle_reasons(recipe, run_state(str(run)), statuses)
    assert idle["filter"] == "waiting on input (filter's last pass: all 2 groups zero_variance)"
    assert idle["train"] == idle["filter"] and idle["rollout"] == ""

    for _ in range(8):
        write_shard(synthetic_table(1, group_size=4), str(run / "batches" / shard_name("batch")),
                    Lineage(stage="test"))
    state = run_state(str(run))
    idle = idle_reasons(recipe, state, statuses)
    assert idle["rollout"] == "staleness: lag at train time would be 8 > 2 (8 steps queued for the trainer)"
    assert idle["train"] == ""  # it has work

    view = Dashboard(Supervisor(recipe))
    view.update(state)
    console = Console(record=True, width=250)
    console.print(view.render(state))
    text = console.export_text()
    assert "idle because" in text and "staleness: lag at train time would be 8 > 2" in text
