"""`arlctl show` and the CLI error handler against hostile text: terminal escapes and Rich markup.

Trajectory text is written by the model, the environment or a task file; printed raw, an OSC 52
sequence writes the user's clipboard, OSC 0 retitles the terminal, CSI sequences move the cursor or
hide lines, and Rich markup restyles or (when unbalanced) crashes the printer. Every attack below goes
through the real `show` command on a real shard and asserts that no control byte reaches the output
while the text itself stays readable (escaped), markup included, literally.
"""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from arlctl.cli.common import handle_errors
from arlctl.cli.main import app
from arlctl.errors import UsageError
from arlctl.render import terminal_safe
from arlctl.schemas.rows import rows_to_table
from arlctl.synthetic import synthetic_rows

runner = CliRunner()

OSC52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07"  # set the clipboard to "echo pwned"
OSC0 = "\x1b]0;owned terminal\x1b\\"  # retitle the window (ST-terminated)
CSI = "\x1b[2J\x1b[1;1H\x1b[8m"  # clear the screen, home the cursor, hide what follows
C1_CSI = "\x9b31m"  # the one-byte C1 form of CSI
C1_OSC = "\x9d0;c1 title\x9c"
OVERWRITE = "harmless\rEVIL"  # a carriage return overwrites the start of the line on a terminal
MARKUP = "[bold red]not a style[/bold red]"
UNBALANCED = "[/] closes nothing"  # Rich raises MarkupError on this when it parses markup
LINK = "[link=https://evil.example]click[/link]"

ATTACKS = [OSC52, OSC0, CSI, C1_CSI, C1_OSC, OVERWRITE, MARKUP, UNBALANCED, LINK]
FORBIDDEN = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # every control except \n and \t


def _hostile_shard(tmp_path):
    """One real shard whose every text column of one row carries every attack."""
    payload = " | ".join(ATTACKS)
    row = synthetic_rows(1, group_size=1, seed=3, mean_turns=2, tokens_per_turn=20)[0]
    row.task_id = f"task {MARKUP} {OSC0}"
    row.env = f"math{CSI}"
    row.prompt_text = f"prompt {payload}"
    row.final_state = f"final {payload}"
    row.reward_info = json.dumps({"log_tail": payload}, ensure_ascii=False)
    row.reward_version = f"v{LINK}"
    row.reward_components = {f"comp{MARKUP}": 1.0}
    row.env_info = {"sandbox": "docker", "engine": f"unix:///run/e.sock{OSC52}", "name": f"box {MARKUP}"}
    for turn in row.turns:
        turn.text = f"text {payload}"
        turn.observation = f"obs {payload}"
        turn.error = f"err {payload}"
        turn.tool_calls = [{"name": f"calc{OSC52}", "arguments": {"expression": payload}, "id": "c"}]
    table = rows_to_table([row])
    # status and finish_reason are checked by the writer; a planted shard need not have been written
    # by arlctl, so they carry attacks too.
    for column, value in (("status", f"ok{C1_CSI}"), ("finish_reason", f"stop{UNBALANCED}")):
        index = table.schema.get_field_index(column)
        table = table.set_column(index, table.schema.field(index), pa.array([value], pa.string()))
    path = tmp_path / "rollouts" / "part-0.parquet"
    path.parent.mkdir()
    pq.write_table(table, str(path))
    return row, path.parent


def test_show_escapes_every_control_sequence_and_markup(tmp_path):
    row, shards = _hostile_shard(tmp_path)
    result = runner.invoke(app, ["show", row.trajectory_id, str(shards)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert not FORBIDDEN.search(out), repr(FORBIDDEN.search(out))
    assert "\x1b" not in out and "\x9b" not in out and "\x07" not in out and "\r" not in out
    # the text is still there, readable: escapes spelled out, markup literal
    assert "\\x1b]52;c;ZWNobyBwd25lZA==\\x07" in out
    assert "\\x9b31m" in out and "harmless\\x0dEVIL" in out
    assert MARKUP in out and "[/] closes nothing" in out and LINK in out
    assert f"comp{MARKUP}" in out  # reward component names too
    assert "ran on" in out and "unix:///run/e.sock" in out and "box [bold" in out  # env_info (v3), markup literal


def test_show_json_keeps_the_exact_text(tmp_path):
    """--json is for programs: the text is exact (JSON escapes control characters by itself)."""
    row, shards = _hostile_shard(tmp_path)
    result = runner.invoke(app, ["show", row.trajectory_id, str(shards), "--json"])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stdout
    assert json.loads(result.stdout)["prompt_text"] == row.prompt_text


@pytest.mark.parametrize("message", [UNBALANCED, MARKUP, f"bad {OSC52} and {CSI}", "[bold]x[/italic]"])
def test_error_handler_prints_hostile_messages_verbatim(message, capsys):
    """A typed error whose message carries markup or escapes: one safe line, the right exit code."""

    @handle_errors
    def fails() -> None:
        raise UsageError(f"bad input {message}", hint=f"hint {message}")

    import typer

    with pytest.raises(typer.Exit) as exit_info:
        fails()
    assert exit_info.value.exit_code == 2
    err = capsys.readouterr().err
    assert not FORBIDDEN.search(err)
    assert "error:" in err and terminal_safe(message) in err and f"hint {terminal_safe(message)}" in err


def test_error_handler_unexpected_exception_with_markup(capsys):
    @handle_errors
    def crashes() -> None:
        raise RuntimeError(f"{UNBALANCED} {OSC0}")

    import typer

    with pytest.raises(typer.Exit) as exit_info:
        crashes()
    assert exit_info.value.exit_code == 1
    err = capsys.readouterr().err
    assert "RuntimeError: [/] closes nothing" in err and not FORBIDDEN.search(err)


def test_show_unknown_id_with_markup_in_the_id(tmp_path):
    """The id the user typed is echoed in the error: through the real CLI, markup in it is literal."""
    _, shards = _hostile_shard(tmp_path)
    result = runner.invoke(app, ["show", f"[/]{OSC52}", str(shards)])
    assert result.exit_code == 1
    assert "no trajectory with id" in result.output and "[/]" in result.output
    assert not FORBIDDEN.search(result.output)


def test_terminal_safe_leaves_ordinary_text_alone():
    text = "def f(x):\n\treturn x  # ünïcode ✓ 你好"
    assert terminal_safe(text) == text
    assert terminal_safe("\u202eevil") == "\\u202eevil"  # bidi override (Trojan Source) spelled out


@pytest.mark.parametrize("command", [["inspect"], ["query", "select task_id, status, env, final_state from trajectories"]],
                         ids=["inspect", "query"])
def test_inspect_and_query_tables_escape_shard_text(tmp_path, command):
    """The same planted shard through the table printers: status, env and task ids are shard data."""
    row, shards = _hostile_shard(tmp_path)
    args = [*command, str(shards)] if command[0] == "inspect" else [command[0], command[1], str(shards)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert not FORBIDDEN.search(result.output), repr(FORBIDDEN.search(result.output))
    assert "\\x9b31m" in result.output  # the status ok<C1 CSI>, spelled out
