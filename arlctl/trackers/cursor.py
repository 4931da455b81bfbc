"""The exporter's memory: which sources one tracker destination already holds, so nothing is sent twice.

One small JSON file per (tracker, destination) under RUN/exports/<tracker>/, rewritten atomically after
each batch the tracker accepted:

  {"version": 1, "tracker": "mlflow", "destination": "sqlite:///...",
   "sent": {"train": [[1, 40]], "eval/gsm8k": [[0, 0], [5, 5]], "rollout": ["rollout-...parquet", ...]},
   "counters": {"rollout": 3},            # the last invocation ordinal handed out per counter stream
   "state": {"run_id": "..."}}            # the tracker's own handle (MLflow run id, W&B run id)

Steps and versions are stored as closed ranges, so a run of 100k train steps stays a few bytes; rollout
and reward invocations (one file each) are stored by name. The window between "the tracker accepted a
batch" and "the cursor was replaced" is the only place a crash can cause a resend.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from arlctl.errors import TerminalError
from arlctl.io.fs import join
from arlctl.io.run import RunLayout
from arlctl.io.store import read_file, write_file
from arlctl.trackers.points import Source

CURSOR_VERSION = 1


def exports_dir(run: str, tracker: str) -> str:
    """RUN/exports/<tracker>: the tracker's default output and where its cursors and lock live."""
    return join(RunLayout(str(run)).exports, tracker)


def cursor_url(run: str, tracker: str, destination: str) -> str:
    """One cursor per destination: pointing a tracker somewhere new starts that destination from nothing."""
    digest = hashlib.sha256(destination.encode()).hexdigest()[:12]
    return join(exports_dir(run, tracker), f"cursor-{digest}.json")


@dataclass
class Cursor:
    tracker: str
    destination: str
    url: str
    sent: dict[str, set[int | str]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, run: str, tracker: str, destination: str) -> Cursor:
        url = cursor_url(run, tracker, destination)
        raw = read_file(url)
        if raw is None:
            return cls(tracker, destination, url)
        try:
            data = json.loads(raw)
            if data.get("version") != CURSOR_VERSION or data.get("destination") != destination:
                raise ValueError(f"version {data.get('version')}, destination {data.get('destination')!r}")
            sent = {stream: _expand(items) for stream, items in data["sent"].items()}
            return cls(tracker, destination, url, sent, dict(data.get("counters") or {}), dict(data.get("state") or {}))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise TerminalError(f"export cursor {url} is unreadable: {err}",
                                hint="remove it to send everything again to this destination") from None

    def has(self, source: Source) -> bool:
        return source.key in self.sent.get(source.stream, ())

    def mark(self, source: Source, points: int) -> None:
        """`source` is in the tracker; a counter stream's ordinal moves past its points."""
        self.sent.setdefault(source.stream, set()).add(source.key)
        if isinstance(source.key, str):
            self.counters[source.stream] = self.counters.get(source.stream, 0) + points

    def save(self) -> None:
        data = {"version": CURSOR_VERSION, "tracker": self.tracker, "destination": self.destination,
                "sent": {stream: _compact(keys) for stream, keys in sorted(self.sent.items())},
                "counters": self.counters, "state": self.state}
        write_file(self.url, json.dumps(data) + "\n")


def _compact(keys: set[int | str]) -> list[Any]:
    """Integers as closed ranges [[lo, hi], ...]; names as a sorted list."""
    numbers = sorted(k for k in keys if isinstance(k, int))
    ranges: list[list[int]] = []
    for n in numbers:
        if ranges and n == ranges[-1][1] + 1:
            ranges[-1][1] = n
        else:
            ranges.append([n, n])
    return ranges + sorted(k for k in keys if isinstance(k, str))


def _expand(items: list[Any]) -> set[int | str]:
    keys: set[int | str] = set()
    for item in items:
        if isinstance(item, str):
            keys.add(item)
        else:
            lo, hi = item
            keys.update(range(int(lo), int(hi) + 1))
    return keys
