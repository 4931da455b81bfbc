"""`arlctl swe`: tools for the swe environment's task rows (prepare: give rows the probe form trusted grading needs)."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import typer

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.errors import TerminalError, TransientError, UsageError
from arlctl.render import plain

HELP = """SWE task rows: prepare them for trusted (probe) grading."""

PREPARE_HELP = """Give every SWE-bench-format row the probe form its grading needs to be trusted, and write the prepared rows to OUT/tasks.jsonl (atomically; a per-row report goes to OUT/prepare.json).

For each row the graded test files are rewritten on the host into probe form (no code of the row runs there); then, in fresh sandboxes of the row's backend, the probe tests run on the gold fix (the records become the row's probe_expected, kept in the prepared row on the host, never inside a sandbox), on the gold fix again and on the buggy code, and the original tests run in-process on both. A test is converted only when its probe verdict equals pytest's on the buggy and on the gold code; otherwise it is unconvertible (a check the probe form cannot express), disagrees (the verdicts differ, or a value changes between runs) or broken (pytest itself fails it on the gold fix), with the cause. A row is graded by probes (trusted) only when every FAIL_TO_PASS and PASS_TO_PASS test is converted; any other row is graded in-process, its reward_info says trusted: false, and `arlctl filter` drops it unless --keep-untrusted.

TASKS: a JSONL, JSON (a list of rows) or Parquet file of SWE-bench rows (each with repo_snapshot, repo_path + base_commit, or image), or builtin:swe (its probe fields are rebuilt). Exit 1 when a row could not be prepared at all (it is named, and left out of OUT), 2 on usage errors, 75 when the sandbox is unavailable.

  arlctl swe prepare swe_rows.jsonl --out prepared/

  arlctl swe prepare 'builtin:swe?n=4' --out /tmp/p -j 2 --json | jq .tests

  arlctl swe prepare swebench_lite.parquet --out prepared/ --sandbox docker -j 8

  arlctl rollout --env swe --tasks prepared/tasks.jsonl --policy oracle:gold --out /tmp/r
"""

PARSERS_HELP = """List the log parsers of the installed swebench package and the repositories it maps to each.

A row of a repository named here is graded from its runner's log with that parser; a row of any other repository names one in its log_parser field (with or without the parse_log_ prefix).

  arlctl swe parsers

  arlctl swe parsers --json | jq 'to_entries[] | select(.value | index("django/django"))'
