"""A scripted Policy for `--policy oracle:calculator`: solves arithmetic math tasks with the calculator tool.

It writes the trajectories a tool-using policy should write, for a cold start (`train --loss sft` on its
rows) and to prove the math tool path end to end (rollout -> reward must give 1.0):

  turn 1   a hermes call of the calculator on the expression the question holds,
           <tool_call>{"name": "calculator", "arguments": {"expression": "347 * 829"}}</tool_call>
  turn 2   once the tool's result is in the prompt, the answer in the env's format: <answer>287663</answer>

The turn is read from the prompt (a tool call after the question means the tool has run), so the policy
keeps no state and any number of trajectories can share it. The answer is the calculator's result as the
tool returned it into the conversation; the script checks that it is there rather than trusting its own
arithmetic, so a tool that failed ends the row as a policy error instead of an answer the tool never gave.
The question is found as in the other oracles: the longest task question the prompt holds. A question with
no arithmetic expression (a word problem) or a prompt without the calculator (`--env-opt tools=none`) is
an error the row records (status policy_error), never a made-up call. Token ids come from the real
tokenizer; every log-prob is 0.0 and each turn ends with the chat template's end-of-message token.
"""

from __future__ import annotations

import json
import re
from typing import Any

from arlctl.envs.calculator import calculate
from arlctl.envs.math import CALCULATOR_TOOL, ENV_NAME
from arlctl.errors import TerminalError, UsageError
from arlctl.inference.scripted import ScriptedPolicy
from arlctl.tools.hermes import CLOSE_TAG, OPEN_TAG

SPEC = "oracle:calculator"
TOOL_NAME = CALCULATOR_TOOL["function"]["name"]
# A run of digits, operators, parentheses, points and spaces that starts and ends on a digit or a bracket:
# "347 * 829" of "What is 347 * 829?", "(12 + 7) * 3" of "Compute (12 + 7) * 3." (the full stop left out).
_EXPRESSION_RE = re.compile(r"[\d(][\d\s+\-*/().]*[\d)]")
_OPERATOR_RE = re.compile(r"[\d)]\s*[-+*/]\s*[\d(]")


def question_expression(question: str) -> str | None:
    """The arithmetic expression a question holds (the longest with an operator), or None."""
    candidates = [m.group().strip() for m in _EXPRESSION_RE.finditer(question)]
    candidates = [c for c in candidates if _OPERATOR_RE.search(c)]
    return max(candidates, key=len) if candidates else None


def tool_call_text(expression: str) -> str:
    """One calculator call in the hermes format the math env's system prompt shows the model."""
    call = {"name": TOOL_NAME, "arguments": {"expression": expression}}
    return f"{OPEN_TAG}\n{json.dumps(call)}\n{CLOSE_TAG}"


class CalculatorOracleScript:
    """The replies of `oracle:calculator` over the run's tasks: call the calculator, then answer."""

    def __init__(self, tasks: list[dict[str, Any]]):
        questions = {q.strip() for t in tasks if isinstance(q := t.get("question", t.get("problem")), str) and q.strip()}
        if not questions:
            raise UsageError(f"{SPEC}: no task has a question", hint=f"use it with --env {ENV_NAME}")
        self.questions = sorted(questions, key=len, reverse=True)  # longest first: the most specific match

    def script(self, prompt: str) -> str:
        """The reply text for a decoded prompt."""
        if f'"name": "{TOOL_NAME}"' not in prompt:
            raise UsageError(f"{SPEC} needs the calculator tool in the prompt",
                             hint="--env math --env-opt tools=calculator (the default)")
        question = next((q for q in self.questions if q in prompt), None)
        if question is None:
            raise TerminalError(f"{SPEC}: the prompt holds none of the tasks' questions")
        expression = question_expression(question)
        if expression is None:
            raise TerminalError(f"{SPEC}: no arithmetic expression in the question {question[:60]!r}",
                                hint="the oracle solves arithmetic tasks (builtin:math?kinds=arithmetic)")
        after = prompt[prompt.rindex(question) + len(question):]
        if OPEN_TAG not in after:
            return tool_call_text(expression)  # turn 1: the tool has not run yet
        result = calculate(expression)
        tool_output = after[after.rindex(CLOSE_TAG) + len(CLOSE_TAG):]
        if result.startswith("error") or result not in tool_output:
            raise TerminalError(f"{SPEC}: the calculator's result {result!r} for {expression!r} is not in the "
                                "conversation after the call")
        return f"<answer>{result}</answer>"


def load_math_oracle(spec: str, tokenizer: Any, tasks: list[dict[str, Any]]) -> ScriptedPolicy:
    """`oracle:calculator` over the run's math tasks (module docstring)."""
    if spec != SPEC:
        raise UsageError(f"unknown scripted policy {spec!r}", hint=f"the math env's scripted policy is {SPEC}")
    return ScriptedPolicy(tokenizer, SPEC, CalculatorOracleScript(tasks).script)
