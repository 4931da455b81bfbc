"""`arlctl up`'s engine: a declarative recipe of stage daemons, run as supervised child processes.

A recipe (YAML) names the run directory and, per stage, its worker count and its command options:

    run: runs/math
    stages:
      rollout: {args: {env: math, tasks: "builtin:math?n=64", policy: default, max-pending: 256}}
      reward:  {workers: 2, args: {reward: math}}
      filter:  {args: {batch-groups: 8}}
      train:   {args: {policy: default, lr: 2.0e-6}}
      sync:    {}
      eval:    {args: {policy: default, tasks: "builtin:math?n=200&seed=999", greedy: true, every: 5}}

A top-level `max-staleness: S` bounds the whole pipeline: no row is trained more than S versions after the
version that generated it. It sets rollout's --max-staleness (backpressure on the projected lag at train
time) and train's --max-lag (rows past it dropped, counted); a stage value looser than S is an error.

`eval` is a side stage: `arlctl eval --watch` evaluates every N-th published policy version into RUN/evals
(arlctl/stages/eval_job.py); no pipeline stage reads what it writes, and a drained pipeline does not wait on it.

Each (stage, worker) becomes one child: `arlctl <stage> --run RUN --watch [--worker I/N] --<key> <value> ...`,
started in its own process group (a Ctrl-C on the terminal reaches only the supervisor, which then stops
the children in order) with stdout and stderr appended to LOGS/<stage>-<i>.log (LOGS = RUN/logs for a
local run). A child that exits 0 is done (`rollout --max-epochs N` finished) and is not restarted, nor is
one that exits 2 (a usage error never fixes itself: it is `failed`); any other exit (a crash, a SIGKILL,
75 for a held lock) is restarted after an exponential backoff — start,
doubling per consecutive crash, capped — and the crash counter resets once a child has run for
`healthy_after_s`. Stopping sends SIGTERM to every child's group (the stage finishes its current unit
and commits), waits `stop_grace_s`, then SIGKILLs what is left.

`mode: loop` runs a stage one-shot (no --watch) again every `interval_s` after each clean exit: the cron
pattern, under the same run lock, for a command without a daemon mode.

Options are checked against the stage's settings (its config dataclass, names and types) and its declared
command options (stages/configs.py), without loading the CLI, so a typo, an option the stage does not have
or a value of the wrong type is an error naming the stage, before anything starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from arlctl.errors import UsageError, did_you_mean
from arlctl.io.run import STAGE_IO, local_logs

SIDE_STAGES = ("eval",)  # read the run, feed nothing back: no pipeline stage waits on them
STAGES = tuple(s for s in STAGE_IO if s not in SIDE_STAGES)  # rollout, reward, filter, train, sync: pipeline order
RECIPE_STAGES = (*STAGES, *SIDE_STAGES)  # what a recipe may name, in start order
USAGE_EXIT = 2  # the CLI's exit code for a usage error (arlctl.errors.UsageError)
# Options the supervisor sets itself: a recipe may not pass them in `args`.
RESERVED = {"run": "the recipe's `run:`", "watch": "`mode:`", "worker": "`workers:`", "json": "nothing (logs are text)",
            "help": "nothing", "dry-run": "nothing (daemons must commit)"}
STAGE_KEYS = {"workers", "args", "mode", "interval_s", "env"}
TOP_KEYS = {"run", "stages", "logs", "env", "restart", "stop_grace_s", "refresh_s", "command", "max-staleness"}
# A recipe's `max-staleness: S` (no row trained more than S versions after the version that generated it)
# sets these stage options, each of which may be given tighter but never looser.
STALENESS_OPTIONS = {"rollout": "max-staleness", "train": "max-lag"}
CHECKED_STALENESS_OPTIONS = {**STALENESS_OPTIONS, "filter": "max-lag"}
RESTART_KEYS = {"backoff_start_s", "backoff_cap_s", "healthy_after_s"}
# A log line that reports a failure (not a counter such as "0 errors" or "env_errors").
# Bounds on every number a recipe sets, checked at load: finite, and within what a supervisor can mean.
MAX_WORKERS = 256  # children of one stage (each is a process with its own run lock share)
MAX_SECONDS = 7 * 86400.0  # any delay, grace or interval: a week
ERROR_LINE = re.compile(r"\b(error|Error|ERROR|Traceback|Exception|CRITICAL|Killed|failed|FAILED)\b|\w+Error\b")


# ------------------------------------------------------------------------------------------------ recipe
@dataclass
class RestartPolicy:
    backoff_start_s: float = 1.0  # delay before the first restart after a crash
    backoff_cap_s: float = 60.0  # the delay doubles per consecutive crash up to this
    healthy_after_s: float = 60.0  # a child that ran this long before crashing starts the count afresh

    def delay(self, consecutive_crashes: int) -> float:
        return min(self.backoff_cap_s, self.backoff_start_s * 2 ** max(0, consecutive_crashes - 1))


@dataclass
class StageSpec:
    name: str
    workers: int = 1
    args: dict[str, Any] = field(default_factory=dict)
    mode: str = "watch"  # watch: a daemon; loop: one-shot again every interval_s after a clean exit
    interval_s: float = 10.0
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Recipe:
    run: str
    stages: list[StageSpec]
    logs: str
    env: dict[str, str] = field(default_factory=dict)
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    stop_grace_s: float = 30.0
    refresh_s: float = 2.0
    command: list[str] = field(default_factory=lambda: [sys.executable, "-m", "arlctl.cli.main"])
    source: str = "<recipe>"

    def stage(self, name: str) -> StageSpec:
        return next(s for s in self.stages if s.name == name)


def load_recipe(path: str, run: str | None = None) -> Recipe:
    """Read and validate a recipe file (`run` overrides its run directory); every problem is a UsageError
    that names the file and the key."""
    import yaml

    try:
        with open(path) as fh:
            data = yaml.safe_load(fh)
    except FileNotFoundError:
        raise UsageError(f"recipe {path} not found", hint="e.g. arlctl up recipes/math_daemons.yaml") from None
    except yaml.YAMLError as err:
        raise UsageError(f"recipe {_yaml_where(path, err)} is not valid YAML: {_yaml_problem(err)}") from None
    if run and isinstance(data, dict):
        data["run"] = run
    return parse_recipe(data, source=path)


def _yaml_where(path: str, err: Any) -> str:
    """`path:line:column` of a YAML error (1-based, as editors count), or the path when YAML gives no mark."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    return f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path


