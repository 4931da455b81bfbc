"""`arlctl sandbox`: the sandboxes' engines before a run (prefetch: every task image on every engine)."""

from __future__ import annotations

import typer

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.errors import UsageError
from arlctl.render import plain

HELP = """Sandbox engines: check them before a run.

  arlctl sandbox prefetch --tasks tasks.jsonl --docker-host unix:///run/arlctl-docker.sock --docker-host tcp://10.0.0.7:2375
"""

PREFETCH_HELP = """Make sure every docker image the tasks need is on every engine, before a run: each distinct image is checked once per engine and, when missing, pulled (--no-pull: only checked), at most --parallel at once; a file of thousands of rows naming a few hundred images costs a few hundred lookups per engine. A task's image is its `image` field (SWE-bench image tasks); tasks without one run in the default sandbox image (or --image). Engines: --docker-host (repeatable; an entry is `URL \\[max=N]` or a file of such lines), else $ARLCTL_DOCKER_HOSTS (comma-separated), else the one engine the docker backend would use. The summary lists, per engine, the images it lacks and how many, then the images on no engine at all (--json: `missing`, `missing_count`, `nowhere`; `checks` has every pair).

Exit code: 1 when some image is on no engine (its tasks cannot run: a rollout ends them env_error), or when every engine is unreachable; else 1 when any engine lacks any image (missing there, or the engine unreachable), unless --allow-partial, which accepts that: placement starts each sandbox on an engine that holds its image; else 0.

  arlctl sandbox prefetch --tasks swe_tasks.jsonl --docker-host unix:///run/arlctl-docker.sock --docker-host unix:///run/arlctl-docker-b.sock

  ARLCTL_DOCKER_HOSTS=unix:///a.sock,unix:///b.sock arlctl sandbox prefetch --tasks tasks.jsonl --parallel 8 --json | jq '.checks[] | select(.ok | not)'

  arlctl sandbox prefetch --tasks tasks.jsonl --docker-host engines.txt --no-pull --allow-partial
"""


def register(app: typer.Typer) -> None:
    sandbox_app = typer.Typer(help=HELP, no_args_is_help=True, rich_markup_mode="rich")

    @sandbox_app.command("prefetch", help=PREFETCH_HELP)
    @handle_errors
    def prefetch_cmd(
        tasks: list[str] = typer.Option([], "--tasks", help="Task file or spec (repeatable)."),
        docker_host: list[str] = typer.Option(
            [], "--docker-host", help="Engine URL \\[max=N], or a hosts file (repeatable)."
        ),
        image: list[str] = typer.Option(
            [],
            "--image",
            help="Also this image (repeatable); the image of tasks "
            "that name none (default: the sandbox base image).",
        ),
        parallel: int = typer.Option(
            4, "--parallel", help="(engine, image) pairs checked or pulled at once."
        ),
        pull: bool = typer.Option(
            True, "--pull/--no-pull", help="Pull images that are missing (else: only check)."
        ),
        allow_partial: bool = typer.Option(
            False,
            "--allow-partial",
            help="Exit 0 when every image is on at least one engine, even if some engine lacks it.",
        ),
        as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
    ) -> None:
        import asyncio
        import time

        from arlctl.sandbox import docker_engines

        if parallel < 1:
            raise UsageError(f"--parallel must be >= 1, got {parallel}")
        started = time.monotonic()
        engines = _engines(docker_host)
        images, rows = _images(tasks, image)
        if not images:
            raise UsageError("no image to prefetch", hint="pass --tasks FILE or --image NAME")
        done = [0]
        total = len(engines) * len(images)
        with console.status(f"checking {len(images)} image(s) on {len(engines)} engine(s)") as status:

            def progress(check) -> None:
                done[0] += 1
                status.update(f"{done[0]}/{total}: {check.image} on {check.engine}: {check.status}")

            checks = asyncio.run(docker_engines.prefetch(engines, images, parallel, pull, on_done=progress))
        bad = [c for c in checks if not c.ok]
        found = docker_engines.summarize(checks)
        code = _exit_code(found, bad, allow_partial)
        if as_json:
            print_json(
                {
                    "ok": not bad,
                    "exit_code": code,
                    "engines": engines,
                    "rows": rows,
                    "images": images,
                    "unavailable": len(bad),
                    "missing": {e: v["missing_images"] for e, v in found["engines"].items()},
                    "missing_count": {e: v["missing"] for e, v in found["engines"].items()},
                    "nowhere": found["nowhere"],
                    "partial": found["partial"],
                    "seconds": round(time.monotonic() - started, 3),
                    "checks": [c.to_json() for c in checks],
                }
            )
        else:
            _print_summary(found, bad, rows, len(images), pull)
            console.print(plain(f"{len(bad)} of {total} (engine, image) pairs unavailable"))
        if code:
            raise typer.Exit(code)

    app.add_typer(sandbox_app, name="sandbox", help="Sandbox engines: prefetch task images on every engine.")


