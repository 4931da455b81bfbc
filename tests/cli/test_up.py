"""`arlctl up`: recipe validation, restart with backoff, loop mode and clean stops, with real processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from arlctl.errors import UsageError
from arlctl.supervisor import SIDE_STAGES, Supervisor, last_error_line, load_recipe, parse_recipe, stage_argv

ARLCTL = [sys.executable, "-m", "arlctl.cli.main"]


def recipe(tmp_path, **stages) -> dict:
    return {"run": str(tmp_path / "run"), "stages": stages or {"sync": {}}}


# ---------------------------------------------------------------------------------------------- recipes
def test_recipe_builds_each_workers_command_line(tmp_path):
    r = parse_recipe(recipe(tmp_path, reward={"workers": 2, "args": {"reward": "math", "poll": 2,
                                                                    "reward_opt": ["fallback=last_number", "format_weight=0.5"]}},
                            train={"args": {"policy": "tiny", "resume": False, "lr": 1e-3}}))
    run = str(tmp_path / "run")
    assert [s.name for s in r.stages] == ["reward", "train"]
    assert stage_argv(r, r.stage("reward"), 1)[len(r.command):] == [
        "reward", "--run", run, "--watch", "--worker", "1/2", "--reward", "math", "--poll", "2",
        "--reward-opt", "fallback=last_number", "--reward-opt", "format_weight=0.5"]
    assert stage_argv(r, r.stage("train"), 0)[len(r.command):] == [
        "train", "--run", run, "--watch", "--policy", "tiny", "--no-resume", "--lr", "0.001"]
    assert r.logs == os.path.join(run, "logs")


@pytest.mark.parametrize("stages, message", [
    ({"rewardd": {}}, "unknown stage 'rewardd'.*did you mean reward"),
    ({"reward": {"args": {"rewrd": "math"}}}, "arlctl reward` has no option --rewrd.*did you mean --reward"),
    ({"reward": {"args": {"run": "x"}}}, "--run is set by the supervisor"),
    ({"reward": {"args": {"watch": True}}}, "--watch is set by the supervisor"),
    ({"filter": {"workers": 2}}, "`arlctl filter` has no --worker I/N"),
    ({"reward": {"workers": 0}}, "workers must be an integer >= 1"),
    ({"reward": {"mode": "cron"}}, "mode must be watch or loop"),
    ({"reward": {"wokers": 2}}, "unknown key of stage reward 'wokers'.*did you mean workers"),
    ({"train": {"args": {"resume": "yes"}}}, "--resume is a flag: give true or false"),
    ({"train": {"args": {"lr": [1, 2]}}}, "--lr takes one value, not a list"),
    ({"eval": {"args": {"compare": ["v0", "v4"]}}}, "--compare is a one-shot option of `arlctl eval`.*drop it"),
])
def test_bad_recipes_fail_with_a_clear_message(tmp_path, stages, message):
    with pytest.raises(UsageError) as info:
        parse_recipe(recipe(tmp_path, **stages))
    assert re.search(message, f"{info.value} (hint: {info.value.hint})"), (str(info.value), info.value.hint)


def test_recipe_file_errors_and_run_override(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("run: [unclosed\n")
    with pytest.raises(UsageError, match="not valid YAML"):
        load_recipe(str(path))
    path.write_text(yaml.safe_dump({"stages": {"sync": {}}}))
    with pytest.raises(UsageError, match="`run:`"):
        load_recipe(str(path))
    assert load_recipe(str(path), run=str(tmp_path / "other")).run == str(tmp_path / "other")


def test_recipe_max_staleness_feeds_rollout_and_train(tmp_path):
    r = parse_recipe({**recipe(tmp_path, rollout={"args": {"env": "math", "policy": "tiny"}},
                               filter={"args": {"max-lag": 1}}, train={"args": {"policy": "tiny"}}),
                      "max-staleness": 2})
    assert stage_argv(r, r.stage("rollout"), 0)[-2:] == ["--max-staleness", "2"]
    assert stage_argv(r, r.stage("train"), 0)[-2:] == ["--max-lag", "2"]
    assert stage_argv(r, r.stage("filter"), 0)[-2:] == ["--max-lag", "1"]  # tighter: kept as given


@pytest.mark.parametrize("stages, message", [
    ({"rollout": {"args": {"max-staleness": 3}}}, "stage rollout: --max-staleness 3 is looser than the recipe's max-staleness 2"),
    ({"train": {"args": {"max-lag": 5}}}, "stage train: --max-lag 5 is looser"),
    ({"filter": {"args": {"max-lag": 3}}}, "stage filter: --max-lag 3 is looser"),
    ({"train": {"args": {"lag-decay": 0.1}}}, "--lag-decay keeps rows past --max-lag"),
])
def test_up_rejects_a_bound_looser_than_max_staleness(tmp_path, stages, message):
    from typer.testing import CliRunner

    from arlctl.cli.main import app

    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({**recipe(tmp_path, **stages), "max-staleness": 2}))
    result = CliRunner().invoke(app, ["up", str(path), "--check"])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "run").exists()  # nothing started, nothing created


def test_recipe_yaml_error_names_line_and_column(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("run: runs/x\nstages:\n  sync: {args: {poll: 2}\n  train: {}\n")
    with pytest.raises(UsageError) as info:
        load_recipe(str(path))
    assert re.search(rf"recipe {re.escape(str(path))}:4:\d+ is not valid YAML: expected ',' or '}}'", str(info.value)), \
        str(info.value)


def test_shipped_recipe_is_valid():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = load_recipe(os.path.join(root, "recipes", "math_daemons.yaml"))
    assert {s.name for s in r.stages} == {"rollout", "reward", "filter", "train", "sync"}


# ----------------------------------------------------------------------------------- supervising children
def python_recipe(tmp_path, code: str, **stage) -> Supervisor:
    """A recipe whose `command` is a small Python program (argv after it is ignored): real processes that
    crash, exit or ignore SIGTERM on cue, to test the supervisor's policy in milliseconds."""
    data = {"run": str(tmp_path / "run"), "command": [sys.executable, "-c", code],
            "restart": {"backoff_start_s": 1, "backoff_cap_s": 4, "healthy_after_s": 30},
            "stages": {"sync": stage}}
    return Supervisor(parse_recipe(data))


