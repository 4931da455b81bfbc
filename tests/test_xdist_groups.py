"""The suite's xdist groups hold on a real pytest-xdist run: every test of a serial group (a chaos- or
distributed-marked test, or an explicit xdist_group) runs on one worker, and the other tests still spread.
Before tests/xdist_groups.py set the id pytest 9 reads, all of them were spread over the workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

MODULE = '''
import json, os, time
import pytest

def _record(name):
    with open(os.environ["WHERE_FILE"], "a") as f:
        f.write(json.dumps([name, os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")
    time.sleep(0.2)  # long enough that an idle worker would take the next test

@pytest.mark.parametrize("i", range(4))
@pytest.mark.chaos
def test_chaos(i):
    _record("chaos")

@pytest.mark.parametrize("i", range(4))
@pytest.mark.xdist_group("engine")
def test_engine(i):
    _record("engine")

@pytest.mark.parametrize("i", range(12))
def test_free(i):
    _record("free")
'''


@pytest.mark.slow
def test_grouped_tests_share_one_worker_and_the_rest_spread(tmp_path):
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nfrom xdist_groups import pytest_collection_modifyitems\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    chaos: a serial group\n")
    (tmp_path / "test_groups.py").write_text(MODULE)
    where = tmp_path / "where.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
         str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "WHERE_FILE": str(where)},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    workers: dict[str, set[str]] = {}
    for line in where.read_text().splitlines():
        name, worker = json.loads(line)
        workers.setdefault(name, set()).add(worker)
    assert len(workers["chaos"]) == 1 and len(workers["engine"]) == 1, workers
    assert len(workers["free"]) == 2, workers  # ungrouped tests still use both workers
    assert "20 passed" in done.stdout
