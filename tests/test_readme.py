"""Docs are tests: every `arlctl COMMAND` the README shows exists and has help with an example."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from arlctl.cli.main import app

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_commands() -> set[str]:
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    return {m for block in blocks for m in re.findall(r"^\s*arlctl ([a-z][a-z-]*)", block, flags=re.M)}


def test_readme_commands_exist_and_have_examples():
    commands = readme_commands()
    assert {"rollout", "reward", "filter", "train", "sync", "query", "inspect", "show", "validate"} <= commands
    runner = CliRunner()
    for command in sorted(commands):
        result = runner.invoke(app, [command, "--help"])
        assert result.exit_code == 0, (command, result.output)
        assert "arlctl " in result.output, f"`arlctl {command} --help` shows no example"


def test_readme_starts_with_the_two_setup_commands():
    text = README.read_text()
    assert text.index("make demo") < text.index("make test") < text.index("## ")
