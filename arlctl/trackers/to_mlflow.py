"""MLflow: one MLflow run per arlctl run, in a local tracking store (default
`sqlite:///RUN/exports/mlflow/mlflow.db`, no server; any tracking URI through `--mlflow-uri`).

MLflow 3 refuses the old `file:` store unless MLFLOW_ALLOW_FILE_STORE=true; asking for a `file:` URI
explicitly sets that for this process. The run id lives in the exporter's cursor, so later exports append
to the same run. Metrics are `<stream>/<metric>` at the point's step, timestamped with its wall time.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from arlctl.errors import TerminalError
from arlctl.trackers.points import Point

BATCH = 1000  # MLflow's limit on metrics per log_batch call


class MlflowSink:
    name = "mlflow"

    def __init__(self, uri: str, experiment: str, run_name: str, state: dict[str, Any]):
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Metric
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        for name in ("mlflow", "alembic"):  # their INFO lines (creating tables...) would crowd the CLI's stderr
            logging.getLogger(name).setLevel(logging.WARNING)

        self.destination, self._metric = uri, Metric
        self._client = MlflowClient(tracking_uri=uri)
        self.run_id = state.get("run_id")
        if self.run_id:
            try:
                self._client.get_run(self.run_id)
            except MlflowException:
                raise TerminalError(f"the export cursor names MLflow run {self.run_id}, which {uri} does not hold",
                                    hint="remove RUN/exports/mlflow/cursor-*.json to export everything again") from None
            return
        found = self._client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self._client.create_experiment(experiment)
        self.run_id = self._client.create_run(experiment_id, run_name=run_name, tags={"arlctl.export": "1"}).info.run_id

    def send(self, points: list[Point]) -> None:
        """log_batch returns once the store has the metrics."""
        metrics = [self._metric(f"{p.stream}/{metric}", value, int(p.wall_time * 1000), p.step)
                   for p in points for metric, value in p.values.items()]
        for start in range(0, len(metrics), BATCH):
            self._client.log_batch(self.run_id, metrics=metrics[start:start + BATCH], synchronous=True)

    def state(self) -> dict[str, Any]:
        return {"run_id": self.run_id}

    def close(self) -> None:
        pass
