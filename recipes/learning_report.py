"""Report of a math learning run (recipes/smollm2_learning.sh): per-iteration curve and held-out eval.

    .venv/bin/python recipes/learning_report.py RUN --out docs/learning
    .venv/bin/python recipes/learning_report.py RUN --by version --bin 5   # a daemon run: no iterations

With `--by version` the training rollouts are grouped by the policy version they started with, in bins of
`--bin` versions (a run of `arlctl up` has no iterations).

Held-out evals come from `arlctl eval` (RUN/evals/<name>/vNNNNNN/: rewarded shards and summary.json): one row
per evaluated version with the correct rate and standard error of its summary, and for each greedy eval with
two or more versions the paired comparison of its first and last version (`arlctl eval --compare`: exact
McNemar). Runs made before `arlctl eval` keep RUN/eval/{before,after,greedy-before,greedy-after}/rewarded;
those are read as before, and their greedy pair gets the same exact test (stages/eval.py `mcnemar_p`).

Reads RUN/rewarded (training rollouts, iteration from the `it0003-...` shard prefix), the held-out evals and
RUN/metrics (train steps), all through DuckDB, and writes OUT/<name>.png (mean reward, answer-format rate,
tool-call rate and correct rate per iteration, held-out evals as a second panel), OUT/<name>.md (the same
numbers as tables) and OUT/<name>.json.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from arlctl.io.duck import connect_paths, sealed, shard_dataset
from arlctl.io.fs import basename
from arlctl.io.shards import list_shards

ITERATION_KEY = "try_cast(regexp_extract(filename, '/it([0-9]+)-', 1) as integer)"
VERSION_KEY = "(policy_version // $bin) * $bin"  # the bin width is a bound parameter
_ITERATION_SQL = """
select {key} as iteration,
       count(*) as trajectories,
       avg(reward) as mean_reward,
       avg(reward_components['correct']) as correct_rate,
       avg(reward_components['format']) as format_rate,
       avg(case when num_tool_calls > 0 then 1.0 else 0.0 end) as tool_call_rate,
       avg(generated_tokens) as mean_generated_tokens,
       max(policy_version) as policy_version
from trajectories
where status <> 'aborted'  -- rows flushed by a rollout stopped by a signal (the iteration was rolled out again)
group by 1 order by 1
"""

EVAL_SQL = """
select count(*) as trajectories,
       avg(reward) as mean_reward,
       avg(reward_components['correct']) as correct_rate,
       avg(reward_components['format']) as format_rate,
       avg(case when num_tool_calls > 0 then 1.0 else 0.0 end) as tool_call_rate,
       avg(generated_tokens) as mean_generated_tokens,
       count(distinct task_id) as tasks
from trajectories
"""


ITERATION_SQL = _ITERATION_SQL.format(key=ITERATION_KEY)
VERSION_SQL = _ITERATION_SQL.format(key=VERSION_KEY)
TRAIN_STEPS_SQL = "select * from train_steps order by step"


def rows(path: str, sql: str, params: dict | None = None) -> list[dict]:
    con, _ = connect_paths(path)
    cur = con.execute(sql, params or {})
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


PAIRED_SQL = """
select b.task_id, b.correct as before, a.correct as after
from (select task_id, max(reward_components['correct']) as correct from before group by 1) b
join (select task_id, max(reward_components['correct']) as correct from after group by 1) a
using (task_id)
"""


def paired_rows(before_dir: Path, after_dir: Path, sql: str) -> list[tuple]:
    """`sql` over the shards of two directories, registered as `before` and `after` on a sealed connection
    (arlctl.io.duck: no path becomes SQL text, and the connection reaches no file)."""
    con = sealed()
    con.register("before", shard_dataset(list_shards(str(before_dir))))
    con.register("after", shard_dataset(list_shards(str(after_dir))))
    return con.execute(sql).fetchall()


def mcnemar(before_dir: Path, after_dir: Path) -> dict:
    """Exact two-sided McNemar test over tasks solved (reward_components['correct']) by exactly one of two
    greedy evals in plain rewarded directories; the test itself is `arlctl eval`'s (stages/eval.py)."""
    from arlctl.stages.eval import mcnemar_p

    pairs = paired_rows(before_dir, after_dir, PAIRED_SQL)
    only_before = sum(1 for _, b, a in pairs if b >= 1 and a < 1)
    only_after = sum(1 for _, b, a in pairs if a >= 1 and b < 1)
    both = sum(1 for _, b, a in pairs if a >= 1 and b >= 1)
    return {"tasks": len(pairs), "both": both, "only_before": only_before, "only_after": only_after,
            "p_value": mcnemar_p(only_before, only_after)}


