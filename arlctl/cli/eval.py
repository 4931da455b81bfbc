"""`arlctl eval`: held-out evaluation of policy versions into RUN/evals, and the paired comparison of two."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import typer

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.cli.options import config_command
from arlctl.errors import TerminalError, UsageError
from arlctl.render import plain
from arlctl.stages.eval import EvalConfig
from arlctl.stages.jobs import EvalOptions

HELP = """Evaluate a policy on held-out tasks with the eval's own sampling: greedy (one answer per task at temperature 0, the default) and/or --samples K at --temperature for pass@k. The rows are rolled out and rewarded by the rollout and reward stages' own code and written as ordinary rewarded shards to RUN/evals/NAME/vNNNNNN/ (NNNNNN = the policy version), with summary.json last. Filter and train never read RUN/evals.

  arlctl eval --run runs/r1 --policy runs/r1/policy --tasks "builtin:math?n=200&seed=999" --greedy

  arlctl eval --run runs/r1 --policy default --tasks "builtin:math?n=100&seed=999" --name pass8 --samples 8 --json

  arlctl eval --run runs/r1 --watch --every 5 --tasks "builtin:math?n=200&seed=999" --max-turns 1

  arlctl eval --run runs/r1 --compare v0 v40

summary.json holds name, version, policy, tasks, samples, temperature, n_tasks, n_rows, truncated (rows a token budget cut: graded, and shown in the table), correct_rate with its standard error (clustered by task), mean_reward, pass_at_k {k: value} for k = 1, 2, 4, ..., K (the unbiased estimator), the rows without a reward and the rows that are not the model's answer (env_error, policy_error, aborted), by cause: they are left out of the rates and counted, never dropped silently. A row is correct when its reward >= --correct-at (default 1.0). With greedy and sampled both, the top-level numbers are the greedy ones (pass@k the sampled ones) and `by_mode` holds each.

A version whose summary.json exists is not evaluated again (--force does); one stopped half-way starts again from nothing. With --watch it follows the policy directory (--policy when it is one, else RUN/policy) and evaluates each published version whose number is a multiple of --every, oldest first, until SIGINT/SIGTERM; a --policy that is a model (default, tiny, an HF directory) is evaluated first, as its own version (0). `arlctl up` runs it as the `eval` stage.

--compare vA vB reads two evaluated versions of --name: the correct rate of each with standard errors, their difference, and on greedy evals the exact two-sided McNemar test over the tasks both graded (b = solved only by A, c = only by B).
"""

MODEL_SPECS = ("default", "tiny", "smollm2-135m")


def register(app: typer.Typer) -> None:
    @app.command("eval", help=HELP)
    @handle_errors
    @config_command(EvalConfig, options=EvalOptions)
    def eval_cmd(cfg: EvalConfig, opts: EvalOptions) -> None:
        from arlctl.io.fs import join
        from arlctl.io.lock import RunLock
        from arlctl.io.run import resolve_io
        from arlctl.stages import policy_job

        _check_name(opts.name)
        _, root = resolve_io("eval", opts.run, None, opts.out)
        if opts.compare:
            if opts.watch:
                raise UsageError("--compare and --watch exclude each other")
            _compare(root, opts.name, opts.compare, opts.as_json)
            return
        cfg.check()
        job = _job(cfg, opts, root)
        follow, first = _policies(opts.policy, opts.run, opts.watch)
        policy_job.check(opts)  # a wrong backend, --backend-opt or --max-batch: a usage error before any work
        if opts.dry_run:
            _dry_run(job, opts, follow, first)
            return
        with RunLock(join(root, opts.name), "eval", wait_s=opts.lock_wait):
            if opts.watch:
                _watch(job, opts, follow, first)
            else:
                _once(job, opts, first)


def _log(line: str) -> None:
    console.print(plain(line), soft_wrap=True)  # progress lines: -q silences them with the rest of stderr


def _check_name(name: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name or ""):
        raise UsageError(f"--name must be a plain directory name (letters, digits, . _ -), got {name!r}")


def _job(cfg: EvalConfig, opts: EvalOptions, root: str) -> Any:
    """The eval's tasks, envs (checked now) and reward, as one EvalJob."""
    from arlctl.settings import parse_env_options
    from arlctl.stages.configs import RewardConfig
    from arlctl.stages.eval_job import EvalJob
    from arlctl.stages.reward_job import build
    from arlctl.stages.rollout_job import EnvPicker, load_task_list

    task_list, default_env = load_task_list(opts.env, opts.tasks, None, opts.limit, cfg.seed)
    if not task_list:
        raise UsageError("no tasks to evaluate", hint="check --tasks and --limit")
    options = parse_env_options(opts.env_opt, "--env-opt")
    EnvPicker(options).check(task_list, default_env)  # unknown envs or options: a usage error before any work
    reward_cfg = RewardConfig(reward=cfg.reward, reward_opt=cfg.reward_opt)
    reward_cfg.check()
    return EvalJob(cfg=cfg, name=opts.name, root=root, tasks=task_list, env=default_env, env_options=options,
                   reward=build(reward_cfg), sources=list(opts.tasks) or [f"builtin:{default_env}"],
                   policy_spec=opts.policy or "", backend=opts.backend, force=opts.force)


