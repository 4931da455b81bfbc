"""Report of the agentic tool-use run (recipes/agentic_tool.sh): held-out evals before SFT, after SFT and
after RL, paired tests between them, the SFT and GRPO curves.

    .venv/bin/python recipes/agentic_tool_report.py RUN --out docs/learning

Reads RUN/eval/{before-sft,after-sft,after-rl}/rewarded (greedy, one sample per held-out task), RUN/sft
(oracle rollouts and the SFT steps' metrics), RUN/rewarded and RUN/metrics (GRPO iterations) and
RUN/commands.log, and writes OUT/agentic_tool.{json,md,png}; OUT/agentic_tool.notes.md, when present, is
the written reading of the run, placed after the title. Paired tests are exact two-sided McNemar over
the tasks solved by exactly one of two evals (`arlctl eval`'s test, stages/eval.py `mcnemar_p`), for the
correct rate and for the tool-call rate.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from learning_report import ITERATION_SQL, mcnemar, paired_rows, rows, stderr, train_steps

from arlctl.stages.eval import mcnemar_p

EVALS = ("before-sft", "after-sft", "after-rl")  # and any other RUN/eval/NAME, listed between them by time
EVAL_SQL = """
select count(distinct task_id) as tasks, count(*) as trajectories,
       avg(reward_components['correct']) as correct_rate,
       avg(case when num_tool_calls > 0 then 1.0 else 0.0 end) as tool_call_rate,
       avg(case when reward_components['format'] > 0 then 1.0 else 0.0 end) as answer_format_rate,
       avg(num_turns) as mean_turns, avg(generated_tokens) as mean_generated_tokens,
       avg(case when status = 'ok' then 1.0 else 0.0 end) as ok_rate
