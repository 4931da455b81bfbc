"""What a stage command is besides its settings: where its data is and how it runs, declared once.

A stage's job is its settings (stages/configs.py) plus one of the option classes here: its inputs and
outputs (--in/--out or --run) and its run options (--watch, --poll, --lock-wait, --worker, --json, ...),
each field with its default and help (`setting`, arlctl/settings.py). `arlctl <stage>` derives these
options from the class (arlctl/cli/options.config_command) and `arlctl up` checks a recipe against the
same class (stage_vocabulary in stages/configs.py), so the two cannot disagree. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass

from arlctl.inference.base import MAX_BATCH
from arlctl.io.sink import FLUSH_GROUPS, FLUSH_SECONDS, SHARD_PREFIX
from arlctl.settings import setting

POLL_SECONDS = 5.0  # --poll
LOCK_WAIT_SECONDS = 0.0  # --lock-wait: a second copy of a stage on the same output fails at once
MAX_ERROR_FRAC = 0.5  # rollout's --max-error-frac

WATCH_HELP = "Keep running: poll the input and process what is new until SIGTERM/SIGINT."
POLL_HELP = "Seconds between polls with --watch."
LOCK_WAIT_HELP = "Seconds to wait for another copy of this stage on the same output to finish."
QUIET_HELP = "Print nothing on stderr but errors (the exit code and --json are unchanged)."
IN_HELP = "Input shard directory (default: the run's)."
OUT_HELP = "Output directory, local or a URL (default: the run's)."
WORKER_HELP = "I/N: take only worker I's share of the inputs (0-based)."


@dataclass
class RunOptions:
    """How any stage command runs: once (cron) or as a daemon, under its run lock."""

    run: str | None = setting(None, "Run directory that fills the defaults.")
    dry_run: bool = setting(False, "Say what would happen; write nothing.")
    watch: bool = setting(False, WATCH_HELP)
    poll: float = setting(POLL_SECONDS, POLL_HELP)
    lock_wait: float = setting(LOCK_WAIT_SECONDS, LOCK_WAIT_HELP)
    as_json: bool = setting(False, "One JSON summary on stdout.", flag="--json")
    quiet: bool = setting(False, QUIET_HELP, short="-q")


@dataclass(kw_only=True)
class StageLoop:
    """How a planned job runs (each stage's job extends it): once, or every `poll` s with `watch`, after
    waiting up to `lock_wait` s for the run lock."""

    watch: bool = False
    poll: float = POLL_SECONDS
    lock_wait: float = LOCK_WAIT_SECONDS


def loop_of(opts: RunOptions) -> dict[str, object]:
    """The StageLoop fields of a command's run options."""
    return {"watch": opts.watch, "poll": opts.poll, "lock_wait": opts.lock_wait}


POLICY_HELP = ("HF dir, RUN/policy (uses LATEST), default, tiny, or a scripted oracle:gold / oracle:empty (swe), "
               "oracle:humaneval, oracle:reasoning-gym, oracle:replies=FILE, oracle:textarena, oracle:calculator "
               "(math).")


@dataclass
class PolicyOptions:
    """Which policy a stage runs and how it is served: what rollout and eval share (stages/policy_job.py
    turns it into a policy, once)."""

    policy: str = setting("default", POLICY_HELP)
    backend: str = setting("hf", "Inference backend: hf, vllm, openai.")
    backend_opt: list[str] = setting(help="KEY=VALUE passed to the inference backend, e.g. enforce_eager=false "
                                     "(vllm: compiled, slower to start, faster to generate) or kv_cache_gib=4.",
                                     factory=list)
    server: list[str] = setting(help="openai backend: server URL (repeatable).", factory=list)
    servers_file: str | None = setting(None, "openai backend: a file of server URLs re-read while running (engines "
                                       "join and drain); default RUN/fleet.json with --run when it exists or no "
                                       "--server is given.")
    max_batch: int = setting(MAX_BATCH, "Sequences per forward pass (hf backend; vllm: max_num_seqs).")


@dataclass
class RolloutOptions(RunOptions, PolicyOptions):
    """`arlctl rollout` besides its loop settings (stages/agent_loop.RolloutConfig)."""

    out: str | None = setting(None, OUT_HELP)
    env: str | None = setting(None, "Environment: math, swe, a plugin name or module:factory (default: each task's "
                              "own \"env\" field, else math).")
    tasks: list[str] = setting(help="builtin:NAME?opts or a JSONL file (default builtin:ENV); with --env-mix, "
                               "repeat as ENV=SOURCE.", factory=list)
    env_mix: str | None = setting(None, "Sample groups across envs at these ratios, e.g. 'swe:0.7,math:0.3' (tasks "
                                  "per env from --tasks ENV=SOURCE or builtin).")
    env_opt: list[str] = setting(help="KEY=VALUE passed to the environment.", factory=list)
    harness: str | None = setting(None, "Run this agent harness G times per task instead of the built-in loop, its "
                                  "model calls recorded through an in-process gateway: mini-swe-agent, a plug-in "
                                  "(entry point arlctl.harnesses) or module:factory.")
    harness_opt: list[str] = setting(help="KEY=VALUE passed to the harness (mini-swe-agent: step_limit, retries, "
                                     "config, wall_time_limit).", factory=list)
    limit: int | None = setting(None, "Use only the first N tasks.")
    prefix: str = setting(SHARD_PREFIX, "Shard name prefix (e.g. it0003 in a loop).")
    chat_template_kwargs: list[str] = setting(help="KEY=VALUE for the chat template (repeatable), e.g. "
                                              "enable_thinking=false.", factory=list)
    max_error_frac: float = setting(MAX_ERROR_FRAC, "Exit 1 when more than this share of trajectories ends env_error or "
                                    "policy_error.")
    top_up: bool = setting(False, "Resample a member that ends env_error (a dead sandbox: infrastructure, not the "
                           "model) with a new seed, so groups stay at G.")
    max_top_up: int = setting(2, "--top-up: resamples allowed per group.")
    flush_groups: int = setting(FLUSH_GROUPS, "Write a shard every N groups.")
    flush_seconds: float = setting(FLUSH_SECONDS, "... or every T seconds.")
    sandbox: str | None = setting(None, "swe: sandbox backend (bwrap, docker, subprocess).")
    sandboxes: int | None = setting(None, "swe: warm sandboxes in the pool.")
    insecure_sandbox: bool = setting(False, "Allow the subprocess backend (trusted code only).")
    docker_host: list[str] = setting(help="--sandbox docker: an engine, 'URL max=N' or a hosts file (repeatable); "
                                     "sandboxes spread over them.", factory=list)
    worker: str | None = setting(None, "I/N: roll out only worker I's share of the tasks.")
    max_epochs: int | None = setting(None, "--watch: stop after N epochs (default: never).")
    max_pending: int | None = setting(None, "--watch: untrained rows (in flight included) never exceed this.")
    max_staleness: int | None = setting(None, "--watch: start no trajectory more than K versions behind the "
                                        "trainer.")


@dataclass
class RewardOptions(RunOptions):
    """`arlctl reward` besides its scoring settings (stages/configs.RewardConfig)."""

    in_url: str | None = setting(None, IN_HELP, flag="--in")
    out: str | None = setting(None, OUT_HELP)
    worker: str | None = setting(None, WORKER_HELP)


@dataclass
class FilterOptions(RunOptions):
    in_url: str | None = setting(None, IN_HELP, flag="--in")
    out_url: str | None = setting(None, OUT_HELP, flag="--out")
    metrics: str | None = setting(None, "Metrics directory (default RUN/metrics).")
    policy_dir: str | None = setting(None, "Policy dir whose LATEST is the current version.")
    ckpt_dir: str | None = setting(None, "Checkpoint dir; its newest step also counts.")
    current_version: int | None = setting(None, "Override the current version.")
    quarantine: bool = setting(False, "Move corrupt input shards to _quarantine/.")


@dataclass
class TrainOptions(RunOptions):
    in_url: str | None = setting(None, IN_HELP, flag="--in")
    out: str | None = setting(None, OUT_HELP)
    policy: str | None = setting(None, "Initial weights: HF dir, policy dir or model name.")
    metrics: str | None = setting(None, "Metrics directory (default RUN/metrics).")
    resume: bool = setting(True, "Continue from the newest checkpoint.", flag="--resume/--no-resume")
    nproc: int = setting(0, "Launch torchrun with this many ranks on this machine (one per GPU; gloo on CPU).")


@dataclass
class SyncOptions(RunOptions):
    ckpt: str | None = setting(None, "Checkpoint directory (default RUN/checkpoints).")
    policy_dir: str | None = setting(None, "Policy directory (default RUN/policy).")


@dataclass
class EvalOptions(RunOptions, PolicyOptions):
    """`arlctl eval` besides its sampling and grading settings (stages/eval.EvalConfig)."""

    out: str | None = setting(None, OUT_HELP)
    name: str = setting("heldout", "Name of the eval: RUN/evals/NAME/vNNNNNN.")
    policy: str | None = setting(None, "HF dir, a policy directory (its LATEST), default, tiny (default: "
                                 "RUN/policy). With --watch: the policy directory to follow, or a model evaluated "
                                 "first.")
    tasks: list[str] = setting(help="builtin:NAME?opts or a JSONL file (default builtin:ENV).", factory=list)
    env: str | None = setting(None, "Environment of the tasks (default: each task's own, else math).")
    env_opt: list[str] = setting(help="KEY=VALUE passed to the environment.", factory=list)
    limit: int | None = setting(None, "Use only the first N tasks.")
    compare: tuple[str, str] | None = setting(None, "Compare two evaluated versions of --name (e.g. v0 v40).",
                                              metavar="VA VB", recipe=False)  # two values, by hand only
    force: bool = setting(False, "Evaluate again a version that has a summary.json.")


# Every stage's run options, declared here (arlctl up checks recipes against them: configs.stage_vocabulary).
STAGE_OPTIONS: dict[str, type] = {"rollout": RolloutOptions, "reward": RewardOptions, "filter": FilterOptions,
                                  "train": TrainOptions, "sync": SyncOptions, "eval": EvalOptions}
