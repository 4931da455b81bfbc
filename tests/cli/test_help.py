"""`--help` piped (no TTY, a narrow width): every example line whole, flags shown as flags, the big commands'
options in panels; and -q/--quiet on every stage command. All through the real app, in process."""

from __future__ import annotations

import re

import pytest
import typer.main
from typer.testing import CliRunner

from arlctl.cli.help import split_examples
from arlctl.cli.main import app
from arlctl.cli.options import PANEL_OF, PANELS

STAGES = ("rollout", "reward", "filter", "train", "sync", "eval")
WIDTH = 60
runner = CliRunner()


def commands():
    """(path, click command) of every command and group the app registers."""

    def walk(command, path):
        yield path, command
        for name, sub in (getattr(command, "commands", None) or {}).items():
            yield from walk(sub, (*path, name))

    return list(walk(typer.main.get_command(app), ()))


def piped_help(path: tuple[str, ...]) -> str:
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH), "TERMINAL_WIDTH": None})
    assert result.exit_code == 0, (path, result.output)
    return result.output


def panels(help_text: str) -> dict[str, list[str]]:
    """{panel title: the long options listed in it} of a rendered help."""
    out: dict[str, list[str]] = {}
    title = None
    for line in help_text.splitlines():
        header = re.match(r"╭─ (.+?) ─", line)
        if header:
            title = header.group(1)
            out[title] = []
        elif title and line.startswith("│"):
            option = re.match(r"│ (--[a-z][a-z0-9-]*)", line)
            if option:
                out[title].append(option.group(1))
        elif line.startswith("╰"):
            title = None
    return out


@pytest.mark.parametrize("path", [path for path, _ in commands()], ids=lambda p: " ".join(p) or "arlctl")
def test_piped_help_keeps_every_example_line_whole(path):
    command = dict(commands())[path]
    _, examples = split_examples(command.help or "")
    shown = {line.strip() for line in piped_help(path).splitlines()}
    for paragraph in examples:
        for line in paragraph.splitlines():
            assert line.strip() in shown, f"`arlctl {' '.join(path)} --help` cut the example line {line.strip()!r}"


def test_the_width_is_narrow_enough_to_cut_examples():
    # Without the verbatim rendering these lines are wrapped: the test above is only worth something if so.
    longest = max(len(line.strip()) for _, command in commands()
                  for paragraph in split_examples(command.help or "")[1] for line in paragraph.splitlines())
    assert longest > WIDTH
    assert any(len(line) > WIDTH for line in piped_help(("rollout",)).splitlines())


def test_every_command_with_examples_shows_them():
    with_examples = [path for path, command in commands() if split_examples(command.help or "")[1]]
    assert {(stage,) for stage in STAGES} <= set(with_examples)
    assert () in with_examples  # the root help's examples too
    assert "Examples:" in piped_help(("rollout",))


@pytest.mark.parametrize("path", [path for path, _ in commands()], ids=lambda p: " ".join(p) or "arlctl")
def test_flags_show_no_value_type(path):
    text = piped_help(path)
    assert "<bool>" not in text, f"`arlctl {' '.join(path)} --help` shows a flag as taking a value"


def test_json_is_shown_as_a_flag():
    text = piped_help(("reward",))
    json_line = next(line for line in text.splitlines() if "--json" in line)
    assert re.search(r"--json\s+One JSON summary", json_line), json_line
    dry_run = next(line for line in text.splitlines() if "--dry-run" in line)
    assert "<" not in dry_run, dry_run


def test_rollout_options_come_in_panels():
    shown = panels(piped_help(("rollout",)))
    assert {"Sampling", "Sandbox", "Limits", "Daemon", "Input and output", "Policy and inference"} <= set(shown)
    assert "--temperature" in shown["Sampling"] and "--group-size" in shown["Sampling"]
    assert "--sandbox" in shown["Sandbox"] and "--docker-host" in shown["Sandbox"]
    assert "--watch" in shown["Daemon"] and "--max-staleness" in shown["Daemon"]
    assert "--step-timeout" in shown["Limits"]
    assert len(shown["Options"]) < 8  # the flat panel keeps only what no panel claims (--json, --help, ...)


def test_a_field_has_one_panel_in_every_command():
    # rollout's and eval's sampling settings land in the same panel, declared once.
    for path in (("rollout",), ("eval",), ("train",)):
        shown = panels(piped_help(path))
        assert "--temperature" in shown["Sampling"], path
    assert sum(len(names) for names in PANELS.values()) == len(PANEL_OF), "a name is declared in two panels"


def test_every_panel_name_is_an_option_somewhere():
    params = {p.name for _, command in commands() for p in getattr(command, "params", [])}
    assert set(PANEL_OF) <= params, sorted(set(PANEL_OF) - params)


def test_small_commands_stay_one_panel():
    assert set(panels(piped_help(("sync",)))) == {"Options"}


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_accepts_quiet(stage):
    for spelling in ("-q", "--quiet"):
        result = runner.invoke(app, [stage, spelling, "--help"])
        assert result.exit_code == 0, (stage, spelling, result.output)
    options = {opt for p in dict(commands())[(stage,)].params for opt in p.opts}
    assert {"-q", "--quiet"} <= options, stage


def test_quiet_silences_the_summary_but_not_errors(tmp_path):
    (tmp_path / "ck").mkdir()
    args = ["sync", "--ckpt", str(tmp_path / "ck"), "--policy-dir", str(tmp_path / "policy")]
    loud = runner.invoke(app, args)
    assert loud.exit_code == 0 and "nothing to do" in loud.output
    quiet = runner.invoke(app, [*args, "-q"])
    assert quiet.exit_code == 0 and quiet.output == ""
    failed = runner.invoke(app, ["sync", "-q"])  # no --ckpt/--policy-dir/--run: a usage error, still printed
    assert failed.exit_code == 2 and "--run RUN" in failed.output
    reward = runner.invoke(app, ["reward", "-q", "--in", str(tmp_path / "ck"), "--out", str(tmp_path / "rw"),
                                 "--reward", "math", "--json"])
    assert reward.exit_code == 0 and '"rows"' in reward.stdout and "rewarded" not in reward.output.replace(
        reward.stdout, "")
