"""The `reverse` reward: 1 when the answer is the task's word reversed, else 0."""

from __future__ import annotations

from typing import Any

VERSION = "reverse-reward-2"  # what arlctl writes into reward_version


def score(final_state: str | None, task: dict[str, Any], response_text: str) -> tuple[float, dict, dict]:
    answer = (final_state if final_state is not None else response_text).strip()
    hit = float(answer == task["word"][::-1])
    return hit, {"exact": hit}, {"answer": answer[:32]}