def wait_exit(child) -> None:
    child.proc.wait(timeout=30)


def test_crash_restarts_with_doubling_capped_backoff_reset_when_healthy(tmp_path):
    sup = python_recipe(tmp_path, "import sys; print('error: boom', flush=True); sys.exit(3)")
    sup.start()
    child = sup.children[0]
    delays = []
    for _ in range(5):
        wait_exit(child)
        now = child.started_at + 1  # crashed one second after its start: not healthy
        sup.tick(now)
        assert child.state == "backoff" and child.last_exit == "exit 3"
        delays.append(child.next_start_at - now)
        sup.tick(child.next_start_at)  # due: restarted
        assert child.state == "running"
    assert delays == [1, 2, 4, 4, 4]
    assert child.restarts == 5 and child.runs == 6
    wait_exit(child)
    sup.tick(child.started_at + 31)  # ran past healthy_after_s before crashing: back to the first delay
    assert child.next_start_at - (child.started_at + 31) == 1
    assert sup.last_error(child) == "error: boom"
    sup.stop(grace_s=5)
    assert child.state == "stopped"


def test_clean_exit_is_done_in_watch_mode_and_rerun_in_loop_mode(tmp_path):
    sup = python_recipe(tmp_path, "pass")
    sup.start()
    wait_exit(sup.children[0])
    sup.tick()
    assert sup.children[0].state == "done" and sup.children[0].restarts == 0

    loop = python_recipe(tmp_path / "loop", "pass", mode="loop", interval_s=5)
    loop.start()
    child = loop.children[0]
    wait_exit(child)
    now = time.time()
    loop.tick(now)
    assert child.state == "waiting" and child.next_start_at == now + 5
    loop.tick(now + 5)
    assert child.state == "running" and child.runs == 2 and child.restarts == 0
    loop.stop(grace_s=5)


def test_usage_error_exit_is_not_restarted(tmp_path):
    sup = python_recipe(tmp_path, "import sys; print('error: no such option: --bogus'); sys.exit(2)")
    sup.start()
    child = sup.children[0]
    wait_exit(child)
    sup.tick()
    assert child.state == "failed" and child.restarts == 0
    assert sup.last_error(child) == "error: no such option: --bogus"


