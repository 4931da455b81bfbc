"""`arlctl export`: a run's metrics reach TensorBoard, W&B (offline) and MLflow (local store) exactly once.

The fixture run's rows are written with the stages' own writers (train's per-step file, rollout's and
reward's per-invocation rows) plus two eval summaries. Each tracker is read back with its own reader --
TensorBoard's EventAccumulator, MLflow's client, W&B's protobuf records from the offline .wandb log -- and
compared with the values read straight from RUN/metrics.
"""

from __future__ import annotations

import fnmatch
import json
import math
import struct
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.stages.reward import RewardResult
from arlctl.stages.reward_job import write_reward_metrics
from arlctl.stages.rollout_job import write_rollout_metrics
from arlctl.stages.train import _write_metrics

runner = CliRunner()


def arlctl(*args: str, code: int = 0):
    result = runner.invoke(app, list(args))
    assert result.exit_code == code, result.output
    return result


def train_row(run: Path, step: int) -> None:
    _write_metrics(str(run / "metrics"), step, f"batch-{step}.parquet",
                   {"loss": 0.1 + step / 3, "lr": 1e-6 * step, "tokens": 100.0 + step, "grad_norm": 1.5 ** step,
                    "policy_version": step - 1, "warning": "", "reward_mean": float("nan")})


@pytest.fixture
def run(tmp_path) -> Path:
    run = tmp_path / "r1"
    for step in (1, 2, 3):
        train_row(run, step)
    for i, seconds in enumerate((2.5, 4.0)):
        write_rollout_metrics({"trajectories": 8 + i, "generated_tokens": 512 * (i + 1), "seconds": seconds,
                               "last_error": None, "error_causes": {}, "backend_metrics": {"busy_s": 1.25 + i}},
                              str(run / "metrics"), "hf")
        time.sleep(0.002)  # rollout names sort by their microsecond stamp
    total = RewardResult(rows=16, row_errors=["x"], seconds=3.2, reward_sum=9.0)
    write_reward_metrics(total, "math@1", str(run / "metrics"))
    for version, accuracy in ((0, 0.25), (2, 0.5)):
        where = run / "evals" / "gsm8k" / f"v{version:06d}"
        where.mkdir(parents=True)
        (where / "summary.json").write_text(json.dumps({"name": "gsm8k", "version": version, "n": 20, "passed": True,
                                                        "metrics": {"accuracy": accuracy, "mean_turns": 1.5},
                                                        "created_at": 1.8e9 + version}))
    return run


def expected(run: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} read straight from RUN/metrics and RUN/evals: what every tracker must hold."""
    out: dict[str, dict[int, float]] = {}
    counters: dict[str, int] = {}
    for path in sorted((run / "metrics").glob("*.parquet")):
        stream = path.name.split("-")[0]
        for row in pq.read_table(path).to_pylist():
            if stream == "train":
                step = row["step"]
            else:
                step = counters[stream] = counters.get(stream, 0) + 1
            for key, value in row.items():
                if key in ("step", "time") and stream == "train":
                    continue
                if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                    out.setdefault(f"{stream}/{key}", {})[step] = float(value)
    for summary in sorted((run / "evals").glob("*/v*/summary.json")):
        data = json.loads(summary.read_text())
        version = int(summary.parent.name[1:])
        out.setdefault("eval/gsm8k/n", {})[version] = float(data["n"])
        for key, value in data["metrics"].items():
            out.setdefault(f"eval/gsm8k/metrics/{key}", {})[version] = value
    return out


# ------------------------------------------------------------------------------------------ the readers


def tensorboard_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def mlflow_history(uri: str, run_id: str, tags) -> dict[str, list[tuple[int, float]]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    return {tag: [(m.step, m.value) for m in client.get_metric_history(run_id, tag)] for tag in tags}


def wandb_records(path: Path):
    """The records of one offline .wandb transaction log: a 7-byte header (":W&B", 0xBEE1, version 0), then
    32 KiB blocks of chunks (crc32 over type+data, length, type: full/first/middle/last), each record a
    serialized `wandb.proto.wandb_internal_pb2.Record`."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # too little room left in the block for a header: padding
            pos += 32768 - pos % 32768
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0:
            break
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == crc
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def wandb_history(directory: Path) -> tuple[dict[str, list[tuple[int, float]]], set[str]]:
    """{tag: [(its step metric's value, value)]} over every offline run directory, and the run ids seen. Each
    tag's x-axis is the step metric its `define_metric` record names (a glob such as "train/*")."""
    out: dict[str, list[tuple[int, float]]] = {}
    ids, axes = set(), {}
    for log in sorted(p for p in directory.glob("wandb/offline-run-*/run-*.wandb")):
        for record in wandb_records(log):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.add(record.run.run_id)
            elif kind == "metric" and record.metric.glob_name:
                axes[record.metric.glob_name] = record.metric.step_metric
            elif kind == "history":
                items = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item}
                for key, value in items.items():
                    axis = next((a for glob, a in axes.items() if fnmatch.fnmatchcase(key, glob)), None)
                    if axis is not None and key != axis:
                        out.setdefault(key, []).append((items[axis], value))
    return out, ids


