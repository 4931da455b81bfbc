"""Judged rows/s vs concurrency: `--reward judge` against a real `arlctl serve` endpoint.

  python benchmarks/judge_bench.py                                   # tiny model, concurrency 1 2 4 8
  python benchmarks/judge_bench.py --policy default --rows 16 --max-tokens 24
  python benchmarks/judge_bench.py --concurrency 1 4 16 --repeats 3 --json

Starts `arlctl serve --policy P --max-batch B` as a subprocess on a free port of 127.0.0.1, builds N math
rows (builtin math tasks; every other answer wrong), and rewards the same table through the reward stage
(`reward_table`) once per concurrency c, with the stage's --concurrency c and the judge's concurrency=c,
so c judge requests are in flight and the server batches them. Every request is greedy with the same
max_tokens, so each run asks the same questions and gets the same replies: only the overlap differs.
One warm-up request runs first. Reports rows/s per concurrency (the median of --repeats runs), and the
ratio to concurrency 1 measured in the same invocation (machines are noisy: compare ratios, not rates).
Null rewards are counted and printed: with the tiny model nearly every verdict is unreadable noise,
which costs the same generation as a readable one.

Then the re-reward (`measure_cache`): the same rows rewarded twice with a reward cache (arlctl/rewards/
cache.py) in a fresh directory, the second time from a newly opened cache as a later `arlctl reward`
would: the hit rate of each pass and the second pass's speed-up over the first. Null rewards are never
cached (a failed judgement is retried), and the tiny model's verdicts are unreadable noise, so this part
judges with ANY_REPLY_RUBRIC, which takes any reply as a pass: every judgement is then cacheable and the
second pass must be all hits, with no request to the server.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(policy: str, max_batch: int, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "arlctl.cli.main", "serve", "--policy", policy, "--port",
                                 str(port), "--max-batch", str(max_batch), "--idle-timeout", "30"],
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"arlctl serve exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("arlctl serve did not come up in 600 s")


def math_table(n: int) -> Any:
    """n rows of builtin math tasks, one turn each; every other row's answer is off by one."""
    from arlctl.envs.math import gold_answer
    from arlctl.envs.tasks import load_tasks
    from arlctl.schemas.rows import TrajectoryRow, Turn, rows_to_table

    rows = []
    for i, task in enumerate(load_tasks(f"builtin:math?n={n}&seed=0")[:n]):
        answer = str(gold_answer(task) + (i % 2))
        text = f"Let me work it out step by step. The result is <answer>{answer}</answer>"
        rows.append(TrajectoryRow(group_id=f"g{i}", sample_index=0, task_id=str(task.get("task_id")), env="math",
                                  env_version="math-1", task=task, policy="bench", prompt_text="", prompt_ids=[1],
                                  response_ids=[2], response_mask=[1], response_logprobs=[0.0],
                                  turns=[Turn(0, 0, 1, 0, text)], final_state=answer))
    return rows_to_table(rows)


def run_concurrency(table: Any, url: str, rubric: str, max_tokens: int, concurrency: int,
                    cache: Any = None) -> dict[str, Any]:
    """Reward `table` once with `concurrency` judge requests in flight: seconds, rows/s, null rewards."""
    from arlctl.envs.registry import get_reward
    from arlctl.stages.reward import reward_table

    reward = get_reward("judge", server=url, model="bench", rubric=rubric, max_tokens=max_tokens,
                        concurrency=concurrency, retries=0, timeout=600)
    start = time.perf_counter()
    out = reward_table(table, reward, concurrency=concurrency, cache=cache)
    seconds = time.perf_counter() - start
    rewards = out.column("reward").to_pylist()
    return {"seconds": seconds, "rows_per_s": table.num_rows / seconds, "nulls": sum(r is None for r in rewards)}


