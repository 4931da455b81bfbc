"""What the train, filter and sync stages are given (`TrainIO`, `FilterIO`, `SyncIO`) and what they return
(`TrainResult`, `FilterResult`, `SyncResult`): typed objects instead of dicts read back by string key.

`to_json()` is exactly the `--json` summary the commands print (keys that only some outcomes have are
left out when absent, as before); `summary_line()` is the one human line. Torch-free, like
stages/configs.py, so the CLI imports them cheaply.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


def _present(obj: Any, optional: tuple[str, ...]) -> dict[str, Any]:
    """The dataclass as a dict, leaving out the optional keys this outcome does not have (None)."""
    out = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return {k: v for k, v in out.items() if not (k in optional and v is None)}


@dataclass
class TrainIO:
    in_url: str  # batch shards
    out: str  # checkpoint directory
    policy: str | None = None  # initial weights when --out holds no checkpoint
    metrics: str | None = None
    resume: bool = True


@dataclass
class TrainResult:
    steps: int
    step: int
    batches: list[str]
    checkpoint: str | None
    resumed_from: int | None
    skipped_nonfinite: int = 0
    rows_dropped_invalid: int = 0
    bad_value_events: list[dict[str, Any]] = field(default_factory=list)
    rows_dropped_stale: int = 0  # --max-lag: rows left out for lagging the weights being trained
    rows_decayed_stale: int = 0  # --lag-decay: rows kept at weight * exp(-decay * lag)
    skipped_stale: int = 0  # batches consumed without an update because every row was stale
    mean_lag: float | None = None
    max_lag: int | None = None
    save_s: float | None = None  # these four only when a step ran
    loss_mean: float | None = None
    reward_mean: float | None = None
    tokens_per_s: float | None = None
    world_size: int = 1  # ranks that trained (torchrun)
    packing: str | None = None  # "packed", or "padded" and why (--pack); only when a step ran

    TRAINED = ("save_s", "loss_mean", "reward_mean", "tokens_per_s", "packing")

    @classmethod
    def from_summary(cls, summary: dict[str, Any]) -> TrainResult:
        return cls(**{f.name: summary[f.name] for f in dataclasses.fields(cls) if f.name in summary})

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if not self.steps:
            for key in self.TRAINED:
                out.pop(key)
        return out

    def summary_line(self) -> str:
        if not self.steps:
            return "nothing to do: every batch shard is already consumed"
        return f"trained {self.steps} steps; checkpoint {self.checkpoint}"


@dataclass
class SyncIO:
    ckpt: str  # checkpoint directory
    policy_dir: str
    dry_run: bool = False


@dataclass
class SyncResult:
    version: int | None
    path: Any
    source_checkpoint: str | None
    previous: str | None
    published: bool = False
    latest_updated: bool = False
    stale: bool = False
    removed: list[str] = field(default_factory=list)
    would_publish: bool | None = None  # dry run, or nothing to do
    nothing_to_do: str | None = None
    would_update_latest: bool | None = None  # dry run
    publish_s: float | None = None  # a publish ran
    sha256: str | None = None
    notified: Any = None  # --notify

    OPTIONAL = ("would_publish", "nothing_to_do", "would_update_latest", "publish_s", "sha256", "notified")

    @classmethod
    def from_summary(cls, summary: dict[str, Any]) -> SyncResult:
        return cls(**{f.name: summary[f.name] for f in dataclasses.fields(cls) if f.name in summary})

    @property
    def name(self) -> str:
        return f"v{self.version:06d}"

    def to_json(self) -> dict[str, Any]:
        return _present(self, self.OPTIONAL)

    def summary_line(self, dry_run: bool = False) -> str:
        if self.version is None:
            return f"nothing to do: {self.nothing_to_do}"
        if dry_run:
            verb = "would publish" if self.would_publish else "already published"
            return f"dry run: {verb} {self.name} from {self.source_checkpoint}"
        if self.stale:
            return f"nothing to do: {self.name} is older than LATEST ({self.previous}); LATEST unchanged"
        if self.published or self.latest_updated:
            return f"published {self.name} -> {self.path} (LATEST updated: {self.latest_updated})"
        return f"nothing to do: {self.name} is already published"


@dataclass
class FilterIO:
    in_url: str  # rewarded shards
    out: str  # batch shards
    metrics: str | None = None  # the per-trajectory audit table
    policy_dir: str | None = None  # its LATEST is the current policy version ...
    ckpt_dir: str | None = None  # ... or the newest checkpoint's step, if newer
    current_version: int | None = None  # overrides both
    quarantine: bool = False
    dry_run: bool = False


@dataclass
class FilterResult:
    inputs: list[str]
    rows_in: int
    rules: dict[str, int]  # rule -> rows dropped (balance: reweighted)
    dropped: int
    groups_kept: int
    rows_kept: int
    batches_planned: int
    batches: list[str]
    current_version: int
    waiting: bool  # fewer than --min-groups survive: nothing consumed
    dry_run: bool
    recovered: list[str]
    quarantined: list[str]
    invalid: list[str]
    untrusted: list[str]
    unresumed: list[str]

    @classmethod
    def from_summary(cls, summary: dict[str, Any]) -> FilterResult:
        return cls(**{f.name: summary[f.name] for f in dataclasses.fields(cls)})

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary_line(self, out: str) -> str:
        if not self.inputs:
            return "nothing to do: every input shard is already consumed"
        if self.dry_run:
            return f"dry run: would write {self.batches_planned} batch shards ({self.rows_kept} rows) to {out}"
        if self.waiting:
            return f"waiting: {self.groups_kept} groups survive, fewer than --min-groups; nothing consumed"
        return f"wrote {len(self.batches)} batch shards to {out}"
