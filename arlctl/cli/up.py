"""`arlctl up RECIPE.yaml`: run the stage daemons of a recipe under one supervisor, with a live dashboard."""

from __future__ import annotations

import json
import math
import shlex
import time
from typing import Any

import typer

from arlctl.cli.common import console, handle_errors
from arlctl.errors import UsageError

HELP = """Start every stage of a recipe as a daemon (`arlctl STAGE --watch ...`), each in its own process group with its log in RUN/logs/<stage>-<i>.log; restart a crashed one with exponential backoff; stop them all cleanly on Ctrl-C or SIGTERM (SIGTERM, a grace period, then SIGKILL). On a terminal a live dashboard shows, per stage, its state, pids, restarts, the shards waiting at its input, throughput, why it is idle (waiting on input, backpressure, staleness, or what the filter dropped) and the last error line of its log, with the lag at train time, policy version, trainer step, staleness and reward trend. Piped or redirected (or with --no-dashboard) it writes timestamped plain lines instead, one per change, as they happen.

  arlctl up recipes/math_daemons.yaml

  arlctl up recipes/math_daemons.yaml --no-dashboard --until-drained    # finish the epochs, drain, exit

  arlctl up recipe.yaml --for 600 --run runs/trial2                     # override the run directory
"""


def register(app: typer.Typer) -> None:
    @app.command("up", help=HELP)
    @handle_errors
    def up_cmd(
        recipe_path: str = typer.Argument(..., metavar="RECIPE.yaml", help="The recipe: run dir and stages."),
        run_dir: str = typer.Option(None, "--run", help="Override the recipe's run directory."),
        for_s: float = typer.Option(None, "--for", help="Stop everything after this many seconds."),
        until_drained: bool = typer.Option(False, "--until-drained",
                                           help="Exit once rollout is done and nothing waits at any stage."),
        no_dashboard: bool = typer.Option(False, "--no-dashboard", help="Plain log lines instead of the live view."),
        check: bool = typer.Option(False, "--check", help="Validate the recipe, print the commands, start nothing."),
    ) -> None:
        from arlctl import supervisor as sv

        if for_s is not None and not (math.isfinite(for_s) and 0 < for_s <= sv.MAX_SECONDS):
            raise UsageError(f"--for must be a finite number of seconds in (0, {sv.MAX_SECONDS:g}], not {for_s}")
        recipe = sv.load_recipe(recipe_path, run=run_dir)
        if check:
            for spec in recipe.stages:
                for i in range(spec.workers):
                    console.print(f"{spec.name}-{i}: {shlex.join(sv.stage_argv(recipe, spec, i))}", soft_wrap=True, highlight=False)
            return
        if no_dashboard or not console.is_terminal:  # piped or in a file: lines, never a redrawn frame
            result = _plain(recipe, for_s, until_drained)
        else:
            result = _live(recipe, for_s, until_drained)
        restarts = sum(result.restarts.values())
        console.print(f"arlctl up: stopped ({result.stopped_by}) after {result.seconds:.0f}s; "
                      f"{restarts} restart{'s' * (restarts != 1)}; policy versions seen "
                      f"{result.policy_history or '-'}; logs in {recipe.logs}", soft_wrap=True)


def _stamp() -> str:
    return time.strftime("%H:%M:%S")


def _say(line: str) -> None:
    """One timestamped plain line, written out now (a file reader sees it while the run goes on)."""
    console.print(f"{_stamp()} {line}", soft_wrap=True, highlight=False, markup=False)
    console.file.flush()


def _plain(recipe: Any, for_s: float | None, until_drained: bool) -> Any:
    from arlctl import supervisor as sv

    last: dict[str, Any] = {}

    def on_state(sup: sv.Supervisor, state: dict[str, Any]) -> None:
        lag = state.get("train_lag") or {}
        line = {"policy": state.get("policy_version"), "step": state.get("trainer_step"),
                "backlog": state["backlog"]["total"], "stages": sup.stage_states(),
                "lag_at_train": {"max": lag.get("max"), "mean": _round(lag.get("mean")),
                                 "dropped_stale": lag.get("rows_dropped_stale", 0)},
                "idle": {k: v for k, v in idle_reasons(sup.recipe, state, sup.stage_states()).items() if v}}
        if line != last.get("line"):
            last["line"] = line
            _say(json.dumps(line))

    sup = sv.Supervisor(recipe, log=_say)
    return sv.run(sup, for_s=for_s, until_drained=until_drained, on_state=on_state)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def idle_reasons(recipe: Any, state: dict[str, Any], stage_status: dict[str, str]) -> dict[str, str]:
    """Per stage of the recipe, why it is idle now ("" when it has work): waiting on input, rollout's
    backpressure or staleness bound (the gate's own numbers, from the recipe's options), and what the
    filter's last pass dropped when it kept nothing (e.g. "all 8 groups zero_variance")."""
    from arlctl.stages.rollout_daemon import projected_lag

    filtered = _filter_verdict(state.get("filter_last"))
    out: dict[str, str] = {}
    for spec in recipe.stages:
        info = state["stages"].get(spec.name, {})
        reason = ""
        if stage_status.get(spec.name, "").split(" ")[0] in ("done", "failed", "stopped"):
            pass  # not idle: finished, or the state column says why not
        elif spec.name == "rollout":
            reason = _rollout_idle(spec.args, state, projected_lag)
        elif spec.name in ("reward", "filter", "train", "sync") and not info.get("waiting_shards"):
            reason = "waiting on input"
            if spec.name in ("filter", "train") and filtered:
                reason += f" (filter's last pass: {filtered})"
        out[spec.name] = reason
    return out


