"""Snapshot transfer: how sandbox start time grows with the snapshot's size (a django checkout is 72 MB).

    python benchmarks/snapshot_transfer.py                     # frame reader + docker starts (if an engine answers)
    python benchmarks/snapshot_transfer.py --sizes 4,64 --json

Two measurements, each against a baseline taken in the same run:
1. The exec server's frame reader (arlctl/sandbox/_sbxd.py `_read_exact`) reading one frame of N MB from a
   pipe written in 64 KiB pieces, against the reader it replaced (appending each chunk to a bytes object,
   which copies the whole frame so far per chunk: quadratic). Printed: seconds of each and their ratio.
2. Docker sandbox start (create, start, snapshot copied into the workspace) for snapshots of each size,
   and the ratio of the largest to the smallest: near the size ratio means the copy is linear.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from arlctl.sandbox import _sbxd

CHUNK = 1 << 16


def _read_by_concatenation(fd: int, n: int) -> bytes | None:
    """The reader before the fix, restated as the baseline: bytes += chunk."""
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _time_reader(reader, size: int) -> float:
    payload = os.urandom(1 << 20) * (size >> 20)
    r, w = os.pipe()

    def write() -> None:
        for start in range(0, len(payload), CHUNK):
            os.write(w, payload[start:start + CHUNK])
        os.close(w)

    writer = threading.Thread(target=write)
    started = time.perf_counter()
    writer.start()
    got = reader(r, len(payload))
    elapsed = time.perf_counter() - started
    writer.join()
    os.close(r)
    assert got == payload
    return elapsed


def _snapshot(root: Path, megabytes: int) -> str:
    root.mkdir(parents=True)
    for i in range(megabytes * 4):  # 256 KiB files, like a source tree of many small ones at scale
        (root / f"f{i:05d}.txt").write_bytes(os.urandom(1 << 18))
    return str(root)


async def _docker_start(snapshot: str) -> float:
    from arlctl.sandbox import make_sandbox

    started = time.perf_counter()
    sandbox = await make_sandbox("docker", snapshot)
    elapsed = time.perf_counter() - started
    await sandbox.close()
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="4,16,64", help="snapshot / frame sizes in MB, comma-separated")
    parser.add_argument("--no-docker", action="store_true", help="the frame reader only")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    out: dict = {"reader": [], "docker": []}
    for mb in sizes:
        new = _time_reader(_sbxd._read_exact, mb << 20)
        old = _time_reader(_read_by_concatenation, mb << 20)
        out["reader"].append({"mb": mb, "bytearray_s": round(new, 4), "concatenation_s": round(old, 4),
                              "speedup": round(old / new, 1)})
    if not args.no_docker:
        try:
            from arlctl.sandbox.docker import docker_client

            docker_client().ping()
        except Exception as err:
            out["docker_skipped"] = f"no docker engine: {err}"
        else:
            with tempfile.TemporaryDirectory() as scratch:
                for mb in sizes:
                    seconds = asyncio.run(_docker_start(_snapshot(Path(scratch) / f"s{mb}", mb)))
                    out["docker"].append({"mb": mb, "start_s": round(seconds, 3)})
            first, last = out["docker"][0], out["docker"][-1]
            out["docker_ratio"] = {"size": last["mb"] / first["mb"], "time": round(last["start_s"] / first["start_s"], 2)}
    if args.json:
        print(json.dumps(out))
        return 0
    for row in out["reader"]:
        print(f"frame {row['mb']:>4} MB: bytearray {row['bytearray_s']:.3f} s, concatenation "
              f"{row['concatenation_s']:.3f} s  ({row['speedup']}x)")
    for row in out["docker"]:
        print(f"docker start, {row['mb']:>4} MB snapshot: {row['start_s']:.2f} s")
    if "docker_ratio" in out:
        print(f"largest/smallest: size x{out['docker_ratio']['size']:g}, start time x{out['docker_ratio']['time']:g}")
    if "docker_skipped" in out:
        print(out["docker_skipped"], file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
