"""`arlctl show`: one trajectory, turn by turn."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from arlctl.cli.common import console, handle_errors, plain, print_json
from arlctl.cli.query import gather_shards
from arlctl.errors import TerminalError
from arlctl.io.duck import VIEW, connect

HELP = """Show one trajectory turn by turn: the prompt, each generation (sampled, mask 1, green), each tool call and observation (environment, mask 0, dim), then the reward and its details. An id prefix is enough when it is unique.

  arlctl show 0192f3c4 RUN/rewarded

  arlctl show 0192f3c4-... RUN/rollouts --json
"""


def find_trajectory(paths: list[str], trajectory_id: str) -> dict[str, Any]:
    con = connect(gather_shards(paths))
    table = con.sql(
        f"select * from {VIEW} where starts_with(trajectory_id, $id) limit 2", params={"id": trajectory_id}
    ).to_arrow_table()
    if table.num_rows == 0:
        raise TerminalError(f"no trajectory with id {trajectory_id!r} in {', '.join(paths)}")
    if table.num_rows > 1:
        raise TerminalError(f"id prefix {trajectory_id!r} is ambiguous", hint="give more characters of the id")
    return table.to_pylist()[0]


def mask_spans(mask: list[int]) -> list[tuple[int, int]]:
    """Run-length encode the response mask: [(mask value, run length), ...]."""
    spans: list[tuple[int, int]] = []
    for m in mask:
        if spans and spans[-1][0] == m:
            spans[-1] = (m, spans[-1][1] + 1)
        else:
            spans.append((m, 1))
    return spans


def register(app: typer.Typer) -> None:
    @app.command("show", help=HELP)
    @handle_errors
    def show(
        trajectory_id: str = typer.Argument(..., help="Trajectory id or a unique prefix."),
        paths: list[str] = typer.Argument(..., help="Shard files or directories."),
        as_json: bool = typer.Option(False, "--json", help="The row as one JSON object (token lists included)."),
    ) -> None:
        row = find_trajectory(paths, trajectory_id)
        if as_json:
            row["reward_components"] = dict(row["reward_components"] or [])
            row["mask_spans"] = mask_spans(row["response_mask"])
            print_json(row)
            return
        render(row)


def render(row: dict[str, Any], out: Console = console, cut: Callable[[Any], Any] = lambda text: text) -> None:
    """Print a row for a human onto `out` (`arlctl show`; `arlctl report` records it as HTML). Every value
    from the row is data (model, env or task-file text): it goes through `plain` (control characters spelled
    out, no markup); only our own labels carry styles. `cut` shortens the long text fields."""
    version = f"v{row['policy_version']}"
    if row["policy_version_last"] != row["policy_version"]:
        version += f"..v{row['policy_version_last']}"
    head = Text.assemble(
        plain(row["trajectory_id"], "bold"), "  task ", plain(row["task_id"]), "  env ", plain(row["env"]),
        "  group ", plain(str(row["group_id"])[:8]), f"#{row['sample_index']}  policy ", plain(version),
        "\nstatus ", plain(row["status"], "bold"), " (", plain(row["finish_reason"]), ")",
        f"  turns {row['num_turns']}  tool calls {row['num_tool_calls']}  env errors {row['env_errors']}  "
        f"tokens {row['prompt_tokens']} prompt + {row['response_tokens']} response "
        f"({row['generated_tokens']} sampled)  time {row['wall_time_s']:.2f}s "
        f"(gen {row['gen_time_s']:.2f}s, env {row['env_time_s']:.2f}s)")
    out.print(Panel(head, title="trajectory", title_align="left"))
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
    out.print(Text.assemble("reward ", plain(row["reward"], "bold"), "  components ", plain(components),
                            "  version ", plain(row["reward_version"])))
    if row["reward_info"]:
        out.print(Panel(plain(cut(row["reward_info"])), title="reward info", title_align="left"))
    if row["advantage"] is not None:
        out.print(plain(f"advantage {row['advantage']:.4f}  weight {row['weight']}"))


def turn_body(turn: dict[str, Any]) -> Text:
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
