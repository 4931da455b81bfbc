"""Shared fixtures. Each test gets its own ARLCTL_HOME unless it asks for the shared model cache."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from xdist_groups import pytest_collection_modifyitems  # noqa: F401  (the serial groups, a hook)

# The repo root, as `python -m pytest` from it has it: tests import the benchmarks' shared pieces
# (benchmarks.toy_loop) when pytest runs from its own script too.
REPO_ROOT = str(Path(__file__).resolve().parents[1])
if REPO_ROOT not in sys.path:
    sys.path.append(REPO_ROOT)

# Nothing may come from a model hub at run time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The CLI processes the tests start run one intra-op thread too (below): two workers, each starting a
# process with a thread per core, would put four busy threads on two cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# The tests' models are tiny: one intra-op thread is faster than two fighting over small kernels, and it
# keeps a loaded machine usable.
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture
def run_dir(tmp_path):
    path = tmp_path / "run"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 endpoint: moto in server mode on 127.0.0.1, as a separate process."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url + "/", timeout=1)
            break
        except Exception:
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("moto server did not start")
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def s3_bucket(s3_server, monkeypatch):
    """A fresh bucket on the moto server; s3fs and DuckDB reach it through AWS_ENDPOINT_URL."""
    import uuid

    import fsspec

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    fsspec.config.conf["s3"] = {"endpoint_url": s3_server}
    bucket = f"arlctl-{uuid.uuid4().hex[:12]}"
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.mkdir(bucket)
    fs.invalidate_cache()
    yield f"s3://{bucket}"
    fsspec.config.conf.pop("s3", None)
