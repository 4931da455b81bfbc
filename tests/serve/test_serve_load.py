"""Many concurrent agent sessions through a real `arlctl serve --reply` process lose no session.

The load driver and the record check are benchmarks/serve_load.py's (which measures the latency at 1,000
sessions); here 200 sessions of 2 turns run at once, half of them streamed, and every session must be
written exactly once: one row of 2 turns per session id, none missing, none twice, no request failed,
no session failed, and the server exits 0. Nothing is timed.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

import pytest

BENCH_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "serve_load.py"
SESSIONS, TURNS = 200, 2


@pytest.fixture(scope="module")
def serve_load():
    spec = importlib.util.spec_from_file_location("serve_load_bench", BENCH_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_200_concurrent_sessions_are_each_written_exactly_once(serve_load, tmp_path):
    report = asyncio.run(serve_load.run(SESSIONS, TURNS, stream_every=2, serial_sessions=2, workdir=tmp_path))
    assert report["errors"] == []
    assert report["concurrent"]["sessions_ended"] == SESSIONS
    assert report["concurrent"]["plain"]["n"] == report["concurrent"]["stream"]["n"] == SESSIONS // 2 * TURNS
    assert report["record_problems"] == [] and report["sessions_lost"] == 0
    assert report["sessions_failed"] == 0 and report["server_exit"] == 0
    # The check itself sees a lost session (it is not vacuous).
    problems = serve_load.lost_or_duplicated(tmp_path / "record", ["load-00000", "never-sent"], TURNS)
    assert "never-sent: not written" in problems and "load-00001: written but never sent" in problems
