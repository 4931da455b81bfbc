"""The export loop: list the run's sources, read the ones a tracker does not hold yet, send, commit.

For each tracker, one poll does:
  1. list the sources (RUN/metrics files, RUN/evals summaries) and drop those its cursor holds;
  2. read each new source once (shared by every tracker in the same poll);
  3. send them in chunks; after each chunk the tracker accepted, replace the cursor atomically.
A source is never split across chunks, so the cursor marks whole sources. A source that cannot be read is
reported (and retried next poll), never skipped in silence. One exporter per tracker directory at a time
(a run lock in RUN/exports/<tracker>/_locks), so two exporters cannot both send the same rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Any

from arlctl.trackers import ExportConfig, Sink, destination, open_sink
from arlctl.trackers.cursor import Cursor, exports_dir
from arlctl.trackers.points import COUNTER_STREAMS, Point, Read, Source, list_sources, read_source

CHUNK_SOURCES = 200  # sources per send: a cursor write every 200 rows at most


@dataclass
class TrackerReport:
    """What one tracker received in this invocation."""

    tracker: str
    destination: str
    cursor: str
    rows: int = 0
    values: int = 0
    by_stream: dict[str, int] = field(default_factory=dict)  # rows per stream
    already_sent: int = 0  # sources the cursor held at the last poll


@dataclass
class ExportResult:
    run: str
    trackers: dict[str, TrackerReport]
    polls: int = 0
    unreadable: dict[str, str] = field(default_factory=dict)  # source url -> the error, at the last poll
    skipped_files: list[str] = field(default_factory=list)  # metrics files that are not metric streams
    nonfinite_values: int = 0  # NaN/inf values left out
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary_line(self) -> str:
        verb = "would send" if self.dry_run else "sent"
        parts = [f"{t.tracker}: {verb} {t.rows} rows ({t.values} values)" for t in self.trackers.values()]
        return "; ".join(parts) + (f"; {len(self.unreadable)} unreadable" if self.unreadable else "")


class Exporter:
    """Holds each tracker's sink, cursor and lock across polls (`--follow` keeps one W&B/MLflow run open).

    with Exporter(run, cfg) as ex:
        ex.poll()
    """

    def __init__(self, run: str, cfg: ExportConfig, dry_run: bool = False, log=lambda line: None):
        cfg.check()
        self.run, self.cfg, self.dry_run, self.log = run, cfg, dry_run, log
        self.result = ExportResult(run, {}, dry_run=dry_run)
        self._cursors: dict[str, Cursor] = {}
        self._sinks: dict[str, Sink] = {}
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Exporter:
        from arlctl.io.lock import RunLock

        try:
            for tracker in dict.fromkeys(self.cfg.to):
                where = destination(tracker, self.run, self.cfg)
                if not self.dry_run:
                    self._stack.enter_context(RunLock(exports_dir(self.run, tracker), "export"))
                cursor = Cursor.load(self.run, tracker, where)
                self._cursors[tracker] = cursor
                self.result.trackers[tracker] = TrackerReport(tracker, where, cursor.url)
        except BaseException:
            self._stack.close()  # the locks taken so far
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            for sink in self._sinks.values():
                sink.close()
        finally:
            self._stack.close()

    def poll(self) -> int:
        """Send everything new to every tracker; returns the rows sent (would be sent, with dry_run)."""
        self.result.polls += 1
        listing = list_sources(self.run)
        self.result.skipped_files = listing.skipped
        self.result.unreadable = {}
        reads: dict[str, Read] = {}  # url -> points, read once per poll
        sent = 0
        for tracker, cursor in self._cursors.items():
            pending = [s for s in listing.sources if not cursor.has(s)]
            self.result.trackers[tracker].already_sent = len(listing.sources) - len(pending)
            ready = [(s, r) for s in pending if (r := self._read(s, reads)) is not None]
            for start in range(0, len(ready), CHUNK_SOURCES):
                sent += self._send(tracker, cursor, ready[start:start + CHUNK_SOURCES])
        self.result.nonfinite_values += sum(r.nonfinite for r in reads.values())
        return sent

    def _read(self, source: Source, reads: dict[str, Read]) -> Read | None:
        if source.url not in reads:
            try:
                reads[source.url] = read_source(source)
            except Exception as err:  # a corrupt or vanished file: reported, retried at the next poll
                self.result.unreadable[source.url] = f"{type(err).__name__}: {err}"
                return None
        return reads[source.url]

    def _send(self, tracker: str, cursor: Cursor, chunk: list[tuple[Source, Read]]) -> int:
        """Send one chunk (counter streams numbered from the cursor), then commit the cursor."""
        counters = dict(cursor.counters)
        points: list[Point] = []
        for source, read in chunk:
            for p in read.points:
                if source.stream in COUNTER_STREAMS:
                    counters[source.stream] = counters.get(source.stream, 0) + 1
                    p = dataclasses.replace(p, step=counters[source.stream])
                points.append(p)
        if not self.dry_run:
            sink = self._sink(tracker, cursor)
            sink.send(points)
            for source, read in chunk:
                cursor.mark(source, len(read.points))
            cursor.state = sink.state()
            cursor.save()
        report = self.result.trackers[tracker]
        report.rows += len(points)
        report.values += sum(len(p.values) for p in points)
        for p in points:
            report.by_stream[p.stream] = report.by_stream.get(p.stream, 0) + 1
        return len(points)

    def _sink(self, tracker: str, cursor: Cursor) -> Sink:
        """Opened on first use, so an export with nothing new never starts a tracker."""
        if tracker not in self._sinks:
            self._sinks[tracker] = open_sink(tracker, self.run, self.cfg, cursor.destination, cursor.state)
            self.log(f"{tracker}: writing to {cursor.destination}")
        return self._sinks[tracker]


def export(run: str, cfg: ExportConfig, dry_run: bool = False, stop: threading.Event | None = None,
           log=lambda line: None) -> ExportResult:
    """Export once, or with cfg.follow poll every cfg.every seconds until `stop` (or SIGINT/SIGTERM) is set."""
    with Exporter(run, cfg, dry_run=dry_run, log=log) as ex:
        if not cfg.follow or dry_run:
            ex.poll()
            return ex.result
        from arlctl.io.watch import watch_loop

        reported: set[str] = set()

        def once() -> int:
            sent = ex.poll()
            if sent:
                log(f"+{sent} rows; in all {ex.result.summary_line()}")
            for url in ex.result.unreadable.keys() - reported:  # each new one once, not at every poll
                log(f"unreadable (retried every poll): {url}: {ex.result.unreadable[url]}")
            reported.clear()
            reported.update(ex.result.unreadable)
            return sent

        # A round that sent rows is followed at once by another; an idle one sleeps `every` seconds.
        watch_loop(once, cfg.every, stop=stop, fail_fast=False)
        return ex.result


__all__ = ["ExportResult", "Exporter", "TrackerReport", "export"]
