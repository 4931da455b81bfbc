"""Weights & Biases: offline by default (no account): the run goes to a local directory (default
RUN/exports/wandb) that `wandb sync` can upload later.

W&B has one step counter per run, which must only grow; arlctl's streams each have their own x-axis. So
each stream gets a W&B step metric (`define_metric("train/*", step_metric="train/step")`) and every log
call carries the point's own step value. The run id is kept in the exporter's cursor, so every export of
one arlctl run logs under the same W&B id (offline, each export is its own `offline-run-*` directory).
Values count as accepted once `run.log` has handed them to the local wandb-core service, which writes
them to the run's .wandb file (W&B has no public flush).
"""

from __future__ import annotations

import uuid
from typing import Any

from arlctl.trackers.points import Point


class WandbSink:
    name = "wandb"

    def __init__(self, directory: str, project: str, run_name: str, mode: str, state: dict[str, Any]):
        import wandb

        self.destination = directory
        self.run_id = state.get("run_id") or uuid.uuid4().hex[:12]
        settings = wandb.Settings(console="off", silent=True, x_disable_stats=True, disable_git=True,
                                  save_code=False, disable_job_creation=True)
        self._run = wandb.init(project=project, name=run_name, id=self.run_id, dir=directory, mode=mode,
                               resume="allow", settings=settings, reinit="create_new")
        self._axes: set[str] = set()

    def send(self, points: list[Point]) -> None:
        for p in points:
            axis = f"{p.stream}/{p.axis}"
            if axis not in self._axes:
                self._run.define_metric(axis, hidden=False)
                self._run.define_metric(f"{p.stream}/*", step_metric=axis)
                self._axes.add(axis)
            self._run.log({**{f"{p.stream}/{k}": v for k, v in p.values.items()}, axis: p.step})

    def state(self) -> dict[str, Any]:
        return {"run_id": self.run_id}

    def close(self) -> None:
        self._run.finish()