def _yaml_problem(err: Any) -> str:
    parts = [getattr(err, "problem", None), getattr(err, "context", None)]
    text = "; ".join(p for p in parts if p) or str(err).splitlines()[0]
    return " ".join(text.split())


def parse_recipe(data: Any, source: str = "<recipe>") -> Recipe:
    """Validate a recipe given as a dict (the parsed YAML). Relative local paths stay relative to the CWD."""

    def fail(message: str, hint: str | None = None) -> UsageError:
        return UsageError(f"recipe {source}: {message}", hint=hint)

    if not isinstance(data, dict):
        raise fail("the top level must be a mapping with `run:` and `stages:`")
    _unknown(data, TOP_KEYS, "top-level key", fail)
    run = data.get("run")
    if not isinstance(run, str) or not run:
        raise fail("`run:` (the run directory, a path or an fsspec URL) is required")
    stages_raw = data.get("stages")
    if not isinstance(stages_raw, dict) or not stages_raw:
        raise fail("`stages:` must map stage names to their settings", hint=f"stages are {', '.join(RECIPE_STAGES)}")
    stages = []
    for name, raw in stages_raw.items():
        if name not in RECIPE_STAGES:
            raise fail(f"unknown stage {name!r}",
                       hint=_suggest(str(name), RECIPE_STAGES) or f"stages are {', '.join(RECIPE_STAGES)}")
        stages.append(_parse_stage(name, {} if raw is None else raw, fail))
    stages.sort(key=lambda s: RECIPE_STAGES.index(s.name))
    if "max-staleness" in data:
        _apply_staleness(data["max-staleness"], stages, fail)
    restart_raw = data.get("restart") or {}
    if not isinstance(restart_raw, dict):
        raise fail("`restart:` must be a mapping")
    _unknown(restart_raw, RESTART_KEYS, "restart key", fail)
    restart = RestartPolicy(**{k: _number(v, f"restart.{k}", fail, minimum=0.0) for k, v in restart_raw.items()})
    if restart.backoff_cap_s < restart.backoff_start_s:
        raise fail(f"restart.backoff_cap_s ({restart.backoff_cap_s:g}) is below restart.backoff_start_s "
                   f"({restart.backoff_start_s:g})", hint="the cap is the longest wait; make it >= the first one")
    try:
        logs = local_logs(data.get("logs"), run)  # RUN/logs by default; must be local
    except UsageError as err:
        raise fail(str(err)) from None
    command = data.get("command")
    if command is not None and not (isinstance(command, list) and command and all(isinstance(c, str) for c in command)):
        raise fail("`command:` must be a list of strings, e.g. [arlctl] or [python, -m, arlctl.cli.main]")
    recipe = Recipe(run=run, stages=stages, logs=str(logs), env=_env(data.get("env"), "env", fail), restart=restart,
                    stop_grace_s=_number(data.get("stop_grace_s", 30.0), "stop_grace_s", fail, minimum=0.0),
                    refresh_s=_number(data.get("refresh_s", 2.0), "refresh_s", fail, minimum=0.1),
                    source=source)
    if command:
        recipe.command = list(command)
    for spec in stages:  # build every command line once: a bad option fails here, before anything starts
        for i in range(spec.workers):
            stage_argv(recipe, spec, i)
    return recipe


