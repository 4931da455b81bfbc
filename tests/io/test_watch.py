"""Daemon mode: a real subprocess watching a directory, stopped by a signal; backoff and error policy."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from arlctl.errors import TerminalError, TransientError
from arlctl.io.shards import write_table_atomic
from arlctl.io.watch import GracefulStop, watch_loop

# A worker daemon: each input file in SRC becomes DST/<name>.parquet (one row per input line). A unit
# "works" for 0.3 s before committing, so a signal usually lands mid-unit. It checks the stop event
# between units, as stages should, so a stop never waits for the whole backlog.
WORKER = """
import os, sys, threading, time
import pyarrow as pa
from arlctl.io.shards import write_table_atomic
from arlctl.io.watch import watch_loop

src, dst = sys.argv[1], sys.argv[2]
stop = threading.Event()

def process_once():
    done = {n[:-8] for n in os.listdir(dst) if n.endswith(".parquet")}
    todo = sorted(n for n in os.listdir(src) if not n.startswith((".", "_")) and n not in done)
    units = 0
    for name in todo:
        if stop.is_set():
            break
        print("start", name, flush=True)
        lines = open(os.path.join(src, name)).read().splitlines()
        time.sleep(0.3)
        write_table_atomic(pa.table({"line": lines}), os.path.join(dst, name + ".parquet"))
        print("committed", name, flush=True)
        units += 1
    return units

stats = watch_loop(process_once, poll_s=0.1, stop=stop)
print("stopped", stats.stopped_by, stats.units, flush=True)
"""


def drop(src, name: str, lines: list[str]) -> None:
    # Inputs appear atomically too (hidden temp, then rename), as an upstream stage would write them.
    tmp = src / f".{name}.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, src / name)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_worker_subprocess_stops_on_signal_without_partial_output(tmp_path, signum):
    src, dst = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    dst.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(src), str(dst)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for k in range(3):
            drop(src, f"a{k:02d}", [f"a{k}-{j}" for j in range(k + 1)])
        events, in_flight = [], None
        while in_flight is None:  # wait until two units committed and a third has started
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            events.append(line.split())
            if line.startswith("committed a01"):
                for k in range(20):  # a backlog the worker will not get through before the signal
                    drop(src, f"b{k:02d}", [f"b{k}"])
            if line.startswith("start") and sum(e[0] == "committed" for e in events) >= 2:
                in_flight = line.split()[1]
        proc.send_signal(signum)
        rest, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    events += [line.split() for line in rest.splitlines()]
    committed = [e[1] for e in events if e[0] == "committed"]
    assert events[-1][:2] == ["stopped", signum.name]
    assert int(events[-1][2]) == len(committed)
    assert in_flight in committed  # the unit in progress when the signal came was finished, not cut
    assert events[-2] == ["committed", in_flight]  # and nothing was started after it
    assert len(committed) < 23  # it stopped between units, not after draining the backlog
    # Nothing partial or hidden left behind, and every output is whole.
    assert sorted(os.listdir(dst)) == sorted(f"{name}.parquet" for name in committed)
    for name in committed:
        table = pq.read_table(dst / f"{name}.parquet")
        assert table.column("line").to_pylist() == (src / name).read_text().splitlines()


@pytest.mark.slow
def test_loop_processes_files_dropped_while_running(tmp_path):
    src, dst = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    done: set[str] = set()

    def process_once() -> int:
        todo = sorted(set(os.listdir(src)) - done)
        for name in todo:
            write_table_atomic(pa.table({"name": [name]}), str(dst / f"{name}.parquet"))
            done.add(name)
        return len(todo)

    def dropper() -> None:
        for k in range(5):
            (src / f"f{k}").write_text("x")
            time.sleep(0.1)

    thread = threading.Thread(target=dropper)
    thread.start()
    stats = watch_loop(process_once, poll_s=0.02, idle_exit_after=0.6)
    thread.join()
    assert stats.stopped_by == "idle"
    assert stats.units == 5
    assert sorted(os.listdir(dst)) == [f"f{k}.parquet" for k in range(5)]


@pytest.mark.slow
def test_transient_errors_back_off_exponentially_and_never_end_the_loop(caplog):
    calls: list[float] = []

    def process_once() -> int:
        calls.append(time.monotonic())
        if len(calls) <= 4:
            raise TransientError("store unavailable")
        return 1 if len(calls) == 5 else 0

    with caplog.at_level(logging.ERROR, logger="arlctl.io.watch"):
        stats = watch_loop(
            process_once, poll_s=0.01, idle_exit_after=1.0, backoff_start_s=0.05, backoff_cap_s=0.15
        )
    assert (stats.transient_errors, stats.units, stats.stopped_by) == (4, 1, "idle")
    # Delays double from 0.05 and stop at the cap: 0.05, 0.10, 0.15 (capped from 0.20), 0.15.
    delays = [float(r.getMessage().split("retrying in ")[1].split("s)")[0]) for r in caplog.records]
    assert delays == [0.05, 0.1, 0.15, 0.15]
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    assert all(gap >= delay for gap, delay in zip(gaps, [0.05, 0.1, 0.15, 0.15]))


def test_store_oserror_is_transient_but_terminal_errors_obey_fail_fast():
    outcomes = [ConnectionError("reset"), TerminalError("bad config"), 1]

    def process_once() -> int:
        result = outcomes.pop(0) if outcomes else 0
        if isinstance(result, Exception):
            raise result
        return result

    stats = watch_loop(process_once, poll_s=0.01, idle_exit_after=0.05, backoff_start_s=0.01)
    assert (stats.transient_errors, stats.terminal_errors, stats.units) == (1, 1, 1)

    def always_terminal() -> int:
        raise TerminalError("bad config")

    with pytest.raises(TerminalError):
        watch_loop(always_terminal, poll_s=0.01, fail_fast=True)


def test_untyped_exception_is_a_bug_and_propagates():
    def buggy() -> int:
        raise KeyError("oops")

    with pytest.raises(KeyError):
        watch_loop(buggy, poll_s=0.01)


def test_stop_event_wakes_a_long_poll_sleep():
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    result: list = []
    # An hour's poll: a loop that did not wake on the event would outlast the generous join below.
    loop = threading.Thread(target=lambda: result.append(watch_loop(lambda: 0, poll_s=3600, stop=stop)), daemon=True)
    loop.start()
    loop.join(timeout=120)
    assert not loop.is_alive(), "the stop event did not wake the poll sleep"
    assert result[0].stopped_by == "stop"


def test_graceful_stop_in_asyncio_and_handlers_restored():
    previous = signal.getsignal(signal.SIGTERM)

    async def main() -> tuple[bool, bool, str | None]:
        async with GracefulStop() as stop:
            early = await stop.wait(0.01)  # no signal yet: a plain timed sleep
            asyncio.get_running_loop().call_later(0.1, os.kill, os.getpid(), signal.SIGTERM)
            # An hour's wait that must end on the signal; the outer bound only turns a hang into a failure.
            woke = await asyncio.wait_for(stop.wait(3600), timeout=120)
            return early, woke, stop.signal_received

    early, woke, received = asyncio.run(main())
    assert (early, woke, received) == (False, True, "SIGTERM")
    assert signal.getsignal(signal.SIGTERM) is previous
