"""The report's PNG plots, drawn with matplotlib's Agg canvas from the numbers `data.collect` returned.

Each plot function takes (numbers, series) and returns PNG bytes, or None when the run did not record what
it would draw (the page then says so). Figures are built with `matplotlib.figure.Figure` directly, not
pyplot: no global figure state, nothing that needs a display.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any

from matplotlib import rc_context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from arlctl.report.data import TRAIN_KEY

Numbers = dict[str, Any]
Series = dict[str, list[float]]


def _png(fig: Figure, tight: bool = True) -> bytes:
    FigureCanvasAgg(fig)
    if tight:  # tight_layout costs a draw per axis: the big grids place their axes by fixed margins instead
        fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return buf.getvalue()


def _figure(cols: int = 1, rows: int = 1, width: float = 5.0, height: float = 3.2) -> tuple[Figure, list]:
    fig = Figure(figsize=(width * cols, height * rows))
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(rows * cols)]
    for ax in axes:
        ax.grid(alpha=0.3)
    return fig, axes


def reward_by_version(n: Numbers, s: Series) -> bytes | None:
    rows = n["reward_by_version"]
    if not rows:
        return None
    fig, (ax,) = _figure(width=7)
    for env in sorted({r["env"] for r in rows}):
        mine = [r for r in rows if r["env"] == env]
        xs = [r["policy_version"] for r in mine]
        line = ax.plot(xs, [r["mean_reward"] for r in mine], marker="o", label=f"{env} mean reward")[0]
        ax.plot(xs, [r["correct_rate"] for r in mine], marker="s", linestyle="--", color=line.get_color(),
                label=f"{env} correct rate")
    ax.set(xlabel="policy version", ylabel="reward / rate", title="Reward and correct rate per policy version")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=8)
    return _png(fig)


def evals(n: Numbers, s: Series) -> bytes | None:
    rows = [e for e in (n["evals"] or []) if e["version"] is not None]
    if not rows:
        return None
    fig, (ax,) = _figure(width=7)
    for name in sorted({e["name"] for e in rows}):
        mine = sorted((e for e in rows if e["name"] == name), key=lambda e: e["version"])
        xs = [e["version"] for e in mine]
        if any(e["correct_rate"] is not None for e in mine):
            ax.errorbar(xs, [_nan(e["correct_rate"]) for e in mine], yerr=[e["correct_stderr"] or 0 for e in mine],
                        marker="o", capsize=3, label=f"{name} correct rate")
        if any(e["mean_reward"] is not None for e in mine):
            ax.plot(xs, [_nan(e["mean_reward"]) for e in mine], marker="s", linestyle="--", label=f"{name} mean reward")
    ax.set(xlabel="policy version", ylabel="held-out score", title="Evaluations (RUN/evals)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=8)
    return _png(fig)


def _train_grid(n: Numbers, columns: list[str], title: str) -> bytes | None:
    if not columns:
        return None
    steps = n["train"]["steps"]
    cols = min(4, len(columns))
    rows = math.ceil(len(columns) / cols)
    fig, axes = _figure(cols, rows, width=3.6, height=2.5)
    for ax, column in zip(axes, columns):
        points = [(st["step"], st[column]) for st in steps if st[column] is not None]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", linewidth=1)
        ax.set_title(column, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.locator_params(nbins=5)
    for ax in axes[len(columns):]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.subplots_adjust(left=0.05, right=0.98, bottom=0.06, top=1 - 0.35 / rows, wspace=0.25, hspace=0.45)
    return _png(fig, tight=False)


def trainer(n: Numbers, s: Series) -> bytes | None:
    if not n["train"]:
        return None
    return _train_grid(n, [c for c in n["train"]["columns"] if c in TRAIN_KEY], "Trainer metrics per step")


def trainer_other(n: Numbers, s: Series) -> bytes | None:
    if not n["train"]:
        return None
    other = [c for c in n["train"]["columns"] if c not in TRAIN_KEY and c not in n["train"]["constant"]]
    return _train_grid(n, other, "Other train-step columns")


def staleness(n: Numbers, s: Series) -> bytes | None:
    st = n["staleness"]
    if not st:
        return None
    fig, (ax,) = _figure()
    ax.bar([h["lag"] for h in st["hist"]], [h["rows"] for h in st["hist"]])
    ax.set(xlabel="lag (trainer step - 1 - policy version)", ylabel="trained rows", title="Staleness of trained rows")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return _png(fig)


def throughput(n: Numbers, s: Series) -> bytes | None:
    tp = n["throughput"]
    if not tp:
        return None
    fig, (left, right) = _figure(2)
    xs = list(range(1, len(tp["invocations"]) + 1))
    left.bar(xs, [_nan(r["trajectories_per_min"]) for r in tp["invocations"]])
    left.set(xlabel="rollout invocation", ylabel="trajectories / min", title="Trajectories per minute")
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    right.bar(xs, [_nan(r["generated_tokens_per_s"]) for r in tp["invocations"]], color="tab:green")
    right.set(xlabel="rollout invocation", ylabel="tokens / s", title="Generated tokens per second")
    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    return _png(fig)


TIME_PARTS = (("generation_s", "generation (in trajectories)"), ("environment_s", "environment (in trajectories)"),
              ("other_in_trajectory_s", "other (in trajectories)"), ("queue_wait_s", "queue (backpressure wait)"),
              ("rollout_stage_s", "rollout stage"), ("reward_stage_s", "reward stage"),
              ("train_stage_s", "train stage (optimizer steps)"))


def time_split(n: Numbers, s: Series) -> bytes | None:
    parts = [(label, n["time_split"][key]) for key, label in TIME_PARTS if n["time_split"][key] is not None]
    if not parts:
        return None
    fig, (ax,) = _figure(width=7)
    ax.barh([p[0] for p in parts][::-1], [p[1] for p in parts][::-1])
    ax.set(xlabel="seconds (summed)", title="Where the time went")
    return _png(fig)


def env_latency(n: Numbers, s: Series) -> bytes | None:
    values = [v for v in s.get("env_latency_s", []) if v is not None]
    if not n["env_latency"] or not values:
        return None
    fig, (ax,) = _figure()
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 20:  # spread over decades: log bins read better
        low, high = math.log10(min(positive)), math.log10(max(positive))
        bins = [10 ** (low + (high - low) * i / 30) for i in range(31)]
        ax.hist(positive, bins=bins)
        ax.set_xscale("log")
    else:
        ax.hist(values, bins=30)
    ax.set(xlabel="environment step latency (s)", ylabel="turns", title="Environment latency")
    return _png(fig)


def lengths(n: Numbers, s: Series) -> bytes | None:
    if not n["lengths"]:
        return None
    fig, (left, right) = _figure(2)
    left.hist(s.get("response_tokens", []), bins=30)
    left.set(xlabel="response tokens", ylabel="trajectories", title="Response length")
    hist = n["lengths"]["turns_hist"]
    right.bar([h["turns"] for h in hist], [h["rows"] for h in hist], color="tab:purple")
    right.set(xlabel="turns", ylabel="trajectories", title="Turns per trajectory")
    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    return _png(fig)


def tools(n: Numbers, s: Series) -> bytes | None:
    t = n["tools"]
    if not t or (not t["mix"] and not t["call_turns"]):
        return None
    fig, (left, right) = _figure(2)
    left.bar([m["name"] for m in t["mix"]], [m["calls"] for m in t["mix"]])
    left.set(ylabel="calls", title="Tool mix")
    left.tick_params(axis="x", labelrotation=30, labelsize=8)
    ok = t["call_turns"] - t["parse_failures"]
    right.bar(["parsed", "parse failure"], [ok, t["parse_failures"]], color=["tab:green", "tab:red"])
    right.set(ylabel="turns with tool calls", title="Tool-call parsing")
    return _png(fig)


def failures(n: Numbers, s: Series) -> bytes | None:
    statuses = n["failures"]["statuses"]
    if not statuses:
        return None
    fig, (ax,) = _figure()
    names = list(statuses)
    ax.bar(names, [statuses[k] for k in names],
           color=["tab:green" if k in ("ok", "truncated") else "tab:red" for k in names])
    ax.set(ylabel="trajectories", title="Row statuses")
    return _png(fig)


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value


# name -> (title, function); the page shows them in this order
PLOTS: dict[str, Callable[[Numbers, Series], bytes | None]] = {
    "reward_by_version": reward_by_version, "evals": evals, "trainer": trainer, "trainer_other": trainer_other,
    "staleness": staleness, "throughput": throughput, "time_split": time_split, "env_latency": env_latency,
    "lengths": lengths, "tools": tools, "failures": failures,
}


def draw_all(numbers: Numbers, series: Series) -> dict[str, bytes | None]:
    """Every plot's PNG (None where the run did not record it).

    Titles, legends and tick labels carry names from the run (metrics columns, envs, tools, evals): they are
    drawn as plain text, never parsed as mathtext or TeX (a column named `$\\frac{$` would fail the draw)."""
    with rc_context({"text.parse_math": False, "text.usetex": False}):
        return {name: fn(numbers, series) for name, fn in PLOTS.items()}
