"""The reasoning-gym env: task specs (weights, n split, options), regeneration in a sealed child process
(the same entries in every process, whatever its hash seed), answer extraction and the dataset's own
scoring, forged rows, the calculator mode, the scripted policies, and the real CLI end to end:
`oracle:reasoning-gym` scores 1.0 on five datasets, wrong replies score 0, inspect breaks rewards down
per dataset.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.envs import reasoning_gym as rg_env
from arlctl.envs.base import Action
from arlctl.envs.reasoning_gym import DatasetKey, extract_answer, reference_entry, score, split_counts
from arlctl.envs.reasoning_gym_oracle import load_scripted
from arlctl.envs.registry import get_reward, make_env
from arlctl.envs.tasks import load_tasks
from arlctl.errors import TerminalError, UsageError
from arlctl.inference.scripted import ScriptedPolicy
from arlctl.io.shards import Lineage, read_shard, write_shard
from arlctl.schemas.rows import TrajectoryRow, Turn, rows_to_table
from arlctl.tools.calls import ToolCall

ARLCTL = [sys.executable, "-m", "arlctl.cli.main"]
# Five datasets from four families; ransom_note iterates over a set of strings (hash order) and
# list_functions draws from the global RNG: in process, another process would generate other questions.
FIVE = ["leg_counting", "basic_arithmetic", "spell_backward", "ransom_note", "list_functions"]


def tasks_of(spec: str) -> list[dict]:
    return load_tasks(spec, env="reasoning-gym")


@pytest.fixture(scope="module")
def tokenizer():
    from arlctl.models import smollm2_tokenizer

    return smollm2_tokenizer()


# ------------------------------------------------------------------------------------------ task specs
def test_split_counts_is_largest_remainder():
    assert split_counts(300, [2, 1]) == [200, 100]
    # 10 / 3 = 3.33 each: floors 3 + 3 + 3 = 9, the one left goes to the earliest of the equal remainders
    assert split_counts(10, [1, 1, 1]) == [4, 3, 3]
    # quotas 3.5, 2.1, 1.4: floors 3 + 2 + 1 = 6, the one left to the largest remainder (.5)
    assert split_counts(7, [0.5, 0.3, 0.2]) == [4, 2, 1]


@pytest.mark.slow
def test_spec_splits_n_by_weight_interleaves_and_matches_the_library():
    import reasoning_gym

    tasks = tasks_of("reasoning-gym:leg_counting:2,basic_arithmetic?n=6&seed=1")
    # weights 2:1 of 6 -> 4 and 2; entry i of n sits at (i + 0.5) / n: legs .125 .375 .625 .875, arith .25 .75
    assert [t["task_id"] for t in tasks] == [
        "rg-leg_counting-s1-n4-0", "rg-basic_arithmetic-s1-n2-0", "rg-leg_counting-s1-n4-1",
        "rg-leg_counting-s1-n4-2", "rg-basic_arithmetic-s1-n2-1", "rg-leg_counting-s1-n4-3"]
    first = tasks[0]
    assert {k: first[k] for k in ("env", "dataset", "seed", "size", "index", "config")} == {
        "env": "reasoning-gym", "dataset": "leg_counting", "seed": 1, "size": 4, "index": 0, "config": {}}
    assert "answer" not in first  # the reward regenerates it; a row never carries what it is graded on
    # leg_counting draws from Random(seed + index) only: the library in this process gives the same questions
    library = reasoning_gym.create_dataset("leg_counting", seed=1, size=4)
    assert [t["question"] for t in tasks if t["dataset"] == "leg_counting"] == [library[i]["question"]
                                                                               for i in range(4)]


@pytest.mark.slow
def test_config_options_reach_the_generator_and_name_the_task():
    tasks = tasks_of("reasoning-gym:leg_counting?n=3&leg_counting.min_animals=1&leg_counting.max_animals=1")
    assert all(t["config"] == {"min_animals": 1, "max_animals": 1} for t in tasks)
    assert all(t["task_id"].startswith("rg-leg_counting-s0-n3-c") for t in tasks)  # a config hash in the id
    for task in tasks:  # one kind of animal per question: the list after "if you have" has no comma
        assert "," not in task["question"].split("if you have")[1], task["question"]


@pytest.mark.parametrize("spec, words", [
    ("leg_countin?n=4", "no dataset 'leg_countin'"),
    ("leg_counting:x", "weight 'x' of 'leg_counting' is not a number"),
    ("leg_counting:0,gcd", "positive finite"),
    ("leg_counting:nan", "positive finite"),
    ("leg_counting,,gcd", "dataset 2 is empty"),
    ("leg_counting,leg_counting", "given twice"),
    ("leg_counting?n=0", "n must be >= 1"),
    ("leg_counting?n=x", "n='x' is not an integer"),
    ("leg_counting,gcd?n=1", "leaves dataset 'gcd' (weight 1) without a task"),
    ("leg_counting?size=9", "unknown option 'size'"),
    ("leg_counting?gcd.max_value=9", "unknown option 'gcd.max_value'"),
    ("leg_counting?leg_counting.seed=3", "seed and size are set by the spec"),
    ("spell_backward?spell_backward.data_file=../../etc/passwd", "looks like a path"),
    ("leg_counting?leg_counting.no_such_field=1", "unexpected keyword argument 'no_such_field'"),
    ("leg_counting?leg_counting.min_animals=9&leg_counting.max_animals=2", "leg_counting"),  # the config's check
])
def test_bad_specs_are_one_line_usage_errors(spec, words):
    with pytest.raises(UsageError) as info:
        tasks_of("reasoning-gym:" + spec)
    assert words in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


def test_unknown_dataset_hint_names_close_and_known_ones():
    with pytest.raises(UsageError) as info:
        tasks_of("reasoning-gym:leg_countin")
    assert "did you mean leg_counting" in info.value.hint and "known: " in info.value.hint


def test_builtin_source_defaults_to_two_datasets():
    tasks = load_tasks("builtin:reasoning-gym?n=4&seed=3", env="reasoning-gym")
    assert [t["dataset"] for t in tasks] == ["leg_counting", "basic_arithmetic"] * 2  # 2 + 2, interleaved


# ---------------------------------------------------------------------------------------- regeneration
@pytest.mark.slow
def test_entries_are_the_same_in_a_process_with_another_hash_seed():
    keys = [DatasetKey(name, 7, 5) for name in FIVE]
    here = {key.name: [e["question"] for e in entries] for key, entries in rg_env.generate(keys).items()}
    # The other process asks one dataset at a time, in reverse order: a dataset's entries do not depend
    # on what the long-lived generator made before.
    code = ("import json; from arlctl.envs import reasoning_gym as m; "
            f"keys = [m.DatasetKey(n, 7, 5) for n in reversed({FIVE!r})]; "
            "print(json.dumps({k.name: [e['question'] for e in m.generate([k])[k]] for k in keys}))")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "1"})
    assert json.loads(child.stdout.splitlines()[-1]) == here


def test_in_process_generation_would_not_be_reproducible():
    """Why generation runs in a sealed child: list_functions draws from the global RNG in process."""
    import reasoning_gym

    first = reasoning_gym.create_dataset("list_functions", seed=7, size=40)
    second = reasoning_gym.create_dataset("list_functions", seed=7, size=40)
    assert [first[i]["question"] for i in range(40)] != [second[i]["question"] for i in range(40)]


# ---------------------------------------------------------------------------------------------- reward
@pytest.fixture(scope="module")
def leg_task() -> dict:
    return tasks_of("reasoning-gym:leg_counting?n=2&seed=5")[0]


def test_extraction_rule():
    assert extract_answer("a <answer>1</answer> b <ANSWER> 12 </ANSWER>") == ("12", "answer_tag")
    assert extract_answer("so...\nAnswer: 7\nthanks") == ("7", "answer_phrase")
    assert extract_answer("**Final answer:** 9") == ("9", "answer_phrase")
    assert extract_answer("3 * 9 = 22\n\n### The answer is: 22") == ("22", "answer_phrase")
    assert extract_answer("So, the answer is 15.\nThe answer is -3.5.") == ("-3.5", "answer_phrase")
    assert extract_answer("My answer you asked is 200.") == (None, "none")  # "answer" then neither ':' nor 'is'
    assert extract_answer("The answer is\nAnswer:") == (None, "none")  # nothing after either
    assert extract_answer("I think\n  42  \n") == (None, "none")
    assert extract_answer("I think\n  42  \n", fallback="last_line") == ("42", "last_line")
    assert extract_answer("") == (None, "none")


def test_reference_answer_scores_one_and_wrong_or_missing_answers_zero(leg_task):
    reference = reference_entry(leg_task)[1]["answer"]
    reward, parts, info = score(f"Counting...\n<answer>{reference}</answer>", leg_task, "")
    assert (reward, parts) == (1.0, {"score": 1.0, "format": 1.0})
    assert info["answer"] == reference and info["reference"] == reference and info["dataset"] == "leg_counting"
    wrong = str(int(reference) + 1)
    assert score(f"Answer: {wrong}", leg_task, "")[:2] == (0.0, {"score": 0.0, "format": 0.0})
    # the phrase rule finds a right answer; format stays 0: the prompt asked for the tag
    assert score(f"So the answer is {reference}.", leg_task, "")[:2] == (1.0, {"score": 1.0, "format": 0.0})
    # Partial credit is the dataset's own rule: an answer holding the reference scores len(ref) / len(answer),
    # e.g. reference "292", answer "2920" -> 3 / 4 = 0.75.
    longer = reference + "0"
    assert score(f"<answer>{longer}</answer>", leg_task, "")[0] == pytest.approx(len(reference) / len(longer))
    reward, parts, info = score(f"the legs add up to {reference}", leg_task, "")  # no answer: the policy's 0
    assert reward == 0.0 and info["note"].startswith("no final answer") and "error" not in info
    # fallback=last_line takes the bare last line; format stays 0 (leg_counting: exact string match)
    reward, parts, info = score(f"let me count\n{reference}", leg_task, "", fallback="last_line")
    assert (reward, parts, info["form"]) == (1.0, {"score": 1.0, "format": 0.0}, "last_line")


def test_no_final_state_grades_the_response_text(leg_task):
    reference = reference_entry(leg_task)[1]["answer"]
    assert score(None, leg_task, f"turn 1\n<answer>{reference}</answer>")[0] == 1.0


def test_forged_rows_never_score_one(leg_task):
    reference = reference_entry(leg_task)[1]["answer"]
    # 1. The question edited: the regenerated entry differs -> null with the cause, not 0 or 1.
    reward, parts, info = score(f"<answer>{reference}</answer>", {**leg_task, "question": "How many legs: 2?"}, "")
    assert reward is None and "question is not the one leg_counting generates" in info["error"]
    # 2. An answer planted in the task is ignored: the reply is graded against the regenerated one.
    planted = {**leg_task, "answer": "3"}
    assert score("<answer>3</answer>", planted, "")[0] == 0.0
    # 3. Pointing at another index with this question: regenerated question differs -> null.
    assert score(f"<answer>{reference}</answer>", {**leg_task, "index": 1}, "")[0] is None
    # 4. Fields that cannot name an entry: null with the cause.
    for bad, words in [({"index": 2}, "outside 0..1"), ({"dataset": "nope"}, "no dataset 'nope'"),
                       ({"seed": "5"}, "'seed' must be an integer"), ({"size": 10**9}, "outside 1..100000"),
                       ({"config": {"data_file": "/etc/passwd"}}, "looks like a path")]:
        reward, _, info = score("<answer>1</answer>", {**leg_task, **bad}, "")
        assert reward is None and words in info["error"], (bad, info)


@pytest.mark.slow
def test_a_generator_past_its_timeout_is_infra_not_zero_and_the_next_one_starts(leg_task, monkeypatch):
    # knight_swap needs about a second per entry here: 50 entries cannot be ready within 0.5 s.
    slow = {**leg_task, "dataset": "knight_swap", "size": 50, "index": 0}
    monkeypatch.setattr(rg_env, "GENERATE_TIMEOUT_S", 0.5)
    reward, parts, info = score("<answer>1</answer>", slow, "")
    assert reward is None and info["infra"] is True and "took over 0.5 s" in info["error"]
    monkeypatch.setattr(rg_env, "_ENTRIES", {})  # nothing cached: a fresh generator must answer
    monkeypatch.setattr(rg_env, "GENERATE_TIMEOUT_S", 600.0)
    reference = reference_entry(leg_task)[1]["answer"]
    assert score(f"<answer>{reference}</answer>", leg_task, "")[0] == 1.0


def test_reward_registered_with_version_and_options():
    reward = get_reward("reasoning-gym", fallback="last_line")
    assert reward.version == f"reasoning-gym-1+rg{rg_env.RG_VERSION}+fallback=last_line"
    with pytest.raises(UsageError):
        score("x", {}, "", fallback="first_line")


# ------------------------------------------------------------------------------------------------- env
def test_single_turn_env_ends_at_the_reply(leg_task):
    env = make_env("reasoning-gym")

    async def episode():
        reset = await env.reset(leg_task)
        first = await env.step(Action(text="thinking <answer>4</answer>"))
        await env.reset(leg_task)
        plain = await env.step(Action(text="no idea"))
        return reset, first, plain

    reset, first, plain = asyncio.run(episode())
    assert [m["role"] for m in reset.messages] == ["system", "user"] and reset.tools == []
    assert reset.messages[1]["content"] == leg_task["question"] and "<answer>" in reset.messages[0]["content"]
    assert (first.done, first.final_state, first.finish_reason) == (True, "thinking <answer>4</answer>", "submit")
    assert (plain.done, plain.final_state, plain.finish_reason) == (True, "no idea", "stop")
    with pytest.raises(TerminalError):
        asyncio.run(env.reset({"task_id": "x"}))


def test_calculator_mode_runs_tools_then_ends_at_the_answer(leg_task):
    env = make_env("reasoning-gym", tools="calculator")
    call = ToolCall(name="calculator", arguments={"expression": "2*4 + 6*3"}, id="c0")

    async def episode():
        reset = await env.reset(leg_task)
        tool = await env.step(Action(text="<tool_call>...</tool_call>", tool_calls=[call]))
        done = await env.step(Action(text="<answer>26</answer>"))
        return reset, tool, done

    reset, tool, done = asyncio.run(episode())
    assert [t["function"]["name"] for t in reset.tools] == ["calculator"] and env.tool_format == "hermes"
    assert not tool.done and tool.observations[0]["content"] == "26"  # 2*4 + 6*3 = 8 + 18 = 26
    assert done.done and done.final_state == "<answer>26</answer>"
    with pytest.raises(UsageError):
        make_env("reasoning-gym", tools="bash")


# -------------------------------------------------------------------------------------- scripted policy
def test_scripted_policy_finds_the_task_in_the_prompt(tokenizer, tmp_path):
    tasks = [{"task_id": "a", "question": "What is 2 + 2?"}, {"task_id": "b", "question": "What is 2 + 2? Twice."},
             {"task_id": "c", "question": "What is 2 + 2?"}]
    replies = tmp_path / "replies.jsonl"
    replies.write_text('{"task_id": "a", "reply": "4"}\n{"task_id": "b", "reply": "8"}\n'
                       '{"task_id": "c", "reply": "4"}\n')
    policy = load_scripted(f"oracle:replies={replies}", tokenizer, tasks)
    assert policy.script("<|im_start|>user\nWhat is 2 + 2? Twice.<|im_end|>") == "8"  # the longest match wins
    assert policy.script("<|im_start|>user\nWhat is 2 + 2?<|im_end|>") == "4"  # a and c agree
    with pytest.raises(TerminalError, match="none of the tasks"):
        policy.script("something else")
    replies.write_text('{"task_id": "a", "reply": "4"}\n{"task_id": "b", "reply": "8"}\n')
    with pytest.raises(TerminalError, match="no reply for task 'c'"):
        load_scripted(f"oracle:replies={replies}", tokenizer, tasks).script("What is 2 + 2?")
    with pytest.raises(UsageError):
        load_scripted("oracle:replies=", tokenizer, tasks)
    assert isinstance(load_scripted("oracle:reasoning-gym", tokenizer, tasks), ScriptedPolicy)


# ------------------------------------------------------------------------------------ CLI: forged shard
def test_reward_cli_on_a_forged_shard(leg_task, tmp_path):
    """Rows written by hand, as a hostile shard would be: only the genuine one earns its reward."""
    reference = reference_entry(leg_task)[1]["answer"]
    forged = {"edited": {**leg_task, "question": leg_task["question"] + " (and 1 extra leg)"},
              "planted": {**leg_task, "answer": "1"}, "genuine": leg_task}
    replies = {"edited": reference, "planted": "1", "genuine": reference}
    rows = [TrajectoryRow(group_id=f"g-{name}", sample_index=0, task_id=name, env="reasoning-gym",
                          env_version="reasoning-gym-1", task=task, policy="p", prompt_text="p", prompt_ids=[1],
                          response_ids=[2], response_mask=[1], response_logprobs=[-0.1],
                          turns=[Turn(0, 0, 1, 0, f"<answer>{replies[name]}</answer>")],
                          final_state=f"<answer>{replies[name]}</answer>")
            for name, task in forged.items()]
    math_task = {"task_id": "m", "env": "math", "question": "1 + 1?", "answer": "2"}  # no dataset: not in by_dataset
    rows.append(TrajectoryRow(group_id="g-m", sample_index=0, task_id="m", env="math", env_version="math-1",
                              task=math_task, policy="p", prompt_text="p", prompt_ids=[1], response_ids=[2],
                              response_mask=[1], response_logprobs=[-0.1], turns=[Turn(0, 0, 1, 0, "2")],
                              final_state="2"))
    run = tmp_path / "run"
    write_shard(rows_to_table(rows), str(run / "rollouts" / "part-1.parquet"), Lineage(stage="rollout"))
    result = CliRunner().invoke(app, ["reward", "--run", str(run), "--reward", "auto", "--max-error-frac", "1"])
    assert result.exit_code == 0, result.output
    out = {r["task_id"]: r for r in read_shard(str(run / "rewarded" / "part-1.parquet")).to_pylist()}
    assert out["genuine"]["reward"] == 1.0 and out["planted"]["reward"] == 0.0 and out["m"]["reward"] == 1.0
    assert out["edited"]["reward"] is None
    assert "cannot regenerate the task" in json.loads(out["edited"]["reward_info"])["error"]
    # inspect: per dataset, 3 trajectories, 2 rewarded, mean (1.0 + 0.0) / 2 = 0.5
    shown = CliRunner().invoke(app, ["inspect", str(run / "rewarded"), "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["by_dataset"] == {
        "reasoning-gym": {"leg_counting": {"rows": 3, "trajectories": 3, "rewarded": 2, "mean_reward": 0.5}}}


# -------------------------------------------------------------------------------- CLI: end to end
def _cli(*args: str) -> dict:
    proc = subprocess.run([*ARLCTL, *args, "--json"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.integration
def test_oracle_scores_one_on_five_datasets_through_the_cli(tmp_path):
    """rollout and reward are separate processes: the reward regenerates every entry on its own."""
    run = str(tmp_path / "run")
    spec = f"reasoning-gym:{','.join(FIVE)}?n=10&seed=4"
    rollout = _cli("rollout", "--env", "reasoning-gym", "--tasks", spec, "--policy", "oracle:reasoning-gym",
                   "--run", run, "-G", "2", "--quiet")
    assert rollout["rows_written"] == 20 and rollout["outcomes"] == {"ok": 20}
    reward = _cli("reward", "--run", run, "--reward", "reasoning-gym")
    assert reward["rows"] == 20 and reward["mean_reward"] == 1.0, reward
    by_dataset = _cli("inspect", f"{run}/rewarded")["by_dataset"]["reasoning-gym"]
    assert by_dataset == {name: {"rows": 4, "trajectories": 4, "rewarded": 4, "mean_reward": 1.0} for name in FIVE}


@pytest.mark.integration
def test_wrong_and_untagged_replies_score_zero_through_the_cli(tmp_path):
    tasks = tasks_of("reasoning-gym:leg_counting,basic_arithmetic?n=4&seed=9")
    lines = []
    for i, task in enumerate(tasks):  # wrong answers in tags, and right answers without any tag
        right = reference_entry(task)[1]["answer"]
        # int(right) + 1 never holds right as a substring (which the default scorer would half-credit)
        lines.append({"task_id": task["task_id"], "reply": f"<answer>{int(right) + 1}</answer>" if i % 2 else right})
    replies = tmp_path / "replies.jsonl"
    replies.write_text("".join(json.dumps(line) + "\n" for line in lines))
    run = str(tmp_path / "run")
    _cli("rollout", "--env", "reasoning-gym", "--tasks", "reasoning-gym:leg_counting,basic_arithmetic?n=4&seed=9",
         "--policy", f"oracle:replies={replies}", "--run", run, "-G", "1", "--quiet")
    reward = _cli("reward", "--run", run, "--reward", "reasoning-gym")
    assert reward["rows"] == 4 and reward["mean_reward"] == 0.0 and reward["row_errors"] == []
    rows = {r["task_id"]: json.loads(r["reward_info"]) for r in read_shard(
        next(str(p) for p in (tmp_path / "run" / "rewarded").glob("*.parquet"))).to_pylist()}
    assert sum(info.get("form") == "none" for info in rows.values()) == 2  # the untagged ones: no answer
