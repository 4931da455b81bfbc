"""Docs are tests, in both directions.

Every `arlctl COMMAND` a ```bash block of the README or a docs/ page shows exists and its `--help` carries an
example, and every command the Typer app registers (groups' subcommands included) appears in such a block.
The README is a front page (at most ~250 lines); the rest lives in docs/ (tests/test_docs.py checks every
example's options too).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from arlctl.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOC_PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
FRONT_PAGE_MAX_LINES = 250

# `arlctl WORD [WORD]` at the start of a line; the second word only counts where the first is a group.
_INVOCATION = re.compile(r"^\s*arlctl ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?", flags=re.M)


def registered_commands() -> set[tuple[str, ...]]:
    """Every command path the CLI answers: ("rollout",), ("model",), ("model", "pull"), ..."""

    def walk(command, path: tuple[str, ...]):
        # Typer vendors its own click, so test for a group by shape rather than by class.
        subcommands = getattr(command, "commands", None)
        if path:
            yield path
        for name, sub in (subcommands or {}).items():
            if not getattr(sub, "hidden", False):
                yield from walk(sub, (*path, name))

    return set(walk(typer.main.get_command(app), ()))


def bash_invocations(text: str, groups: set[str]) -> set[tuple[str, ...]]:
    """The command paths shown in ```bash blocks of a markdown text."""
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    paths: set[tuple[str, ...]] = set()
    for block in blocks:
        for first, second in _INVOCATION.findall(block):
            paths.add((first, second) if first in groups and second else (first,))
    return paths


def _groups(commands: set[tuple[str, ...]]) -> set[str]:
    return {path[0] for path in commands if len(path) > 1}


def readme_commands() -> set[tuple[str, ...]]:
    """The command paths the README and the docs/ pages show in ```bash blocks."""
    groups = _groups(registered_commands())
    return set().union(*(bash_invocations(page.read_text(), groups) for page in DOC_PAGES))


def help_examples(help_text: str, path: tuple[str, ...]) -> list[str]:
    """Lines of `--help` output that are an example of this command (the Usage line does not count)."""
    prefix = "arlctl " + " ".join(path)
    return [line.strip() for line in help_text.splitlines() if line.strip().startswith(prefix)]


@pytest.mark.slow
def test_readme_commands_exist_and_have_examples():
    commands = readme_commands()
    core = {"rollout", "reward", "filter", "train", "sync", "query", "inspect", "show", "validate"}
    assert {(name,) for name in core} <= commands
    runner = CliRunner()
    for path in sorted(commands):
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (path, result.output)
        if path[0] in _groups(registered_commands()) and len(path) == 1:
            continue  # a group's help lists its subcommands; each subcommand's help carries the example
        assert help_examples(result.output, path), f"`arlctl {' '.join(path)} --help` shows no example"


def test_every_registered_command_is_in_a_readme_bash_block():
    shown = readme_commands()
    registered = registered_commands()
    groups = _groups(registered)
    # A group counts as shown through any of its subcommands; each leaf command must be shown itself.
    shown_groups = {path[0] for path in shown if len(path) > 1}
    missing = sorted(
        " ".join(path)
        for path in registered
        if path not in shown and not (len(path) == 1 and path[0] in groups and path[0] in shown_groups)
    )
    assert not missing, f"commands with no example in a README or docs/ ```bash block: {missing}"


def test_the_two_directions_catch_a_missing_and_an_unknown_command():
    # The checks above are only worth something if the parser sees what a README shows and nothing more.
    text = (
        "```bash\narlctl rollout --run r\n  arlctl model pull --json\narlctl nosuch x\n```\n"
        "```text\narlctl reward  (not a bash block)\n```\n"
    )
    shown = bash_invocations(text, {"model"})
    assert shown == {("rollout",), ("model", "pull"), ("nosuch",)}
    assert ("reward",) in registered_commands() and ("reward",) not in shown
    assert ("nosuch",) not in registered_commands()
    assert CliRunner().invoke(app, ["nosuch", "--help"]).exit_code != 0


def test_help_examples_ignore_the_usage_line():
    usage_only = " Usage: arlctl train [OPTIONS]\n\n Train the policy.\n"
    assert help_examples(usage_only, ("train",)) == []
    assert help_examples(usage_only + "\n arlctl train --run runs/r1\n", ("train",)) == ["arlctl train --run runs/r1"]


def test_readme_starts_with_the_two_setup_commands():
    text = README.read_text()
    assert text.index("make demo") < text.index("make test") < text.index("## ")


def test_readme_is_a_front_page_that_links_every_docs_page():
    text = README.read_text()
    assert len(text.splitlines()) <= FRONT_PAGE_MAX_LINES
    assert "## The loop" in text and "## Where to read on" in text
    for page in DOC_PAGES[1:]:
        assert f"](docs/{page.name})" in text, f"README does not link docs/{page.name}"
    # the loop's five stages are shown on the front page itself
    loop = bash_invocations(text, _groups(registered_commands()))
    assert {("rollout",), ("reward",), ("filter",), ("train",), ("sync",)} <= loop


def test_docs_links_resolve():
    # pages moved out of the README link relative to docs/: a link to a file that is not there is a moved fact lost
    for page in DOC_PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)[^)]*\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links {target}, which does not exist"
