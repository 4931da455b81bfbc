"""Stage settings are defined once: every config field is its command's option (same name, default, help),
each command's whole vocabulary is what `arlctl up` checks recipes against, and `config_command` hands the
command a built config. Also `train --dry-run` and `train`'s stop at a step boundary, on real shards."""

from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import dataclass

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.cli.options import config_command, option_defaults
from arlctl.settings import cli_fields, field_default, flag_of, setting
from arlctl.stages.configs import stage_config, stage_vocabulary
from arlctl.stages.jobs import STAGE_OPTIONS

STAGES = ("rollout", "reward", "filter", "train", "sync", "eval")
runner = CliRunner()


def command(stage: str):
    return typer.main.get_command(app).commands[stage]  # type: ignore[attr-defined]


@pytest.mark.parametrize("stage", STAGES)
def test_every_config_field_is_its_option_with_the_same_default(stage):
    options = option_defaults(command(stage))
    config = stage_config(stage)
    assert cli_fields(config), f"{stage}: no option derived from {config.__name__}"
    for f in cli_fields(config):
        assert flag_of(f) in options, f"{stage}: config field {f.name} has no option {flag_of(f)}"
        name, default = options[flag_of(f)]
        assert name == f.name, f"{stage}: {flag_of(f)} sets {name}, not the field {f.name}"
        expected = field_default(f)
        assert (list(default) if isinstance(default, tuple) else default) == expected, (
            f"{stage}: {flag_of(f)} defaults to {default!r}, the config field {f.name} to {expected!r}")


@pytest.mark.parametrize("stage", STAGES)
def test_every_config_field_says_what_it_means(stage):
    for f in dataclasses.fields(stage_config(stage)):
        assert f.metadata.get("help"), f"{stage}: {f.name} has no help text"
        assert "\n" not in f.metadata["help"], f"{stage}: {f.name}'s help is hard-wrapped"


@pytest.mark.parametrize("stage", STAGES)
def test_recipe_vocabulary_is_the_commands_own(stage):
    """`arlctl up` checks recipes against the configs and the job options: they must be the command's options."""
    cli = {opt[2:] for opt in option_defaults(command(stage)) if opt != "--help"}
    assert set(stage_vocabulary(stage)) == cli, (
        f"only in the CLI: {sorted(cli - set(stage_vocabulary(stage)))}; "
        f"only in the vocabulary: {sorted(set(stage_vocabulary(stage)) - cli)}")
    flags = {p.opts[0][2:] for p in command(stage).params if getattr(p, "is_flag", False)}
    assert {name for name, kind in stage_vocabulary(stage).items() if kind.type is bool} >= flags
    # Each stage's non-setting options are declared in one place: its job options (stages/jobs.py).
    assert set(STAGE_OPTIONS) == set(STAGES)


@pytest.mark.parametrize("stage", sorted(STAGE_OPTIONS))
def test_every_job_option_is_its_option_with_the_same_default_and_help(stage):
    options = option_defaults(command(stage))
    helps = {p.opts[0]: p.help for p in command(stage).params}
    for f in cli_fields(STAGE_OPTIONS[stage]):
        assert flag_of(f) in options, f"{stage}: job field {f.name} has no option {flag_of(f)}"
        name, default = options[flag_of(f)]
        assert (name, default) == (f.name, field_default(f)), f"{stage}: {flag_of(f)}"
        assert helps[flag_of(f)] == f.metadata["help"] and f.metadata["help"], f"{stage}: {flag_of(f)}'s help"


def test_config_command_builds_the_config_from_its_options():
    @dataclass
    class Demo:
        rate: float = setting(0.5, "A rate.")
        names: list[str] = setting(help="Names (repeatable).", factory=lambda: ["a"])
        fast: bool = setting(False, "Go fast.", flag="--fast/--slow")
        hidden: int = setting(7, "Not an option.", cli=False)

    seen: list = []
    demo = typer.Typer()

    @demo.command()
    @config_command(Demo)
    def go(cfg: Demo, label: str = typer.Option("x", "--label")) -> None:
        seen.append((cfg, label))

    assert runner.invoke(demo, []).exit_code == 0
    assert seen[-1] == (Demo(), "x")
    result = runner.invoke(demo, ["--rate", "2", "--names", "b", "--names", "c", "--fast", "--label", "y"])
    assert result.exit_code == 0, result.output
    assert seen[-1] == (Demo(rate=2.0, names=["b", "c"], fast=True), "y")
    assert runner.invoke(demo, ["--hidden", "3"]).exit_code == 2  # cli=False: no option


