"""Old import path of the run layout: everything lives in arlctl/io/run.py (kept for arlctl/cli/*)."""

from __future__ import annotations

from arlctl.io.run import STAGE_DIRS, STAGE_IO, RunLayout, metrics_dir_for, resolve_io

RunDir = RunLayout  # the old name

__all__ = ["STAGE_DIRS", "STAGE_IO", "RunDir", "RunLayout", "metrics_dir_for", "resolve_io"]
