"""The `math` environment: arithmetic and word problems, a calculator tool, and the math reward rule.

Episode (DESIGN.md §7): reset(task) gives a system message with the rules and a user message with the
question; the tool list holds one OpenAI function schema, `calculator(expression)`. Each step:

1. If the turn's text (outside any <tool_call> block) holds a final answer — the last `<answer>…</answer>`
   or `\\boxed{…}` — the episode ends: done, final_state = the answer text, finish_reason "submit".
   A final answer wins over tool calls written in the same turn: the model chose to stop.
2. Otherwise every parse error becomes an error observation (StepResult.error is set, so the loop counts
   it in env_errors) and every calculator call is evaluated by the safe parser in `calculator.py`.
   An invalid expression is an ordinary tool result starting with `error:` — the tool worked, the
   arithmetic did not — so it is not counted as an env error.
3. A turn with neither an answer nor a tool call gets a user message nudging the model to answer
   (`on_no_action="nudge"`, the default, so a model that thinks aloud across turns is not cut short;
   the loop's --max-turns bounds it), or ends the episode with final_state None (`on_no_action="end"`).

Reward (`score`, REWARD_VERSION "math-1"):
    correct = 1 if the answer parses as one number equal to the gold answer within
              |pred - gold| <= max(1e-6 * |gold|, 1e-9), else 0
    format  = 1 if the answer came from a well-formed tag and its content parses as one number, else 0
    reward  = correct + format_weight * format            (format_weight defaults to 0: reward = correct)
The answer is final_state if set, else the last tag in response_text (the assistant turns' text).
Option fallback="last_number": with no tagged answer at all, the last number in response_text is taken
for `correct` (format stays 0). Small untrained models (SmolLM2-135M) rarely write tags, and a reward
that is always 0 teaches nothing; the option is off by default and shows in reward_version.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from arlctl.envs.base import Action, EnvReset, StepResult
from arlctl.envs.calculator import calculate, format_number
from arlctl.errors import TerminalError, UsageError
from arlctl.tools.calls import ToolCall
from arlctl.tools.hermes import OPEN_TAG, parse_hermes, strip_tool_calls
from arlctl.tools.render import format_parse_error, format_tool_result

ENV_NAME = "math"
ENV_VERSION = "math-1"
REWARD_VERSION = "math-1"
REL_TOL = Fraction(1, 10**6)
ABS_TOL = Fraction(1, 10**9)

CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression exactly. Supports + - * / // % ** and parentheses, "
        "decimals, and sqrt, abs, round, floor, ceil, min, max.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {
                    "type": "string",
                    "description": "the expression to evaluate",
                    "examples": ["(12 + 7) * 3 / 4"],
                }
            },
            "required": ["expression"],
        },
    },
}

SYSTEM_PROMPT = (
    "You are a careful math assistant. Solve the problem step by step. "
    "You may use the calculator tool for arithmetic. "
    "When you know the result, end your reply with the final number in answer tags, "
    "for example <answer>42</answer>."
)
# tools="none": the same rules without the calculator; the prompt is about 4x shorter (no tool schema block),
# which is what a CPU training run on a small model can afford.
SYSTEM_PROMPT_NO_TOOLS = SYSTEM_PROMPT.replace("You may use the calculator tool for arithmetic. ", "")
NUDGE = (
    "Please continue: call the calculator tool if you need to compute something, "
    "or give your final answer as <answer>NUMBER</answer>."
)

# ---- answer extraction and number parsing -------------------------------------------------------------

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_BOXED_RE = re.compile(r"\\boxed\s*\{")


def _boxed_spans(text: str) -> list[tuple[int, str]]:
    """(start, content) of every \\boxed{...}, matching nested braces (\\boxed{\\frac{7}{2}})."""
    spans = []
    for match in _BOXED_RE.finditer(text):
        depth, pos = 1, match.end()
        while pos < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[pos], 0)
            pos += 1
        if depth == 0:
            spans.append((match.start(), text[match.end() : pos - 1]))
    return spans


def extract_answer(text: str) -> tuple[str, str] | None:
    """The last final answer in a text as (content, "answer_tag" | "boxed"), or None if there is none."""
    candidates = [(m.start(), m.group(1), "answer_tag") for m in _ANSWER_RE.finditer(text)]
    candidates += [(start, content, "boxed") for start, content in _boxed_spans(text)]
    if not candidates:
        return None
    _start, content, form = max(candidates, key=lambda c: c[0])
    return content.strip(), form


_LATEX_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_LATEX_WRAP_RE = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\s*\{([^{}]*)\}")
_THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_PREFIX_RE = re.compile(r"^[A-Za-z][A-Za-z ]{0,30}[=:]\s*")  # "x = 5", "Answer: 5"
_NUMBER_RE = re.compile(
    r"^([-+]?)\s*(\d+(?:\.\d*)?|\.\d+)(?:[eE]([-+]?\d+))?(?:\s*/\s*(\d+(?:\.\d*)?|\.\d+))?"
)
_UNITS_RE = re.compile(r"^[\sA-Za-z%°./²³]*$")  # what may trail a number: units, %, a full stop
MAX_ANSWER_CHARS = 1000
MAX_ANSWER_EXPONENT = 400  # "1e999999999" must not allocate a billion-digit integer


def parse_number(text: str) -> tuple[Fraction | None, str]:
    """Parse an answer as one exact number; return (value or None, a note on what was done)."""
    if len(text) > MAX_ANSWER_CHARS:
        return None, f"answer longer than {MAX_ANSWER_CHARS} characters"
    s = text.strip().translate(str.maketrans({"−": "-", "–": "-"}))
    s = _LATEX_FRAC_RE.sub(r"(\1)/(\2)", s)
    s = _LATEX_WRAP_RE.sub(r"\1", s)
    for junk in ("\\$", "$", "\\,", "\\!", "\\ ", "\\left", "\\right", "{", "}", "(", ")"):
        s = s.replace(junk, "" if junk not in ("\\,", "\\ ") else " ")
    s = _PREFIX_RE.sub("", s.strip())
    s = _THOUSANDS_RE.sub("", s).strip()
    match = _NUMBER_RE.match(s)
    if match is None:
        return None, f"no number at the start of {text.strip()[:40]!r}"
    rest = s[match.end() :]
    if not _UNITS_RE.match(rest):
        return None, f"more than a number in {text.strip()[:40]!r} (after the number: {rest.strip()[:20]!r})"
    sign, mantissa, exponent, denominator = match.groups()
    if exponent and abs(int(exponent)) > MAX_ANSWER_EXPONENT:
        return None, f"exponent {exponent} out of range"
    value = Fraction(mantissa) * (Fraction(10) ** int(exponent) if exponent else 1)
    if denominator is not None:
        if Fraction(denominator) == 0:
            return None, "division by zero in the answer"
        value /= Fraction(denominator)
    value = -value if sign == "-" else value
    note = "parsed" + (f"; ignored trailing {rest.strip()!r}" if rest.strip() else "")
    return value, note


def gold_answer(task: dict[str, Any]) -> Fraction:
    """The task's exact answer. GSM8K-style answers ("... #### 42") use the part after ####."""
    raw = task.get("answer")
    if raw is None:
        raise TerminalError(
            f"task {task.get('task_id')!r} has no 'answer' field", hint="math tasks need question and answer"
        )
    text = str(raw).rsplit("####", 1)[-1]
    value, note = parse_number(text)
    if value is None:
        raise TerminalError(f"task {task.get('task_id')!r}: gold answer {raw!r} is not a number ({note})")
    return value


