"""`--policy oracle:harness-gold`: a scripted policy that solves swe tasks through a text-based harness.

For `arlctl rollout --env swe --harness mini-swe-agent`: its first reply is one bash action (in the
harness's ```mswea_bash_command block) that writes the task's gold patch to a file and applies it with git;
its second submits (COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT, the package's own submit protocol). The task is
found from the "(task ID)" line the rollout adds to the problem statement (stages/harness_run.py), the gold
patch from the row (a SWE-bench row of --tasks) or the built-in suite. It proves the harness path end to end
without a model: the diff the harness leaves in the sandbox is graded 1.0, and a two-call session is one
row. `oracle:harness-empty` submits at once (reward 0). Deterministic, log-probs 0, state-free.
"""

from __future__ import annotations

from typing import Any

from arlctl.envs.swe.oracle import _TASK_RE, OraclePolicy
from arlctl.errors import UsageError

APPLIED = "arlctl-oracle-applied"
FENCE = "```mswea_bash_command"
SUBMIT = f"THOUGHT: the fix is in place; submitting.\n\n{FENCE}\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"


class HarnessOracle(OraclePolicy):
    def script(self, prompt: str) -> str:
        match = _TASK_RE.search(prompt)
        if match is None:
            raise UsageError("oracle:harness-gold works only on swe tasks run through --harness "
                             "(no '(task ID)' line in the prompt)")
        if self.submit_only or APPLIED in prompt[match.end():]:
            return SUBMIT
        patch = self._task(match.group(1))["patch"]
        if "ARLCTL_GOLD_EOF" in patch or "```" in patch:
            raise UsageError(f"oracle:harness-gold cannot quote the gold patch of {match.group(1)}")
        return (f"THOUGHT: apply the known fix.\n\n{FENCE}\ncat > /tmp/arlctl-gold.diff <<'ARLCTL_GOLD_EOF'\n"
                f"{patch.rstrip(chr(10))}\nARLCTL_GOLD_EOF\ngit apply /tmp/arlctl-gold.diff && echo {APPLIED}\n```")


def load_harness_oracle(spec: str, tokenizer: Any, tasks: list[dict[str, Any]] | None = None) -> HarnessOracle:
    if spec not in ("oracle:harness-gold", "oracle:harness-empty"):
        raise UsageError(f"unknown oracle policy {spec!r}", hint="oracle:harness-gold or oracle:harness-empty")
    by_id = {str(t.get("instance_id") or t["task_id"]): t for t in tasks or [] if t.get("patch")}
    policy = HarnessOracle(tokenizer, by_id, name=spec)
    policy.submit_only = spec == "oracle:harness-empty"
    return policy
