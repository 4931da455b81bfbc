"""swe step rewards over a real bwrap sandbox: reward_step = share of the visible suite passing after run_tests."""

from __future__ import annotations

import asyncio

import pytest

from arlctl.envs.base import Action
from arlctl.envs.swe.env import SweEnv, pytest_share
from arlctl.envs.swe.tasks import load_suite_task
from arlctl.sandbox.bwrap import bwrap_available
from arlctl.tools.calls import ToolCall

TASK = "stockroom-001"  # visible suite: tests/test_inventory.py, 3 tests, all passing on the buggy snapshot
BREAK_REMOVE = {"path": "stockroom/inventory.py", "old": "item.quantity -= count", "new": "item.quantity -= count + 1"}


@pytest.fixture
def swe_home(tmp_path, monkeypatch):
    if not bwrap_available():
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    monkeypatch.setenv("ARLCTL_HOME", str(tmp_path / "home"))  # the task snapshot is built here


def turn(*calls: tuple[str, dict]):
    return Action(text="", tool_calls=[ToolCall(name, args) for name, args in calls])


def episode(*turns: Action) -> list:
    async def go():
        env = SweEnv(sandboxes=1)
        try:
            await env.reset(load_suite_task(TASK))
            return [await env.step(action) for action in turns]
        finally:
            await env.close()

    return asyncio.run(go())


@pytest.mark.slow
def test_run_tests_gives_the_visible_pass_share_as_the_step_reward(swe_home):
    results = episode(
        turn(("run_tests", {})),  # 3 of 3 pass
        turn(("edit_file", BREAK_REMOVE)),  # no run_tests: no step reward
        turn(("run_tests", {})),  # test_add_and_remove now fails: 2 of 3
        # a path that selects one passing test: the whole suite is measured anyway, 2 of 3
        turn(("run_tests", {"path": "tests/test_inventory.py::test_remove_too_many"})),
        turn(("run_tests", {}), ("submit", {})),  # the share measured before a submit in the same turn counts
    )
    assert [r.reward_step for r in results] == [1.0, None, pytest.approx(2 / 3), pytest.approx(2 / 3),
                                                pytest.approx(2 / 3)]
    assert "1 passed" in results[3].observations[0]["content"]  # what the model saw: only its one test
    assert results[-1].done and results[-1].finish_reason == "submit"


def test_edited_visible_tests_earn_nothing(swe_home):
    # Deleting the failing test would make the rest pass (2 of 2); any change under tests/ scores 0 instead.
    results = episode(
        turn(("edit_file", BREAK_REMOVE)),
        turn(("bash", {"command": "rm tests/test_inventory.py && printf 'def test_ok():\\n    pass\\n' > tests/test_x.py"})),
        turn(("run_tests", {})),
    )
    assert "1 passed" in results[2].observations[0]["content"]
    assert results[2].reward_step == 0.0


def test_no_step_reward_when_git_cannot_compare_the_tests(swe_home):
    results = episode(turn(("bash", {"command": "rm -rf .git"})), turn(("run_tests", {})))
    assert results[1].reward_step is None  # git cannot compare the tests with the snapshot: no measurement


def test_pytest_share_reads_the_last_summary_line():
    # passed / (passed + failed + errors): 2 / (2 + 1) and 2 / (2 + 2); warnings and skips do not count
    assert pytest_share("exit code: 1\nF..\n1 failed, 2 passed in 0.05s\n") == pytest.approx(2 / 3)
    assert pytest_share("==== 2 passed, 2 errors, 1 skipped, 3 warnings in 0.1s ====") == 0.5
    # a test that prints a fake summary is output before pytest's own last line
    assert pytest_share("9 passed in 0.1s\n1 failed in 0.2s") == 0.0
    assert pytest_share("no tests ran in 0.01s") is None
    assert pytest_share("exit code: 4\nERROR: file or directory not found: nope") is None
