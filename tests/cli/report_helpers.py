"""A small real run for the `arlctl report` tests, built through the CLI like the integration tests.

Two learning iterations of the tiny random model on `first-token` (rollout -> reward -> filter -> train ->
sync), so there are two policy versions, several optimizer steps and trained rows with a lag; then one
rollout of `math` with a scripted policy (`oracle:replies=`) whose replies call the calculator, write a
malformed call, answer, and carry hostile text (`<script>`), rewarded but never trained on; and `arlctl eval`
of version 0 and of the latest version (RUN/evals/heldout/vNNNNNN).
"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.envs.tasks import load_tasks

runner = CliRunner()

HOSTILE = '<script>document.title="pwned"</script><img src=x onerror=alert(1)>'
MATH_TASKS = "builtin:math?n=3&seed=0"


def arlctl(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def math_replies(path: Path) -> Path:
    """One scripted reply per math task: a calculator call (with hostile text around it), a malformed
    call, and a right answer."""
    tasks = load_tasks(MATH_TASKS, env="math")
    replies = [
        f'{HOSTILE} <tool_call>{{"name": "calculator", "arguments": {{"expression": "2+2"}}}}</tool_call>',
        "<tool_call>{not json at all</tool_call>",
        f"<answer>{tasks[2]['answer']}</answer>",
    ]
    path.write_text("".join(json.dumps({"task_id": t["task_id"], "reply": r}) + "\n" for t, r in zip(tasks, replies)))
    return path


def build_run(root: Path) -> str:
    """The run described in the module docstring, at root/run; returns its path."""
    run = str(root / "run")
    for i in range(2):
        policy = f"{run}/policy" if i else "tiny"
        arlctl("rollout", "--env", "first-token", "--tasks", f"builtin:first-token?n=6&seed={i}",
               "--policy", policy, "--run", run, "-G", "4", "--max-turns", "1", "--max-new-tokens", "1",
               "--seed", str(i), "--prefix", f"it{i:04d}", "--flush-groups", "1000", "-q")
        arlctl("reward", "--run", run, "--reward", "first-token")
        arlctl("filter", "--run", run, "--batch-groups", "2", "--policy-dir", f"{run}/policy")
        arlctl("train", "--run", run, "--policy", "tiny", "--lr", "1e-2")
        arlctl("sync", "--run", run)
    replies = math_replies(root / "replies.jsonl")
    arlctl("rollout", "--env", "math", "--tasks", MATH_TASKS, "--policy", f"oracle:replies={replies}",
           "--run", run, "-G", "2", "--max-turns", "3", "--max-new-tokens", "96", "--prefix", "math", "-q")
    arlctl("reward", "--run", run, "--reward", "auto")
    for policy in ("tiny", f"{run}/policy"):  # held-out evals of version 0 and of the latest version
        arlctl("eval", "--run", run, "--policy", policy, "--tasks", "builtin:first-token?n=6&seed=99",
               "--env", "first-token", "--samples", "2", "--max-turns", "1", "--max-new-tokens", "1", "-q")
    return run
