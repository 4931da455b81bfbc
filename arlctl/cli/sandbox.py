"""`arlctl sandbox`: the sandboxes' engines before a run (prefetch: every task image on every engine)."""

from __future__ import annotations

import typer

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.errors import UsageError
from arlctl.render import plain

HELP = """Sandbox engines: check them before a run.

  arlctl sandbox prefetch --tasks tasks.jsonl --docker-host unix:///run/arlctl-docker.sock --docker-host tcp://10.0.0.7:2375
"""

PREFETCH_HELP = """Make sure every docker image the tasks need is on every engine, before a run: each (engine, image) pair is checked and, when the image is missing, pulled (--no-pull: only checked), at most --parallel at once. A task's image is its `image` field (SWE-bench image tasks); tasks without one run in the default sandbox image (or --image). Engines: --docker-host (repeatable; an entry is `URL \\[max=N]` or a file of such lines), else $ARLCTL_DOCKER_HOSTS (comma-separated), else the one engine the docker backend would use. Exit 1 when any image is unavailable on any engine (missing, or the engine unreachable).

  arlctl sandbox prefetch --tasks swe_tasks.jsonl --docker-host unix:///run/arlctl-docker.sock --docker-host unix:///run/arlctl-docker-b.sock

  ARLCTL_DOCKER_HOSTS=unix:///a.sock,unix:///b.sock arlctl sandbox prefetch --tasks tasks.jsonl --parallel 8 --json | jq '.checks[] | select(.ok | not)'

  arlctl sandbox prefetch --tasks tasks.jsonl --docker-host engines.txt --no-pull
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
        as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
    ) -> None:
        import asyncio

        from arlctl.sandbox import docker_engines

        if parallel < 1:
            raise UsageError(f"--parallel must be >= 1, got {parallel}")
        engines = _engines(docker_host)
        images = _images(tasks, image)
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
        if as_json:
            print_json(
                {
                    "ok": not bad,
                    "engines": engines,
                    "images": images,
                    "unavailable": len(bad),
                    "checks": [c.to_json() for c in checks],
                }
            )
        else:
            _print_table(checks)
        if bad:
            if not as_json:
                console.print(plain(f"{len(bad)} of {total} (engine, image) pairs unavailable"))
            raise typer.Exit(1)

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


def _images(task_specs: list[str], extra: list[str]) -> list[str]:
    """Every image the tasks run in (in first-seen order), then --image ones."""
    from arlctl.envs.swe.tasks import image_of
    from arlctl.envs.tasks import load_tasks
    from arlctl.sandbox.docker import DEFAULT_IMAGE

    default = extra[0] if extra else DEFAULT_IMAGE
    images: dict[str, None] = {}
    for spec in task_specs:
        for task in load_tasks(spec, env=None, default_env="swe"):
            images[image_of(task) or default] = None
    for name in extra:
        images[name] = None
    return list(images)


def _print_table(checks) -> None:
    from rich.table import Table

    table = Table(title="images on engines", show_lines=False)
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