def _choose(opts: EvalOptions, spec: str) -> Any:
    """`spec` resolved with eval's backend options (stages/policy_job.py): cheap, loads no model; a scripted
    oracle:* spec is refused (an eval needs a model)."""
    import dataclasses

    from arlctl.stages import policy_job

    return policy_job.choose(dataclasses.replace(opts, policy=spec), progress=False, scripted_ok=False)


def _policies(policy: str | None, run: str | None, watch: bool) -> tuple[str | None, str | None]:
    """(policy directory to follow with --watch, model or policy spec evaluated first)."""
    from pathlib import Path

    from arlctl.io.run import RunLayout

    run_policy = RunLayout(run).policy if run else None
    if not watch:
        spec = policy or run_policy
        if spec is None:
            raise UsageError("give --policy (or --run, to evaluate RUN/policy)")
        return None, spec
    is_model = policy is not None and (policy in MODEL_SPECS or (Path(policy) / "config.json").is_file())
    follow = run_policy if policy is None or is_model else policy
    if follow is None:
        raise UsageError("--watch follows a policy directory: give --run or --policy RUN/policy")
    return follow, policy if is_model else None


def _once(job: Any, opts: EvalOptions, spec: str) -> None:
    from arlctl.cli.common import stop_on_signals
    from arlctl.stages import policy_job
    from arlctl.stages.eval_job import EvalResult, evaluate_version, read_summary

    choice = _choose(opts, spec)  # an evaluated version loads no model
    version = choice.version
    existing = read_summary(job.version_dir(version))
    if existing is not None and not job.force:
        result = EvalResult(version, job.version_dir(version), existing, skipped=True)
    else:
        async def main() -> Any:
            stop = stop_on_signals("stopping the eval; its version stays unevaluated")
            pol = await asyncio.to_thread(lambda: policy_job.load(choice, run=opts.run))
            try:
                _log(f"eval {job.name}: v{pol.version} of {pol.name}, {len(job.tasks)} tasks, "
                     f"{' + '.join(job.cfg.modes())}")
                return await evaluate_version(job, pol, stop, _log)
            finally:
                await pol.close()

        result = asyncio.run(main())
    if opts.as_json:
        print_json(result.to_json())
    console.print(plain(result.summary_line()), soft_wrap=True)
    if result.summary is not None:
        console.print(mode_table(result.summary))
    if result.interrupted:
        raise TerminalError(f"interrupted: v{result.version} was not evaluated",
                            hint="run it again; the version starts from nothing")


