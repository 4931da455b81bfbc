"""The docs' shell examples still parse against the CLI.

Every `arlctl ...` command line in a code block of README.md or a docs/ page (continuation lines joined,
comments dropped, `|`, `&&`, `;` and `$(...)` splitting commands) names a command the app registers, and
every option it uses is an option of that command. Checked in process, through the click command objects.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer.main

from arlctl.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
NOT_SHELL = {"python", "py", "yaml", "yml", "json", "toml", "text", "jsonl", "ini", "dockerfile", "sql"}
_BLOCK = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", flags=re.S | re.M)
_SEPARATORS = {"|", "||", "&&", ";", "&", "(", "$(", ")", "`"}
_PREFIXES = {"nohup", "exec", "time", "env", "sudo"}


def shell_lines(text: str) -> list[tuple[int, str]]:
    """(line number, logical line) of every shell code block of a markdown text, continuations joined."""
    out = []
    for match in _BLOCK.finditer(text):
        if match.group(1).lower() in NOT_SHELL:
            continue
        first = text.count("\n", 0, match.start(2)) + 1
        pending, start = "", first
        for offset, line in enumerate(match.group(2).splitlines()):
            if not pending:
                start = first + offset
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            out.append((start, pending + line))
            pending = ""
    return out


def invocations(line: str) -> list[list[str]]:
    """The argument lists given to `arlctl` on one shell line (after `arlctl`, up to the command's end)."""
    if not re.search(r"(^|[\s/|;&($`])arlctl\s", line):
        return []
    lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;()`")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens = list(lexer)
    found: list[list[str]] = []
    at_command = True
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token in _SEPARATORS or set(token) <= set("|&;()`"):
            at_command = True
        elif at_command and (token in _PREFIXES or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", token)):
            pass  # `FOO=1 arlctl ...`, `nohup arlctl ...`: still at the command word
        elif at_command and (token == "arlctl" or token.endswith("/arlctl")):
            args = []
            i += 1
            while i < len(tokens) and not (tokens[i] in _SEPARATORS or set(tokens[i]) <= set("|&;()`")):
                args.append(tokens[i])
                i += 1
            found.append(args)
            continue
        else:
            at_command = False
        i += 1
    return found


def check_invocation(args: list[str]) -> str | None:
    """Why `arlctl ARGS` does not parse against the app (None when it does)."""
    command = typer.main.get_command(app)
    path = ["arlctl"]
    rest = list(args)
    while getattr(command, "commands", None) is not None:
        while rest and rest[0].startswith("-"):  # the group's own options (--debug)
            problem = _unknown_option(command, rest.pop(0), path)
            if problem:
                return problem
        if not rest:
            return None  # `arlctl model` alone: a group's help
        name = rest.pop(0)
        if name not in command.commands:
            return f"`{' '.join(path)}` has no command {name!r}"
        command = command.commands[name]
        path.append(name)
    for token in rest:
        if token == "--":
            break  # what follows is handed on, not arlctl's
        problem = _unknown_option(command, token, path)
        if problem:
            return problem
    return None


def _unknown_option(command, token: str, path: list[str]) -> str | None:
    if not re.match(r"^--?[A-Za-z]", token):
        return None  # a value, a placeholder (RUN, ...), or a negative number
    spelled = token.split("=", 1)[0] if token.startswith("--") else token[:2]
    known = {opt for p in command.params for opt in [*p.opts, *getattr(p, "secondary_opts", [])]}
    known |= {"--help", "-h"}
    if spelled not in known:
        return f"`{' '.join(path)}` has no option {spelled}"
    return None


def problems(page: Path, text: str | None = None) -> list[str]:
    text = page.read_text() if text is None else text
    out = []
    for number, line in shell_lines(text):
        try:
            calls = invocations(line)
        except ValueError as err:  # unbalanced quotes: not a line a shell would run
            out.append(f"{_name(page)}:{number}: {err}: {line.strip()}")
            continue
        for args in calls:
            problem = check_invocation(args)
            if problem:
                out.append(f"{_name(page)}:{number}: {problem}: {line.strip()}")
    return out


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)


def test_there_are_pages_with_many_examples():
    counted = sum(len(invocations(line)) for page in PAGES for _, line in shell_lines(page.read_text()))
    assert {p.name for p in PAGES} >= {"README.md", "daemons.md", "inference.md", "observing.md"}
    assert counted > 100, counted


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_shell_example_parses_against_the_cli(page):
    found = problems(page)
    assert not found, "\n".join(found)


def test_the_checker_fails_on_a_planted_bad_flag_and_command():
    page = ROOT / "README.md"
    planted = page.read_text() + (
        "\n```bash\narlctl rollout --run runs/r1 \\\n    --no-such-flag 3   # a flag rollout lacks\n"
        "arlctl nosuch --json\narlctl model pull --frobnicate | jq .\nX=1 .venv/bin/arlctl reward -Z --run r\n"
        "echo $(arlctl status runs/r1 --json --bogus)\n```\n"
    )
    found = problems(page, planted)
    assert len(found) == 5, found
    assert "has no option --no-such-flag" in found[0]
    assert "has no command 'nosuch'" in found[1]
    assert "`arlctl model pull` has no option --frobnicate" in found[2]
    assert "has no option -Z" in found[3]
    assert "`arlctl status` has no option --bogus" in found[4]


def test_the_checker_reads_what_a_shell_would_run():
    text = (
        "```bash\narlctl train --run r --lr 1e-5   # --not-a-flag in a comment\n"
        "echo arlctl --bogus   # arlctl is an argument here, not the command\n"
        "torchrun -m -- arlctl.cli.main train --run RUN\n```\n"
        "```python\nsubprocess.run(['arlctl', 'x'])  # not shell\narlctl nosuch\n```\n"
        "```text\narlctl nosuch --bogus\n```\n"
    )
    lines = shell_lines(text)
    assert [invocations(line) for _, line in lines] == [[["train", "--run", "r", "--lr", "1e-5"]], [], []]
