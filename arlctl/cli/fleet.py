"""`arlctl fleet`: edit RUN/fleet.json, the inference engines an `--backend openai` rollout routes to."""

from __future__ import annotations

import asyncio
from typing import Any

import typer
from rich.table import Table

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.cli.options import DryRunOpt, JsonOpt, LockWaitOpt
from arlctl.render import plain

HELP = """The inference engines of a run, in RUN/fleet.json. A rollout with `--backend openai --backend-opt servers_file=RUN/fleet.json` re-reads the file while it runs: engines added join (they take first turns of new trajectories once GET /health answers), engines removed drain (no new trajectories; the ones they serve finish there, or move with their full token prefix if the engine goes away).

  arlctl fleet add runs/r1 http://10.0.0.5:8000 http://10.0.0.6:8000

  arlctl fleet remove runs/r1 http://10.0.0.5:8000

  arlctl fleet list runs/r1 --probe --json

Edits are atomic (the file is replaced whole) and serialised by the run's `fleet` lock, so two concurrent edits never lose one another.
"""

RunArg = typer.Argument(..., help="Run directory (any fsspec URL); the list lives in RUN/fleet.json.")
UrlsArg = typer.Argument(..., help="Engine base URLs (http://host:port; a trailing /v1 is dropped).")


def register(app: typer.Typer) -> None:
    fleet_app = typer.Typer(help=HELP, no_args_is_help=True, rich_markup_mode="rich")

    @fleet_app.command("add", help="Add engines to RUN/fleet.json (already listed: unchanged).\n\n"
                                   "  arlctl fleet add runs/r1 http://10.0.0.5:8000")
    @handle_errors
    def add(run: str = RunArg, urls: list[str] = UrlsArg, lock_wait: LockWaitOpt = 30.0,
            dry_run: DryRunOpt = False, as_json: JsonOpt = False) -> None:
        _edit(run, add=urls, remove=[], lock_wait=lock_wait, dry_run=dry_run, as_json=as_json)

    @fleet_app.command("remove", help="Remove engines from RUN/fleet.json; running rollouts drain them "
                                      "(not listed: unchanged).\n\n  arlctl fleet remove runs/r1 http://10.0.0.5:8000")
    @handle_errors
    def remove(run: str = RunArg, urls: list[str] = UrlsArg, lock_wait: LockWaitOpt = 30.0,
               dry_run: DryRunOpt = False, as_json: JsonOpt = False) -> None:
        _edit(run, add=[], remove=urls, lock_wait=lock_wait, dry_run=dry_run, as_json=as_json)

    @fleet_app.command("list", help="Show the engines in RUN/fleet.json; --probe asks each for /health and "
                                    "its policy version.\n\n  arlctl fleet list runs/r1 --probe")
    @handle_errors
    def list_cmd(run: str = RunArg,
                 probe: bool = typer.Option(False, "--probe", help="GET /health and /v1/models of each engine."),
                 as_json: JsonOpt = False) -> None:
        from arlctl.inference.fleet import fleet_path, read_servers_file

        path = fleet_path(run)
        urls = read_servers_file(path)
        rows: list[dict[str, Any]] = [{"url": u} for u in urls]
        if probe and rows:
            rows = asyncio.run(_probe_all(urls))
        if as_json:
            print_json({"file": path, "servers": rows})
            return
        if not rows:
            console.print(plain(f"{path}: no engines (arlctl fleet add {run} URL)"))
            return
        table = Table(title=path, show_lines=False)
        for column in rows[0]:
            table.add_column(column)
        for row in rows:
            table.add_row(*(plain("-" if v is None else v) for v in row.values()))
        console.print(table)

    app.add_typer(fleet_app, name="fleet")


def _edit(run: str, add: list[str], remove: list[str], lock_wait: float, dry_run: bool, as_json: bool) -> None:
    from arlctl.inference.fleet import edit_fleet, fleet_path

    before, after = edit_fleet(run, add=add, remove=remove, dry_run=dry_run, wait_s=lock_wait)
    added = [u for u in after if u not in before]
    removed = [u for u in before if u not in after]
    if as_json:
        print_json({"file": fleet_path(run), "servers": after, "added": added, "removed": removed,
                    "dry_run": dry_run})
        return
    verb = "would " if dry_run else ""
    for url in added:
        console.print(plain(f"{verb}add {url}"))
    for url in removed:
        console.print(plain(f"{verb}remove {url} (running rollouts drain it)"))
    if not added and not removed:
        console.print(plain("unchanged: " + ", ".join(add + remove) + (" already listed" if add else " not listed")))
    console.print(plain(f"{fleet_path(run)}: {len(after)} engine(s)"))


async def _probe_all(urls: list[str]) -> list[dict[str, Any]]:
    """Each engine's health and the model and version it reports (None where it does not say)."""
    import aiohttp

    async def one(http: Any, url: str) -> dict[str, Any]:
        row: dict[str, Any] = {"url": url, "healthy": "no", "model": None, "version": None}
        try:
            async with http.get(url + "/health") as resp:
                row["healthy"] = "yes" if resp.status == 200 else f"HTTP {resp.status}"
            async with http.get(url + "/v1/models") as resp:
                data = await resp.json() if resp.status == 200 else {}
            first = (data.get("data") or [{}])[0] if isinstance(data, dict) else {}
            row["model"], row["version"] = first.get("id"), first.get("version")
        except Exception as err:  # noqa: BLE001 - an engine that cannot be asked is shown as such
            row["healthy"] = f"no ({type(err).__name__})"
        return row

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3.0)) as http:
        return list(await asyncio.gather(*(one(http, u) for u in urls)))