def is_close(predicted: Fraction, gold: Fraction) -> bool:
    return abs(predicted - gold) <= max(REL_TOL * abs(gold), ABS_TOL)


_LAST_NUMBER_RE = re.compile(r"[-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+(?!\.\d))?")


def _last_number(text: str) -> str | None:
    matches = _LAST_NUMBER_RE.findall(text[-5000:])
    return matches[-1] if matches else None


def score(
    final_state: str | None,
    task: dict[str, Any],
    response_text: str,
    *,
    format_weight: float = 0.0,
    fallback: str = "none",
) -> tuple[float, dict[str, float], dict[str, Any]]:
    """The math reward rule (see the module docstring). Returns (reward, components, info)."""
    if fallback not in ("none", "last_number"):
        raise UsageError(f"math reward: fallback must be 'none' or 'last_number', got {fallback!r}")
    gold = gold_answer(task)
    info: dict[str, Any] = {"gold": format_number(gold)}
    if final_state is not None:
        answer, info["source"], tagged = final_state, "final_state", True
    else:
        found = extract_answer(response_text or "")
        answer, tagged = (found[0], True) if found else (None, False)
        info["source"] = f"response_text:{found[1]}" if found else "none"
        if answer is None and fallback == "last_number":
            answer = _last_number(response_text or "")
            info["source"] = "response_text:last_number" if answer is not None else "none"
    predicted: Fraction | None = None
    if answer is None:
        info["note"] = "no final answer"
    else:
        info["answer"] = answer[:200]
        predicted, info["note"] = parse_number(answer)
        if predicted is not None:
            info["parsed"] = format_number(predicted)
    correct = 1.0 if predicted is not None and is_close(predicted, gold) else 0.0
    well_formed = 1.0 if tagged and predicted is not None else 0.0
    components = {"correct": correct, "format": well_formed}
    return correct + float(format_weight) * well_formed, components, info