def arlctl_evals(run: Path) -> tuple[dict, dict]:
    """({label: numbers}, {eval name: paired comparison}) from RUN/evals (`arlctl eval`): one entry per
    evaluated version; each greedy eval with two or more versions compares its first and last."""
    from arlctl.io.run import RunLayout
    from arlctl.stages.eval_job import compare_versions, evaluated_versions, read_summary

    root = Path(RunLayout(str(run)).evals)
    evals, paired = {}, {}
    for name in sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))):
        versions = sorted(evaluated_versions(str(root), name))
        for version in versions:
            directory = root / name / f"v{version:06d}"
            summary = read_summary(str(directory))
            numbers = rows(str(directory), EVAL_SQL)[0]
            numbers.update(correct_rate=summary["correct_rate"], correct_se=summary["correct_se"],
                           pass_at_k=summary["pass_at_k"], version=version, mode=summary["primary"])
            evals[f"{name} v{version}"] = numbers
        if len(versions) >= 2 and "greedy" in read_summary(str(root / name / f"v{versions[-1]:06d}"))["by_mode"]:
            paired[name] = compare_versions(str(root), name, versions[0], versions[-1])
    return evals, paired


def legacy_evals(run: Path) -> tuple[dict, dict]:
    """The same from the RUN/eval/<name>/rewarded directories of runs made before `arlctl eval`."""
    evals = {}
    for name in ("before", "after", "greedy-before", "greedy-after"):  # greedy-*: temperature 0, G=1
        d = run / "eval" / name / "rewarded"
        if d.exists():
            evals[name] = rows(str(d), EVAL_SQL)[0]
            evals[name]["correct_se"] = stderr(evals[name]["correct_rate"], evals[name]["trajectories"])
    paired = {}
    if "greedy-before" in evals and "greedy-after" in evals:
        paired["greedy"] = mcnemar(run / "eval" / "greedy-before" / "rewarded",
                                   run / "eval" / "greedy-after" / "rewarded")
    return evals, paired


def _paired_line(name: str, test: dict) -> str:
    """One sentence for a paired greedy comparison (legacy mcnemar() or `arlctl eval --compare`)."""
    if "modes" in test:  # arlctl eval --compare
        mc = test["modes"]["greedy"]["mcnemar"]
        first, last = f"v{test['a']}", f"v{test['b']}"
        only_first, only_last = mc["only_a"], mc["only_b"]
    else:
        mc, first, last = test, "before", "after"
        only_first, only_last = mc["only_before"], mc["only_after"]
    return (f"Greedy ({name}), paired over {mc['tasks']} tasks: solved both times {mc['both']}, only {first} "
            f"{only_first}, only {last} {only_last}; exact McNemar p = {mc['p_value']:.2g}.")


def stderr(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 0.0) / n) if n else float("nan")