def _apply_staleness(bound: Any, stages: list[StageSpec], fail: Callable[..., UsageError]) -> None:
    """`max-staleness: S` feeds rollout's --max-staleness (its backpressure) and train's --max-lag (the rows
    past the bound are dropped when their step comes); an explicit value looser than S, or train's
    --lag-decay (which keeps rows past --max-lag), would break the bound and is an error."""
    if isinstance(bound, bool) or not isinstance(bound, int) or bound < 0:
        raise fail(f"max-staleness must be an integer >= 0 (versions), not {bound!r}")
    for spec in stages:
        option = CHECKED_STALENESS_OPTIONS.get(spec.name)
        if option is None:
            continue
        given = spec.args.get(option)
        if given is not None:
            _check_type(f"recipe: stage {spec.name}: --{option}", given, int)
            if int(given) > bound:
                raise fail(f"stage {spec.name}: --{option} {given} is looser than the recipe's max-staleness {bound}",
                           hint=f"drop it (max-staleness sets it) or give at most {bound}")
        elif spec.name in STALENESS_OPTIONS:
            spec.args[option] = bound
        if spec.name == "train" and spec.args.get("lag-decay"):
            raise fail(f"stage train: --lag-decay keeps rows past --max-lag, so max-staleness {bound} would not hold",
                       hint="drop lag-decay (filter's decay weighs rows by their lag within the bound)")


def _parse_stage(name: str, raw: Any, fail: Callable[..., UsageError]) -> StageSpec:
    if not isinstance(raw, dict):
        raise fail(f"stage {name}: settings must be a mapping (workers, args, mode, interval_s, env)")
    _unknown(raw, STAGE_KEYS, f"key of stage {name}", fail)
    workers = raw.get("workers", 1)
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= MAX_WORKERS:
        raise fail(f"stage {name}: workers must be an integer >= 1 and <= {MAX_WORKERS}, not {workers!r}")
    mode = raw.get("mode", "watch")
    if mode not in ("watch", "loop"):
        raise fail(f"stage {name}: mode must be watch or loop, not {mode!r}")
    args = raw.get("args") or {}
    if not isinstance(args, dict):
        raise fail(f"stage {name}: args must be a mapping of option: value")
    options = stage_options(name)
    clean: dict[str, Any] = {}
    for key, value in args.items():
        option = str(key).lstrip("-").replace("_", "-")
        if option in RESERVED:
            raise fail(f"stage {name}: --{option} is set by the supervisor (use {RESERVED[option]})")
        if option not in options:
            raise fail(f"stage {name}: `arlctl {name}` has no option --{option}",
                       hint=_suggest(option, list(options), prefix="--") or f"see `arlctl {name} --help`")
        if options[option].one_shot:
            raise fail(f"stage {name}: --{option} is a one-shot option of `arlctl {name}`, run by hand, not by a "
                       "daemon", hint=f"drop it from the recipe; run `arlctl {name} --{option} ...` yourself")
        clean[option] = value
    if workers > 1 and "worker" not in options:
        raise fail(f"stage {name}: `arlctl {name}` has no --worker I/N, so it runs with workers: 1")
    if mode == "watch" and "watch" not in options:
        raise fail(f"stage {name}: `arlctl {name}` has no --watch", hint="use `mode: loop` to rerun it one-shot")
    return StageSpec(name=name, workers=workers, args=clean, mode=mode,
                     interval_s=_number(raw.get("interval_s", 10.0), f"{name}.interval_s", fail, minimum=0.0),
                     env=_env(raw.get("env"), f"{name}.env", fail))