# ---- the environment --------------------------------------------------------------------------------


class MathEnv:
    """One episode of one math task. Cheap to build: the loop makes one per trajectory."""

    name = ENV_NAME
    version = ENV_VERSION
    tool_format = "hermes"  # which arlctl.tools parser reads this env's calls (see parse_action)
    final_state_truncated = None  # an answer is never cut

    def __init__(self, on_no_action: str = "nudge", max_calls_per_turn: int = 8, tools: str = "calculator"):
        if on_no_action not in ("nudge", "end"):
            raise UsageError(f"on_no_action must be 'nudge' or 'end', got {on_no_action!r}")
        if tools not in ("calculator", "none"):
            raise UsageError(f"math env: tools must be 'calculator' or 'none', got {tools!r}")
        self.on_no_action = on_no_action
        self.max_calls_per_turn = max_calls_per_turn
        self.tools = [CALCULATOR_TOOL] if tools == "calculator" else []
        self.system_prompt = SYSTEM_PROMPT if self.tools else SYSTEM_PROMPT_NO_TOOLS
        self.task: dict[str, Any] | None = None

    def parse_action(self, text: str) -> Action:
        """Parse one assistant turn with the hermes parser, validated against this env's tools."""
        calls, errors = parse_hermes(text, self.tools)
        return Action(text=text, tool_calls=calls, parse_errors=errors)

    async def reset(self, task: dict[str, Any]) -> EnvReset:
        """Task fields: `question` (or `problem`) and `answer` (a number, or GSM8K's "... #### N")."""
        question = task.get("question", task.get("problem"))
        if not isinstance(question, str) or not question.strip():
            raise TerminalError(f"math task {task.get('task_id')!r} has no 'question' text")
        gold_answer(task)  # fail at reset, not at reward time, on a task whose answer is not a number
        self.task = task
        messages = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": question.strip()},
        ]
        return EnvReset(messages=messages, tools=list(self.tools))

    async def step(self, action: Action) -> StepResult:
        if self.task is None:
            raise TerminalError("MathEnv.step called before reset")
        if not action.tool_calls and not action.parse_errors and OPEN_TAG in action.text:
            action = self.parse_action(action.text)  # the caller did not parse; do it here
        final = extract_answer(strip_tool_calls(action.text))
        if final is not None:
            return StepResult(observations=[], done=True, final_state=final[0], finish_reason="submit")
        observations: list[dict[str, Any]] = []
        errors: list[str] = []
        for parse_error in action.parse_errors:
            observations.append(format_parse_error(parse_error))
            errors.append(parse_error.message)
        for index, call in enumerate(action.tool_calls):
            observation, error = self._run_call(index, call)
            observations.append(observation)
            if error is not None:
                errors.append(error)
        if not observations:
            if self.on_no_action == "end":
                return StepResult(observations=[], done=True, final_state=None, finish_reason="stop")
            observations.append({"role": "user", "content": NUDGE})
        return StepResult(observations=observations, done=False, error="; ".join(errors) or None)

    def _run_call(self, index: int, call: ToolCall) -> tuple[dict[str, Any], str | None]:
        """One call's tool message, and an env error if the call itself was unusable."""
        if index >= self.max_calls_per_turn:
            error = (
                f"error: at most {self.max_calls_per_turn} calculator calls per turn; this call was skipped"
            )
        elif call.name != "calculator":
            error = f"error: unknown tool {call.name!r}; available tools: calculator"
        elif not isinstance(call.arguments.get("expression"), str):
            error = 'error: calculator needs an "expression" string argument'
        else:
            # A bad expression comes back as "error: ..." text but is the model's mistake, not the env's.
            return format_tool_result(call, calculate(call.arguments["expression"])), None
        return format_tool_result(call, error), error

    async def final_state(self) -> str | None:
        """None: an episode the loop cut short has no answer (the reward stage reads the response text)."""
        return None

    async def close(self) -> None:
        self.task = None
