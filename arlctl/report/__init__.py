"""`arlctl report`: one HTML page and PNG plots from what the stages wrote in a run directory.

  sources.py   which files a run holds, one DuckDB connection with a view over each kind
  data.py      the numbers, one query per section ("not recorded" is None, never a zero)
  plots.py     the PNGs (matplotlib Agg)
  samples.py   sample trajectories as `arlctl show` renders them, exported as escaped HTML
  page.py      the self-contained page (plots inlined, numbers also as a JSON data block)
  chromium.py  --screenshot

`build_report` reads and draws; `write_report` commits the PNGs, then the page (each file atomically, so
a browser reloading during `--watch` sees the previous page or the new one, never half of one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from arlctl.io.fs import join
from arlctl.io.store import write_file
from arlctl.report import page, plots, samples
from arlctl.report.data import collect
from arlctl.report.sources import list_run

PAGE = "report.html"
PLOTS_DIR = "plots"


@dataclass
class Report:
    numbers: dict[str, Any]
    pngs: dict[str, bytes | None]
    html: str
    written: dict[str, str] = field(default_factory=dict)  # what -> URL/path

    def to_json(self) -> dict[str, Any]:
        """The numbers the page shows, which plots it has, and where it was written."""
        return {**self.numbers, "plots": {name: png is not None for name, png in self.pngs.items()},
                "written": self.written}


def build_report(run: str, samples_count: int = 4, sample_ids: tuple[str, ...] = (),
                 refresh_s: float | None = None) -> Report:
    """Read the run, draw the plots, render the page (nothing written)."""
    data = collect(list_run(run), samples=samples_count, sample_ids=sample_ids)
    pngs = plots.draw_all(data.numbers, data.series)
    fragments = [samples.render_html(row) for row in data.samples]
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    html = page.render_page(data.numbers, pngs, fragments, stamp, refresh_s)
    return Report(numbers=data.numbers, pngs=pngs, html=html)


def write_report(report: Report, out: str) -> Report:
    """PNGs under OUT/plots/, then OUT/report.html (local or any fsspec URL)."""
    for name, png in report.pngs.items():
        if png is not None:
            report.written[f"plot:{name}"] = write_file(join(out, PLOTS_DIR, f"{name}.png"), png)
    report.written["html"] = write_file(join(out, PAGE), report.html)
    return report


__all__ = ["PAGE", "Report", "build_report", "write_report"]
