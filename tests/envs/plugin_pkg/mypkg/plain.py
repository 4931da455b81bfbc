"""A reward with no version attribute anywhere: arlctl records "mypkg.plain:half" as its version."""

from __future__ import annotations

from typing import Any


def half(final_state: str | None, task: dict[str, Any], response_text: str) -> tuple[float, dict, dict]:
    return 0.5, {}, {}
