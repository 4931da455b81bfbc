"""Sample trajectories on the page, rendered by `arlctl show`'s own renderer (arlctl/render.py `render`).

The row is printed to a recording Rich console and exported as HTML with inline styles. Every value from
the row goes through `plain` (control characters spelled out, never markup), and Rich's HTML export escapes
every text segment, so a shard's `<script>` arrives on the page as text, never as markup.
"""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console
from rich.terminal_theme import DEFAULT_TERMINAL_THEME

from arlctl.render import render

WIDTH = 110  # characters per line of a rendered trajectory
MAX_TEXT = 4000  # characters of one text field (prompt, final state, reward info) shown on the page


def render_html(row: dict[str, Any]) -> str:
    """One trajectory as an HTML `<pre>` fragment (styles inline; every text escaped by Rich)."""
    out = Console(record=True, file=io.StringIO(), width=WIDTH, color_system="truecolor", highlight=False)
    render(row, out, cut=_cut)
    return out.export_html(theme=DEFAULT_TERMINAL_THEME, inline_styles=True, code_format="<pre class=\"traj\">{code}</pre>")


def _cut(text: Any) -> str:
    text = str(text)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + f"... ({len(text) - MAX_TEXT} more characters)"