def stage_options(stage: str) -> dict[str, Any]:
    """{long option name without dashes: OptionKind} of `arlctl <stage>`, from the stage's config dataclass and
    its declared command options (stages/configs.py) -- not from the CLI, which a recipe check never loads."""
    from arlctl.stages.configs import stage_vocabulary

    return stage_vocabulary(stage)


def stage_argv(recipe: Recipe, spec: StageSpec, worker: int) -> list[str]:
    """The command line of one child: `arlctl STAGE --run RUN [--watch] [--worker I/N] --opt value ...`."""
    argv = [*recipe.command, spec.name, "--run", recipe.run]
    if spec.mode == "watch":
        argv.append("--watch")
    if spec.workers > 1:
        argv += ["--worker", f"{worker}/{spec.workers}"]
    options = stage_options(spec.name)
    for option, value in spec.args.items():
        argv += _option_args(spec.name, option, value, options[option])
    return argv


def _option_args(stage: str, option: str, value: Any, kind: Any) -> list[str]:
    where = f"recipe: stage {stage}: --{option}"
    if kind.type is bool:
        if not isinstance(value, bool):
            raise UsageError(f"{where} is a flag: give true or false, not {value!r}")
        if option == kind.negation:  # the recipe named the --no-X spelling
            return [f"--{option}"] if value else []
        if value:
            return [f"--{option}"]
        return [f"--{kind.negation}"] if kind.negation else []
    values = value if isinstance(value, list) else [value]
    if len(values) != 1 and kind.type is not list:
        raise UsageError(f"{where} takes one value, not a list")
    out: list[str] = []
    for item in values:
        if isinstance(item, (dict, list)) or item is None:
            raise UsageError(f"{where}: values must be strings or numbers, not {item!r}")
        _check_type(where, item, kind.type)
        out += [f"--{option}", str(item).lower() if isinstance(item, bool) else str(item)]
    return out


def _check_type(where: str, item: Any, kind: Any) -> None:
    """A value for an int or float setting must read as one (YAML may hand over `1e-3` as a string) and be
    finite (YAML's `.nan` and `.inf` are floats; a stage never wants them)."""
    if kind not in (int, float):
        return
    try:
        ok = not isinstance(item, bool) and (isinstance(item, int) or not isinstance(item, float) or kind is float)
        if ok and isinstance(item, str):
            ok = math.isfinite(kind(item))
        elif ok:
            ok = math.isfinite(item)
    except (ValueError, OverflowError):
        ok = False
    if not ok:
        raise UsageError(f"{where} takes {'an integer' if kind is int else 'a finite number'}, not {item!r}")


def _unknown(raw: dict, allowed: set[str], what: str, fail: Callable[..., UsageError]) -> None:
    for key in raw:
        if key not in allowed:
            raise fail(f"unknown {what} {key!r}", hint=_suggest(str(key), sorted(allowed)) or
                       f"allowed: {', '.join(sorted(allowed))}")


