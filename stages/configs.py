"""The settings of the filter, reward and sync stages: one dataclass each, every default written once.

Each field says what it means (`setting(default, help)`, arlctl/settings.py); `arlctl <stage>` derives its
options from these fields (arlctl/cli/options.py) and `arlctl up` checks recipes against them. They live
apart from their stages so that building the CLI or checking a recipe never imports torch; import each
from here, not from its stage. Train's settings are `TrainConfig` in arlctl/rl/config.py (the trainer
reads them, and rl sits below the stages); rollout's are `RolloutConfig` in stages/agent_loop.py, next to
the loop that reads them. `stage_config` finds any stage's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from arlctl.errors import UsageError
from arlctl.rl.config import TrainConfig
from arlctl.settings import setting

DEFAULT_KEEP_STATUS = ("ok",)
NOTIFY_FLAVORS = ("vllm", "sglang")


@dataclass
class FilterConfig:
    TRUNCATED = ("keep", "drop")  # the choices of --truncated (a class constant, not a setting)

    keep_status: list[str] = setting(help="Statuses kept (repeatable); truncated rows are --truncated's.",
                                     factory=lambda: list(DEFAULT_KEEP_STATUS))
    truncated: str = setting("keep", "Rows of status truncated (a reply cut by a token budget or the context): keep "
                                     "(trained on like ok rows, whatever --keep-status says) or drop (counted under "
                                     "the truncated rule).")
    min_group_size: int = setting(2, "Fewest rows a group may keep.")
    keep_uniform: float = setting(0.0, "Fraction of zero-variance groups kept (signal only with --adv batch).")
    dedupe_threshold: float | None = setting(
        None, "Tool-call n-gram Jaccard at which a row is a near-duplicate (default: only exact duplicate ids).")
    dedupe_ngram: int = setting(3, "n of the tool-call n-grams.")
    max_lag: int | None = setting(None, "Drop rows whose policy lags more than this.")
    decay: float = setting(0.0, "weight = exp(-decay * lag).")
    where: str | None = setting(None, "DuckDB SQL predicate rows must satisfy.")
    max_pos_frac: float | None = setting(None, "Cap on positive-advantage weight share.")
    adv: str = setting("group", "Advantages: group | group-mean | dr-grpo | rloo | batch | reinforce++ (one per "
                                "trajectory, from the reward) | turn | turn-mean (one per turn, from step rewards and "
                                "the reward; see --gamma) | gae (train computes GAE from its critic: --value-coef) | "
                                "distill (train adds the teacher's per-token advantage: --teacher).")
    gamma: float = setting(1.0, "Discount of the turn modes: R_t = r_t + gamma * R_{t+1}, R_last = r_last + reward.")
    batch_groups: int = setting(8, "Groups per batch shard (one optimizer step).")
    min_groups: int = setting(1, "Wait (consume nothing) until this many groups.")
    seed: int = setting(0, "Seed of the --keep-uniform choice.")
    vocab_size: int | None = setting(None, "Token ids must be below this (the policy's vocabulary size; default: "
                                           "only negative ids are invalid).")
    keep_untrusted: bool = setting(False, "Keep rows whose reward_info says trusted: false (a verdict the policy's "
                                          "code could have forged, e.g. swe rows graded in-process; see `arlctl swe "
                                          "prepare`). Default: the untrusted rule drops them.")

    def check(self) -> None:
        from arlctl.rl.advantages import ADVANTAGE_MODES  # torch: import late

        if self.adv not in ADVANTAGE_MODES:
            raise UsageError(f"--adv must be one of {', '.join(ADVANTAGE_MODES)}, not {self.adv!r}")
        if self.truncated not in self.TRUNCATED:
            raise UsageError(f"--truncated must be one of {', '.join(self.TRUNCATED)}, not {self.truncated!r}")
        if self.batch_groups < 1 or self.min_groups < 1 or self.min_group_size < 1:
            raise UsageError("--batch-groups, --min-groups and --min-group-size must be >= 1")
        if not 0.0 <= self.keep_uniform <= 1.0:
            raise UsageError("--keep-uniform is a fraction in [0, 1]")
        if self.max_pos_frac is not None and not 0.0 < self.max_pos_frac < 1.0:
            raise UsageError("--max-pos-frac is a fraction in (0, 1)")
        if self.dedupe_threshold is not None and not 0.0 < self.dedupe_threshold <= 1.0:
            raise UsageError("--dedupe-threshold is a Jaccard similarity in (0, 1]")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise UsageError("--vocab-size must be >= 1")
        if not (math.isfinite(self.decay) and self.decay >= 0):
            raise UsageError("--decay must be a finite number >= 0")
        if not 0.0 <= self.gamma <= 1.0:  # NaN fails this too
            raise UsageError(f"--gamma is a discount in [0, 1], not {self.gamma}")


@dataclass
class RewardConfig:
    ON_TRUNCATED = ("grade", "zero", "null")  # the choices of --on-truncated (a class constant, not a setting)
    GRADE = ON_TRUNCATED[0]  # its default
    CONCURRENCY = 4  # --concurrency's default

    reward: str = setting("math", "Reward function: math, swe, format, a plugin name, module:attr, auto (per row "
                                  "env), a weighted sum such as 'swe + 0.2*judge', or http://HOST:PORT/NAME (a "
                                  "reward served by `arlctl reward-serve`).")
    reward_opt: list[str] = setting(help="KEY=VALUE options of the reward (ENV.KEY=VALUE with --reward auto, "
                                         "COMPONENT.KEY=VALUE with a weighted sum).", factory=list)
    concurrency: int = setting(CONCURRENCY, "Rows graded at once (sandboxed graders, judges; requests to a reward server).")
    quarantine: bool = setting(False, "Move corrupt inputs to _quarantine/ and go on.")
    max_error_frac: float = setting(0.5, "Exit 1 when more than this fraction of rows got no reward.")
    cache: str | None = setting(None, "Reward cache directory (any fsspec URL, s3 included; may be shared by "
                                      "runs). Default with --run: RUN/reward-cache; without --run: no cache.")
    no_cache: bool = setting(False, "Use no reward cache: score every row, remember nothing.")
    overlong_penalty: str | None = setting(None, "L_MAX,L_CACHE: DAPO's soft overlong penalty added to the reward "
                                                 "(component `overlong`): 0 up to L_MAX - L_CACHE generated tokens, "
                                                 "then down to -1 at L_MAX, -1 beyond. E.g. 1024,256.")
    cache_flush_s: float = setting(60.0, "Write the cache's new entries at least this often while a shard is "
                                         "scored (seconds; and after each shard): a crash loses at most this much "
                                         "grading.")
    on_truncated: str = setting(GRADE, "Rows of status truncated (a reply cut by --max-new-tokens, --max-tokens or "
                                         "the context): grade (as any row), zero (reward 0, not graded) or null "
                                         "(no reward, reward_info.error says why; filter drops them).")

    def check(self) -> None:
        if self.on_truncated not in self.ON_TRUNCATED:
            raise UsageError(f"--on-truncated must be one of {', '.join(self.ON_TRUNCATED)}, not {self.on_truncated!r}")
        if not 0.0 <= self.max_error_frac <= 1.0:
            raise UsageError(f"--max-error-frac is a fraction in [0, 1], not {self.max_error_frac}")
        if self.concurrency < 1:
            raise UsageError(f"--concurrency must be >= 1, not {self.concurrency}")
        if not (math.isfinite(self.cache_flush_s) and self.cache_flush_s >= 0):
            raise UsageError(f"--cache-flush-s must be a finite number >= 0, not {self.cache_flush_s}")
        if self.cache is not None and self.no_cache:
            raise UsageError("--cache and --no-cache contradict each other")
        self.overlong()

    def overlong(self) -> tuple[int, int] | None:
        """(L_max, L_cache) of --overlong-penalty, or None; a malformed value is a usage error."""
        if self.overlong_penalty is None:
            return None
        parts = self.overlong_penalty.replace(" ", "").split(",")
        try:
            l_max, l_cache = (int(p) for p in parts)
        except ValueError:
            raise UsageError(f"--overlong-penalty is L_MAX,L_CACHE (two integers), not {self.overlong_penalty!r}",
                             hint="e.g. --overlong-penalty 1024,256") from None
        if not 0 < l_cache <= l_max:
            raise UsageError(f"--overlong-penalty needs 0 < L_CACHE <= L_MAX, not {l_max},{l_cache}")
        return l_max, l_cache


@dataclass
class SyncConfig:
    keep: int = setting(3, "Versions to keep.")
    notify: list[str] = setting(help="Inference server URL to reload (repeatable).", factory=list)
    notify_flavor: str = setting("vllm", "Server kind: vllm or sglang.")

    def check(self) -> None:
        if self.keep < 1:
            raise UsageError(f"--keep must be >= 1, not {self.keep}", hint="the version LATEST names is always kept")
        if self.notify_flavor not in NOTIFY_FLAVORS:
            raise UsageError(f"--notify-flavor must be one of {', '.join(NOTIFY_FLAVORS)}, not {self.notify_flavor!r}")


@dataclass(frozen=True)
class OptionKind:
    """What a recipe may give one option: its value type, and the spelling that turns a flag off."""

    type: Any  # bool (a flag), list (repeatable), or the value's type
    negation: str | None = None  # "no-resume"
    field: str | None = None  # the config field it sets, if any
    one_shot: bool = False  # an option of a command run by hand that no recipe may give (setting(recipe=False))


def stage_config(stage: str) -> type:
    if stage == "rollout":
        from arlctl.stages.agent_loop import RolloutConfig  # no torch; kept out of this module's imports

        return RolloutConfig
    if stage == "eval":
        from arlctl.stages.eval import EvalConfig  # no torch either

        return EvalConfig
    return {"reward": RewardConfig, "filter": FilterConfig, "train": TrainConfig, "sync": SyncConfig}[stage]


def stage_vocabulary(stage: str) -> dict[str, OptionKind]:
    """{long option without dashes: OptionKind} of `arlctl STAGE`, from its config and its job options
    (stages/jobs.STAGE_OPTIONS: every stage has them; an unknown stage is a KeyError)."""
    import typing

    from arlctl.settings import options_of

    out: dict[str, OptionKind] = {}
    for name, (field_name, kind) in options_of(stage_config(stage)).items():
        origin = typing.get_origin(kind)
        base = list if origin is list else next((a for a in typing.get_args(kind) if a is not type(None)), kind)
        out[name] = OptionKind(type=base, field=field_name)
    from arlctl.stages.jobs import STAGE_OPTIONS

    for spelling, (kind, one_shot) in _declared(STAGE_OPTIONS[stage]).items():
        name, _, negation = spelling.partition("/")
        out[name] = OptionKind(type=kind, negation=negation or None, one_shot=one_shot)
        if negation:
            out[negation] = out[name]
    return out


def _declared(options: type) -> dict[str, tuple[Any, bool]]:
    """{spelling ("resume/no-resume" for a pair): (type, one-shot)} of a job's option fields (stages/jobs.py)."""
    import typing

    from arlctl.settings import cli_fields, field_types

    types = field_types(options)
    out: dict[str, Any] = {}
    for f in cli_fields(options):
        spelling = "/".join(part.removeprefix("--") for part in (f.metadata.get("flag") or
                                                                "--" + f.name.replace("_", "-")).split("/"))
        kind = types[f.name]
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        out[spelling] = (list if typing.get_origin(kind) is list else (args[0] if args else kind),
                         not f.metadata.get("recipe", True))
    return out