def train_steps(run: Path) -> list[dict]:
    metrics = run / "metrics"
    if not any(metrics.glob("train-*.parquet")):
        return []
    con = sealed()
    con.register("train_steps", shard_dataset([s for s in list_shards(str(metrics))
                                               if basename(s).startswith("train-")], with_filename=False))
    cur = con.execute(TRAIN_STEPS_SQL)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("--out", default="docs/learning")
    ap.add_argument("--name", default="smollm2_math")
    ap.add_argument("--by", choices=("iteration", "version"), default="iteration",
                    help="group training rollouts by recipe iteration or by policy version bins")
    ap.add_argument("--bin", type=int, default=5, help="policy versions per bin with --by version")
    args = ap.parse_args()
    if args.bin < 1:
        ap.error("--bin must be at least 1")
    run, out = Path(args.run), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    if args.by == "iteration":
        iters = rows(str(run / "rewarded"), ITERATION_SQL)
    else:
        iters = rows(str(run / "rewarded"), VERSION_SQL, {"bin": args.bin})
    evals, paired = arlctl_evals(run) if (run / "evals").is_dir() else legacy_evals(run)
    steps = train_steps(run)
    unit = "iteration" if args.by == "iteration" else f"policy versions (bins of {args.bin}, by first version)"

    report = {"run": str(run), "grouped_by": unit, "iterations": iters, "eval": evals, "greedy_paired": paired,
              "train_steps": len(steps),
              "train": [{k: s.get(k) for k in ("step", "loss", "clip_frac", "approx_kl", "entropy", "grad_norm",
                                                "tokens_per_s", "reward_mean")} for s in steps]}
    (out / f"{args.name}.json").write_text(json.dumps(report, indent=1, default=str) + "\n")

    first_col = "iteration" if args.by == "iteration" else "versions"
    lines = [f"# {args.name}: training rollouts per {unit}", "",
             f"| {first_col} | policy version | trajectories | mean reward | correct | answer-format rate "
             "| tool-call rate | generated tokens |", "|---|---|---|---|---|---|---|---|"]
    for r in iters:
        label = r["iteration"] if args.by == "iteration" else f"{r['iteration']}–{r['iteration'] + args.bin - 1}"
        lines.append(f"| {label} | {r['policy_version']} | {r['trajectories']} | {r['mean_reward']:.3f} "
                     f"| {r['correct_rate']:.3f} | {r['format_rate']:.3f} | {r['tool_call_rate']:.3f} "
                     f"| {r['mean_generated_tokens']:.1f} |")
    if evals:
        lines += ["", "## Held-out tasks (a seed no training iteration uses)", "",
                  "| policy | tasks | trajectories | mean reward | correct (± s.e.) | answer-format rate "
                  "| tool-call rate | generated tokens |", "|---|---|---|---|---|---|---|---|"]
        for name, e in evals.items():
            lines.append(f"| {name} | {e['tasks']} | {e['trajectories']} | {e['mean_reward']:.3f} "
                         f"| {e['correct_rate']:.3f} ± {e['correct_se']:.3f} "
                         f"| {e['format_rate']:.3f} | {e['tool_call_rate']:.3f} "
                         f"| {e['mean_generated_tokens']:.1f} |")
    for name, test in paired.items():
        lines += ["", _paired_line(name, test)]
    lines += ["", f"{len(steps)} optimizer steps in total."]
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 1]})
    xs = [r["iteration"] for r in iters]
    for key, label in (("mean_reward", "mean reward"), ("correct_rate", "correct"),
                       ("format_rate", "answer-format rate"), ("tool_call_rate", "tool-call rate")):
        ax.plot(xs, [r[key] for r in iters], marker="o", label=label)
    ax.set_xlabel("iteration (rollouts of policy v = previous steps)" if args.by == "iteration"
                  else "policy version the rollouts started with (bin start)")
    ax.set_ylabel("rate / reward")
    ax.set_title(f"training rollouts per {first_col[:-1] if first_col == 'versions' else first_col} bin"
                 if args.by == "version" else "training rollouts per iteration")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if evals:
        names = list(evals)
        vals = [evals[n]["correct_rate"] for n in names]
        errs = [evals[n]["correct_se"] for n in names]
        colors = ["#999999" if n.endswith(("before", " v0")) else "#2a7ab9" for n in names]
        bx.bar(names, vals, yerr=errs, capsize=6, color=colors)
        bx.tick_params(axis="x", labelsize=7)
        bx.set_title("held-out correct rate")
        bx.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / f"{args.name}.png", dpi=110)
    print("\n".join(lines))
    print(f"wrote {out / (args.name + '.png')}, {out / (args.name + '.md')}, {out / (args.name + '.json')}")


if __name__ == "__main__":
    main()