@pytest.mark.slow
def test_stop_escalates_to_sigkill_after_the_grace_period(tmp_path):
    code = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ig' + 'noring', flush=True); time.sleep(120)")
    sup = python_recipe(tmp_path, code)
    sup.start()
    child = sup.children[0]
    deadline = time.time() + 30
    # Wait for the printed word: the log's header line holds the code, with 'ig' + 'noring' split.
    while "ignoring" not in Path(child.log_path).read_text() and time.time() < deadline:
        time.sleep(0.1)
    sup.stop(grace_s=1)
    assert child.state == "stopped" and child.last_exit == "killed by SIGKILL"
    assert any("SIGKILLed after the 1s grace period" in what for _, _, what in sup.events)


def test_last_error_line_reads_only_the_current_run(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("=== t arlctl up starts: a\nTraceback: old\n=== t arlctl up starts: b\nok\n")
    assert last_error_line(str(log)) is None
    with open(log, "a") as fh:
        fh.write("error: corrupt shard part-1.parquet: bad footer\nstill going\n")
    assert last_error_line(str(log)) == "error: corrupt shard part-1.parquet: bad footer"


# --------------------------------------------------------------------------------------------- the CLI
@pytest.mark.integration
def test_up_restarts_a_killed_daemon_and_stops_cleanly_on_sigterm(tmp_path):
    """`arlctl up` over real `sync --watch` and `train --watch` daemons on an empty run: SIGKILL one, it
    comes back; SIGTERM to `up` stops both (no process of theirs left) and `up` exits 0."""
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"run": str(tmp_path / "run"), "restart": {"backoff_start_s": 0.5},
                                    "stages": {"train": {"args": {"policy": "tiny", "poll": 1}},
                                               "sync": {"args": {"poll": 1}}}}))
    proc = subprocess.Popen([*ARLCTL, "up", str(path), "--no-dashboard", "--for", "300"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []

    def read_until(needle: str) -> str:
        for line in proc.stdout:
            lines.append(line)
            if needle in line:
                return line
        raise AssertionError("".join(lines))

    try:
        first = read_until("sync-0: started pid")
        pid = int(first.rsplit("pid", 1)[1])
        log = tmp_path / "run" / "logs" / "sync-0.log"
        deadline = time.time() + 120
        while "nothing to do" not in log.read_text() and time.time() < deadline:  # the daemon got going
            time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        read_until("sync-0: killed by SIGKILL")
        again = read_until("sync-0: started pid")
        new_pid = int(again.rsplit("pid", 1)[1])
        assert new_pid != pid
        proc.send_signal(signal.SIGTERM)
        read_until("arlctl up: stopped (signal SIGTERM)")
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    with pytest.raises(ProcessLookupError):
        os.killpg(new_pid, 0)  # the daemon's whole process group is gone
    assert "1 restart" in "".join(lines)


@pytest.mark.parametrize("recipe", sorted(Path(__file__).parents[2].glob("recipes/*.yaml")), ids=lambda p: p.name)
def test_shipped_recipes_validate_against_the_stage_commands(recipe):
    loaded = load_recipe(str(recipe))
    names = {s.name for s in loaded.stages}
    # every pipeline stage, plus side stages only (eval: recipes/smollm2_async_short.yaml)
    assert names - set(SIDE_STAGES) == {"rollout", "reward", "filter", "train", "sync"}, names
    for spec in loaded.stages:
        argv = stage_argv(loaded, spec, 0)
        assert argv[len(loaded.command)] == spec.name and "--run" in argv


def test_dashboard_rates_a_side_stage_without_an_output_counter():
    """An eval stage has no row in the run state's stage counters: its throughput cell is "-", not a crash."""
    from arlctl.cli.up import Dashboard

    view = Dashboard(sup=None)
    view.update({"time": 0.0, "stages": {"rollout": {"output_rows": 10}}})
    view.update({"time": 120.0, "stages": {"rollout": {"output_rows": 30}}})
    assert view.rate("rollout") == "10.0 traj/min"
    assert view.rate("eval") == "-"
