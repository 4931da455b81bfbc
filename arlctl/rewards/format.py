"""`--reward format`: is the final answer written in the required form? A small rule, mostly a composite's part.

    format = 1 if the response holds a final answer, the last <answer>...</answer> or \\boxed{...} (the
             math env's rule, arlctl/envs/math.py), whose content parses as one number, else 0
With the option pattern=REGEX instead: format = 1 if REGEX matches anywhere in the response text (Python
re, DOTALL), else 0. reward = format; components {"format": format}; reward_info says what was found.

It repeats the `format` component of `--reward math` as a reward of its own, so that a composite such as
`--reward 'math + 0.1*format'` or `'judge + 0.1*format'` can weigh it separately.
"""

from __future__ import annotations

import re
from typing import Any

from arlctl.envs.math import extract_answer, parse_number
from arlctl.envs.registry import register_reward
from arlctl.errors import UsageError

NAME = "format"
VERSION = "format-1"


def score(final_state: str | None, task: dict[str, Any], response_text: str, *,
          pattern: str | None = None) -> tuple[float, dict[str, float], dict[str, Any]]:
    """1.0 when the response is in the required form (see the module docstring), else 0.0."""
    text = response_text or ""
    if pattern is not None:
        try:
            found = re.search(str(pattern), text, re.DOTALL)
        except re.error as err:
            raise UsageError(f"format reward: pattern {pattern!r} is not a regular expression: {err}") from None
        value = 1.0 if found else 0.0
        return value, {"format": value}, {"pattern": str(pattern), "matched": found is not None}
    answer = extract_answer(text)
    if answer is None:
        return 0.0, {"format": 0.0}, {"note": "no <answer> tag or \\boxed{} in the response"}
    content, form = answer
    number, note = parse_number(content)
    value = 1.0 if number is not None else 0.0
    return value, {"format": value}, {"form": form, "answer": content[:200], "note": note}


register_reward(NAME, score, VERSION)