def _number(value: Any, name: str, fail: Callable[..., UsageError], minimum: float,
            maximum: float = MAX_SECONDS) -> float:
    """A finite int or float in [minimum, maximum]; NaN, inf, strings and bools are usage errors."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not minimum <= value <= maximum:
        raise fail(f"{name} must be a finite number in [{minimum:g}, {maximum:g}], not {value!r}")
    return float(value)


def _env(raw: Any, name: str, fail: Callable[..., UsageError]) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise fail(f"{name} must map variable names to values")
    return {str(k): str(v) for k, v in raw.items()}


def _suggest(word: str, choices: Any, prefix: str = "") -> str | None:
    return did_you_mean(word, choices, n=1, shown=lambda choice: prefix + choice)


# ---------------------------------------------------------------------------------------------- children
@dataclass
class Child:
    """One supervised process: a (stage, worker) of the recipe and its restart bookkeeping."""

    stage: str
    index: int
    argv: list[str]
    log_path: str
    env: dict[str, str]
    mode: str = "watch"
    interval_s: float = 10.0
    state: str = "pending"  # pending, running, backoff (crashed, restart due), waiting (loop), done, failed, stopped
    proc: Any = None
    pid: int | None = None
    restarts: int = 0  # restarts after crashes, over the session
    runs: int = 0  # starts, over the session
    consecutive_crashes: int = 0
    started_at: float = 0.0
    next_start_at: float = 0.0
    last_exit: str | None = None
    last_crash: str | None = None

    @property
    def name(self) -> str:
        return f"{self.stage}-{self.index}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
        return f"killed by signal {-returncode}"
    return f"exit {returncode}" + (" (transient)" if returncode == 75 else "")


class Supervisor:
    """Start, watch, restart and stop the recipe's children. `run()` is the loop `arlctl up` drives;
    tests may call `start()`, `tick()`, `stop_stage()` and `stop()` themselves."""

    def __init__(self, recipe: Recipe, log: Callable[[str], None] | None = None):
        self.recipe = recipe
        self.log = log or (lambda line: None)
        self.children: list[Child] = []
        self.events: list[tuple[float, str, str]] = []  # (time, child, what): starts, exits, restarts
        self.policy_history: list[int] = []  # policy/LATEST versions in the order observed
        self.started_at = 0.0
        os.makedirs(recipe.logs, exist_ok=True)
        for spec in recipe.stages:
            for i in range(spec.workers):
                self.children.append(Child(
                    stage=spec.name, index=i, argv=stage_argv(recipe, spec, i),
                    log_path=os.path.join(recipe.logs, f"{spec.name}-{i}.log"),
                    env={**recipe.env, **spec.env}, mode=spec.mode, interval_s=spec.interval_s))

    # ------------------------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.started_at = time.time()
        for child in self.children:
            self._spawn(child)

    def _spawn(self, child: Child) -> None:
        env = {**os.environ, **child.env, "PYTHONUNBUFFERED": "1"}
        with open(child.log_path, "ab") as log_file:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            log_file.write(f"=== {stamp} arlctl up starts: {shlex.join(child.argv)}\n".encode())
            log_file.flush()
            # Own session and process group: the terminal's Ctrl-C reaches only the supervisor.
            child.proc = _popen(child.argv, log_file, env)
        child.pid, child.state, child.started_at = child.proc.pid, "running", time.time()
        child.runs += 1
        self._event(child, f"started pid {child.pid}")

    def tick(self, now: float | None = None) -> None:
        """Reap exited children and start the ones whose restart (or next loop run) is due."""
        now = time.time() if now is None else now
        for child in self.children:
            if child.state == "running" and child.proc.poll() is not None:
                self._exited(child, child.proc.returncode, now)
            if child.state in ("backoff", "waiting") and now >= child.next_start_at:
                if child.state == "backoff":
                    child.restarts += 1
                self._spawn(child)

    def _exited(self, child: Child, returncode: int, now: float) -> None:
        what = describe_exit(returncode)
        child.last_exit, child.pid = what, None
        ran = now - child.started_at
        self._append_log(child, f"=== arlctl up: {what} after {ran:.1f}s")
        if returncode == 0:
            if child.mode == "loop":
                child.state, child.next_start_at = "waiting", now + child.interval_s
                child.consecutive_crashes = 0
            else:
                child.state = "done"
            self._event(child, f"{what}: " + (f"next run in {child.interval_s:.0f}s" if child.mode == "loop" else "done"))
            return
        if returncode == USAGE_EXIT:  # a bad option or recipe never fixes itself: do not loop on it
            child.state, child.last_crash = "failed", what
            self._event(child, f"{what} (usage error): not restarted; see {child.log_path}")
            return
        child.consecutive_crashes = 1 if ran >= self.recipe.restart.healthy_after_s else child.consecutive_crashes + 1
        delay = self.recipe.restart.delay(child.consecutive_crashes)
        child.state, child.next_start_at, child.last_crash = "backoff", now + delay, what
        self._event(child, f"{what} after {ran:.1f}s; restart in {delay:.1f}s")

    def stop_stage(self, stage: str, grace_s: float | None = None) -> None:
        """Stop one stage's children for good (SIGTERM, grace, SIGKILL); they are not restarted."""
        self._stop([c for c in self.children if c.stage == stage], grace_s)

    def stop(self, grace_s: float | None = None) -> None:
        """Stop everything, sources first so downstream stages may commit what upstream flushed on SIGTERM."""
        self._stop(list(self.children), grace_s)

    def _stop(self, children: list[Child], grace_s: float | None) -> None:
        grace = self.recipe.stop_grace_s if grace_s is None else grace_s
        live = [c for c in children if c.alive()]
        for child in children:
            if child.state in ("backoff", "waiting", "pending"):
                child.state = "stopped"
        for child in live:
            _signal_group(child.proc.pid, signal.SIGTERM)
            self._event(child, "SIGTERM sent")
        deadline = time.time() + grace
        for child in live:
            try:
                child.proc.wait(timeout=max(0.0, deadline - time.time()))
            except Exception:  # subprocess.TimeoutExpired: past the grace period
                _signal_group(child.proc.pid, signal.SIGKILL)
                child.proc.wait()
                self._event(child, f"SIGKILLed after the {grace:.0f}s grace period")
            child.last_exit = describe_exit(child.proc.returncode)
            self._append_log(child, f"=== arlctl up: stopped ({child.last_exit})")
            child.state, child.pid = "stopped", None
        for child in children:
            if child.state == "running":  # exited on its own just now, not yet reaped by tick()
                child.last_exit, child.state, child.pid = describe_exit(child.proc.wait()), "stopped", None
            # A SIGTERM only asks the leader to stop: sweep the group for strays (a sandbox, a worker).
            if child.proc is not None:
                _signal_group(child.proc.pid, signal.SIGKILL)

    def kill(self, child: Child, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to a child's whole process group (chaos tests, soak runs)."""
        if child.alive():
            _signal_group(child.proc.pid, sig)
            self._event(child, f"sent {signal.Signals(sig).name}")

    # ------------------------------------------------------------------------------------ status
    def running(self, stage: str | None = None) -> list[Child]:
        return [c for c in self.children if c.state == "running" and (stage is None or c.stage == stage)]

    def stage_states(self) -> dict[str, str]:
        """One word per stage for the dashboard: e.g. `running 2/2`, `backoff`, `done`."""
        out = {}
        for spec in self.recipe.stages:
            kids = [c for c in self.children if c.stage == spec.name]
            running = sum(c.state == "running" for c in kids)
            states = {c.state for c in kids}
            word = "running" if running else ("backoff" if "backoff" in states else sorted(states)[0])
            out[spec.name] = f"{word} {running}/{len(kids)}" if len(kids) > 1 else word
        return out

    def observe_policy(self, version: int | None) -> None:
        if version is not None and (not self.policy_history or self.policy_history[-1] != version):
            self.policy_history.append(version)

    def restarts(self) -> dict[str, int]:
        return {c.name: c.restarts for c in self.children}

    def last_error(self, child: Child) -> str | None:
        """The last error-looking line its log has written since the child last started, else its last crash."""
        line = last_error_line(child.log_path)
        return line or child.last_crash

    def _event(self, child: Child, what: str) -> None:
        self.events.append((time.time(), child.name, what))
        self.log(f"{child.name}: {what}")

    def _append_log(self, child: Child, line: str) -> None:
        with contextlib.suppress(OSError), open(child.log_path, "a") as fh:
            fh.write(line + "\n")


def _popen(argv: list[str], log_file: Any, env: dict[str, str]) -> Any:
    import subprocess

    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True, close_fds=True,
                            preexec_fn=_term_with_parent if sys.platform == "linux" else None)