def _rollout_idle(args: dict[str, Any], state: dict[str, Any], projected_lag: Any) -> str:
    from arlctl.stages.agent_loop import RolloutConfig  # no torch

    backlog = state["backlog"]
    group = int(args.get("group-size", RolloutConfig().group_size))
    pending = args.get("max-pending")
    if pending is not None and backlog["total"] + group > int(pending):
        return f"backpressure: backlog {backlog['total']} + group {group} > max-pending {pending}"
    bound = args.get("max-staleness")
    lag, queued = projected_lag(backlog, state.get("policy_version") or 0)
    if bound is not None and lag > int(bound):
        return f"staleness: lag at train time would be {lag} > {bound} ({queued} steps queued for the trainer)"
    return ""


def _filter_verdict(last: dict[str, Any] | None) -> str:
    """The filter's last pass in words when it kept no group, else ""."""
    if not last or last["kept"] or not last["groups"]:
        return ""
    dropped = last["dropped"]
    if len(dropped) == 1:
        return f"all {last['groups']} groups {next(iter(dropped))}"
    return f"no group of {last['groups']} kept: " + ", ".join(f"{rule} {n}" for rule, n in dropped.items())


def _live(recipe: Any, for_s: float | None, until_drained: bool) -> Any:
    from rich.live import Live

    from arlctl import supervisor as sv

    sup = sv.Supervisor(recipe)
    view = Dashboard(sup)
    with Live(view.render(None), console=console, refresh_per_second=2, transient=False) as live:
        sup.log = view.note

        def on_tick(s: sv.Supervisor, elapsed: float) -> None:
            if elapsed - view.drawn_at >= 0.5:  # the loop ticks every 0.2 s; a redraw reads every log tail
                view.drawn_at = elapsed
                live.update(view.render(view.state))

        def on_state(s: sv.Supervisor, state: dict[str, Any]) -> None:
            view.update(state)

        return sv.run(sup, for_s=for_s, until_drained=until_drained, on_tick=on_tick, on_state=on_state)


class Dashboard:
    """Per-child table (state, pid, restarts, waiting, throughput, last error) above the run state panel."""

    OUTPUT_KEY = {"rollout": "output_rows", "reward": "output_rows", "filter": "output_rows", "train": "step",
                  "sync": "version"}
    UNIT = {"rollout": "traj", "reward": "rows", "filter": "rows", "train": "steps", "sync": "versions"}

    def __init__(self, sup: Any):
        self.sup = sup
        self.state: dict[str, Any] | None = None
        self.first: tuple[float, dict[str, float]] | None = None
        self.notes: list[str] = []
        self.drawn_at = -1.0

    def note(self, line: str) -> None:
        self.notes = [*self.notes[-5:], f"{_stamp()} {line}"]

    def update(self, state: dict[str, Any]) -> None:
        self.state = state
        if self.first is None:
            self.first = (state["time"], self._outputs(state))

    def _outputs(self, state: dict[str, Any]) -> dict[str, float]:
        return {stage: float(info.get(self.OUTPUT_KEY[stage]) or 0) for stage, info in state["stages"].items()}

    def rate(self, stage: str) -> str:
        if self.state is None or self.first is None or stage not in self.OUTPUT_KEY:
            return "-"
        minutes = (self.state["time"] - self.first[0]) / 60
        if minutes <= 0:
            return "-"
        done = self._outputs(self.state)[stage] - self.first[1][stage]
        return f"{done / minutes:.1f} {self.UNIT[stage]}/min"

    def render(self, state: dict[str, Any] | None) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        table = Table(title="arlctl up", title_justify="left", header_style="bold", expand=False)
        idle = idle_reasons(self.sup.recipe, state, self.sup.stage_states()) if state is not None else {}
        for column in ("process", "state", "pid", "restarts", "waiting", "throughput", "idle because", "last error"):
            if column == "last error":  # one line per process: the newest error, cut to fit
                table.add_column(column, overflow="ellipsis", no_wrap=True, max_width=60)
            else:
                table.add_column(column, no_wrap=True)
        for child in self.sup.children:
            waiting = "-"
            if state is not None:
                info = state["stages"].get(child.stage, {})
                if "waiting_shards" in info:
                    waiting = str(info["waiting_shards"])
            style = {"running": "green", "backoff": "red", "done": "blue", "stopped": "dim"}.get(child.state, "")
            retry = f" ({max(0.0, child.next_start_at - time.time()):.0f}s)" if child.state == "backoff" else ""
            table.add_row(child.name, Text(child.state + retry, style=style), str(child.pid or "-"),
                          str(child.restarts), waiting, self.rate(child.stage), Text(idle.get(child.stage, "")),
                          Text(self.sup.last_error(child) or ""))
        parts: list[Any] = [table]
        if state is not None:
            lag = state.get("train_lag") or {}
            if lag.get("steps"):
                bound = next((s.args.get("max-lag") for s in self.sup.recipe.stages if s.name == "train"), None)
                parts.append(Text(f"lag at train time: max {lag['max']} mean {_round(lag['mean'])} over "
                                  f"{lag['rows']} rows in {lag['steps']} steps; {lag['rows_dropped_stale']} rows "
                                  f"dropped as stale" + (f" (bound {bound})" if bound is not None else "")))
            parts.append(_render_state(state, self.sup.stage_states()))
        parts += [Text(line, style="dim") for line in self.notes]
        return Group(*parts)


def _render_state(state: dict[str, Any], stage_status: dict[str, str]) -> Any:
    from arlctl.runstate import render

    return render(state, stage_status)