"""

SANDBOXES = ("bwrap", "docker")
MAX_CAUSES_SHOWN = 8
MAX_DISAGREEMENTS_SHOWN = 20


def load_rows(spec: str) -> list[dict[str, Any]]:
    """The rows a TASKS argument names: a .json list of rows, or any task source of `arlctl rollout --tasks`
    (JSONL, Parquet, builtin:swe), every row an swe task."""
    from arlctl.envs.tasks import load_tasks

    if spec.endswith(".json"):
        path = Path(spec)
        if not path.is_file():
            raise UsageError(f"task file not found: {spec}")
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as err:
            raise UsageError(f"{spec}: not a JSON file: {err}") from None
        if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
            raise UsageError(f"{spec}: a .json task file holds a non-empty list of row objects",
                             hint="or give a JSONL file, one row per line")
        seen: set[str] = set()
        for position, row in enumerate(rows, start=1):
            task_id = row.get("task_id") or row.get("instance_id")
            if not isinstance(task_id, str | int) or isinstance(task_id, bool) or task_id == "":
                raise UsageError(f"{spec}: row {position} has no instance_id / task_id")
            row["task_id"] = str(task_id)
            if row["task_id"] in seen:
                raise UsageError(f"{spec}: duplicate task_id {row['task_id']!r} (row {position})")
            seen.add(row["task_id"])
            row.setdefault("env", "swe")
            if row["env"] != "swe":
                raise UsageError(f"{spec}: row {row['task_id']!r} is for env {row['env']!r}, not swe")
        return rows
    return load_tasks(spec, env="swe")


def check_sandbox(kind: str, rows: list[dict[str, Any]]) -> None:
    """Usage errors for a backend the rows cannot use; a TransientError (exit 75) when it is not there."""
    from arlctl.envs.swe.tasks import image_of

    if kind not in SANDBOXES:
        raise UsageError(f"--sandbox must be one of {', '.join(SANDBOXES)}, not {kind!r}")
    images = [r["task_id"] for r in rows if image_of(r)]
    if images and kind != "docker":
        raise UsageError(f"{len(images)} row(s) are image tasks ({images[0]}, ...): they are prepared in their "
                         "own image's container", hint="use --sandbox docker")
    if kind == "bwrap":
        from arlctl.sandbox.bwrap import bwrap_available

        if not bwrap_available():
            raise TransientError("the bwrap sandbox is unavailable: bwrap is not installed",
                                 hint="apt-get install bubblewrap, or use --sandbox docker")
    else:
        from arlctl.sandbox.docker import docker_client

        docker_client(timeout=10).close()  # SandboxError (exit 75) when no engine answers


def summarize(results: list[Any], seconds: float, out: str) -> dict[str, Any]:
    """The one summary object (--json) of a prepare run."""
    tests = Counter(t["status"] for r in results for t in r.tests)
    causes = Counter(t["cause"] for r in results for t in r.tests if t["status"] == "unconvertible")
    return {
        "out": out, "rows": len(results), "prepared": sum(r.row is not None for r in results),
        "probe_graded": sum(r.to_json()["probe_graded"] for r in results),
        "failed": [{"task_id": r.task_id, "error": r.error} for r in results if r.row is None],
        "tests": {s: tests.get(s, 0) for s in ("converted", "unconvertible", "disagrees", "broken")},
        "unconvertible_causes": dict(causes.most_common()),
        "disagreements": [{"task_id": r.task_id, "id": t["id"], "status": t["status"], "cause": t["cause"]}
                          for r in results for t in r.tests if t["status"] in ("disagrees", "broken")],
        "seconds": round(seconds, 1),
        "results": [r.to_json() for r in results],
    }


def _row_line(done: Any) -> str:
    if done.row is None:
        return f"failed    {done.task_id}: {done.error}"
    info = done.to_json()
    state = "probe" if info["probe_graded"] else "untrusted"
    return (f"{state:<9} {done.task_id}: {info['converted']} converted, {info['unconvertible']} unconvertible, "
            f"{info['disagrees']} disagree, {info['broken']} broken")


def _render(summary: dict[str, Any]) -> None:
    t = summary["tests"]
    console.print(plain(f"swe prepare: {summary['rows']} rows, {summary['prepared']} prepared, "
                        f"{summary['probe_graded']} probe-graded (trusted), {len(summary['failed'])} failed, "
                        f"{summary['seconds']} s"), soft_wrap=True)
    console.print(plain(f"tests: {t['converted']} converted, {t['unconvertible']} unconvertible, "
                        f"{t['disagrees']} disagree with pytest, {t['broken']} broken"), soft_wrap=True)
    for cause, n in list(summary["unconvertible_causes"].items())[:MAX_CAUSES_SHOWN]:
        console.print(plain(f"  unconvertible x{n}: {cause}"), soft_wrap=True)
    extra = len(summary["unconvertible_causes"]) - MAX_CAUSES_SHOWN
    if extra > 0:
        console.print(f"  ... and {extra} more causes (--json lists them all)")
    for d in summary["disagreements"][:MAX_DISAGREEMENTS_SHOWN]:
        console.print(plain(f"  {d['status']}: {d['task_id']} {d['id']}: {d['cause']}"), soft_wrap=True)
    extra = len(summary["disagreements"]) - MAX_DISAGREEMENTS_SHOWN
    if extra > 0:
        console.print(f"  ... and {extra} more (--json lists them all)")
    console.print(plain(f"wrote {summary['out']}"), soft_wrap=True)


def register(app: typer.Typer) -> None:
    swe_app = typer.Typer(help=HELP, no_args_is_help=True, rich_markup_mode="rich")

    @swe_app.command("prepare", help=PREPARE_HELP)
    @handle_errors
    def prepare_cmd(
        tasks: str = typer.Argument(..., metavar="TASKS", help="JSONL / JSON / Parquet file of SWE-bench rows, or builtin:swe."),
        out: str = typer.Option(..., "--out", help="Directory for tasks.jsonl (the prepared rows) and prepare.json."),
        sandbox: str = typer.Option("bwrap", "--sandbox", help="Backend of the grading runs: bwrap | docker."),
        jobs: int = typer.Option(2, "-j", "--jobs", help="Rows prepared at once (each runs 5 sandboxes in turn)."),
        timeout: float = typer.Option(120.0, "--timeout", help="Seconds one test run may take."),
        as_json: bool = typer.Option(False, "--json", help="One JSON summary object on stdout."),
    ) -> None:
        import asyncio

        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from arlctl.envs.swe.grader import sandbox_factory
        from arlctl.envs.swe.prepare import prepare_rows, write_prepared

        if jobs < 1:
            raise UsageError(f"-j/--jobs must be >= 1, got {jobs}")
        if not (timeout > 0 and timeout < 86400):
            raise UsageError(f"--timeout must be a number of seconds in (0, 86400), got {timeout}")
        out_dir = Path(out)
        if out_dir.exists() and not out_dir.is_dir():
            raise UsageError(f"--out {out} is not a directory")
        rows = load_rows(tasks)
        check_sandbox(sandbox, rows)
        started = time.monotonic()
        with Progress(TextColumn("[bold]prepare"), BarColumn(), MofNCompleteColumn(), TextColumn("rows"),
                      TimeElapsedColumn(), console=console, transient=False) as progress:
            bar = progress.add_task("prepare", total=len(rows))

            def on_done(done: Any) -> None:
                progress.console.print(plain(_row_line(done)), soft_wrap=True)
                progress.advance(bar)

            results = asyncio.run(prepare_rows(rows, sandbox_factory(sandbox), concurrency=jobs, timeout=timeout,
                                              on_done=on_done))
        target = write_prepared(results, out_dir)
        summary = summarize(results, time.monotonic() - started, str(target))
        report = out_dir / "prepare.json"
        tmp = out_dir / ".prepare.json.tmp"
        tmp.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
        tmp.replace(report)
        _render(summary)
        if as_json:
            print_json(summary)
        if summary["failed"]:
            first = summary["failed"][0]
            raise TerminalError(f"{len(summary['failed'])} row(s) could not be prepared, e.g. "
                                f"{first['task_id']}: {first['error']}",
                                hint=f"they are left out of {target}; {report} has every row's report")

    @swe_app.command("parsers", help=PARSERS_HELP)
    @handle_errors
    def parsers_cmd(
        as_json: bool = typer.Option(False, "--json", help="One JSON object: parser -> the repos it is mapped to."),
    ) -> None:
        from arlctl.envs.swe import official

        try:
            keys, repos = official.registry(), official.repo_parsers()
        except ImportError:
            raise UsageError(official.MISSING_PACKAGE) from None
        # by function: an alias (parse_log_flask is parse_log_pytest) lists the repos of the function it names
        table = {key: sorted(r for r, k in repos.items() if keys[k] is keys[key]) for key in sorted(keys)}
        if as_json:
            print_json(table)
            return
        for key, mapped in table.items():
            console.print(plain(f"{key.removeprefix(official.PREFIX):<28} {', '.join(mapped) or '-'}"), soft_wrap=True)
        console.print(plain(f"{len(table)} parsers, {len(repos)} repositories (the swebench package's own maps)"))

    app.add_typer(swe_app, name="swe", help="SWE task rows: prepare them for trusted (probe) grading; list log parsers.")
