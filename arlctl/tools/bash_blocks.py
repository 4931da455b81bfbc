"""Parser for fenced bash blocks, the mini-swe-agent convention: each turn holds exactly one command.

    ```bash
    grep -rn "def parse" src/
    ```

The block becomes ToolCall(name="bash", arguments={"command": ...}). Zero blocks, several blocks, an
unclosed fence or an empty command are ParseErrors whose message tells the model the rule, because a turn
with no command or two commands is ambiguous: which one did the model mean to run first, and did it
expect to see the first one's output before writing the second?
Fences tagged `bash`, `sh` or `shell` count; other languages (```python) are ignored as prose.
"""

from __future__ import annotations

import re

from arlctl.tools.calls import ParseError, ToolCall

BASH_TOOL_NAME = "bash"
# A fence opens at the start of a line: ```bash, optional spaces, newline; it closes at a line of ```.
_BLOCK_RE = re.compile(r"^[ \t]*```(?:bash|sh|shell)[ \t]*\n(.*?)^[ \t]*```[ \t]*$", re.DOTALL | re.MULTILINE)
_OPEN_RE = re.compile(r"^[ \t]*```(?:bash|sh|shell)[ \t]*$", re.MULTILINE)
_RULE = "Reply with exactly one ```bash block containing one command (chain steps with && if needed)."


def parse_bash_blocks(text: str, allow_none: bool = False) -> tuple[list[ToolCall], list[ParseError]]:
    """Parse one assistant turn. Returns ([call], []) on success, else ([], [error]).

    `allow_none=True` makes a turn without any block valid (([], [])), for envs where the agent may
    also finish by writing prose.
    """
    blocks = list(_BLOCK_RE.finditer(text))
    closed_spans = [match.span() for match in blocks]
    unclosed = [
        opening
        for opening in _OPEN_RE.finditer(text)
        if not any(start <= opening.start() < end for start, end in closed_spans)
    ]
    if unclosed:
        raw = text[unclosed[0].start() :]
        return [], [
            ParseError(raw=raw, message=f"unclosed ```bash block: end it with a line of ```. {_RULE}")
        ]
    if not blocks:
        if allow_none:
            return [], []
        return [], [ParseError(raw=text[-500:], message=f"no ```bash block found. {_RULE}")]
    if len(blocks) > 1:
        raw = "\n".join(match.group(0) for match in blocks)
        return [], [
            ParseError(
                raw=raw,
                message=f"found {len(blocks)} ```bash blocks, expected exactly one; "
                f"the next command can use this one's output. {_RULE}",
            )
        ]
    command = blocks[0].group(1).strip("\n")
    if not command.strip():
        return [], [ParseError(raw=blocks[0].group(0), message=f"the ```bash block is empty. {_RULE}")]
    return [ToolCall(name=BASH_TOOL_NAME, arguments={"command": command}, id="call_0")], []
