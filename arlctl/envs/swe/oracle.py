"""Scripted Policies for swe: `--policy oracle:gold` applies each task's gold patch through the tools;
`--policy oracle:empty` submits the repository untouched (SWE-bench's empty-patch check: reward 0).

It proves the swe pipeline end to end (rollout -> reward must give 1.0 on every built-in task) without a
model. The gold patch is the task row's own `patch` (a SWE-bench row from --tasks), else the built-in
suite's task of that instance_id. Each generate call decodes the prompt, finds the task from the "(task <instance_id>)" line the
swe env writes into the first user message, and answers with one hermes tool call per turn: an
edit_file per hunk of the gold patch (create_file for new files, bash rm for deleted ones), then
run_tests, then submit. The turn number is read from the prompt (how many calls it already holds), so
the policy keeps no state between calls and any number of trajectories can share it.
Token ids come from the real tokenizer; every log-prob is 0.0 (the script is deterministic) and each turn
ends with the chat template's end-of-message token, so finish_reason is "stop".
It lives with the swe env because it reads what only that env knows (task suites, gold patches, the prompt
the env writes); inference/ stays below envs/ and never imports it (the loader does, by this path).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from arlctl.envs.swe.diffs import paths_in, split_sections
from arlctl.envs.swe.tasks import load_suite_task, prepare_snapshot
from arlctl.errors import UsageError
from arlctl.inference.scripted import ScriptedPolicy

_TASK_RE = re.compile(r"\(task ([A-Za-z0-9_.\-/]+)\)")


def gold_tool_calls(patch: str, originals: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Tool calls (name, arguments) that turn the buggy files into the gold ones, hunk by hunk.

    With `originals` (path -> buggy text), each hunk's context is trimmed to the least that still makes
    its old text unique in the file, which keeps every call short.
    """
    calls: list[dict[str, Any]] = []
    for section in split_sections(patch):
        lines = section.text.splitlines(keepends=True)
        hunks = _hunks(lines)
        if section.old_path is None and section.new_path:
            content = "".join(line[1:] for hunk in hunks for line in hunk if line.startswith("+"))
            calls.append({"name": "create_file", "arguments": {"path": section.new_path, "content": content}})
        elif section.new_path is None and section.old_path:
            calls.append({"name": "bash", "arguments": {"command": f"rm -f -- '{section.old_path}'"}})
        else:
            original = (originals or {}).get(section.new_path)
            for hunk in hunks:
                old, new = _shortest_unique(hunk, original)
                calls.append({"name": "edit_file", "arguments": {"path": section.new_path, "old": old, "new": new}})
    return calls


def _texts(hunk: list[str]) -> tuple[str, str]:
    old = "".join(line[1:] for line in hunk if line[:1] in (" ", "-"))
    new = "".join(line[1:] for line in hunk if line[:1] in (" ", "+"))
    return old, new


def _shortest_unique(hunk: list[str], original: str | None) -> tuple[str, str]:
    if original is None:
        return _texts(hunk)
    lead = next((i for i, line in enumerate(hunk) if line[:1] != " "), len(hunk))
    trail = next((i for i, line in enumerate(reversed(hunk)) if line[:1] != " "), len(hunk))
    for keep in range(lead + trail + 1):  # fewest context lines first
        for keep_lead in range(min(keep, lead) + 1):
            keep_trail = keep - keep_lead
            if keep_trail > trail:
                continue
            old, new = _texts(hunk[lead - keep_lead : len(hunk) - trail + keep_trail])
            if old and original.count(old) == 1:
                return old, new
    return _texts(hunk)


def _hunks(lines: list[str]) -> list[list[str]]:
    hunks: list[list[str]] = []
    for line in lines:
        if line.startswith("@@"):
            hunks.append([])
        elif hunks and line[:1] in (" ", "-", "+"):
            hunks[-1].append(line if line.endswith("\n") else line + "\n")
        elif hunks and line.startswith("\\"):  # "\ No newline at end of file": drop the last newline
            last = hunks[-1][-1]
            hunks[-1][-1] = last[:-1] if last.endswith("\n") else last
    return hunks


def render_calls(calls: list[dict[str, Any]]) -> str:
    return "\n".join(f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>" for call in calls)


class OraclePolicy(ScriptedPolicy):
    """A scripted policy that replays gold patches. `tasks`: instance_id -> task dict."""

    def __init__(self, tokenizer: Any, tasks: dict[str, dict[str, Any]] | None = None, name: str = "oracle:gold"):
        super().__init__(tokenizer, name)  # its script is the method below; each turn ends as a model's would
        self.submit_only = name == "oracle:empty"
        self.tasks = dict(tasks or {})

    def _task(self, instance_id: str) -> dict[str, Any]:
        if instance_id not in self.tasks:
            self.tasks[instance_id] = load_suite_task(instance_id)
        return self.tasks[instance_id]

    def _originals(self, task: dict[str, Any]) -> dict[str, str]:
        """The buggy text of each file the gold patch edits, read from the task's snapshot."""
        root = Path(prepare_snapshot(task))
        return {p: (root / p).read_text(encoding="utf-8") for p in paths_in(task["patch"]) if (root / p).is_file()}

    def script(self, prompt: str) -> str:
        """The reply text for a decoded prompt."""
        match = _TASK_RE.search(prompt)
        if match is None:
            raise UsageError("oracle:gold works only with --env swe prompts (no '(task ID)' line found)")
        if self.submit_only:
            return render_calls([{"name": "submit", "arguments": {}}])
        task = self._task(match.group(1))
        plan = [*gold_tool_calls(task["patch"], self._originals(task)), {"name": "run_tests", "arguments": {}},
                {"name": "submit", "arguments": {}}]
        # After the issue text only our own earlier turns hold tool calls: that count is where we are.
        done = prompt[match.end() :].count("<tool_call>")
        return render_calls([plan[min(done, len(plan) - 1)]])


def load_oracle(spec: str, tokenizer: Any, tasks: list[dict[str, Any]] | None = None) -> OraclePolicy:
    """`oracle:gold` / `oracle:empty` -> an OraclePolicy; tasks (e.g. from a JSONL file) override the
    built-in suite."""
    if spec not in ("oracle:gold", "oracle:empty"):
        raise UsageError(f"unknown oracle policy {spec!r}", hint="the scripted policies are oracle:gold and oracle:empty")
    by_id = {str(t.get("instance_id") or t["task_id"]): t for t in tasks or [] if t.get("patch")}
    return OraclePolicy(tokenizer, by_id, name=spec)
