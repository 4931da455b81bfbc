"""The oracle:gold policy: its tool calls rebuild every gold fix; through the real rollout it earns 1.0."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from swe_helpers import run

from arlctl.envs.swe.env import SweEnvFactory
from arlctl.envs.swe.grader import score
from arlctl.envs.swe.oracle import OraclePolicy, gold_tool_calls, load_oracle, render_calls
from arlctl.envs.swe.tasks import load_suite_task, prepare_snapshot, suite_ids
from arlctl.errors import UsageError
from arlctl.inference.base import SamplingParams


def _apply_calls(root: Path, calls: list[dict]) -> None:
    """What the env's tools do, done on a host copy (edit_file: exactly one occurrence)."""
    for call in calls:
        args = call["arguments"]
        target = root / args.get("path", "")
        if call["name"] == "edit_file":
            text = target.read_text()
            assert text.count(args["old"]) == 1, (target, args["old"])
            target.write_text(text.replace(args["old"], args["new"]))
        elif call["name"] == "create_file":
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(args["content"])
        else:
            raise AssertionError(call)


def test_gold_calls_rebuild_every_gold_fix(tmp_path):
    for iid in suite_ids():
        task = load_suite_task(iid)
        snapshot = prepare_snapshot(task)
        by_calls, by_git = tmp_path / iid / "calls", tmp_path / iid / "git"
        shutil.copytree(snapshot, by_calls)
        shutil.copytree(snapshot, by_git)
        originals = {p.relative_to(by_calls).as_posix(): p.read_text() for p in by_calls.rglob("*.py")}
        calls = gold_tool_calls(task["patch"], originals)
        assert calls == [c for c in calls if c["name"] in ("edit_file", "create_file")]
        _apply_calls(by_calls, calls)
        subprocess.run(["git", "-C", str(by_git), "apply", "-"], input=task["patch"], text=True, check=True)
        for path in by_git.rglob("*.py"):
            rel = path.relative_to(by_git)
            assert (by_calls / rel).read_text() == path.read_text(), (iid, rel)


def test_script_follows_the_turns(tokenizer):
    policy = OraclePolicy(tokenizer)
    task = load_suite_task("verscmp-027")  # a gold patch with two files
    calls = gold_tool_calls(task["patch"])
    assert [c["name"] for c in calls] == ["edit_file", "edit_file"]
    prompt = "system...\nRepository: r (task verscmp-027)\n<issue>x</issue>"
    first = policy.script(prompt)
    assert first.count("<tool_call>") == 1 and '"edit_file"' in first
    after_two = prompt + first + "obs" + policy.script(prompt + first)
    assert '"run_tests"' in policy.script(after_two)
    assert '"submit"' in policy.script(after_two + '<tool_call>{"name": "run_tests"}</tool_call>')
    with pytest.raises(UsageError):
        policy.script("a math question")
    with pytest.raises(UsageError):
        load_oracle("oracle:silver", tokenizer)


def test_generate_returns_real_tokens(tokenizer):
    from arlctl.inference.chat import ChatCodec

    policy = OraclePolicy(tokenizer)
    prompt_ids = tokenizer("Repository: r (task stockroom-001)", add_special_tokens=False)["input_ids"]
    gen = run(policy.generate(prompt_ids, SamplingParams(max_new_tokens=512)))
    assert gen.finish_reason == "stop" and gen.logprobs == [0.0] * len(gen.ids)
    text, glue = ChatCodec(tokenizer).split_generation(gen.ids)
    assert text == policy.script("Repository: r (task stockroom-001)")
    short = run(policy.generate(prompt_ids, SamplingParams(max_new_tokens=5)))
    assert short.finish_reason == "length" and len(short.ids) == 5


def test_every_turn_fits_the_default_budget(tokenizer):
    """CLI defaults: 256 new tokens per turn, 6 turns. Every gold plan fits both."""
    for iid in suite_ids():
        policy = OraclePolicy(tokenizer)
        task = load_suite_task(iid)
        calls = gold_tool_calls(task["patch"], policy._originals(task))
        assert len(calls) + 2 <= 6, iid
        for call in calls:
            text = render_calls([call])
            assert len(tokenizer(text, add_special_tokens=False)["input_ids"]) < 256, iid


def _rollout(task_ids: list[str], tokenizer) -> list:
    from arlctl.stages.agent_loop import RolloutConfig
    from arlctl.stages.rollout import rollout

    tasks = [load_suite_task(i) for i in task_ids]
    policy = OraclePolicy(tokenizer)
    cfg = RolloutConfig(env="swe", group_size=1, concurrency=2, max_turns=6, max_new_tokens=256)
    rows: list = []

    async def sink(group):
        rows.extend(group)

    async def go():
        envs = SweEnvFactory(sandboxes=2)
        try:
            await rollout(tasks, policy, envs, cfg, sink)
        finally:
            await envs.aclose()
        return [await score(r.final_state, load_suite_task(r.task_id)) for r in rows]

    return list(zip(rows, run(go()), strict=True))


@pytest.mark.slow
def test_oracle_rollout_reaches_reward_one(tokenizer, bwrap):
    results = _rollout(["stockroom-001", "verscmp-027"], tokenizer)
    for row, (reward, _, info) in results:
        assert (row.status, row.finish_reason) == ("ok", "submit"), row.task_id
        assert reward == 1.0, (row.task_id, info)


@pytest.mark.sweep
def test_oracle_rollout_every_task(tokenizer, bwrap):
    results = _rollout(suite_ids(), tokenizer)
    assert len(results) == len(suite_ids())
    assert [row.task_id for row, (reward, _, _) in results if reward != 1.0] == []