def measure(args: argparse.Namespace, url: str) -> list[dict[str, Any]]:
    table = math_table(args.rows)
    run_concurrency(math_table(1), url, args.rubric, args.max_tokens, 1)  # warm-up: first request, lazy setup
    results = []
    for c in args.concurrency:
        runs = [run_concurrency(table, url, args.rubric, args.max_tokens, c) for _ in range(args.repeats)]
        rate = statistics.median(r["rows_per_s"] for r in runs)
        results.append({"concurrency": c, "rows": table.num_rows, "rows_per_s": rate,
                        "seconds": [round(r["seconds"], 2) for r in runs], "nulls": runs[-1]["nulls"]})
    base = next((r["rows_per_s"] for r in results if r["concurrency"] == 1), results[0]["rows_per_s"])
    for r in results:
        r["ratio_vs_c1"] = r["rows_per_s"] / base
    return results


# Same prompt as the math rubric's task part; the verdict is the empty string at the start of a line, which
# every reply has: a pass whatever the judge says.
ANY_REPLY_RUBRIC = """name: any-reply
kind: judge
template: |
  Task: {prompt}
  Answer: {answer}
  Is the answer correct?
verdict: '^()'
scores: {"": 1.0}
"""


def measure_cache(args: argparse.Namespace, url: str) -> dict[str, Any]:
    """Reward the rows twice through a reward cache: (hits, misses, seconds) per pass and the speed-up."""
    from arlctl.rewards.cache import RewardCache

    table = math_table(args.rows)
    concurrency = max(args.concurrency)
    where = Path(tempfile.mkdtemp(prefix="judge-bench-cache-"))
    rubric = where / "any-reply.yaml"
    rubric.write_text(ANY_REPLY_RUBRIC)
    passes = []
    for _ in range(2):
        cache = RewardCache(str(where / "cache"))  # opened anew each pass, as a later invocation would
        run = run_concurrency(table, url, str(rubric), args.max_tokens, concurrency, cache=cache)
        cache.flush()
        lookups = max(cache.hits + cache.misses, 1)
        passes.append({"hits": cache.hits, "misses": cache.misses, "hit_rate": cache.hits / lookups,
                       "seconds": round(run["seconds"], 3), "nulls": run["nulls"]})
    return {"concurrency": concurrency, "passes": passes,
            "speedup_second_vs_first": passes[0]["seconds"] / max(passes[1]["seconds"], 1e-9)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="tiny", help="what the judge server serves: tiny, default, a path")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=16, help="judge reply budget per request")
    parser.add_argument("--max-batch", type=int, default=16, help="the server's sequences per forward pass")
    parser.add_argument("--rubric", default="math")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    log = Path(tempfile.mkdtemp(prefix="judge-bench-")) / "serve.log"
    proc, url = start_server(args.policy, args.max_batch, log)
    try:
        results = measure(args, url)
        rereward = measure_cache(args, url)
    finally:
        proc.terminate()
        proc.wait(60)
    load = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"policy": args.policy, "max_tokens": args.max_tokens, "load_avg_1m": load,
                          "results": results, "rereward": rereward}))
        return
    print(f"judge = arlctl serve --policy {args.policy} (max_batch {args.max_batch}), rubric {args.rubric}, "
          f"{args.rows} rows, max_tokens {args.max_tokens}, load average {load:.1f}")
    print(f"{'concurrency':>11} {'rows/s':>8} {'x c=1':>6} {'nulls':>6}  seconds")
    for r in results:
        print(f"{r['concurrency']:>11} {r['rows_per_s']:>8.2f} {r['ratio_vs_c1']:>6.2f} {r['nulls']:>6}  {r['seconds']}")
    first, second = rereward["passes"]
    print(f"re-reward through the cache (concurrency {rereward['concurrency']}): first pass {first['hits']} hits / "
          f"{first['misses']} misses in {first['seconds']} s; second pass {second['hits']} hits / {second['misses']} "
          f"misses (hit rate {second['hit_rate']:.0%}; nulls are never cached: {first['nulls']}) in "
          f"{second['seconds']} s: {rereward['speedup_second_vs_first']:.1f}x faster")


if __name__ == "__main__":
    main()
