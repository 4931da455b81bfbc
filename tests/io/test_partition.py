"""--worker I/N partitioning: parsing, disjoint and covering shares, stability across processes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from arlctl.errors import UsageError
from arlctl.io.partition import owns, parse_worker, partition, shard_bucket

NAMES = [f"part-20261129T2250{k:04d}Z-{k * 7919 % 65536:08x}.parquet" for k in range(1000)]


@pytest.mark.parametrize(
    ("spec", "expected"), [("0/1", (0, 1)), ("2/4", (2, 4)), (" 3/5 ", (3, 5)), (None, (0, 1)), ("", (0, 1))]
)
def test_parse_worker_accepts(spec, expected):
    assert parse_worker(spec) == expected


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("4/4", "I must be in 0..3"),
        ("-1/4", "I must be in 0..3"),
        ("0/0", "at least 1"),
        ("a/4", "whole numbers"),
        ("1", "expected I/N"),
        ("1/2/3", "expected I/N"),
    ],
)
def test_parse_worker_rejects_with_clear_message(spec, fragment):
    with pytest.raises(UsageError) as info:
        parse_worker(spec)
    assert fragment in str(info.value)
    assert info.value.exit_code == 2
    assert "--worker" in info.value.hint


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_shares_are_disjoint_and_cover_all(n):
    shares = [set(partition(NAMES, i, n)) for i in range(n)]
    assert sum(len(s) for s in shares) == len(NAMES)  # disjoint: no name counted twice
    assert set().union(*shares) == set(NAMES)  # covering
    # sha256 spreads 1000 names roughly evenly: each share within 1000/n +- 25%.
    for share in shares:
        assert abs(len(share) - len(NAMES) / n) < 0.25 * len(NAMES) / n


def test_bucket_is_sha256_of_basename():
    name = "part-x.parquet"
    expected = int.from_bytes(hashlib.sha256(b"part-x.parquet").digest()[:8], "big") % 3
    assert shard_bucket(name, 3) == expected
    # Only the basename counts: a URL or path to the same shard lands on the same worker.
    assert shard_bucket("s3://bucket/run/rollouts/part-x.parquet", 3) == expected
    assert owns("/tmp/run/rollouts/part-x.parquet", expected, 3)


def test_stable_across_processes():
    code = (
        "import json, sys; from arlctl.io.partition import shard_bucket; "
        "names = json.load(sys.stdin); print(json.dumps([shard_bucket(x, 5) for x in names]))"
    )
    results = []
    for seed in ("0", "12345"):  # different PYTHONHASHSEEDs: Python's hash() would differ, ours must not
        proc = subprocess.run(
            [sys.executable, "-c", code],
            input=json.dumps(NAMES[:200]),
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
            check=True,
        )
        results.append(json.loads(proc.stdout))
    assert results[0] == results[1] == [shard_bucket(x, 5) for x in NAMES[:200]]