def as_sorted(history: dict[str, list[tuple[int, float]]]) -> dict[str, dict[int, float]]:
    out = {}
    for tag, points in history.items():
        steps = [s for s, _ in points]
        assert len(steps) == len(set(steps)), f"{tag} was sent twice: {points}"
        out[tag] = dict(points)
    return out


# ------------------------------------------------------------------------------------------------ tests


@pytest.mark.slow
def test_every_tracker_holds_the_runs_values_once(run):
    want = expected(run)
    assert want["train/loss"] == {1: 0.1 + 1 / 3, 2: 0.1 + 2 / 3, 3: 0.1 + 3 / 3}
    assert "train/reward_mean" not in want and "train/step" not in want  # NaN is left out; step is the x-axis
    assert want["rollout/generated_tokens"] == {1: 512.0, 2: 1024.0}
    assert want["reward/rows"] == {1: 16.0} and want["eval/gsm8k/metrics/accuracy"] == {0: 0.25, 2: 0.5}

    first = json.loads(arlctl("export", str(run), "--to", "tensorboard", "--to", "wandb", "--to", "mlflow",
                              "--json").stdout)
    rows = 3 + 2 + 1 + 2  # train steps + rollout invocations + reward invocation + eval versions
    values = sum(len(points) for points in want.values())
    for tracker in ("tensorboard", "wandb", "mlflow"):
        assert first["trackers"][tracker]["rows"] == rows and first["trackers"][tracker]["values"] == values
    assert first["nonfinite_values"] == 3  # reward_mean is NaN in each train row

    # TensorBoard keeps float32 scalars.
    tb = as_sorted(tensorboard_scalars(run / "exports" / "tensorboard"))
    assert tb == {tag: {s: float(np.float32(v)) for s, v in pts.items()} for tag, pts in want.items()}
    # ...each at its row's wall time: an eval at its summary's created_at, a train step at its row's time.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "exports" / "tensorboard"))
    acc.Reload()
    assert [e.wall_time for e in acc.Scalars("eval/gsm8k/n")] == [1.8e9, 1.8e9 + 2]
    times = {r["step"]: r["time"] for p in (run / "metrics").glob("train-*") for r in pq.read_table(p).to_pylist()}
    assert {e.step: e.wall_time for e in acc.Scalars("train/loss")} == times
    wandb, ids = wandb_history(run / "exports" / "wandb")
    assert as_sorted(wandb) == want
    cursor = json.loads(next((run / "exports" / "mlflow").glob("cursor-*.json")).read_text())
    uri = first["trackers"]["mlflow"]["destination"]
    assert as_sorted(mlflow_history(uri, cursor["state"]["run_id"], want)) == want

    # A second export sends nothing, and the trackers hold what they held.
    again = json.loads(arlctl("export", str(run), "--to", "tensorboard", "--to", "wandb", "--to", "mlflow",
                              "--json").stdout)
    assert {t: r["rows"] for t, r in again["trackers"].items()} == {"tensorboard": 0, "wandb": 0, "mlflow": 0}
    assert again["trackers"]["mlflow"]["already_sent"] == rows
    assert as_sorted(tensorboard_scalars(run / "exports" / "tensorboard")) == tb
    assert as_sorted(mlflow_history(uri, cursor["state"]["run_id"], want)) == want

    # A new train step goes to the same W&B and MLflow runs, and only it.
    train_row(run, 4)
    third = json.loads(arlctl("export", str(run), "--to", "wandb", "--to", "mlflow", "--json").stdout)
    assert third["trackers"]["wandb"]["by_stream"] == {"train": 1} == third["trackers"]["mlflow"]["by_stream"]
    want = expected(run)
    assert as_sorted(mlflow_history(uri, cursor["state"]["run_id"], want)) == want
    wandb, more_ids = wandb_history(run / "exports" / "wandb")
    assert as_sorted(wandb) == want and more_ids == ids and len(ids) == 1


