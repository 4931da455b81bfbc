"""`arlctl report`: an HTML page and PNG plots of a run, from what the stages wrote (arlctl/report/)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import typer
from rich.markup import escape

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.errors import ArlctlError, UsageError

HELP = """Render a run as one self-contained HTML page (plots inlined; it opens from disk, no server) plus the PNGs beside it, from RUN's shards, RUN/metrics and RUN/evals, read with DuckDB. Sections: reward and correct rate per policy version, eval curves, trainer metrics (loss, KL, entropy, clip fractions, grad norm, tokens/s, ...), staleness of trained rows, throughput, the time split, environment latency, prefix-cache hit rate and inference idle ratio, response length and turns, tool mix and tool-call parse failures, row statuses and error causes, and a few sample trajectories rendered as `arlctl show` does. What the run did not record says "not recorded in this run". Works on local paths and fsspec URLs (s3://...).

  arlctl report runs/r1                              # runs/r1/report/report.html + plots/*.png

  arlctl report s3://bucket/runs/r1 --out ./r1-report --screenshot docs/report.png

  arlctl report runs/r1 --watch --every 30           # re-render while the run is live (the tab reloads itself)

  arlctl report runs/r1 --json | jq '.reward_by_version, .tools.parse_failure_rate'
"""


def register(app: typer.Typer) -> None:
    @app.command("report", help=HELP)
    @handle_errors
    def report_cmd(
        run: str = typer.Argument(..., help="Run directory (local path or fsspec URL)."),
        out: str | None = typer.Option(None, "--out", help="Where report.html and plots/ go (default RUN/report)."),
        watch: bool = typer.Option(False, "--watch", help="Re-render every --every seconds until SIGTERM/SIGINT."),
        every: float = typer.Option(30.0, "--every", help="Seconds between renders with --watch."),
        samples: int = typer.Option(4, "--samples", help="Sample trajectories picked automatically (best, "
                                    "worst, a failure, the most tool calls)."),
        sample: list[str] = typer.Option([], "--sample", help="A trajectory id (or unique prefix) to show too; "
                                         "repeatable."),
        shot: Path | None = typer.Option(None, "--screenshot", help="Also write a PNG screenshot of the page "
                                         "(headless Chromium; $ARLCTL_CHROMIUM picks the binary)."),
        window: str = typer.Option("1280x4000", "--window-size", help="Screenshot size WIDTHxHEIGHT in pixels."),
        as_json: bool = typer.Option(False, "--json", help="The numbers the page shows, as one JSON object "
                                     "on stdout (one per render with --watch)."),
    ) -> None:
        from arlctl.io.fs import join
        from arlctl.io.watch import GracefulStop

        try:
            import matplotlib  # noqa: F401  (the plots; not a core dependency of the stages)
        except ImportError:
            raise UsageError("arlctl report needs matplotlib", hint="pip install matplotlib") from None
        if every <= 0:
            raise UsageError("--every must be > 0 seconds")
        if samples < 0:
            raise UsageError("--samples must be >= 0")
        size = _window_size(window) if shot else None
        if shot:
            from arlctl.report.chromium import find_chromium

            find_chromium()  # fail before the work when there is no browser
        out = out or join(run, "report")
        if not watch:
            _render_once(run, out, samples, tuple(sample), shot, size, as_json, None)
            return
        renders = 0
        with GracefulStop() as stop:
            while not stop.is_set():
                try:
                    _render_once(run, out, samples, tuple(sample), shot, size, as_json, every)
                    renders += 1
                except (ArlctlError, OSError) as err:  # a live run: a store hiccup must not end the watch
                    console.print(f"[yellow]report: render failed, retrying in {every:g}s:[/] {escape(str(err))}")
                stop.sleep(every)
        console.print(f"report: stopped after {renders} renders ({stop.signal_received or 'stop'})")


def _render_once(run: str, out: str, samples: int, sample_ids: tuple[str, ...], shot: Path | None,
                 size: tuple[int, int] | None, as_json: bool, refresh_s: float | None) -> None:
    from arlctl.io import store
    from arlctl.report import PAGE, build_report, write_report

    with console.status(f"report: reading {escape(run)}"):
        report = write_report(build_report(run, samples, sample_ids, refresh_s), out)
    drawn = sum(png is not None for png in report.pngs.values())
    console.print(f"report: {escape(report.written['html'])} ({drawn} plots; "
                  f"{len(report.pngs) - drawn} not recorded in this run)", soft_wrap=True)
    if shot is not None and size is not None:
        from arlctl.report.chromium import screenshot

        with tempfile.TemporaryDirectory(prefix="arlctl-report-") as tmp:
            html = Path(report.written["html"])
            if store.local_path(report.written["html"]) is None:  # Chromium opens local files: take a copy
                html = Path(tmp) / PAGE
                html.write_text(report.html, encoding="utf-8")
            report.written["screenshot"] = str(screenshot(html, shot, *size))
        console.print(f"report: screenshot {escape(str(shot))}")
    if as_json:
        print_json(report.to_json())


def _window_size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(part) for part in text.lower().replace(",", "x").split("x"))
    except ValueError:
        raise UsageError(f"--window-size must be WIDTHxHEIGHT, got {text!r}") from None
    if width < 100 or height < 100:
        raise UsageError("--window-size: at least 100x100 pixels")
    return width, height
