"""The run directory layout (DESIGN.md §5): where each stage reads and writes by default."""

from __future__ import annotations

from dataclasses import dataclass

from arlctl.errors import UsageError
from arlctl.io.fs import join

STAGE_DIRS = {
    "rollouts": "rollouts",
    "rewarded": "rewarded",
    "batches": "batches",
    "checkpoints": "checkpoints",
    "policy": "policy",
    "metrics": "metrics",
}

# stage -> (default input dir, default output dir)
STAGE_IO = {
    "rollout": (None, "rollouts"),
    "reward": ("rollouts", "rewarded"),
    "filter": ("rewarded", "batches"),
    "train": ("batches", "checkpoints"),
    "sync": ("checkpoints", "policy"),
}


@dataclass(frozen=True)
class RunDir:
    root: str

    def path(self, kind: str) -> str:
        return join(self.root, STAGE_DIRS[kind])

    @property
    def rollouts(self) -> str:
        return self.path("rollouts")

    @property
    def rewarded(self) -> str:
        return self.path("rewarded")

    @property
    def batches(self) -> str:
        return self.path("batches")

    @property
    def checkpoints(self) -> str:
        return self.path("checkpoints")

    @property
    def policy(self) -> str:
        return self.path("policy")

    @property
    def metrics(self) -> str:
        return self.path("metrics")


def resolve_io(stage: str, run: str | None, in_: str | None, out: str | None) -> tuple[str | None, str]:
    """Fill --in/--out from --run where they were not given explicitly."""
    default_in, default_out = STAGE_IO[stage]
    if run:
        rd = RunDir(run)
        if in_ is None and default_in:
            in_ = rd.path(default_in)
        if out is None:
            out = rd.path(default_out)
    if default_in and in_ is None:
        raise UsageError(f"{stage}: give --in or --run", hint=f"e.g. arlctl {stage} --run RUN")
    if out is None:
        raise UsageError(f"{stage}: give --out or --run", hint=f"e.g. arlctl {stage} --run RUN")
    return in_, out


def metrics_dir_for(out: str, run: str | None) -> str:
    """Metrics go to RUN/metrics; without --run, beside the output directory."""
    if run:
        return RunDir(run).metrics
    parent = out.rstrip("/").rsplit("/", 1)[0] if "/" in out.rstrip("/") else "."
    return join(parent, "metrics")
