"""`arlctl serve --reply TEXT`: a scripted policy with fixed replies, for driving harnesses and load tests.

It measures and exercises the gateway, not a model: no weights are loaded (only the tokenizer of
--policy, so prompts render and replies tokenize exactly as they would), and a reply costs a tokenizer
call. With several --reply values the i-th turn of a conversation gets the i-th reply: each call answers
with the first reply the prompt does not already contain, and the last one once all are there (so a
reply that also appears in a user message is skipped). Replies may hold hermes <tool_call> blocks, which
the gateway returns as tool calls. Rows recorded from it carry policy `scripted:<name>` and log-probs 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from arlctl.errors import UsageError
from arlctl.inference.scripted import ScriptedPolicy


def replies_script(replies: list[str]) -> Callable[[str], str]:
    """script(prompt) -> the first reply not yet in the prompt, else the last."""
    if not replies or not all(replies):
        raise UsageError("--reply needs non-empty text")

    def script(prompt: str) -> str:
        return next((reply for reply in replies if reply not in prompt), replies[-1])

    return script


def replies_policy(tokenizer: Any, name: str, replies: list[str]) -> ScriptedPolicy:
    return ScriptedPolicy(tokenizer, f"scripted:{name}", replies_script(replies))
