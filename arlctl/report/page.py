"""The report page: one self-contained HTML file (plots inlined as data: URIs, no script, no request).

Every value from the run is escaped (`html.escape`) before it reaches the page; the numbers are also
embedded as JSON in `<script type="application/json" id="report-data">` (a data block, never executed)
with `<`, `>` and `&` written as \\u escapes so no shard text can close the element. A Content-Security-Policy
forbids every script and every request except the inlined images, so even a missed escape could not run.
Each number shown in a table cell carries `data-key` (its path in the JSON) so a test can check that the
page shows exactly what `--json` prints.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from html import escape
from typing import Any

from arlctl.report.data import TRAIN_KEY
from arlctl.report.plots import TIME_PARTS

Pngs = dict[str, bytes | None]

NOT_RECORDED = "not recorded in this run"
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #1d1d1f; max-width: 1500px; }
h1 { margin-bottom: 0; } h2 { margin-top: 32px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.meta { color: #666; font-size: 13px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.missing { color: #a15c00; font-style: italic; }
img.plot { max-width: 100%; border: 1px solid #eee; margin: 8px 0; }
pre.traj { font-size: 12px; line-height: 1.25; background: #fff; border: 1px solid #ddd; padding: 8px;
           overflow-x: auto; white-space: pre; }
.grid { display: flex; flex-wrap: wrap; gap: 24px; }
"""


def fmt(value: Any) -> str:
    """How a number is shown: integers as they are, floats to 4 significant digits; None is not recorded."""
    if value is None:
        return NOT_RECORDED
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return "NaN"
        return f"{value:.4g}"
    return str(value)


def json_block(data: dict[str, Any]) -> str:
    """The numbers as a JSON data block that no string inside can break out of."""
    text = json.dumps(data, sort_keys=True, default=str)
    for char, code in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                       ("\u2029", "\\u2029")):
        text = text.replace(char, code)
    return f'<script type="application/json" id="report-data">{text}</script>'


Key = tuple  # a path into the JSON numbers: ("failures", "statuses", "ok"), ("train", "steps", 3, "loss")


def _path(key: Key | str) -> Key:
    return tuple(key.split(".")) if isinstance(key, str) else key


def _cell(value: Any, key: Key | str) -> str:
    """A table cell of a number, with data-key = its path in the JSON (a JSON list, so any name is safe)."""
    attr = escape(json.dumps(list(_path(key))))
    if value is None:
        return f'<td class="missing" data-key="{attr}">{NOT_RECORDED}</td>'
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f'<td class="num" data-key="{attr}">{escape(fmt(value))}</td>'
    return f"<td>{escape(str(value))}</td>"


def kv_table(pairs: list[tuple[str, Any, Key | str]]) -> str:
    """(label, value, json key) rows."""
    rows = "".join(f"<tr><th>{escape(label)}</th>{_cell(value, key)}</tr>" for label, value, key in pairs)
    return f"<table>{rows}</table>"


