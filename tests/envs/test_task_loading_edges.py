"""Hostile and broken task files through the real `arlctl rollout` CLI: one usage line, never a traceback.

Each case is a file a careless user or an attacker could hand to `--tasks`. The command must stop
before loading a model with exit 2 and a single `file:line: reason` line (or `file: no tasks`), and the
loader must never crash with a Python traceback or roll out nothing with exit 0.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.envs.tasks import MAX_TASK_DEPTH, load_tasks
from arlctl.errors import UsageError

runner = CliRunner()
GOOD = json.dumps({"task_id": "ok-1", "question": "1+1?", "answer": "2"}).encode()


def rollout_with(path, tmp_path):
    return runner.invoke(app, ["rollout", "--env", "math", "--tasks", str(path), "--policy", "tiny",
                               "--out", str(tmp_path / "out"), "-q"])


def assert_usage_line(result, expected: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.output


CASES = [
    # (name, file bytes, expected fragment of the one error line; {f} is the file path)
    ("empty file", b"", "{f}: no tasks"),
    ("blank lines only", b"\n   \n\t\n", "{f}: no tasks"),
    ("invalid utf-8 byte", GOOD + b"\n{\"task_id\": \"b\", \"question\": \"\xff\"}\n", "{f}:2: invalid UTF-8 (byte 0xff"),
    ("latin-1 file", "{\"task_id\": \"c\", \"question\": \"café\"}\n".encode("latin-1"), "{f}:1: invalid UTF-8"),
    ("cut multi-byte char", GOOD + b"\n" + GOOD + b"\n{\"task_id\": \"d\", \"q\": \"\xe2\x82\"}\n",
     "{f}:3: invalid UTF-8"),
    ("utf-16 file", json.dumps({"task_id": "e"}).encode("utf-16"), "{f}:1: invalid UTF-8"),
    ("deeply nested array", b"[" * 100_000 + b"]" * 100_000, "{f}:1: bad JSON: nested too deeply"),
    ("deeply nested field", b'{"task_id": "f", "x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
     "{f}:1: bad JSON: nested too deeply"),
    ("nested past the task limit", b'{"task_id": "g", "x": ' + b"[" * 200 + b"]" * 200 + b"}",
     f"{{f}}:1: bad JSON: nested deeper than {MAX_TASK_DEPTH} levels"),
    ("truncated json", GOOD + b'\n{"task_id": "h",', "{f}:2: bad JSON"),
    ("nul byte line", b'\x00{"task_id": "i"}', "{f}:1: bad JSON"),
    ("list task id", b'{"task_id": ["a", "b"], "question": "q"}', "{f}:1: task_id must be a string"),
    ("object task id", b'{"task_id": {"$ne": null}}', "{f}:1: task_id must be a string"),
    ("float task id", b'{"task_id": 1.5}', "{f}:1: task_id must be a string"),
    ("bool task id", b'{"task_id": true}', "{f}:1: task_id must be a string"),
    ("instance_id list", b'{"instance_id": [1]}', "{f}:1: task_id must be a string"),
    ("null task id", b'{"task_id": null}', "{f}:1: task has no 'task_id'"),
    ("lone surrogate task id", b'{"task_id": "a\\ud800"}', "{f}:1: task_id \"a\\ud800\" is not valid Unicode"),
]


@pytest.mark.parametrize(("name", "content", "expected"), CASES, ids=[c[0] for c in CASES])
def test_bad_task_file_is_one_usage_line(tmp_path, name, content, expected):
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(content)
    assert_usage_line(rollout_with(path, tmp_path), expected.format(f=path))
    assert not (tmp_path / "out").exists()  # stopped before anything was started or written


def test_empty_builtin_source_is_an_error(tmp_path):
    result = runner.invoke(app, ["rollout", "--env", "math", "--tasks", "builtin:math?n=0", "--policy", "tiny",
                                 "--out", str(tmp_path / "out"), "-q"])
    assert_usage_line(result, "builtin:math?n=0: no tasks")


def test_bom_and_integer_ids_still_load(tmp_path):
    """The checks refuse only what is broken: a BOM from an editor and integer ids are fine."""
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD + b"\n" + json.dumps({"task_id": 7, "question": "q"}).encode() + b"\n")
    tasks = load_tasks(str(path), env="math")
    assert [t["task_id"] for t in tasks] == ["ok-1", "7"]
    nested = {"task_id": "deep", "x": json.loads("[" * (MAX_TASK_DEPTH - 1) + "]" * (MAX_TASK_DEPTH - 1))}
    path.write_text(json.dumps(nested) + "\n")
    assert load_tasks(str(path), env="math")[0]["task_id"] == "deep"


def test_loader_errors_are_usage_errors(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\xff\n")
    with pytest.raises(UsageError, match=r"t\.jsonl:1: invalid UTF-8"):
        load_tasks(str(path))
