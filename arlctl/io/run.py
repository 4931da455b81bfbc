"""RunLayout: every path of a run directory (DESIGN.md §5), and each stage's default --in/--out.

  RUN/rollouts/  RUN/rewarded/  RUN/batches/ (+ _filter/ manifests)  RUN/checkpoints/  RUN/policy/
  RUN/metrics/   RUN/evals/     RUN/logs/    RUN/reward-cache/   <each stage's output>/_locks/
  RUN/evals/<name>/vNNNNNN/      one held-out evaluation of one policy version (`arlctl eval`): rewarded
                                 shards, then summary.json last. Nothing downstream reads RUN/evals.

A run root may be a local path or any fsspec URL; only `logs` must be local (children append to their log
files), so a remote run keeps its logs in ./logs unless told otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from arlctl.errors import UsageError
from arlctl.io.fs import is_remote, join
from arlctl.io.ledger import MANIFEST_DIR, version_dir_name
from arlctl.io.lock import LOCK_DIR

STAGE_DIRS = {
    "rollouts": "rollouts",
    "rewarded": "rewarded",
    "batches": "batches",
    "checkpoints": "checkpoints",
    "policy": "policy",
    "metrics": "metrics",
    "evals": "evals",
    "logs": "logs",
    "reward-cache": "reward-cache",
    "exports": "exports",
}

# stage -> (default input dir, default output dir)
STAGE_IO = {
    "rollout": (None, "rollouts"),
    "reward": ("rollouts", "rewarded"),
    "filter": ("rewarded", "batches"),
    "train": ("batches", "checkpoints"),
    "sync": ("checkpoints", "policy"),
    "eval": (None, "evals"),  # a side stage: reads the policy, writes RUN/evals; no other stage reads it
}
EVAL_SUMMARY = "summary.json"  # an eval version directory's marker, written last


@dataclass(frozen=True)
class RunLayout:
    root: str

    def path(self, kind: str) -> str:
        return join(str(self.root), STAGE_DIRS[kind])

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
    def filter_manifests(self) -> str:
        return join(self.batches, MANIFEST_DIR)

    @property
    def checkpoints(self) -> str:
        return self.path("checkpoints")

    @property
    def policy(self) -> str:
        return self.path("policy")

    @property
    def metrics(self) -> str:
        return self.path("metrics")

    @property
    def evals(self) -> str:
        return self.path("evals")

    def eval_dir(self, name: str) -> str:
        """RUN/evals/<name>: every evaluated version of one named evaluation."""
        return join(self.evals, name)

    def eval_version(self, name: str, version: int) -> str:
        """RUN/evals/<name>/vNNNNNN: the rows and summary.json of one policy version's evaluation."""
        return eval_version_dir(self.evals, name, version)

    @property
    def exports(self) -> str:
        """Tracker export state (cursors, locks, local tracker stores) of `arlctl export`."""
        return self.path("exports")

    @property
    def fleet(self) -> str:
        """RUN/fleet.json: the run's inference servers file (`arlctl fleet` edits it, `rollout --run` reads it)."""
        return join(str(self.root), "fleet.json")

    @property
    def reward_cache(self) -> str:
        """Judgements already paid for (arlctl/rewards/cache.py), the reward stage's default --cache."""
        return self.path("reward-cache")

    def locks(self, stage: str) -> str:
        """Where a stage's single-writer locks live: `_locks/` inside its output directory (arlctl/io/lock.py)."""
        return join(self.stage_io(stage)[1], LOCK_DIR)

    @property
    def logs(self) -> str:
        """RUN/logs for a local run; ./logs for a remote one (log files must be local)."""
        return "logs" if is_remote(self.root) else self.path("logs")

    def stage_io(self, stage: str) -> tuple[str | None, str]:
        """The default (input, output) directories of a stage in this run."""
        default_in, default_out = STAGE_IO[stage]
        return (self.path(default_in) if default_in else None), self.path(default_out)


def eval_version_dir(evals: str, name: str, version: int) -> str:
    """<evals>/<name>/vNNNNNN under any evals root (--out, or RUN/evals)."""
    return join(str(evals), name, version_dir_name(version))


def local_logs(logs: str | None, run: str) -> str:
    """The logs directory of a recipe: the one given, else the run's default; it must be local."""
    logs = logs or RunLayout(run).logs
    if is_remote(str(logs)):
        raise UsageError("`logs:` must be a local directory (children append to their log files)")
    return str(logs)


def resolve_io(stage: str, run: str | None, in_: str | None, out: str | None) -> tuple[str | None, str]:
    """Fill --in/--out from --run where they were not given explicitly."""
    default_in, _ = STAGE_IO[stage]
    if run:
        run_in, run_out = RunLayout(run).stage_io(stage)
        in_ = run_in if in_ is None else in_
        out = run_out if out is None else out
    if default_in and in_ is None:
        raise UsageError(f"{stage}: give --in or --run", hint=f"e.g. arlctl {stage} --run RUN")
    if out is None:
        raise UsageError(f"{stage}: give --out or --run", hint=f"e.g. arlctl {stage} --run RUN")
    return in_, out


def metrics_dir_for(out: str, run: str | None) -> str:
    """Metrics go to RUN/metrics; without --run, beside the output directory."""
    if run:
        return RunLayout(run).metrics
    parent = out.rstrip("/").rsplit("/", 1)[0] if "/" in out.rstrip("/") else "."
    return join(parent, "metrics")


__all__ = ["EVAL_SUMMARY", "STAGE_DIRS", "STAGE_IO", "RunLayout", "eval_version_dir", "local_logs", "metrics_dir_for",
           "resolve_io"]
