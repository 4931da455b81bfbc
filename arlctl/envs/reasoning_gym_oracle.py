"""Scripted policies for single-turn tasks: `--policy oracle:reasoning-gym` and `--policy oracle:replies=FILE`.

`oracle:reasoning-gym` answers every reasoning-gym task with its reference answer, regenerated from the
task (`<answer>REFERENCE</answer>`); through rollout and reward it must score 1.0 wherever the dataset's
reference answer is one the dataset scores 1.0 (a few puzzle datasets have no single reference answer).
`oracle:replies=FILE` answers from a JSONL file of `{"task_id": ..., "reply": ...}` lines, for any env whose
tasks carry their prompt text in `question`, `prompt` or `problem` (wrong answers, format tests).

Each generate call decodes the prompt and finds its task: the task whose prompt text occurs in the prompt
(the longest such text, so one question that contains another is not mistaken for it). Tasks with the same
text must have the same reply, else the call fails (the row ends policy_error). The policy keeps no state
between calls. Token ids come from the real tokenizer, each reply ends with the chat template's
end-of-message token, log-probs are 0.0. It lives with the env it scripts; the rollout CLI picks it by name.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from arlctl.errors import TerminalError, UsageError
from arlctl.inference.scripted import ScriptedPolicy
from arlctl.io.fs import get_fs

SPECS = ("oracle:reasoning-gym", "oracle:replies=")
PROMPT_FIELDS = ("question", "prompt", "problem")


def _prompt_text(task: dict[str, Any]) -> str | None:
    for field in PROMPT_FIELDS:
        value = task.get(field)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


class ReplyScript:
    """The replies of a scripted policy: reply(task) for the task whose prompt text is in the prompt."""

    def __init__(self, tasks: list[dict[str, Any]], reply: Callable[[dict[str, Any]], str], name: str):
        self.name, self.reply = name, reply
        self.by_text: dict[str, list[dict[str, Any]]] = {}
        for task in tasks:
            text = _prompt_text(task)
            if text is not None:
                self.by_text.setdefault(text, []).append(task)
        if not self.by_text:
            raise UsageError(f"{name}: no task has a prompt text ({', '.join(PROMPT_FIELDS)})")
        self.texts = sorted(self.by_text, key=len, reverse=True)  # longest first: the most specific match

    def script(self, prompt: str) -> str:
        """The reply text for a decoded prompt."""
        text = next((t for t in self.texts if t in prompt), None)
        if text is None:
            raise TerminalError(f"{self.name}: the prompt holds none of the tasks' texts")
        replies = {self.reply(task) for task in self.by_text[text]}
        if len(replies) > 1:
            ids = ", ".join(str(t.get("task_id")) for t in self.by_text[text][:4])
            raise TerminalError(f"{self.name}: tasks {ids} share one prompt but have different replies")
        return replies.pop()


def reference_reply(task: dict[str, Any]) -> str:
    """`<answer>REFERENCE</answer>` of a reasoning-gym task, regenerated (never read from the task)."""
    from arlctl.envs.reasoning_gym import reference_entry

    return f"<answer>{reference_entry(task)[1]['answer']}</answer>"


def read_replies(url: str) -> dict[str, str]:
    """task_id -> reply from a JSONL file; a bad line is a usage error naming it."""
    fs, path = get_fs(url)
    if not fs.exists(path):
        raise UsageError(f"replies file not found: {url}", hint='one {"task_id": ..., "reply": ...} per line')
    replies: dict[str, str] = {}
    with fs.open(path, "r", encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError as exc:
                raise UsageError(f"{url}:{lineno}: bad JSON: {exc}") from None
            if not isinstance(item, dict) or not isinstance(item.get("reply"), str) or "task_id" not in item:
                raise UsageError(f"{url}:{lineno}: each line needs a task_id and a string reply")
            replies[str(item["task_id"])] = item["reply"]
    return replies


def load_scripted(spec: str, tokenizer: Any, tasks: list[dict[str, Any]]) -> ScriptedPolicy:
    """`oracle:reasoning-gym` or `oracle:replies=FILE` over the run's tasks (module docstring)."""
    if spec == "oracle:reasoning-gym":
        return ScriptedPolicy(tokenizer, spec, ReplyScript(tasks, reference_reply, spec).script)
    if spec.startswith("oracle:replies=") and spec != "oracle:replies=":
        replies = read_replies(spec.partition("=")[2])

        def reply(task: dict[str, Any]) -> str:
            if str(task.get("task_id")) not in replies:
                raise TerminalError(f"{spec}: no reply for task {task.get('task_id')!r}")
            return replies[str(task["task_id"])]

        return ScriptedPolicy(tokenizer, spec, ReplyScript(tasks, reply, spec).script)
    raise UsageError(f"unknown scripted policy {spec!r}",
                     hint="oracle:reasoning-gym, oracle:replies=FILE.jsonl or oracle:gold (swe)")
