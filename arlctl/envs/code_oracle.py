"""A scripted Policy for `--policy oracle:humaneval`: answers each code task with its canonical solution.

It proves the code pipeline end to end (rollout -> reward must give 1.0 on every HumanEval problem)
without a model. Each generate call decodes the prompt and finds the problem whose prompt text the user
message holds (the longest match, should one prompt contain another). The reply is the whole function,
prompt + canonical solution, in a ```python block (the "function" form the grader must handle). With the
python tool offered (`--env-opt tools=python`) the first turn instead runs that function in the tool and
the second answers, so the tool path is exercised too; the turn is read from the prompt (tool calls after
the problem text), so the policy keeps no state and any number of trajectories can share it.
Token ids come from the real tokenizer; every log-prob is 0.0 and each turn ends with the chat template's
end-of-message token (finish_reason "stop"), as in the swe oracle (arlctl/envs/swe/oracle.py).
"""

from __future__ import annotations

import json
from typing import Any

from arlctl.envs.code_grader import problems
from arlctl.errors import UsageError
from arlctl.inference.scripted import ScriptedPolicy
from arlctl.tools.hermes import CLOSE_TAG, OPEN_TAG

SPEC = "oracle:humaneval"


def solution(task_id: str) -> str:
    """The canonical whole function of a problem: its prompt followed by the reference body."""
    prob = problems()[task_id]
    return prob["prompt"] + prob["canonical_solution"]


class CodeOracleScript:
    """The replies of `oracle:humaneval`: the canonical solution of the problem found in the prompt."""

    def __init__(self) -> None:
        # Longest prompts first: the first one found in a conversation is the most specific.
        self._prompts = sorted(((p["prompt"].strip(), task_id) for task_id, p in problems().items()),
                               key=lambda pair: -len(pair[0]))

    def script(self, prompt: str) -> str:
        """The reply text for a decoded prompt."""
        found = next(((text, task_id) for text, task_id in self._prompts if text in prompt), None)
        if found is None:
            raise UsageError(f"{SPEC} works only with --env code prompts (no HumanEval problem found)")
        text, task_id = found
        code = solution(task_id)
        answer = f"```python\n{code}```"
        after = prompt[prompt.index(text) + len(text):]
        if '"name": "python"' not in prompt or OPEN_TAG in after:
            return answer  # single turn, or the tool already ran: the final answer
        call = {"name": "python", "arguments": {"code": f"{code}\nprint({problems()[task_id]['entry_point']!r}, 'ok')\n"}}
        return f"{OPEN_TAG}\n{json.dumps(call)}\n{CLOSE_TAG}"


def load_oracle(spec: str, tokenizer: Any, tasks: list[dict[str, Any]] | None = None) -> ScriptedPolicy:
    if spec != SPEC:
        raise UsageError(f"unknown oracle policy {spec!r}", hint=f"the code env's scripted policy is {SPEC}")
    return ScriptedPolicy(tokenizer, SPEC, CodeOracleScript().script)