def rows_table(rows: list[dict[str, Any]], columns: list[str], key: str, label_columns: tuple[str, ...] = (),
               paths: dict[str, Key] | None = None) -> str:
    """A table of dict rows; number cells carry the path (key, row index, column), or (key, index, *paths[c])."""
    paths = paths or {}
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = []
    for i, row in enumerate(rows):
        cells = "".join(f"<td>{escape(fmt(row.get(c)))}</td>" if c in label_columns
                        else _cell(_get(row, paths.get(c, (c,))), (*_path(key), i, *paths.get(c, (c,))))
                        for c in columns)
        body.append(f"<tr>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _get(row: dict[str, Any], path: Key) -> Any:
    for part in path:
        row = row.get(part) if isinstance(row, dict) else None
    return row


def counts_table(counts: dict[str, int] | None, key: str, label: str) -> str:
    if counts is None:
        return missing(label)
    if not counts:
        return f"<p>{escape(label)}: none</p>"
    rows = "".join(f"<tr><td>{escape(str(name))}</td>{_cell(n, (*_path(key), name))}</tr>" for name, n in counts.items())
    return f"<table><tr><th>{escape(label)}</th><th>rows</th></tr>{rows}</table>"


def missing(what: str = "") -> str:
    return f'<p class="missing">{escape(what + ": " if what else "")}{NOT_RECORDED}</p>'


def plot(name: str, png: bytes | None, title: str) -> str:
    if png is None:
        return f'<div id="plot-{name}" data-plot="missing">{missing(title)}</div>'
    data = base64.b64encode(png).decode()
    return (f'<img class="plot" id="plot-{name}" data-plot="{name}" alt="{escape(title)}" '
            f'src="data:image/png;base64,{data}">')


# ----------------------------------------------------------------------------------------------- sections


def _overview(n: dict[str, Any], pngs: Pngs) -> str:
    o = n["overview"]
    return kv_table([
        ("trajectories in rollouts/", o["rollout_rows"], "overview.rollout_rows"),
        ("rows in rewarded/", o["rewarded_rows"], "overview.rewarded_rows"),
        ("rows in batches/", o["batch_rows"], "overview.batch_rows"),
        ("optimizer steps (train metrics)", o["train_steps"], "overview.train_steps"),
        ("policy versions in rollouts", o["policy_versions"], "overview.policy_versions"),
        ("run minutes (first trajectory start to last finish)", o["run_minutes"], "overview.run_minutes"),
        ("trajectories per run minute", o["trajectories_per_run_minute"], "overview.trajectories_per_run_minute")])


def _reward(n: dict[str, Any], pngs: Pngs) -> str:
    rows = n["reward_by_version"]
    table = rows_table(rows, ["env", "policy_version", "rows", "rewarded", "mean_reward", "correct_rate"],
                       "reward_by_version", ("env",)) if rows else missing("rewarded rows")
    return plot("reward_by_version", pngs["reward_by_version"], "reward") + table


def _evals(n: dict[str, Any], pngs: Pngs) -> str:
    evals = n["evals"]
    if not evals:
        return plot("evals", pngs["evals"], "evaluations") + missing("RUN/evals")
    ks = sorted({k for e in evals for k in e["pass_at_k"]}, key=lambda k: (len(k), k))
    columns = ["name", "version", "rows", "graded", "null_reward", "correct_rate", "correct_stderr", "mean_reward",
               *[f"pass@{k}" for k in ks], "shard_rows", "shard_mean_reward"]
    return plot("evals", pngs["evals"], "evaluations") + rows_table(
        evals, columns, "evals", ("name",), paths={f"pass@{k}": ("pass_at_k", k) for k in ks})


def _trainer(n: dict[str, Any], pngs: Pngs) -> str:
    tr = n["train"]
    body = plot("trainer", pngs["trainer"], "trainer metrics")
    if not tr:
        return body
    body += plot("trainer_other", pngs["trainer_other"], "other train-step columns")
    body += kv_table([(f"{c} (last recorded)", tr["last"][c], ("train", "last", c))
                      for c in tr["columns"] if c in TRAIN_KEY])
    if tr["constant"]:
        body += '<p class="meta">unchanged over every step:</p>' + kv_table(
            [(c, value, ("train", "constant", c)) for c, value in tr["constant"].items()])
    if tr["not_recorded"]:
        body += f'<p class="missing">{escape(", ".join(tr["not_recorded"]))}: {NOT_RECORDED}</p>'
    return body


def _staleness(n: dict[str, Any], pngs: Pngs) -> str:
    st = n["staleness"]
    body = plot("staleness", pngs["staleness"], "staleness")
    if not st:
        return body
    return body + kv_table([("trained rows", st["trained_rows"], "staleness.trained_rows"),
                            ("mean lag", st["mean_lag"], "staleness.mean_lag"),
                            ("max lag", st["max_lag"], "staleness.max_lag")]) + rows_table(
        st["hist"], ["lag", "rows"], "staleness.hist")


def _throughput(n: dict[str, Any], pngs: Pngs) -> str:
    tp = n["throughput"]
    body = plot("throughput", pngs["throughput"], "throughput")
    if not tp:
        return body
    return body + kv_table([
        ("trajectories / min (all rollout invocations)", tp["trajectories_per_min"], "throughput.trajectories_per_min"),
        ("generated tokens / s", tp["generated_tokens_per_s"], "throughput.generated_tokens_per_s"),
        ("rollout seconds", tp["seconds"], "throughput.seconds")]) + rows_table(
        tp["invocations"], ["file", "trajectories", "seconds", "trajectories_per_min", "generated_tokens_per_s"],
        "throughput.invocations", ("file",))


def _time_split(n: dict[str, Any], pngs: Pngs) -> str:
    return (plot("time_split", pngs["time_split"], "time split")
            + kv_table([(label, n["time_split"][key], f"time_split.{key}") for key, label in TIME_PARTS])
            + f'<p class="meta">filter stage: {NOT_RECORDED} (filter writes no timing)</p>')


def _env_latency(n: dict[str, Any], pngs: Pngs) -> str:
    el = n["env_latency"]
    body = plot("env_latency", pngs["env_latency"], "environment latency")
    keys = ("turns", "mean_s", "p50_s", "p90_s", "p99_s", "max_s")
    return body + (kv_table([(k, el[k], f"env_latency.{k}") for k in keys]) if el else "")


def _inference(n: dict[str, Any], pngs: Pngs) -> str:
    inf = n["inference"]
    return kv_table([
        ("prefix-cache hit rate", inf["prefix_cache_hit_rate"], "inference.prefix_cache_hit_rate"),
        ("inference idle ratio (seconds-weighted)", inf["idle_ratio"], "inference.idle_ratio")]) + (
        f'<p class="meta">backends: {escape(", ".join(inf["backends"] or []) or NOT_RECORDED)}</p>')


def _lengths(n: dict[str, Any], pngs: Pngs) -> str:
    ln = n["lengths"]
    body = plot("lengths", pngs["lengths"], "lengths")
    if not ln:
        return body
    keys = ("trajectories", "mean_response_tokens", "p50_response_tokens", "p90_response_tokens",
            "max_response_tokens", "mean_generated_tokens", "mean_turns")
    return body + kv_table([(k, ln[k], f"lengths.{k}") for k in keys]) + rows_table(
        ln["turns_hist"], ["turns", "rows"], "lengths.turns_hist")


def _tools(n: dict[str, Any], pngs: Pngs) -> str:
    tl = n["tools"]
    body = plot("tools", pngs["tools"], "tools")
    if not tl:
        return body
    return body + kv_table([
        ("turns", tl["turns"], "tools.turns"), ("turns with tool calls", tl["call_turns"], "tools.call_turns"),
        ("tool-call parse failures", tl["parse_failures"], "tools.parse_failures"),
        ("parse-failure rate", tl["parse_failure_rate"], "tools.parse_failure_rate")]) + rows_table(
        tl["mix"], ["name", "calls"], "tools.mix", ("name",))


def _failures(n: dict[str, Any], pngs: Pngs) -> str:
    f = n["failures"]
    body = plot("failures", pngs["failures"], "row statuses")
    body += "<div class=\"grid\"><div>" + counts_table(f["statuses"], "failures.statuses", "status") + "</div>"
    body += "<div>" + counts_table(f["finish_reasons"], "failures.finish_reasons", "finish reason") + "</div></div>"
    infra = f["infra_failures"]
    body += kv_table([
        ("env_error rows (infrastructure)", infra and infra["env_error_rows"], "failures.infra_failures.env_error_rows"),
        ("infra: error causes in metrics", infra and infra["infra_causes"], "failures.infra_failures.infra_causes"),
        ("rows with a null reward", f["null_rewards"], "failures.null_rewards")])
    if f["reward_errors"]:
        body += counts_table(f["reward_errors"], "failures.reward_errors", "null reward cause")
    for stage, causes in f["error_causes"].items():
        body += counts_table(causes, f"failures.error_causes.{stage}", f"{stage} error cause")
    return body


SECTIONS: list[tuple[str, Callable[[dict[str, Any], Pngs], str]]] = [
    ("Overview", _overview), ("Reward and correct rate per policy version", _reward), ("Evaluations", _evals),
    ("Trainer", _trainer), ("Staleness", _staleness), ("Throughput", _throughput), ("Time split", _time_split),
    ("Environment latency", _env_latency), ("Inference backend", _inference),
    ("Response length and turns", _lengths), ("Tools", _tools), ("Failures", _failures),
]


def render_page(n: dict[str, Any], pngs: Pngs, samples_html: list[str], rendered_at: str,
                refresh_s: float | None = None) -> str:
    """The whole page. `refresh_s` (with --watch) makes an open browser tab reload itself."""
    every = max(1, round(refresh_s)) if refresh_s else None  # browsers take whole seconds
    refresh = f'<meta http-equiv="refresh" content="{every}">' if every else ""
    parts = [(title, section(n, pngs)) for title, section in SECTIONS]
    parts.append(("Sample trajectories", "".join(samples_html) or missing("trajectories")))
    body = "".join(f"<section><h2>{escape(title)}</h2>{html}</section>" for title, html in parts)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">{refresh}'
            f"<title>arlctl report: {escape(str(n['run']))}</title><style>{STYLE}</style></head><body>"
            f"<h1>arlctl report</h1><p class=\"meta\">run {escape(str(n['run']))} · rendered {escape(rendered_at)}"
            f"{f' · refreshes every {every} s' if every else ''}</p>"
            f"{body}{json_block(n)}</body></html>")
