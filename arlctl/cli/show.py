"""`arlctl show`: one trajectory, turn by turn."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.panel import Panel
from rich.text import Text

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.cli.query import gather_shards
from arlctl.errors import TerminalError
from arlctl.io.duck import VIEW, connect

HELP = """Show one trajectory turn by turn: the prompt, each generation (sampled, mask 1, green), each
tool call and observation (environment, mask 0, dim), then the reward and its details.
An id prefix is enough when it is unique.

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
        _render(row)


def _render(row: dict[str, Any]) -> None:
    head = (f"[bold]{row['trajectory_id']}[/]  task {row['task_id']}  env {row['env']}  "
            f"group {row['group_id'][:8]}#{row['sample_index']}  policy v{row['policy_version']}"
            f"{'' if row['policy_version_last'] == row['policy_version'] else '..v' + str(row['policy_version_last'])}\n"
            f"status [bold]{row['status']}[/] ({row['finish_reason']})  turns {row['num_turns']}  "
            f"tool calls {row['num_tool_calls']}  env errors {row['env_errors']}  "
            f"tokens {row['prompt_tokens']} prompt + {row['response_tokens']} response "
            f"({row['generated_tokens']} sampled)  time {row['wall_time_s']:.2f}s "
            f"(gen {row['gen_time_s']:.2f}s, env {row['env_time_s']:.2f}s)")
    console.print(Panel(head, title="trajectory", title_align="left"))
    console.print(Panel(Text(row["prompt_text"], style="cyan"), title=f"prompt ({row['prompt_tokens']} tokens)",
                        title_align="left"))
    for turn in row["turns"]:
        body = Text()
        body.append(turn["text"], style="green")
        calls = json.loads(turn["tool_calls"] or "[]")
        for call in calls:
            body.append(f"\n→ {call.get('name')}({json.dumps(call.get('arguments'))})", style="bold yellow")
        if turn["observation"] is not None:
            body.append("\n" + turn["observation"], style="dim")
        if turn["error"]:
            body.append(f"\n! {turn['error']}", style="red")
        title = (f"turn {turn['index']}  [green]sampled {turn['gen_len']} tok (mask 1)[/]  "
                 f"[dim]env {turn['obs_len']} tok (mask 0)[/]  v{turn['policy_version']}  "
                 f"gen {turn['gen_latency_s']:.2f}s env {turn['env_latency_s']:.2f}s")
        console.print(Panel(body, title=title, title_align="left"))
    spans = " ".join(f"[green]{n}[/]" if m == 1 else f"[dim]{n}[/]" for m, n in mask_spans(row["response_mask"]))
    console.print(f"mask spans (green sampled, dim environment): {spans}")
    if row["final_state"] is not None:
        console.print(Panel(row["final_state"], title="final state", title_align="left"))
    components = dict(row["reward_components"] or [])
    console.print(f"reward [bold]{row['reward']}[/]  components {components}  version {row['reward_version']}")
    if row["reward_info"]:
        console.print(Panel(row["reward_info"], title="reward info", title_align="left"))
    if row["advantage"] is not None:
        console.print(f"advantage {row['advantage']:.4f}  weight {row['weight']}")
