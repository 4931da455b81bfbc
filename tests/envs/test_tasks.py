"""Task sources: builtin specs with query options and JSONL files."""

from __future__ import annotations

import json

import pytest

from arlctl.envs.math_gen import generate_tasks
from arlctl.envs.tasks import BUILTIN_SOURCES, load_tasks, register_task_source
from arlctl.errors import UsageError


def test_builtin_math_spec():
    tasks = load_tasks("builtin:math?n=5&seed=2&difficulty=3")
    assert tasks == generate_tasks(5, seed=2, difficulty=3)
    assert all(t["env"] == "math" and t["task_id"] for t in tasks)
    assert len(load_tasks("builtin:math")) == 256  # default n


def test_builtin_options_are_checked():
    with pytest.raises(UsageError, match="unknown option"):
        load_tasks("builtin:math?n=2&colour=red")
    with pytest.raises(UsageError, match="not an integer"):
        load_tasks("builtin:math?n=many")
    with pytest.raises(UsageError, match="given twice"):
        load_tasks("builtin:math?n=1&n=2")
    with pytest.raises(UsageError, match="unknown task source builtin:nope"):
        load_tasks("builtin:nope")


def test_kinds_option():
    tasks = load_tasks("builtin:math?n=10&kinds=word")
    assert all(t["kind"].startswith("word:") for t in tasks)


def test_registered_source_is_used():
    @register_task_source("unit-test-source")
    def source(options):
        return [{"task_id": f"u{i}", "env": "demo"} for i in range(int(options.get("n", 1)))]

    try:
        assert load_tasks("builtin:unit-test-source?n=3") == [
            {"task_id": "u0", "env": "demo"},
            {"task_id": "u1", "env": "demo"},
            {"task_id": "u2", "env": "demo"},
        ]
    finally:
        BUILTIN_SOURCES.pop("unit-test-source")


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_jsonl_file(tmp_path):
    path = write_lines(
        tmp_path / "tasks.jsonl",
        [
            json.dumps({"task_id": "a", "question": "1+1?", "answer": "2"}),
            "",
            json.dumps({"task_id": 7, "env": "math", "question": "2+2?", "answer": 4}),
        ],
    )
    tasks = load_tasks(path, env="math")
    assert [t["task_id"] for t in tasks] == ["a", "7"]  # ids are strings
    assert [t["env"] for t in tasks] == ["math", "math"]  # filled in from --env


def test_jsonl_bad_json_names_the_line(tmp_path):
    path = write_lines(
        tmp_path / "t.jsonl", [json.dumps({"task_id": "a", "env": "math"}), '{"task_id": "b",']
    )
    with pytest.raises(UsageError, match=r"t\.jsonl:2: bad JSON"):
        load_tasks(path)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['["not", "an", "object"]'], ":1: a task must be a JSON object"),
        (['{"question": "no id"}'], ":1: task has no 'task_id'"),
        (['{"task_id": "a", "env": "math"}', '{"task_id": "a", "env": "math"}'], "duplicate task_id 'a'"),
        (['{"task_id": "a", "env": "swe"}'], "is for env 'swe', not 'math'"),
    ],
)
def test_jsonl_validation(tmp_path, lines, message):
    path = write_lines(tmp_path / "t.jsonl", lines)
    with pytest.raises(UsageError, match=message):
        load_tasks(path, env="math")


def test_missing_env_without_default(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", ['{"task_id": "a"}'])
    with pytest.raises(UsageError, match="has no 'env' field"):
        load_tasks(path)


def test_missing_file_and_fsspec_url(tmp_path):
    with pytest.raises(UsageError, match="task file not found"):
        load_tasks(str(tmp_path / "missing.jsonl"))
    import fsspec

    with fsspec.open("memory://arlctl-test/tasks.jsonl", "w") as handle:
        handle.write('{"task_id": "m1", "env": "math", "question": "q", "answer": "1"}\n')
    assert load_tasks("memory://arlctl-test/tasks.jsonl")[0]["task_id"] == "m1"