def _term_with_parent() -> None:
    """In the child before exec: SIGTERM it if the supervisor dies, even by SIGKILL (Linux prctl
    PR_SET_PDEATHSIG), so a killed `arlctl up` leaves no orphan daemons behind."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def last_error_line(log_path: str, tail_bytes: int = 32768) -> str | None:
    """The last line that looks like an error in the log tail, after the newest `arlctl up starts` marker."""
    try:
        with open(log_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - tail_bytes))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("=== ") and "arlctl up starts" in line]
    lines = lines[starts[-1] + 1:] if starts else lines
    for line in reversed(lines):
        if ERROR_LINE.search(line) and not line.startswith("=== arlctl up: stopped"):
            return line.strip()[:200]
    return None


# ------------------------------------------------------------------------------------------------ drain
def pipeline_drained(state: dict[str, Any]) -> bool:
    """Nothing waits anywhere: every rollout is rewarded, filtered and trained, and the newest
    checkpoint is published (uses `arlctl.runstate.run_state`'s dict)."""
    stages = state["stages"]
    waiting = sum(stages[s].get("waiting_shards", 0) for s in ("reward", "filter", "train"))
    return waiting == 0 and not stages["sync"]["waiting_shards"]


@dataclass
class UpResult:
    stopped_by: str  # "signal SIGINT", "time", "drained", "all done"
    seconds: float
    restarts: dict[str, int]
    events: list[tuple[float, str, str]]
    policy_history: list[int]
    state: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def run(sup: Supervisor, for_s: float | None = None, until_drained: bool = False,
        on_tick: Callable[[Supervisor, float], None] | None = None,
        on_state: Callable[[Supervisor, dict[str, Any]], None] | None = None,
        sources: tuple[str, ...] = ("rollout",)) -> UpResult:
    """Supervise until a signal (SIGTERM/SIGINT), `for_s` seconds, or — with `until_drained` — until the
    source stages (rollout) are done or stopped and nothing waits anywhere; then stop everything.

    on_tick(sup, elapsed) runs every loop turn (chaos tests kill from it); on_state(sup, state) gets each
    fresh run state (the dashboard)."""
    from arlctl.io.watch import GracefulStop
    from arlctl.runstate import ShardCache, run_state

    cache = ShardCache()
    sup.start()
    t0 = time.monotonic()
    next_state = 0.0
    state: dict[str, Any] | None = None
    stopped_by = "all done"
    with GracefulStop() as flag:
        try:
            while True:
                sup.tick()
                elapsed = time.monotonic() - t0
                if on_tick is not None:
                    on_tick(sup, elapsed)
                if time.monotonic() >= next_state:
                    next_state = time.monotonic() + sup.recipe.refresh_s
                    try:
                        forget_listings(sup.recipe.run)
                        state = run_state(sup.recipe.run, cache)
                    except Exception as err:  # a store blip must not take the supervisor down
                        state = None  # and a stale state must not say "drained"
                        sup.log(f"run state unavailable: {type(err).__name__}: {err}")
                    if state is not None:
                        sup.observe_policy(state.get("policy_version"))
                        if on_state is not None:
                            on_state(sup, state)
                    if until_drained and state is not None and _sources_finished(sup, sources) \
                            and pipeline_drained(state):
                        stopped_by = "drained"
                        break
                if flag.is_set():
                    stopped_by = f"signal {flag.signal_received or 'stop'}"
                    break
                if for_s is not None and elapsed >= for_s:
                    stopped_by = "time"
                    break
                if all(c.state in ("done", "failed", "stopped") for c in sup.children):
                    break
                flag.sleep(0.2)
        finally:  # also on an exception in a hook: never leave daemons behind
            sup.log(f"stopping ({stopped_by})")
            sup.stop()
    with contextlib.suppress(Exception):
        forget_listings(sup.recipe.run)
        state = run_state(sup.recipe.run, cache)
        sup.observe_policy(state.get("policy_version"))
    return UpResult(stopped_by=stopped_by, seconds=time.monotonic() - t0, restarts=sup.restarts(),
                    events=sup.events, policy_history=sup.policy_history, state=state)


def forget_listings(url: str) -> None:
    """Drop fsspec's cached directory listings: s3fs keeps them for the life of the process, so a
    long-running reader (this loop) would never see what the daemons wrote since its first look."""
    from arlctl.io.fs import get_fs

    get_fs(url)[0].invalidate_cache()


def _sources_finished(sup: Supervisor, sources: tuple[str, ...]) -> bool:
    kids = [c for c in sup.children if c.stage in sources]
    return all(c.state in ("done", "failed", "stopped") for c in kids)


__all__ = ["RECIPE_STAGES", "SIDE_STAGES", "STAGES", "Child", "Recipe", "RestartPolicy", "StageSpec", "Supervisor",
           "UpResult", "describe_exit", "last_error_line", "forget_listings", "load_recipe", "parse_recipe", "pipeline_drained", "run", "stage_argv"]