def _engines(entries: list[str]) -> list[str]:
    """The engine URLs: --docker-host entries, else $ARLCTL_DOCKER_HOSTS, else the backend's one engine."""
    from arlctl.sandbox.docker import default_url
    from arlctl.sandbox.docker_engines import hosts_from

    hosts = [url for url, _ in hosts_from(entries or None)]
    if hosts:
        return hosts
    url = default_url()
    if url is None:
        raise UsageError("no docker engine named", hint="pass --docker-host URL or set ARLCTL_DOCKER_HOSTS")
    return [url]


def _images(task_specs: list[str], extra: list[str]) -> tuple[list[str], int]:
    """(every distinct image the tasks run in, in first-seen order, then --image ones; task rows read)."""
    from arlctl.envs.swe.tasks import image_of
    from arlctl.envs.tasks import load_tasks
    from arlctl.sandbox.docker import DEFAULT_IMAGE

    default = extra[0] if extra else DEFAULT_IMAGE
    images: dict[str, None] = {}
    rows = 0
    for spec in task_specs:
        for task in load_tasks(spec, env=None, default_env="swe"):
            rows += 1
            images[image_of(task) or default] = None
    for name in extra:
        images[name] = None
    return list(images), rows


def _exit_code(found: dict, bad: list, allow_partial: bool) -> int:
    """1 when an image is on no engine (or no engine answers); 1 when any pair is unavailable, unless
    allow_partial; else 0 (PREFETCH_HELP says the same to the user)."""
    if found["nowhere"] or not any(e["reachable"] for e in found["engines"].values()):
        return 1
    return 1 if bad and not allow_partial else 0


_LISTED = 8  # images named per engine in the text summary (--json names every one)


def _listed(images: list[str]) -> str:
    more = len(images) - _LISTED
    return ", ".join(images[:_LISTED]) + (f" … and {more} more" if more > 0 else "")


def _print_summary(found: dict, bad: list, rows: int, n_images: int, pulled: bool) -> None:
    """One line per engine (what it has, what it lacks), why an unreachable engine is, the images on no
    engine, then, when pulls were tried, why each failed (up to a screenful; --json has every pair). A file
    of thousands of rows stays readable."""
    from rich.table import Table

    table = Table(title=f"{n_images} image(s) of {rows} task row(s), on {len(found['engines'])} engine(s)")
    table.add_column("engine", overflow="fold", ratio=3)
    table.add_column("has", justify="right", no_wrap=True)
    table.add_column("lacks", justify="right", no_wrap=True)
    table.add_column("images it lacks", overflow="fold", ratio=4)
    for engine, entry in found["engines"].items():
        lacks = "unreachable" if not entry["reachable"] else _listed(entry["missing_images"])
        table.add_row(
            plain(engine),
            f"{entry['available']}/{entry['images']}",
            plain(str(entry["missing"]), "red" if entry["missing"] else "green"),
            plain(lacks),
        )
    console.print(table)
    for engine, entry in found["engines"].items():
        if not entry["reachable"]:
            why = next((c.detail for c in bad if c.engine == engine), "")
            console.print(plain(f"{engine} is unreachable: {why}", "red"))
    if found["nowhere"]:
        console.print(
            plain(f"{len(found['nowhere'])} image(s) on no engine: {_listed(found['nowhere'])}", "red")
        )
    failed_pulls = [c for c in bad if c.status == "missing"] if pulled else []
    if failed_pulls:
        _print_table(failed_pulls[:_MAX_ROWS])
        if len(failed_pulls) > _MAX_ROWS:
            console.print(
                plain(f"({len(failed_pulls) - _MAX_ROWS} more failed pulls: --json lists them all)")
            )


_MAX_ROWS = 40


def _print_table(checks) -> None:
    from rich.table import Table

    table = Table(title="images that could not be pulled", show_lines=False)
    table.add_column("engine", overflow="fold", ratio=3)
    table.add_column("image", overflow="fold", ratio=3)
    table.add_column("status", no_wrap=True)
    table.add_column("s", justify="right", no_wrap=True)
    table.add_column("detail", overflow="fold", ratio=2)
    for c in checks:
        style = "green" if c.ok else "red"
        detail = c.detail if len(c.detail) <= 40 else c.detail[:39] + "…"  # --json has it whole
        table.add_row(
            plain(c.engine), plain(c.image), plain(c.status, style), f"{c.seconds:.1f}", plain(detail)
        )
    console.print(table)
