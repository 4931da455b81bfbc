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

HELP = """Start every stage of a recipe as a daemon (`arlctl STAGE --watch ...`), each in its own process group with its log in RUN/logs/<stage>-<i>.log; restart a crashed one with exponential backoff; stop them all cleanly on Ctrl-C or SIGTERM (SIGTERM, a grace period, then SIGKILL). A live dashboard shows, per stage, its state, pids, restarts, the shards waiting at its input, throughput and the last error line of its log, with the policy version, trainer step, staleness and reward trend.

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
        if no_dashboard:
            result = _plain(recipe, for_s, until_drained)
        else:
            result = _live(recipe, for_s, until_drained)
        restarts = sum(result.restarts.values())
        console.print(f"arlctl up: stopped ({result.stopped_by}) after {result.seconds:.0f}s; "
                      f"{restarts} restart{'s' * (restarts != 1)}; policy versions seen "
                      f"{result.policy_history or '-'}; logs in {recipe.logs}", soft_wrap=True)


def _stamp() -> str:
    return time.strftime("%H:%M:%S")


def _plain(recipe: Any, for_s: float | None, until_drained: bool) -> Any:
    from arlctl import supervisor as sv

    last: dict[str, Any] = {}

    def on_state(sup: sv.Supervisor, state: dict[str, Any]) -> None:
        line = {"policy": state.get("policy_version"), "step": state.get("trainer_step"),
                "backlog": state["backlog"]["total"], "stages": sup.stage_states()}
        if line != last.get("line"):
            last["line"] = line
            console.print(f"{_stamp()} {json.dumps(line)}", soft_wrap=True, highlight=False)

    sup = sv.Supervisor(recipe, log=lambda msg: console.print(f"{_stamp()} {msg}", soft_wrap=True, highlight=False))
    return sv.run(sup, for_s=for_s, until_drained=until_drained, on_state=on_state)


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
        for column in ("process", "state", "pid", "restarts", "waiting", "throughput", "last error"):
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
                          str(child.restarts), waiting, self.rate(child.stage), self.sup.last_error(child) or "")
        parts: list[Any] = [table]
        if state is not None:
            parts.append(_render_state(state, self.sup.stage_states()))
        parts += [Text(line, style="dim") for line in self.notes]
        return Group(*parts)


def _render_state(state: dict[str, Any], stage_status: dict[str, str]) -> Any:
    from arlctl.runstate import render

    return render(state, stage_status)
