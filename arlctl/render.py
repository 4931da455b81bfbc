"""Trajectories and other data rendered for a reader: `arlctl show` prints them, `arlctl report` records them.

Text from trajectories, task files and error messages is data, not terminal input: before it is printed
it goes through `terminal_safe` (every character outside an allowlist of printable Unicode
categories spelled out) and is handed to Rich as `Text` (`plain`), never parsed as markup. This module sits below the CLI and the report (it imports neither), so
both can use the one renderer.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

# ASCII text, the common case, is checked by one regex (the same rule as below, restricted to ASCII): the C0 controls except \n and \t (ESC starts every
# CSI/OSC sequence, \r overwrites a line) and DEL.
_ASCII_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f]")
# Outside ASCII a character is shown only when its Unicode general category is on this list: letters,
# marks, numbers, punctuation, symbols and visible spaces. Everything else is spelled out: controls (Cc:
# C0, DEL, C1 -- 0x9b is a one-byte CSI), format characters (Cf: the bidi overrides and isolates of Trojan
# Source, zero-width spaces and joiners, the U+E0000 tag block that hides text from a reader), line and
# paragraph separators (Zl, Zp), surrogates, private-use and unassigned code points. An allowlist: a code
# point nobody thought of is spelled out, not shown.
PRINTABLE_CATEGORIES = frozenset({"Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No",
                                  "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs"})


def terminal_safe(text: str) -> str:
    """`text` with every character a terminal would obey or hide spelled out (ESC -> "\\x1b", U+E0041 ->
    "\\U000e0041"), so a reader sees it instead. Newlines and tabs stay; printable text is unchanged."""
    if text.isascii():
        return _ASCII_UNSAFE.sub(lambda m: _spell(m.group()), text)
    return "".join(c if c in "\n\t" or unicodedata.category(c) in PRINTABLE_CATEGORIES else _spell(c) for c in text)


def one_line(text: str) -> str:
    """`terminal_safe(text)` with newlines and tabs spelled out too: for a name or an id, which one line
    must show whole (a planted newline in a shard name cannot start a line of its own)."""
    return terminal_safe(text).replace("\n", "\\n").replace("\t", "\\t")


def plain_line(text: Any, style: str = "") -> Text:
    """A name or an id as a Rich Text: `one_line`, never parsed as markup."""
    return Text(one_line(str(text)), style=style)


def _spell(char: str) -> str:
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def plain(text: Any, style: str = "") -> Text:
    """Data as a Rich Text: terminal-safe and never parsed as markup."""
    return Text(terminal_safe(str(text)), style=style)


def mask_spans(mask: list[int]) -> list[tuple[int, int]]:
    """Run-length encode the response mask: [(mask value, run length), ...]."""
    spans: list[tuple[int, int]] = []
    for m in mask:
        if spans and spans[-1][0] == m:
            spans[-1] = (m, spans[-1][1] + 1)
        else:
            spans.append((m, 1))
    return spans


def render(row: dict[str, Any], out: Console, cut: Callable[[Any], Any] = lambda text: text) -> None:
    """Print a row for a human onto `out` (`arlctl show`; `arlctl report` records it as HTML). Every value
    from the row is data (model, env or task-file text): it goes through `plain` (control characters spelled
    out, no markup); only our own labels carry styles. `cut` shortens the long text fields."""
    version = f"v{row['policy_version']}"
    if row["policy_version_last"] != row["policy_version"]:
        version += f"..v{row['policy_version_last']}"
    head = Text.assemble(  # names and ids on one line each: a planted newline cannot forge a field
        plain_line(row["trajectory_id"], "bold"), "  task ", plain_line(row["task_id"]), "  env ",
        plain_line(row["env"]), "  group ", plain_line(str(row["group_id"])[:8]), f"#{row['sample_index']}  policy ",
        plain_line(version), "\nstatus ", plain_line(row["status"], "bold"), " (", plain_line(row["finish_reason"]), ")",
        f"  turns {row['num_turns']}  tool calls {row['num_tool_calls']}  env errors {row['env_errors']}  "
        f"tokens {row['prompt_tokens']} prompt + {row['response_tokens']} response "
        f"({row['generated_tokens']} sampled)  time {row['wall_time_s']:.2f}s "
        f"(gen {row['gen_time_s']:.2f}s, env {row['env_time_s']:.2f}s)")
    out.print(Panel(head, title="trajectory", title_align="left"))
    if row.get("env_info"):  # schema v3: where the env ran (sandbox, engine/host, container)
        out.print(Text.assemble("ran on ", plain(cut(row["env_info"]))))
    out.print(Panel(plain(cut(row["prompt_text"]), "cyan"), title=f"prompt ({row['prompt_tokens']} tokens)",
                    title_align="left"))
    for turn in row["turns"]:
        out.print(Panel(turn_body(turn), title=Text.assemble(
            f"turn {turn['index']}  ", (f"sampled {turn['gen_len']} tok (mask 1)", "green"), "  ",
            (f"env {turn['obs_len']} tok (mask 0)", "dim"), f"  v{turn['policy_version']}  "
            f"gen {turn['gen_latency_s']:.2f}s env {turn['env_latency_s']:.2f}s"), title_align="left"))
    spans = Text("mask spans (green sampled, dim environment):")
    for m, n in mask_spans(row["response_mask"]):
        spans.append(f" {n}", style="green" if m == 1 else "dim")
    out.print(spans)
    if row["final_state"] is not None:
        out.print(Panel(plain(cut(row["final_state"])), title="final state", title_align="left"))
    components = dict(row["reward_components"] or [])
    out.print(Text.assemble("reward ", plain_line(row["reward"], "bold"), "  components ", plain_line(components),
                            "  version ", plain_line(row["reward_version"])))
    if row["reward_info"]:
        out.print(Panel(plain(cut(row["reward_info"])), title="reward info", title_align="left"))
    if row["advantage"] is not None:
        out.print(plain(f"advantage {row['advantage']:.4f}  weight {row['weight']}"))


def turn_body(turn: dict[str, Any]) -> Text:
    """One turn: the generation (green), each tool call it made, the observation (dim) and any error."""
    body = plain(turn["text"], "green")
    try:
        calls = json.loads(turn["tool_calls"] or "[]")
    except ValueError:  # a planted shard: show the raw text rather than fail
        calls = [{"name": turn["tool_calls"], "arguments": None}]
    for call in calls if isinstance(calls, list) else [calls]:
        call = call if isinstance(call, dict) else {"name": call}
        arguments = json.dumps(call.get("arguments"), ensure_ascii=False)
        body.append_text(plain(f"\n→ {call.get('name')}({arguments})", "bold yellow"))
    if turn["observation"] is not None:
        body.append_text(plain("\n" + turn["observation"], "dim"))
    if turn["error"]:
        body.append_text(plain(f"\n! {turn['error']}", "red"))
    return body
