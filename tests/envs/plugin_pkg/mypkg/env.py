"""`reverse`: the model is asked to spell a word backwards and answers with the `submit` tool (or plain text).

It imports only arlctl's public dataclasses, as any out-of-tree environment would.
"""

from __future__ import annotations

from typing import Any

from arlctl.envs.base import Action, EnvReset, StepResult

SUBMIT = {"type": "function", "function": {
    "name": "submit", "description": "Give the final answer.",
    "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}}

NOT_CALLABLE = 42  # for the test of a spec that names something that is not a factory


class ReverseEnv:
    name = "reverse"
    version = "reverse-1"

    def __init__(self, hint: bool = False):
        self.hint = hint

    async def reset(self, task: dict[str, Any]) -> EnvReset:
        prompt = f"Spell {task['word']!r} backwards."
        if self.hint:
            prompt += f" It has {len(task['word'])} letters."
        return EnvReset(messages=[{"role": "user", "content": prompt}], tools=[SUBMIT])

    async def step(self, action: Action) -> StepResult:
        for call in action.tool_calls:
            if call.name == "submit":
                answer = str(call.arguments.get("answer", ""))
                return StepResult(observations=[], done=True, final_state=answer, finish_reason="submit")
        # No submit call: the reply text is the answer (one-turn episodes keep the test fast).
        return StepResult(observations=[], done=True, final_state=action.text)

    async def close(self) -> None:
        pass


def make(**options: Any) -> ReverseEnv:
    return ReverseEnv(**options)


def not_an_env() -> str:
    return "a factory that returns something without reset/step/close"