from trajectories
"""
TOOL_PAIRS_SQL = """
select b.task_id, b.called as before, a.called as after
from (select task_id, max(case when num_tool_calls > 0 then 1 else 0 end) as called from before group by 1) b
join (select task_id, max(case when num_tool_calls > 0 then 1 else 0 end) as called from after group by 1) a
using (task_id)
"""


def exact_mcnemar(pairs: list[tuple[str, float, float]]) -> dict:
    """The tool-call rate's paired test: `arlctl eval`'s exact McNemar p over tasks called in one eval only."""
    only_before = sum(1 for _, b, a in pairs if b >= 1 and a < 1)
    only_after = sum(1 for _, b, a in pairs if a >= 1 and b < 1)
    return {"tasks": len(pairs), "both": sum(1 for _, b, a in pairs if a >= 1 and b >= 1),
            "only_before": only_before, "only_after": only_after, "p_value": mcnemar_p(only_before, only_after)}


def tool_mcnemar(before: Path, after: Path) -> dict:
    return exact_mcnemar(paired_rows(before, after, TOOL_PAIRS_SQL))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("--out", default="docs/learning")
    ap.add_argument("--name", default="agentic_tool")
    args = ap.parse_args()
    run, out = Path(args.run), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    found = sorted((d for d in (run / "eval").glob("*/rewarded") if d.is_dir()), key=lambda d: d.stat().st_mtime)
    names = [n for n in EVALS[:1] if (run / "eval" / n / "rewarded").exists()]
    names += [d.parent.name for d in found if d.parent.name not in names]
    evals = {n: rows(str(run / "eval" / n / "rewarded"), EVAL_SQL)[0] for n in names}
    paired = {}
    for b, a in (("before-sft", "after-sft"), ("after-sft", "after-rl"), ("before-sft", "after-rl")):
        if b in evals and a in evals:
            bd, ad = run / "eval" / b / "rewarded", run / "eval" / a / "rewarded"
            paired[f"{b} -> {a}"] = {"correct": mcnemar(bd, ad), "tool_call": tool_mcnemar(bd, ad)}
    sft_rows = rows(str(run / "sft" / "rewarded"), EVAL_SQL)[0] if (run / "sft" / "rewarded").exists() else None
    sft_steps = [{k: s.get(k) for k in ("step", "loss", "nll", "rows", "tokens", "grad_norm", "lr")}
                 for s in train_steps(run / "sft")]
    rl_iters = rows(str(run / "rewarded"), ITERATION_SQL) if (run / "rewarded").exists() else []
    rl_steps = [{k: s.get(k) for k in ("step", "loss", "nll", "rows", "reward_mean", "approx_kl", "grad_norm")}
                for s in train_steps(run)]
    commands = (run / "commands.log").read_text().splitlines() if (run / "commands.log").exists() else []
    report = {"run": str(run), "eval": evals, "paired": paired, "sft_data": sft_rows, "sft_steps": sft_steps,
              "rl_iterations": rl_iters, "rl_steps": rl_steps, "commands": commands}
    (out / f"{args.name}.json").write_text(json.dumps(report, indent=1, default=str) + "\n")

    notes = out / f"{args.name}.notes.md"
    lines = [f"# {args.name}: SmolLM2-135M learns to use the calculator", "",
             *([notes.read_text().rstrip(), ""] if notes.exists() else []),
             "Held-out tasks: greedy (temperature 0), one sample per task, `--env-opt tools=calculator`.", "",
             "| policy | tasks | correct (± s.e.) | tool-call rate | answer-format rate | turns | generated tokens |",
             "|---|---|---|---|---|---|---|"]
    for name, e in evals.items():
        lines.append(f"| {name} | {e['tasks']} | {e['correct_rate']:.3f} ± {stderr(e['correct_rate'], e['trajectories']):.3f} "
                     f"| {e['tool_call_rate']:.3f} | {e['answer_format_rate']:.3f} | {e['mean_turns']:.2f} "
                     f"| {e['mean_generated_tokens']:.1f} |")
    if paired:
        lines += ["", "Paired over the same tasks, exact two-sided McNemar (only-before / only-after = tasks "
                  "where exactly one of the two succeeds):", "",
                  "| comparison | measure | both | only before | only after | p |", "|---|---|---|---|---|---|"]
        for label, tests in paired.items():
            for measure, t in tests.items():
                lines.append(f"| {label} | {measure} | {t['both']} | {t['only_before']} | {t['only_after']} "
                             f"| {t['p_value']:.2g} |")
    if sft_rows:
        lines += ["", f"SFT data: {sft_rows['trajectories']} oracle:calculator trajectories, correct rate "
                  f"{sft_rows['correct_rate']:.3f}, tool-call rate {sft_rows['tool_call_rate']:.3f}.", "",
                  "| SFT step | rows | trained tokens | loss (mean NLL per token) | grad norm |", "|---|---|---|---|---|"]
        lines += [f"| {s['step']} | {s['rows']:.0f} | {s['tokens']:.0f} | {s['loss']:.4f} | {s['grad_norm']:.3f} |"
                  for s in sft_steps]
    if rl_iters:
        lines += ["", "GRPO training rollouts (temperature 1.0):", "",
                  "| iteration | policy version | trajectories | correct | tool-call rate | generated tokens |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['iteration']} | {r['policy_version']} | {r['trajectories']} | {r['correct_rate']:.3f} "
                  f"| {r['tool_call_rate']:.3f} | {r['mean_generated_tokens']:.1f} |" for r in rl_iters]
        lines += ["", f"{len(rl_steps)} GRPO optimizer steps (groups whose rewards were all equal carry no signal "
                  "and are dropped by filter)."]
    if commands:
        lines += ["", "## Commands (RUN/commands.log, in order)", "", "```", *commands, "```"]
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(evals)
    xs = range(len(names))
    for key, label, offset in (("correct_rate", "correct", -0.2), ("tool_call_rate", "tool-call rate", 0.2)):
        vals = [evals[n][key] for n in names]
        errs = [stderr(v, evals[n]["trajectories"]) for v, n in zip(vals, names, strict=True)]
        ax.bar([x + offset for x in xs], vals, width=0.4, yerr=errs, capsize=4, label=label)
    ax.set_xticks(list(xs), names)
    ax.set_ylim(0, 1.05)
    ax.set_title("held-out, greedy")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    if sft_steps:
        bx.plot([s["step"] for s in sft_steps], [s["loss"] for s in sft_steps], marker="o", label="SFT loss (NLL/token)")
    if rl_iters:
        bx2 = bx.twinx()
        bx2.plot([len(sft_steps) + r["iteration"] + 1 for r in rl_iters], [r["correct_rate"] for r in rl_iters],
                 marker="s", color="tab:green", label="GRPO rollouts: correct")
        bx2.set_ylim(0, 1.05)
        bx2.legend(fontsize=8, loc="center right")
    bx.set_xlabel("SFT step, then GRPO iteration")
    bx.set_title("training")
    bx.legend(fontsize=8, loc="upper right")
    bx.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / f"{args.name}.png", dpi=110)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