def test_a_field_that_is_also_an_own_option_is_refused():
    @dataclass
    class Demo:
        rate: float = setting(0.5, "A rate.")

    with pytest.raises(TypeError, match="rate"):
        @config_command(Demo)
        def go(cfg: Demo, rate: float = 1.0) -> None: ...


def all_commands(group=None, prefix=""):
    """(name, click command) of every registered command, subcommands included."""
    group = group or typer.main.get_command(app)
    for name, cmd in group.commands.items():
        yield prefix + name, cmd
        if hasattr(cmd, "commands"):
            yield from all_commands(cmd, prefix + name + " ")


def test_every_command_help_is_not_hard_wrapped():
    """Rich re-wraps help to the terminal: a hard line break inside prose breaks it mid-sentence."""
    names = []
    for name, cmd in all_commands():
        names.append(name)
        for paragraph in (cmd.help or "").split("\n\n"):
            lines = [line for line in paragraph.strip("\n").split("\n") if line.strip()]
            if len(lines) > 1:  # only a block of examples may span lines, each an indented command
                assert all(line.startswith("  ") for line in lines), (name, paragraph[:80])
    assert {"rollout", "model pull", "status", "doctor"} <= set(names)


def test_stage_help_is_not_hard_wrapped():
    for stage in STAGES:
        cmd = command(stage)
        for paragraph in cmd.help.split("\n\n"):
            lines = paragraph.strip("\n").split("\n")
            if len(lines) > 1:  # examples: every line of a multi-line paragraph is an indented command
                assert all(line.startswith("  ") for line in lines), (stage, paragraph[:80])
        for p in cmd.params:
            assert "\n" not in (p.help or ""), (stage, p.name)


# ------------------------------------------------------------------------------------ train on real shards
def test_train_dry_run_names_the_batches_and_writes_nothing(tmp_path):
    from tests.cli.test_watch_stages import make_batches

    batches = make_batches(tmp_path, 0, 2)
    ckpts = tmp_path / "checkpoints"
    result = runner.invoke(app, ["train", "--in", batches, "--out", str(ckpts), "--policy", "tiny", "--dry-run",
                                 "--max-steps", "1", "--lr", "3e-5", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["dry_run"] is True and summary["steps"] == 0 and len(summary["batches"]) == 1
    assert summary["config"]["lr"] == 3e-5 and summary["config"]["max_steps"] == 1
    assert not ckpts.exists()


@pytest.mark.slow
def test_train_stops_at_a_step_boundary_with_the_step_saved(tmp_path):
    from arlctl.models import tiny_model_dir
    from arlctl.rl.config import TrainConfig
    from arlctl.stages import train as stage
    from arlctl.stages.results import TrainIO
    from tests.cli.test_watch_stages import make_batches

    batches = make_batches(tmp_path, 0, 3)
    io = TrainIO(in_url=batches, out=str(tmp_path / "checkpoints"), policy=str(tiny_model_dir()))
    stop = threading.Event()
    result = stage.run(TrainConfig(lr=1e-4, save_every=100), io, stop, on_step=lambda step, m: stop.set())
    assert result.steps == 1 and result.step == 1  # the signal came during step 1: steps 2 and 3 never started
    state = json.loads((tmp_path / "checkpoints" / "step-000001" / "state.json").read_text())
    assert len(state["consumed_batches"]) == 1
    again = stage.run(TrainConfig(lr=1e-4), io, threading.Event())
    assert again.steps == 2 and again.resumed_from == 1
    assert again.packing == "packed"  # --pack auto on the tiny Llama
    assert set(again.to_json()) == {"steps", "step", "batches", "checkpoint", "resumed_from", "skipped_nonfinite",
                                    "rows_dropped_invalid", "bad_value_events", "save_s", "loss_mean",
                                    "reward_mean", "tokens_per_s", "rows_dropped_stale", "rows_decayed_stale", "world_size",
                                    "skipped_stale", "mean_lag", "max_lag", "packing"}