def _watch(job: Any, opts: EvalOptions, follow: str, first: str | None) -> None:
    from arlctl.cli.common import stop_on_signals
    from arlctl.stages import policy_job
    from arlctl.stages.eval_job import watch

    if opts.poll <= 0:
        raise UsageError("--poll must be positive")
    _log(f"eval {job.name}: following {follow}, every {job.cfg.every} version(s); Ctrl-C stops")

    async def main() -> Any:
        stop = stop_on_signals("stopping the eval watcher (an unfinished version stays unevaluated)")
        return await watch(job, follow, policy_job.loader(opts, opts.run), stop, opts.poll, first=first, log=_log,
                           on_result=lambda r: _print_result(r))

    result = asyncio.run(main())
    if opts.as_json:
        print_json(result.to_json())
    console.print(plain(f"eval {job.name}: evaluated {len(result.to_json()['evaluated'])} version(s)"
                        + (f"; {len(result.failed)} could not be: "
                           + "; ".join(f"v{v}: {why}" for v, why in result.failed.items()) if result.failed else "")),
                  soft_wrap=True)


def _print_result(result: Any) -> None:
    console.print(plain(result.summary_line()), soft_wrap=True)
    if result.summary is not None:
        console.print(mode_table(result.summary))


def mode_table(summary: dict[str, Any]) -> Any:
    """Each evaluated mode's rows: how many were graded and correct, and those cut by a token budget
    (truncated: graded, but a low rate may be the budget's), without a reward, or not the model's answer."""
    from rich.table import Table

    table = Table("mode", "rows", "graded", "correct", "truncated", "no reward", "not answers", title_justify="left")
    for mode, block in summary.get("by_mode", {}).items():
        rate = "-" if block["correct_rate"] is None else f"{block['correct_rate']:.3f}"
        table.add_row(mode, str(block["n_rows"]), str(block["n_graded"]), rate,
                      str(block.get("truncated", block["status"].get("truncated", 0))),
                      str(block["null_reward"]), str(block["not_answers"]))
    return table


def _dry_run(job: Any, opts: EvalOptions, follow: str | None, first: str | None) -> None:
    from arlctl.stages.eval_job import due_versions, read_summary

    planned = []
    if first is not None:
        version = _choose(opts, first).version
        if job.force or read_summary(job.version_dir(version)) is None:
            planned.append(version)
    if opts.watch:
        planned += [v for v, _ in due_versions(job, follow, set())]
    for version in planned:
        console.print(plain(f"would evaluate v{version}: {len(job.tasks)} tasks ({' + '.join(job.cfg.modes())}) "
                            f"-> {job.version_dir(version)}"), soft_wrap=True)
    console.print(plain(f"dry run: {len(planned)} version(s) to evaluate now; nothing written"))


def parse_version_arg(text: str) -> int:
    """v000040, v40 or 40 -> 40."""
    match = re.fullmatch(r"v?(\d+)", text.strip())
    if match is None:
        raise UsageError(f"--compare takes policy versions such as v0 or v000040, got {text!r}")
    return int(match.group(1))


def _compare(root: str, name: str, versions: tuple[str, str], as_json: bool) -> None:
    from arlctl.stages.eval_job import compare_versions

    a, b = (parse_version_arg(v) for v in versions)
    result = compare_versions(root, name, a, b)
    if as_json:
        print_json(result)
    for mode, entry in result["modes"].items():
        sides = [f"v{result[s]} {_rate(entry[s])}" for s in ("a", "b")]
        line = f"{name} {mode}: {sides[0]} -> {sides[1]}"
        if "difference" in entry:
            line += f", difference {entry['difference']:+.3f}"
        test = entry.get("mcnemar")
        if test is not None:
            line += (f"; paired over {test['tasks']} tasks: both {test['both']}, only v{a} {test['only_a']}, "
                     f"only v{b} {test['only_b']}, neither {test['neither']}; exact McNemar p = {test['p_value']:.4g}")
        console.print(plain(line), soft_wrap=True)


def _rate(block: dict[str, Any]) -> str:
    if block["correct_rate"] is None:
        return "no graded rows"
    return f"correct {block['correct_rate']:.3f} ± {block['correct_se']:.3f} (n={block['n_graded']})"
