"""Weights-only publishing under the daemons (issue 15): `train --publish-every 1 --save-every 5`.

The pipeline runs as daemons under `arlctl up`'s supervisor (the tiny model on small math tasks). Every
step writes a weights-only checkpoint (HF files + state.json {"full": false}, no optimizer state) that sync
publishes and rollout reloads; only every 5th step (and the last) carries the trainer's sharded state. Then
the exactly-once audit of the drained run is clean.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from arlctl.audit import audit_run
from arlctl.io.ledger import list_checkpoints, read_state
from arlctl.runstate import trainer_progress
from arlctl.supervisor import Supervisor, parse_recipe, run
from tests.chaos.test_chaos import Chaos, chaos_recipe

pytestmark = pytest.mark.integration


def test_weights_only_versions_are_published_reloaded_and_audit_clean(tmp_path):
    run_dir, logs = str(tmp_path / "run"), str(tmp_path / "logs")
    recipe = chaos_recipe(run_dir, logs)
    recipe["stages"]["train"]["args"].update({"publish-every": 1, "save-every": 5})
    # Rollout may run at most 2 groups ahead of training: it waits for, and reloads, the published versions.
    recipe["stages"]["rollout"]["args"]["max-pending"] = 8
    # Every group trains (the filter's seeded drop of uniform groups is not under test here): nine committed
    # rollout shards make nine batches, so the step count below does not hang on which groups were uniform.
    recipe["stages"]["filter"]["args"]["keep-uniform"] = 1.0
    sup = Supervisor(parse_recipe(recipe, source="test"), log=print)
    # No kills: Chaos only stops rollout (SIGTERM) once it committed its shards, so the run drains.
    stopper = Chaos(seed=0, kill_every=1e9)
    result = run(sup, for_s=600, until_drained=True, on_tick=stopper.on_tick, on_state=stopper.on_state)
    assert not stopper.kills
    assert result.stopped_by == "drained", f"did not drain (logs in {logs})"

    report = audit_run(run_dir, drained=True, latest_history=result.policy_history)
    print("audit:", report.as_dict())
    assert report.problems == [], report.problems
    assert report.trainer_step == report.consumed_batches == report.batches >= 6, report.as_dict()
    assert report.latest == report.trainer_step

    # Checkpoints: full every 5 steps and at the end, weights-only between; each weights-only one is an HF
    # directory without trainer state.
    kinds = {step: read_state(loc).get("full", True) for step, loc in list_checkpoints(f"{run_dir}/checkpoints")}
    last = max(kinds)
    assert all(kinds[s] for s in kinds if s % 5 == 0 or s == last), kinds
    weights_only = [s for s, full in kinds.items() if not full]
    assert len(weights_only) >= 4, kinds
    one = Path(run_dir) / "checkpoints" / f"step-{weights_only[0]:06d}"
    assert (one / "model.safetensors").is_file() and not (one / "trainer").exists()
    assert not (one / "scheduler.pt").exists()
    assert trainer_progress(f"{run_dir}/checkpoints")["resume_step"] == last

    # Weights-only checkpoints were published (sync takes the newest checkpoint at each poll, so a fast
    # trainer's steps may be skipped, never reordered) and rollout reloaded such versions.
    published = set(result.policy_history) | set(report.policy_versions)  # LATEST as seen | versions kept (--keep)
    assert set(weights_only) & published, (published, weights_only)
    text = "".join(p.read_text() for p in Path(logs).glob("rollout*"))
    reloaded = {int(m) for m in re.findall(r"policy reloaded: v\d+ -> v(\d+)", text)}
    assert reloaded & set(weights_only), (reloaded, weights_only)
