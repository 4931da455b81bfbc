"""Experiment trackers: send a run's metrics to TensorBoard, Weights & Biases or MLflow, exactly once.

  points.py          what is sent: RUN/metrics rows and RUN/evals summaries as points on each stream's x-axis
  cursor.py          what each tracker destination already holds (RUN/exports/<tracker>/cursor-*.json)
  export.py          the loop: list sources, read the new ones, send, then commit the cursor; --follow polls
  to_tensorboard.py  to_wandb.py  to_mlflow.py   one small sink per tracker: send(points), state(), close()

The tracker packages are the optional `arlctl[trackers]` extra; a missing one is a usage error that says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from arlctl.errors import UsageError
from arlctl.io import store
from arlctl.io.fs import basename, join
from arlctl.settings import setting
from arlctl.trackers.cursor import exports_dir
from arlctl.trackers.points import Point

TRACKERS = ("tensorboard", "wandb", "mlflow")
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
WANDB_MODES = ("offline", "online")


@dataclass
class ExportConfig:
    to: list[str] = setting(factory=list, help="Tracker to send to: tensorboard, wandb or mlflow (repeatable).")
    follow: bool = setting(False, "Keep running: send new rows as stages write them, until SIGINT/SIGTERM.")
    every: float = setting(30.0, "Seconds between polls with --follow.")
    tb_dir: str | None = setting(None, "TensorBoard log directory (default RUN/exports/tensorboard).")
    wandb_dir: str | None = setting(None, "W&B directory (default RUN/exports/wandb).")
    wandb_project: str = setting("arlctl", "W&B project name.")
    wandb_mode: str = setting("offline", "W&B mode: offline (default, no account) or online (needs `wandb login`).")
    mlflow_uri: str | None = setting(None, "MLflow tracking URI (default sqlite:///RUN/exports/mlflow/mlflow.db).")
    mlflow_experiment: str = setting("arlctl", "MLflow experiment name.")

    def check(self) -> None:
        if not self.to:
            raise UsageError("give at least one --to", hint="e.g. arlctl export RUN --to tensorboard")
        unknown = [t for t in self.to if t not in TRACKERS]
        if unknown:
            raise UsageError(f"unknown tracker {unknown[0]!r}: choose from {', '.join(TRACKERS)}")
        if self.wandb_mode not in WANDB_MODES:
            raise UsageError(f"--wandb-mode must be one of {', '.join(WANDB_MODES)}, not {self.wandb_mode!r}")
        if self.every <= 0:
            raise UsageError("--every must be > 0 seconds")


class Sink(Protocol):
    """One tracker destination. `send` returns once the tracker holds the points (the cursor is written
    after it); `state` is what the cursor keeps to find the same tracker run next time."""

    name: str
    destination: str

    def send(self, points: list[Point]) -> None: ...

    def state(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def destination(tracker: str, run: str, cfg: ExportConfig) -> str:
    """Where `tracker` writes for this run: the option given, else under RUN/exports/<tracker> (local runs only)."""
    given = {"tensorboard": cfg.tb_dir, "wandb": cfg.wandb_dir, "mlflow": cfg.mlflow_uri}[tracker]
    if given:
        return given
    if store.local_path(run) is None:
        flag = {"tensorboard": "--tb-dir", "wandb": "--wandb-dir", "mlflow": "--mlflow-uri"}[tracker]
        raise UsageError(f"{run} is not local: give {flag} for the {tracker} output",
                         hint="trackers write local files; the cursor still lives in RUN/exports")
    default = exports_dir(run, tracker)
    if tracker == "mlflow":
        from pathlib import Path

        return "sqlite:///" + str(Path(join(default, "mlflow.db")).resolve())
    return default


def open_sink(tracker: str, run: str, cfg: ExportConfig, where: str, state: dict[str, Any]) -> Sink:
    """Import the tracker's package and open its destination; a missing package is a usage error."""
    try:
        if tracker == "tensorboard":
            from arlctl.trackers.to_tensorboard import TensorBoardSink

            return TensorBoardSink(where)
        if tracker == "wandb":
            from arlctl.trackers.to_wandb import WandbSink

            return WandbSink(where, cfg.wandb_project, run_name(run), cfg.wandb_mode, state)
        from arlctl.trackers.to_mlflow import MlflowSink

        if where.startswith("sqlite:///"):
            from pathlib import Path

            Path(where.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        return MlflowSink(where, cfg.mlflow_experiment, run_name(run), state)
    except ImportError as err:
        if err.name and err.name.split(".")[0] == PACKAGES[tracker]:
            raise UsageError(f"--to {tracker} needs the {PACKAGES[tracker]} package, which is not installed",
                             hint="pip install 'arlctl[trackers]'") from None
        raise


def run_name(run: str) -> str:
    """The tracker-side name of an arlctl run: its directory's name."""
    return basename(str(run).rstrip("/")) or "run"


__all__ = ["TRACKERS", "ExportConfig", "Sink", "destination", "open_sink", "run_name"]
