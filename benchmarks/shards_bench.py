"""Shards vs JSONL: write throughput and an aggregate query, as ratios measured in the same run.

  python benchmarks/shards_bench.py                 # 100k trajectories, then the 1M-row aggregate
  python benchmarks/shards_bench.py --rows 20000    # quicker

The same synthetic trajectories (about 6 turns and 800 response tokens each, so that the JSONL copy fits
on disk) are written as Parquet shards through arlctl's atomic writer and as JSONL. The aggregate is
per-env mean reward, p50/p99 response_tokens and status counts:
  - DuckDB over the Parquet shards (what `arlctl query` does),
  - a Python scan of the JSONL (json.loads per line: what a JSONL pipeline does),
  - DuckDB over the JSONL (for fairness: the same engine, the row format).
Then the shards are replicated to 1M trajectories and the aggregate is timed again with DuckDB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arlctl.io.duck import connect
from arlctl.io.shards import Lineage, list_shards, write_shard
from arlctl.synthetic import synthetic_table

AGG_SQL = """
select env, avg(reward) as mean_reward,
       quantile_cont(response_tokens, 0.5) as p50, quantile_cont(response_tokens, 0.99) as p99
from trajectories group by env order by env
"""
STATUS_SQL = "select status, count(*) from trajectories group by 1 order by 1"
# The same aggregate over the JSONL copy; its path is a bound parameter, never SQL text.
JSONL_AGG_SQL = """
select env, avg(reward), quantile_cont(response_tokens, 0.5), quantile_cont(response_tokens, 0.99)
from read_json($path, columns = {env: 'VARCHAR', reward: 'FLOAT', response_tokens: 'INTEGER', status: 'VARCHAR'})
group by 1
"""


def make_blocks(rows: int, block: int, distinct_blocks: int) -> list[pa.Table]:
    """`rows` trajectories in blocks; blocks beyond the distinct ones are copies with new ids and rewards."""
    base = [synthetic_table(block // 4, 4, seed=s, mean_turns=6, tokens_per_turn=150) for s in range(distinct_blocks)]
    rng = np.random.default_rng(0)
    out = []
    for i in range(rows // block):
        t = base[i % distinct_blocks]
        if i >= distinct_blocks:
            ids = pa.array([str(uuid.UUID(bytes=rng.bytes(16), version=4)) for _ in range(t.num_rows)])
            reward = pa.array(rng.permutation(t.column("reward").to_numpy(zero_copy_only=False)), pa.float32())
            t = t.set_column(t.schema.get_field_index("trajectory_id"), t.schema.field("trajectory_id"), ids)
            t = t.set_column(t.schema.get_field_index("trace_id"), t.schema.field("trace_id"), ids)
            t = t.set_column(t.schema.get_field_index("reward"), t.schema.field("reward"), reward)
        out.append(t)
    return out


def write_parquet(blocks: list[pa.Table], directory: str) -> tuple[float, int]:
    start = time.perf_counter()
    for i, t in enumerate(blocks):
        write_shard(t, os.path.join(directory, f"part-{i:05d}.parquet"), Lineage(stage="bench"))
    elapsed = time.perf_counter() - start
    size = sum(os.path.getsize(p) for p in list_shards(directory))
    return elapsed, size


def write_jsonl(blocks: list[pa.Table], path: str) -> tuple[float, int]:
    start = time.perf_counter()
    with open(path, "w") as fh:
        for t in blocks:
            for row in t.to_pylist():
                row["started_at"] = row["started_at"].isoformat()
                row["finished_at"] = row["finished_at"].isoformat()
                fh.write(json.dumps(row) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return time.perf_counter() - start, os.path.getsize(path)


def jsonl_python_scan(path: str) -> dict:
    rewards: dict[str, list[float]] = {}
    tokens: dict[str, list[int]] = {}
    statuses: dict[str, int] = {}
    with open(path) as fh:
        for line in fh:
            row = json.loads(line)
            rewards.setdefault(row["env"], []).append(row["reward"])
            tokens.setdefault(row["env"], []).append(row["response_tokens"])
            statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    return {env: (statistics.fmean(rewards[env]), float(np.percentile(tokens[env], 50)),
                  float(np.percentile(tokens[env], 99))) for env in sorted(rewards)} | {"status": statuses}


def timed(fn, repeat: int = 3):
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--block", type=int, default=5_000)
    parser.add_argument("--distinct-blocks", type=int, default=4)
    parser.add_argument("--scale-rows", type=int, default=1_000_000)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()

    work = args.dir or tempfile.mkdtemp(prefix="arlctl-bench-")
    pq_dir, jsonl = os.path.join(work, "shards"), os.path.join(work, "rows.jsonl")
    print(f"generating {args.rows} synthetic trajectories ...", flush=True)
    blocks = make_blocks(args.rows, args.block, args.distinct_blocks)
    tokens = sum(pc.sum(t.column("response_tokens")).as_py() for t in blocks)
    print(f"  {args.rows} rows, {tokens / args.rows:.0f} response tokens per row")

    pq_s, pq_bytes = write_parquet(blocks, pq_dir)
    js_s, js_bytes = write_jsonl(blocks, jsonl)
    raw_mb = sum(t.nbytes for t in blocks) / 1e6
    print(f"write  parquet: {pq_s:6.2f} s  {raw_mb / pq_s:7.1f} MB/s of rows  file {pq_bytes / 1e6:8.1f} MB")
    print(f"write  jsonl  : {js_s:6.2f} s  {raw_mb / js_s:7.1f} MB/s of rows  file {js_bytes / 1e6:8.1f} MB")
    print(f"  parquet writes {js_s / pq_s:.1f}x faster and is {js_bytes / pq_bytes:.1f}x smaller")

    con = connect(list_shards(pq_dir))
    duck_s, duck_rows = timed(lambda: (con.execute(AGG_SQL).fetchall(), con.execute(STATUS_SQL).fetchall()))
    scan_s, scan_result = timed(lambda: jsonl_python_scan(jsonl), repeat=1)
    djs_s, _ = timed(lambda: __import__("duckdb").execute(JSONL_AGG_SQL, {"path": jsonl}).fetchall(), repeat=1)
    for env, mean, p50, _p99 in duck_rows[0]:
        ref = scan_result[env]
        assert abs(mean - ref[0]) < 1e-4 and abs(p50 - ref[1]) < 1e-6, (env, mean, ref)
    print(f"aggregate over {args.rows} rows: duckdb/parquet {duck_s * 1e3:8.1f} ms | python jsonl scan "
          f"{scan_s * 1e3:9.1f} ms | duckdb/jsonl {djs_s * 1e3:9.1f} ms")
    print(f"  ratio: parquet+duckdb is {scan_s / duck_s:.0f}x faster than a JSONL scan "
          f"({djs_s / duck_s:.0f}x faster than duckdb over the same JSONL)  goal >= 10x")

    copies = max(1, args.scale_rows // args.rows)
    for c in range(1, copies):
        for shard in list_shards(pq_dir):
            if "copy" not in shard:
                name = os.path.basename(shard).replace("part-", f"part-copy{c:02d}-")
                os.link(shard, os.path.join(pq_dir, name))
    shards = list_shards(pq_dir)
    con = connect(shards)
    n = con.execute("select count(*) from trajectories").fetchone()[0]
    big_s, _ = timed(lambda: (con.execute(AGG_SQL).fetchall(), con.execute(STATUS_SQL).fetchall()))
    print(f"aggregate over {n} rows ({len(shards)} shards): {big_s:.2f} s  goal < 3 s on 2 cores")
    if not args.dir:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
