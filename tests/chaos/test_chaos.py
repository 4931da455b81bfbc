"""Chaos: the daemon pipeline under `arlctl up`'s supervisor while stage processes are SIGKILLed at random.

The tiny model on small math tasks (-G 4, 8 new tokens, one turn) runs as six daemons (rollout, two
reward workers, filter, train, sync). Every few seconds a seeded RNG picks a stage (a shuffled round
over all five, so each is hit) and SIGKILLs one of its running processes; the supervisor restarts it
with backoff. Once rollout has committed ROLLOUT_SHARDS shards (or after ROLLOUT_CAP_S) it is stopped
(SIGTERM: in-flight trajectories end as `aborted`), kills go on for a while, then the rest drains —
every rollout rewarded, filtered and trained, the last checkpoint published — and everything stops. Then `arlctl.audit.audit_run` checks the run directory: every shard reads and
validates, no visible temp or partial file, each trajectory trained in exactly one consumed batch or
dropped by a named filter rule, no id twice across batches, trainer step == consumed batches, LATEST
only moved forward, and no row ran a policy newer than the trainer at its start.

The same again with the run directory on S3 (moto's server on 127.0.0.1).

Resume (issue 27 item 3): a real `arlctl rollout` is interrupted (SIGINT) or killed (SIGKILL) right after
its first committed shard and run again with the same argv; across both invocations every (task, sample)
has exactly one non-aborted trajectory (the audit), the summaries count the rows in the shards, and the
tasks the first invocation finished get no row from the second.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from arlctl.audit import audit_run
from arlctl.io.lock import LEASE_TTL_ENV
from arlctl.io.shards import list_shards, read_shard
from arlctl.supervisor import STAGES, Supervisor, parse_recipe, run

pytestmark = pytest.mark.chaos

ROLLOUT_SHARDS = 8  # rollout runs until it committed this many shards (4 trajectories each) ...
ROLLOUT_CAP_S = 300  # ... or for this long, then gets SIGTERM
KILL_EVERY = 8.0  # seconds between SIGKILLs
KILL_AFTER_ROLLOUT_S = 20  # kills go on this long into the drain, then the drain must finish on its own
MIN_UPTIME = 12.0  # kill only processes up this long: one still importing torch tests nothing
HARD_STOP = 600  # the drain must finish before this, or the test fails (a loaded 2-core machine is slow)


def chaos_recipe(run_dir: str, logs: str) -> dict:
    # lock-wait: a restarted stage queues behind its killed predecessor's run lock instead of exiting 75
    # and being restarted in a loop (on S3 a killed holder's lease stays until it expires).
    common = {"poll": 1, "lock-wait": 90}
    return {
        "run": run_dir,
        "logs": logs,
        "restart": {"backoff_start_s": 0.5, "backoff_cap_s": 4, "healthy_after_s": 20},
        "stop_grace_s": 30,
        "refresh_s": 1,
        "stages": {
            "rollout": {"args": {"env": "math", "tasks": "builtin:math?n=6&seed=0", "policy": "tiny",
                                 "group-size": 4, "concurrency": 8, "max-turns": 1, "max-new-tokens": 8,
                                 "flush-groups": 1, "max-pending": 48, "max-staleness": 2, **common}},
            "reward": {"workers": 2, "args": {"reward": "math",
                                              "reward-opt": ["fallback=last_number", "format_weight=0.5"], **common}},
            # The tiny model's math rewards are mostly all-equal within a group: keep-uniform 0.75 trains
            # most such groups and drops the rest by a named rule (zero_variance).
            "filter": {"args": {"batch-groups": 1, "keep-uniform": 0.75, **common}},
            "train": {"args": {"policy": "tiny", "lr": 1e-3, **common}},
            "sync": {"args": common},
        },
    }


class Chaos:
    """Supervisor hooks: SIGKILL a stage every KILL_EVERY seconds (a seeded, shuffled round over all
    five stages); stop rollout once it committed ROLLOUT_SHARDS shards. Progress, not the clock, decides:
    rollout is killed again only after its restart committed two more shards, so a slow machine cannot
    starve the run."""

    def __init__(self, seed: int, kill_every: float = KILL_EVERY, stage_gap_s: float = 0.0, min_kills: int = 0):
        self.kill_every, self.stage_gap_s, self.min_kills = kill_every, stage_gap_s, min_kills
        self.last_kill: dict[str, float] = {}
        self.rng = random.Random(seed)
        self.round: list[str] = []
        self.next_kill = kill_every
        self.kills: list[tuple[float, str]] = []
        self.rollout_shards = 0
        self.rollout_floor = 0  # rollout shards when rollout was last killed (first kill after 2 shards)
        self.rollout_stopped_at: float | None = None

    def victims(self, sup: Supervisor, stage: str, elapsed: float) -> list:
        """Running processes of `stage` up MIN_UPTIME, unless the stage was killed too recently or (rollout)
        has not committed two shards since its last kill."""
        if elapsed - self.last_kill.get(stage, -1e9) < self.stage_gap_s:
            return []
        if stage == "rollout" and self.rollout_shards < self.rollout_floor + 2:
            return []
        return sorted((c for c in sup.running(stage) if time.time() - c.started_at >= MIN_UPTIME),
                      key=lambda c: c.index)

    def on_state(self, sup: Supervisor, state: dict) -> None:
        self.rollout_shards = state["stages"]["rollout"]["output_shards"]

    def on_tick(self, sup: Supervisor, elapsed: float) -> None:
        # Rollout stops once it committed enough shards AND enough kills landed (a fast machine would
        # otherwise drain before the chaos happened), or at the cap.
        enough = self.rollout_shards >= ROLLOUT_SHARDS and len(self.kills) >= self.min_kills
        if self.rollout_stopped_at is None and (enough or elapsed >= ROLLOUT_CAP_S):
            self.rollout_stopped_at = elapsed
            sup.stop_stage("rollout")
        if self.rollout_stopped_at is not None and elapsed >= self.rollout_stopped_at + KILL_AFTER_ROLLOUT_S:
            return
        if elapsed < self.next_kill:
            return
        self.next_kill = elapsed + self.kill_every
        live = {c.stage for c in sup.children if c.state not in ("stopped", "done", "failed")}
        self.round = [stage for stage in self.round if stage in live]  # a stopped rollout has no turn
        if not self.round:
            self.round = [stage for stage in STAGES if stage in live]
            self.rng.shuffle(self.round)
        # The next stage of the round that has a victim now; the others keep their turn for later.
        for stage in reversed(self.round):
            victims = self.victims(sup, stage, elapsed)
            if victims:
                break
        else:
            self.next_kill = elapsed + 1.0  # every stage is restarting or not yet going: try again soon
            return
        self.round.remove(stage)
        victim = self.rng.choice(victims)
        sup.kill(victim)
        self.kills.append((round(elapsed, 1), victim.name))
        self.last_kill[stage] = elapsed
        if stage == "rollout":
            self.rollout_floor = self.rollout_shards


def run_chaos(run_dir: str, logs: str, seed: int, min_kills: int, env: dict[str, str] | None = None,
              **chaos_options) -> None:
    recipe = chaos_recipe(run_dir, logs) | ({"env": env} if env else {})
    sup = Supervisor(parse_recipe(recipe, source="chaos"), log=print)
    chaos = Chaos(seed, min_kills=min_kills, **chaos_options)
    t0 = time.monotonic()
    result = run(sup, for_s=HARD_STOP, until_drained=True, on_tick=chaos.on_tick, on_state=chaos.on_state)
    print(f"chaos: {len(chaos.kills)} kills {chaos.kills}; restarts {result.restarts}; "
          f"{result.stopped_by} after {time.monotonic() - t0:.0f}s; LATEST history {result.policy_history}")
    assert result.stopped_by == "drained", f"did not drain within {HARD_STOP}s (logs in {logs})"

    # The chaos happened: kills landed on every stage, and each killed process was restarted.
    killed_stages = {name.rsplit("-", 1)[0] for _, name in chaos.kills}
    assert len(chaos.kills) >= min_kills and killed_stages == set(STAGES), chaos.kills
    assert sum(result.restarts.values()) >= len(chaos.kills) - 1, (result.restarts, chaos.kills)

    report = audit_run(run_dir, drained=True, latest_history=result.policy_history)
    print("audit:", report.as_dict())
    assert report.problems == [], report.problems
    # ... and it was not vacuous: trajectories were trained and some dropped by a named rule.
    assert report.trajectories >= 16 and report.trained >= 8, report.as_dict()
    assert report.trained + sum(report.dropped.values()) == report.trajectories
    assert report.trainer_step == report.consumed_batches == report.batches >= 2
    assert result.policy_history and report.latest == report.trainer_step


def test_chaos_local(tmp_path):
    run_chaos(str(tmp_path / "run"), str(tmp_path / "logs"), seed=6, min_kills=8)


def test_chaos_s3(s3_bucket, tmp_path):
    # A SIGKILLed holder's lease on S3 blocks its stage until it expires, so the recipe sets a 15 s lease
    # (renewed every 5 s) and each stage is killed at most once per 20 s: more often and nothing would get
    # past its lock.
    run_chaos(f"{s3_bucket}/run", str(tmp_path / "logs"), seed=7, min_kills=5, kill_every=8.0, stage_gap_s=20.0,
              env={LEASE_TTL_ENV: "15"})


RESUME_TASKS, RESUME_G = 16, 4


def resume_argv(run_dir: str) -> list[str]:
    return [sys.executable, "-m", "arlctl.cli.main", "rollout", "--env", "first-token",
            "--tasks", f"builtin:first-token?n={RESUME_TASKS}&seed=0", "--policy", "tiny", "--run", run_dir,
            "-G", str(RESUME_G), "-c", "4", "--max-turns", "1", "--max-new-tokens", "24", "--seed", "1",
            "--flush-groups", "1", "--json"]  # no -q: the resume line on stderr is asserted


def _rows(shards: list[str]) -> list[dict]:
    columns = ["trajectory_id", "group_id", "sample_index", "task_id", "status"]
    return [r for shard in shards for r in read_shard(shard, columns=columns).to_pylist()]


def _summary(stdout: str) -> dict:
    return json.loads(stdout[stdout.index("{"):stdout.rindex("}") + 1])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["sigint", "sigkill"])
def test_rollout_rerun_after_a_stop_completes_every_unit_once(tmp_path, sig):
    run_dir = str(tmp_path / "run")
    out = f"{run_dir}/rollouts"
    proc = subprocess.Popen(resume_argv(run_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while not list_shards(out) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    first_shards = list_shards(out)
    first_rows = _rows(first_shards)
    done_first = {(r["group_id"], r["sample_index"]) for r in first_rows if r["status"] != "aborted"}
    assert 0 < len(done_first) < RESUME_TASKS * RESUME_G, "the stop did not land mid-run"
    if sig == signal.SIGINT:
        assert proc.returncode == 0, stderr
        first = _summary(stdout)
        assert first["interrupted"] and first["rows_written"] == len(first_rows)  # the rows in the shards
    finished_tasks = {t for t, n in Counter(r["task_id"] for r in first_rows if r["status"] != "aborted").items()
                      if n == RESUME_G}

    again = subprocess.run(resume_argv(run_dir), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    second = _summary(again.stdout)
    new_rows = _rows([s for s in list_shards(out) if s not in first_shards])
    assert second["rows_written"] == len(new_rows) == RESUME_TASKS * RESUME_G - len(done_first)
    assert second["samples_skipped"] == len(done_first) and "samples already written" in again.stderr
    assert not finished_tasks & {r["task_id"] for r in new_rows}  # finished tasks are not rolled out again

    report = audit_run(run_dir, drained=False)
    assert report.problems == [], report.problems
    assert report.units == RESUME_TASKS * RESUME_G
    usable = Counter(r["task_id"] for r in first_rows + new_rows if r["status"] != "aborted")
    assert set(usable.values()) == {RESUME_G} and len(usable) == RESUME_TASKS
    print(f"{sig.name}: first invocation {len(first_rows)} rows ({len(done_first)} units), re-run "
          f"{len(new_rows)} rows, {len(finished_tasks)} finished tasks untouched")
