"""Task schemes (`reasoning-gym:...`), env families (`textarena:GAME`) and Parquet task files: the plumbing
that lets ecosystem environments plug in by name, checked with throwaway registrations."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from arlctl.envs import registry, tasks
from arlctl.envs.tasks import load_tasks, scheme_of
from arlctl.errors import UsageError


def test_scheme_of_tells_schemes_from_builtin_specs_paths_and_urls():
    assert scheme_of("reasoning-gym:leg_counting?n=4") == "reasoning-gym"
    assert scheme_of("humaneval:") == "humaneval"
    assert scheme_of("builtin:math?n=4") is None
    assert scheme_of("s3://bucket/tasks.jsonl") is None
    assert scheme_of("reasoning-gym://host/tasks.jsonl") is None  # a URL, not the scheme
    assert scheme_of("data/tasks.jsonl") is None


def test_a_scheme_gets_the_rest_of_its_spec_and_its_tasks_are_checked_like_any(monkeypatch):
    seen = []

    def source(rest):
        seen.append(rest)
        return [{"task_id": "a", "env": "math"}, {"task_id": "a", "env": "math"}]

    monkeypatch.setitem(tasks.TASK_SCHEMES, "toy-scheme", "no.such.module")
    monkeypatch.setitem(tasks.SCHEME_SOURCES, "toy-scheme", source)
    with pytest.raises(UsageError, match="duplicate task_id 'a'"):
        load_tasks("toy-scheme:x,y?n=2")
    assert seen == ["x,y?n=2"]


def test_a_scheme_whose_module_cannot_import_is_a_usage_error(monkeypatch):
    monkeypatch.setitem(tasks.TASK_SCHEMES, "gone-scheme", "arlctl_no_such_module")
    with pytest.raises(UsageError, match="task source 'gone-scheme:x' is not available"):
        load_tasks("gone-scheme:x")


def test_parquet_task_files_load_one_task_per_row_with_instance_ids(tmp_path):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"instance_id": ["o__r-1", "o__r-2"], "repo": ["o/r", "o/r"],
                             "FAIL_TO_PASS": ['["t1"]', None]}), path)
    loaded = load_tasks(str(path), env="swe")
    assert [t["task_id"] for t in loaded] == ["o__r-1", "o__r-2"]
    assert loaded[0]["FAIL_TO_PASS"] == '["t1"]' and "FAIL_TO_PASS" not in loaded[1]  # nulls dropped
    assert {t["env"] for t in loaded} == {"swe"}


def test_a_broken_or_idless_parquet_file_is_a_usage_error(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(UsageError, match="not a readable Parquet file"):
        load_tasks(str(bad), env="swe")
    idless = tmp_path / "idless.parquet"
    pq.write_table(pa.table({"repo": ["o/r"]}), idless)
    with pytest.raises(UsageError, match="row 1: task has no 'task_id'"):
        load_tasks(str(idless), env="swe")


def test_a_family_member_is_registered_on_first_use_and_is_not_a_plugin_spec(monkeypatch):
    made = []

    class Game:
        def __init__(self, member):
            self.member = member

        async def reset(self, task): ...

        async def step(self, action): ...

        async def close(self): ...

    def register_member(member):
        if member not in ("Win-v0", "Lose-v0"):
            raise UsageError(f"unknown game {member!r}")
        made.append(member)
        registry.register_env(f"toyfam:{member}", lambda: Game(member))
        registry.register_reward(f"toyfam:{member}", lambda final_state, task, text: (1.0, {}, {}), "toyfam-1")

    monkeypatch.setitem(registry.FAMILIES, "toyfam", "no.such.module")
    monkeypatch.setitem(registry.FAMILY_MEMBERS, "toyfam", register_member)
    for table in (registry.ENVS, registry.REWARDS):
        monkeypatch.setattr(registry, "ENVS" if table is registry.ENVS else "REWARDS", dict(table))
    assert not registry.is_spec("toyfam:Win-v0") and registry.is_spec("mypkg.env:make")
    assert registry.make_env("toyfam:Win-v0").member == "Win-v0"
    assert registry.get_reward("toyfam:Win-v0").version == "toyfam-1"
    assert made == ["Win-v0"]  # registered once, found in the table the second time
    with pytest.raises(UsageError, match="unknown game 'Nope-v0'"):
        registry.make_env("toyfam:Nope-v0")


def test_a_family_whose_package_is_missing_says_what_to_install(monkeypatch):
    monkeypatch.setitem(registry.FAMILIES, "gonefam", "arlctl_no_such_module")
    with pytest.raises(UsageError, match="env 'gonefam:X' is not available.*") as err:
        registry.make_env("gonefam:X")
    assert "install the gonefam package" in (err.value.hint or "")


def test_version_suffix_puts_what_options_name_into_the_reward_version(monkeypatch):
    def score(final_state, task, text, rubric="default"):
        return 1.0, {}, {}

    score.version_suffix = lambda rubric="default": f"@{rubric.upper()}"
    monkeypatch.setattr(registry, "REWARDS", dict(registry.REWARDS))
    registry.register_reward("suffixed", score, "suffixed-1")
    assert registry.get_reward("suffixed").version == "suffixed-1@DEFAULT"
    assert registry.get_reward("suffixed", rubric="r").version == "suffixed-1+rubric=r@R"


def test_unversioned_options_stay_out_of_the_reward_version(monkeypatch):
    def score(final_state, task, text, rubric="default", timeout=1.0):
        return 1.0, {}, {}

    score.unversioned_options = ("timeout",)
    monkeypatch.setattr(registry, "REWARDS", dict(registry.REWARDS))
    registry.register_reward("transported", score, "transported-1")
    assert registry.get_reward("transported", timeout=9).version == "transported-1"
    assert registry.get_reward("transported", timeout=9, rubric="r").version == "transported-1+rubric=r"
    assert registry.get_reward("transported", timeout=9).score(None, {}, "") == (1.0, {}, {})
