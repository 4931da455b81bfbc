"""Episodes of the math environment driven by scripted assistant turns."""

from __future__ import annotations

import asyncio

import pytest

from arlctl.envs.base import Action, Env
from arlctl.envs.math import CALCULATOR_TOOL, NUDGE, SYSTEM_PROMPT, MathEnv, score
from arlctl.envs.math_gen import generate_task
from arlctl.errors import TerminalError, UsageError
from arlctl.tools.calls import ParseError, ToolCall

TASK = {"task_id": "t1", "env": "math", "question": "What is (3 + 2) * 3?", "answer": "15"}


def run(coro):
    return asyncio.run(coro)


def started_env(**options) -> MathEnv:
    env = MathEnv(**options)
    run(env.reset(TASK))
    return env


def call(text: str) -> str:
    return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{text}"}}}}</tool_call>'


def test_env_satisfies_protocol():
    env = MathEnv()
    assert isinstance(env, Env)
    assert (env.name, env.version) == ("math", "math-1")


def test_reset_gives_system_user_and_calculator_tool():
    reset = run(MathEnv().reset(TASK))
    assert reset.messages == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "What is (3 + 2) * 3?"},
    ]
    assert reset.tools == [CALCULATOR_TOOL]
    assert "<answer>" in SYSTEM_PROMPT


def test_tool_call_gives_tool_observation():
    env = started_env()
    action = env.parse_action("I will compute.\n" + call("(3 + 2) * 3"))
    result = run(env.step(action))
    assert not result.done
    assert result.error is None
    assert result.observations == [
        {"role": "tool", "name": "calculator", "content": "15", "tool_call_id": "call_0"}
    ]


def test_several_calls_one_observation_each():
    env = started_env()
    result = run(env.step(env.parse_action(call("3 + 2") + "\n" + call("5 * 3") + call("1/0"))))
    assert [obs["content"] for obs in result.observations] == ["5", "15", "error: division by zero"]
    # A bad expression is a normal tool result, not an env error.
    assert result.error is None


def test_answer_ends_the_episode():
    env = started_env()
    result = run(env.step(env.parse_action("5 * 3 = 15, so <answer>15</answer>")))
    assert result.done
    assert result.final_state == "15"
    assert result.finish_reason == "submit"
    assert result.observations == []


def test_boxed_answer_and_last_answer_wins():
    env = started_env()
    result = run(env.step(env.parse_action("first <answer>14</answer>, no wait: \\boxed{\\frac{30}{2}}")))
    assert result.done
    assert result.final_state == "\\frac{30}{2}"
    assert score(result.final_state, TASK, "")[0] == 1.0


def test_answer_wins_over_a_tool_call_in_the_same_turn():
    env = started_env()
    result = run(env.step(env.parse_action(call("5*3") + " <answer>15</answer>")))
    assert result.done and result.final_state == "15"


def test_answer_inside_a_tool_call_is_not_a_submission():
    env = started_env()
    text = '<tool_call>{"name": "calculator", "arguments": {"expression": "<answer>1</answer>"}}</tool_call>'
    result = run(env.step(env.parse_action(text)))
    assert not result.done
    assert result.observations[0]["content"].startswith("error: unexpected character '<'")


def test_parse_error_becomes_counted_error_observation():
    env = started_env()
    result = run(env.step(env.parse_action('<tool_call>{"name": "calculator", "arguments": {</tool_call>')))
    assert not result.done
    assert len(result.observations) == 1
    assert result.observations[0]["role"] == "tool"
    assert result.observations[0]["content"].startswith("error: invalid JSON in tool call")
    assert result.error is not None and "invalid JSON" in result.error


def test_unknown_tool_from_an_unvalidated_action():
    env = started_env()
    action = Action(text="...", tool_calls=[ToolCall(name="python", arguments={"code": "1"}, id="c")])
    result = run(env.step(action))
    assert result.observations[0]["content"] == "error: unknown tool 'python'; available tools: calculator"
    assert result.error is not None


def test_parse_errors_given_by_the_loop_are_reported():
    env = started_env()
    action = Action(text="x", parse_errors=[ParseError(raw="<tool_call>", message="unclosed <tool_call>")])
    result = run(env.step(action))
    assert result.observations[0]["content"] == "error: unclosed <tool_call>\nyour call was: <tool_call>"
    assert result.error == "unclosed <tool_call>"


def test_unparsed_action_is_parsed_by_the_env():
    env = started_env()
    result = run(env.step(Action(text=call("2**5"))))
    assert result.observations[0]["content"] == "32"


def test_no_action_nudges_or_ends():
    env = started_env()
    result = run(env.step(Action(text="Hmm, let me think about it.")))
    assert not result.done
    assert result.observations == [{"role": "user", "content": NUDGE}]
    env = started_env(on_no_action="end")
    result = run(env.step(Action(text="Hmm.")))
    assert result.done and result.final_state is None and result.finish_reason == "stop"


def test_calls_per_turn_are_capped():
    env = started_env(max_calls_per_turn=2)
    result = run(env.step(env.parse_action(call("1") + call("2") + call("3"))))
    assert [obs["content"] for obs in result.observations][:2] == ["1", "2"]
    assert "at most 2 calculator calls" in result.observations[2]["content"]
    assert result.error is not None


def test_bad_tasks_fail_at_reset():
    with pytest.raises(TerminalError, match="no 'question'"):
        run(MathEnv().reset({"task_id": "x", "answer": "1"}))
    with pytest.raises(TerminalError, match="not a number"):
        run(MathEnv().reset({"task_id": "x", "question": "q", "answer": "eleven"}))
    with pytest.raises(TerminalError, match="before reset"):
        run(MathEnv().step(Action(text="<answer>1</answer>")))
    with pytest.raises(UsageError):
        MathEnv(on_no_action="explode")


def test_full_episode_on_a_generated_task():
    task = generate_task(seed=0, index=0, difficulty=1)  # "Calculate 11 - 1." -> 10
    env = MathEnv()
    reset = run(env.reset(task))
    expression = reset.messages[1]["content"].removeprefix("Calculate ").rstrip(".")
    step1 = run(env.step(env.parse_action(call(expression))))
    assert step1.observations[0]["content"] == task["answer"] == "10"
    step2 = run(env.step(env.parse_action(f"<answer>{step1.observations[0]['content']}</answer>")))
    assert step2.done
    assert score(step2.final_state, task, "")[0] == 1.0
    run(env.close())


def test_registry_makes_math_env():
    from arlctl.envs.registry import list_envs, make_env

    env = make_env("math", on_no_action="end")
    assert isinstance(env, MathEnv) and env.on_no_action == "end"
    assert "math" in list_envs()
    with pytest.raises(UsageError, match="unknown env 'chess'"):
        make_env("chess")
    with pytest.raises(UsageError, match="bad option for env 'math'"):
        make_env("math", colour="red")


def test_tools_none_drops_the_calculator_from_schema_and_prompt():
    env = MathEnv(tools="none")
    reset = run(env.reset(TASK))
    assert reset.tools == []
    system = reset.messages[0]["content"]
    assert "calculator" not in system and "<answer>" in system
    # the answer rule is unchanged
    result = run(env.step(Action(text="so <answer>15</answer>")))
    assert result.done and result.final_state == "15"
    with pytest.raises(UsageError, match="tools must be"):
        MathEnv(tools="abacus")