def test_follow_sends_a_row_written_later(run):
    from arlctl.trackers import ExportConfig
    from arlctl.trackers.export import export

    stop = threading.Event()
    cfg = ExportConfig(to=["tensorboard"], follow=True, every=0.05)
    results = []
    worker = threading.Thread(target=lambda: results.append(export(str(run), cfg, stop=stop)))
    worker.start()
    try:
        cursor_dir = run / "exports" / "tensorboard"
        wait_for(lambda: any(cursor_dir.glob("cursor-*.json")))
        train_row(run, 4)  # written while the exporter follows
        wait_for(lambda: '[1, 4]' in next(cursor_dir.glob("cursor-*.json")).read_text())
    finally:
        stop.set()
        worker.join(30)
    assert not worker.is_alive()
    assert results[0].trackers["tensorboard"].rows == 3 + 2 + 1 + 2 + 1 and results[0].polls >= 2
    tb = as_sorted(tensorboard_scalars(run / "exports" / "tensorboard"))
    assert tb["train/loss"] == {s: float(np.float32(v)) for s, v in expected(run)["train/loss"].items()}


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_an_unreadable_file_is_named_and_the_rest_is_sent(run):
    (run / "metrics" / "train-step-000009.parquet").write_bytes(b"not parquet")
    result = arlctl("export", str(run), "--to", "tensorboard", code=1)
    assert "train-step-000009.parquet" in result.output
    tb = tensorboard_scalars(run / "exports" / "tensorboard")
    assert sorted(s for s, _ in tb["train/loss"]) == [1, 2, 3]
    # Once readable it is sent, once.
    (run / "metrics" / "train-step-000009.parquet").unlink()
    train_row(run, 9)
    arlctl("export", str(run), "--to", "tensorboard")
    assert sorted(s for s, _ in tensorboard_scalars(run / "exports" / "tensorboard")["train/loss"]) == [1, 2, 3, 9]


def test_dry_run_writes_nothing_and_usage_errors(run, monkeypatch):
    out = json.loads(arlctl("export", str(run), "--to", "mlflow", "--dry-run", "--json").stdout)
    assert out["dry_run"] and out["trackers"]["mlflow"]["rows"] == 8
    assert not (run / "exports").exists()
    assert "unknown tracker" in arlctl("export", str(run), "--to", "comet", code=2).output
    assert "--to" in arlctl("export", str(run), code=2).output
    for name in [m for m in sys.modules if m == "mlflow" or m.startswith("mlflow.")] + ["mlflow"]:
        monkeypatch.setitem(sys.modules, name, None)  # as if the package were not installed
    result = arlctl("export", str(run), "--to", "mlflow", code=2)
    assert "pip install 'arlctl[trackers]'" in result.output
