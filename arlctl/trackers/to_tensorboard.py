"""TensorBoard: scalar events in a log directory (default RUN/exports/tensorboard), via tensorboard's own
event-file writer (no torch, no TensorFlow needed).

Each point becomes one `Event` per value: tag `<stream>/<metric>`, `step` on the stream's x-axis and the
row's wall time. TensorBoard stores scalars as float32. Every export opens a new event file in the same
directory; TensorBoard reads them all as one run.
"""

from __future__ import annotations

from typing import Any

from arlctl.trackers.points import Point


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, logdir: str):
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.destination = logdir
        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
        self._writer = EventFileWriter(logdir, max_queue_size=1000, flush_secs=3600)

    def send(self, points: list[Point]) -> None:
        """Queue every value, then flush: on return the events are in the file."""
        for p in points:
            for metric, value in p.values.items():
                summary = self._summary(value=[self._summary.Value(tag=f"{p.stream}/{metric}", simple_value=value)])
                self._writer.add_event(self._event(wall_time=p.wall_time, step=p.step, summary=summary))
        self._writer.flush()

    def state(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        self._writer.close()
