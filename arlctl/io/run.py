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
from arlctl.io.store import local_path

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


def resolve_io(stage: str, run: str | None, in_: str | None, out: str | None, *, watch: bool = False,
               flags: tuple[str, str] = ("--in", "--out")) -> tuple[str | None, str]:
    """Fill --in/--out from --run where they were not given explicitly, then check them (check_stage_io)."""
    default_in, _ = STAGE_IO[stage]
    in_flag, out_flag = flags
    if run:
        run_in, run_out = RunLayout(run).stage_io(stage)
        in_ = run_in if in_ is None else in_
        out = run_out if out is None else out
    if default_in and in_ is None:
        raise UsageError(f"{stage}: give {in_flag} or --run", hint=f"e.g. arlctl {stage} --run RUN")
    if out is None:
        raise UsageError(f"{stage}: give {out_flag} or --run", hint=f"e.g. arlctl {stage} --run RUN")
    check_stage_io(stage, run, {in_flag: in_} if in_ else {}, {out_flag: out}, watch=watch)
    return in_, out


def check_stage_io(stage: str, run: str | None, inputs: dict[str, str], outputs: dict[str, str], *,
                   watch: bool = False) -> None:
    """The one IO check of every stage command, made before anything is created (issue 27 item 2).

    - Only the stages that read no stage's output (rollout, and eval of a policy) start a run: any other
      stage given a --run that does not exist is a usage error, so a typo never leaves a half-made run
      behind (a lock directory, an empty metrics file).
    - Every input must exist. With --watch neither the run nor the inputs need to: daemons are started side by
      side (`arlctl up`, systemd units) and one waits for its upstream to appear.
    - An output may not be, lie inside, or hold an input, nor another stage's directory of the run: a
      stage reading what it writes re-reads its own output on every re-run (filter --in X --out X).
    A missing path's error names it and the closest existing names beside it.
    """
    if not watch:
        if run is not None and STAGE_IO[stage][0] is not None and not _exists(run):
            raise UsageError(f"{stage}: run directory {run} does not exist",
                             hint=_near(run) or "a run is started by `arlctl rollout --run RUN`")
        for flag, path in inputs.items():
            if not _exists(path):
                raise UsageError(f"{stage}: {flag} {path} does not exist",
                                 hint=_near(path) or f"{flag} names a directory an earlier stage wrote")
    claimed = {f"{flag} {path}": path for flag, path in inputs.items()}
    if run is not None:
        layout, own = RunLayout(run), STAGE_IO[stage][1]  # own: the one directory of the run this stage writes
        for kind in STAGE_DIRS:
            if kind != own:
                claimed.setdefault(f"the run's {kind}/ ({layout.path(kind)})", layout.path(kind))
    for flag, path in outputs.items():
        for what, other in claimed.items():
            if _overlaps(path, other):
                raise UsageError(f"{stage}: {flag} {path} overlaps {what}",
                                 hint="a stage must write where nothing it reads lives; give another --out")


def _exists(url: str) -> bool:
    """Local paths only: an object store has no empty directories, so a prefix nothing was written under yet
    cannot be told from a typo without a request (and credentials) this check must not need."""
    path = local_path(url)
    return path is None or path.exists()


def _canonical(url: str) -> str:
    """Comparable form of a location: a local path made absolute with its links resolved, a URL unslashed."""
    path = local_path(url)
    return str(url).rstrip("/") if path is None else str(path.resolve())


def _overlaps(a: str, b: str) -> bool:
    """True when one location is the other or lies inside it."""
    x, y = _canonical(a), _canonical(b)
    return x == y or x.startswith(y.rstrip("/") + "/") or y.startswith(x.rstrip("/") + "/")


def _near(url: str) -> str | None:
    """For a local path that does not exist: 'did you mean ...' from the names in its nearest existing
    parent, else what that parent holds."""
    import os

    from arlctl.errors import did_you_mean

    path = local_path(url)
    if path is None:
        return None
    parent, missing = path, []
    while not parent.is_dir() and parent != parent.parent:
        missing.insert(0, parent.name)
        parent = parent.parent
    if not missing or not parent.is_dir():
        return None
    names = [n for n in os.listdir(parent) if not n.startswith((".", "_"))]
    guess = did_you_mean(missing[0], names, shown=lambda n: str(parent.joinpath(n, *missing[1:])))
    if guess:
        return guess
    shown = sorted(names)[:8]
    return f"{parent}/ holds: {', '.join(shown)}{', ...' if len(names) > len(shown) else ''}" if shown else None


def metrics_dir_for(out: str, run: str | None) -> str:
    """Metrics go to RUN/metrics; without --run, beside the output directory."""
    if run:
        return RunLayout(run).metrics
    parent = out.rstrip("/").rsplit("/", 1)[0] if "/" in out.rstrip("/") else "."
    return join(parent, "metrics")


__all__ = ["EVAL_SUMMARY", "STAGE_DIRS", "STAGE_IO", "RunLayout", "check_stage_io", "eval_version_dir", "local_logs", "metrics_dir_for",
           "resolve_io"]
