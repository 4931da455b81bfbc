"""The reward cache (arlctl/rewards/cache.py) with the real `judge` reward against a real HTTP judge server
that counts the requests it answers: a second run asks the judge nothing, a changed rubric asks again, a
crashed run's grading is reused, a damaged cache file is ignored with a warning, and a null reward is never
remembered. Also the CLI's defaults (RUN/reward-cache), its counts and metrics, and a cache on s3."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow.parquet as pq
import pytest
from test_composite import by_task, math_row
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.io.shards import Lineage, list_shards, read_shard, write_shard
from arlctl.rewards import rubrics
from arlctl.rewards.cache import RewardCache
from arlctl.rewards.composite import build_reward
from arlctl.schemas.rows import rows_to_table
from arlctl.stages.reward import reward_dir

ARLCTL = [sys.executable, "-m", "arlctl.cli.main"]
RUBRIC = """name: strict
kind: judge
template: |
  Task: {prompt}
  Work: {response}
  Answer: {answer}
verdict: 'VERDICT:\\s*(PASS|FAIL)'
scores: {PASS: 1.0, FAIL: 0.0}
"""


class CountingJudge:
    """An OpenAI-compatible /v1/chat/completions on 127.0.0.1 that passes answers of 12 and counts requests.
    mode "ok" answers; "fail" answers 503; "hold" answers the first `allow` requests, then holds the rest."""

    def __init__(self) -> None:
        self.requests, self.mode, self.allow = 0, "ok", 0
        self.lock, self.release = threading.Lock(), threading.Event()
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"])).decode()
                with judge.lock:
                    judge.requests += 1
                    n = judge.requests
                if judge.mode == "hold" and n > judge.allow:
                    judge.release.wait(60)
                if judge.mode == "fail":
                    self._send(503, {"error": {"message": "judge overloaded"}})
                    return
                verdict = "PASS" if "<answer>12</answer>" in body else "FAIL"
                self._send(200, {"choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": f"VERDICT: {verdict}"}}]})

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        # shutdown() waits for the loop to look again: the default 0.5 s poll was half a second per test
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def stop(self) -> None:
        self.release.set()
        self.httpd.shutdown()


@pytest.fixture
def judge_server():
    server = CountingJudge()
    yield server
    server.stop()


def rollouts(directory, shards: int = 1, per_shard: int = 3) -> str:
    """Shards of math rows; in each, the first row answers 12 (correct, judge PASS), the others 5 (wrong)."""
    for s in range(shards):
        rows = [math_row(f"s{s}r{i}", "12" if i == 0 else "5", "12", "12" if i == 0 else "5")
                for i in range(per_shard)]
        write_shard(rows_to_table(rows), os.path.join(directory, f"part-{s}.parquet"), Lineage(stage="rollout"))
    return str(directory)


def judge_opts(server: CountingJudge, rubric) -> list[str]:
    return [f"judge.server={server.url}", "judge.model=counting-judge", f"judge.rubric={rubric}",
            "judge.retries=0", "judge.timeout=30"]


def rewards_of(directory) -> dict[str, tuple]:
    """task_id -> (reward, components, info without the judge's timing, version) of a rewarded directory."""
    out = {}
    for shard in list_shards(str(directory)):
        for task_id, row in by_task(read_shard(shard)).items():
            info = {k: v for k, v in json.loads(row["reward_info"]).items() if k != "seconds"}
            if "parts" in info:
                info["parts"] = {k: {x: y for x, y in v.items() if x != "seconds"} for k, v in info["parts"].items()}
            out[task_id] = (row["reward"], row["reward_components"], info, row["reward_version"])
    return out


def test_second_run_asks_the_judge_nothing_and_a_changed_rubric_asks_again(tmp_path, judge_server):
    src = rollouts(tmp_path / "rollouts", shards=2, per_shard=3)
    rubric = tmp_path / "rubric.yaml"
    rubric.write_text(RUBRIC)
    cache_url = str(tmp_path / "cache")
    reward = build_reward("math + 0.2*judge", judge_opts(judge_server, rubric))

    first = reward_dir(src, str(tmp_path / "out1"), reward, cache=RewardCache(cache_url))
    assert judge_server.requests == 6 and (first.cache_hits, first.cache_misses) == (0, 12)  # 6 rows x 2 parts
    got = rewards_of(tmp_path / "out1")
    # s0r0: math 1 + 0.2 * judge PASS 1 = 1.2; s0r1: 0 + 0.2 * 0 = 0
    assert got["s0r0"][0] == pytest.approx(1.2) and got["s0r1"][0] == 0.0

    second = reward_dir(src, str(tmp_path / "out2"), reward, cache=RewardCache(cache_url))
    assert judge_server.requests == 6, "the second run asked the judge again"
    assert (second.cache_hits, second.cache_misses) == (12, 0)
    assert rewards_of(tmp_path / "out2") == got  # the very same rows, cached or not

    # Another weight: the composite's version changes, its parts' do not: still no judge call.
    heavier = build_reward("math + 0.5*judge", judge_opts(judge_server, rubric))
    reward_dir(src, str(tmp_path / "out3"), heavier, cache=RewardCache(cache_url))
    assert judge_server.requests == 6
    # s0r0: 1 + 0.5 * 1 = 1.5
    assert rewards_of(tmp_path / "out3")["s0r0"][0] == pytest.approx(1.5)

    # The rubric file's content changed behind the same path: the judge's version differs, every row is asked.
    # (The rubric loader reads a file once per process, as one invocation should; a new run is a new process.)
    rubric.write_text(RUBRIC.replace("Work:", "The work:"))
    rubrics._load.cache_clear()
    edited = build_reward("math + 0.2*judge", judge_opts(judge_server, rubric))
    assert edited.version != reward.version
    third = reward_dir(src, str(tmp_path / "out4"), edited, cache=RewardCache(cache_url))
    assert judge_server.requests == 12 and third.cache_hits == 6  # math's entries are still good


def test_null_rewards_are_not_cached(tmp_path, judge_server):
    src = rollouts(tmp_path / "rollouts", per_shard=2)
    rubric = tmp_path / "rubric.yaml"
    rubric.write_text(RUBRIC)
    reward = build_reward("judge", [o.removeprefix("judge.") for o in judge_opts(judge_server, rubric)])
    judge_server.mode = "fail"
    reward_dir(src, str(tmp_path / "out1"), reward, cache=RewardCache(str(tmp_path / "cache")))
    assert judge_server.requests == 2
    assert all(v[0] is None for v in rewards_of(tmp_path / "out1").values())
    judge_server.mode = "ok"  # the judge is back: the rows are graded now, not answered from a cache of nulls
    again = reward_dir(src, str(tmp_path / "out2"), reward, cache=RewardCache(str(tmp_path / "cache")))
    assert judge_server.requests == 4 and again.cache_hits == 0
    assert rewards_of(tmp_path / "out2")["s0r0"][0] == 1.0


@pytest.mark.slow
def test_a_crashed_run_reuses_the_grading_it_cached(tmp_path, judge_server):
    """SIGKILL in the middle of a shard: the restart asks the judge only for the rows not yet graded."""
    run = tmp_path / "run"
    rollouts(run / "rollouts", per_shard=6)
    rubric = tmp_path / "rubric.yaml"
    rubric.write_text(RUBRIC)
    opts = [f"server={judge_server.url}", "model=counting-judge", f"rubric={rubric}", "retries=0"]
    argv = [*ARLCTL, "reward", "--run", str(run), "--reward", "judge", "--concurrency", "1",
            "--cache-flush-s", "0", "--json", *(a for o in opts for a in ("--reward-opt", o))]
    judge_server.mode, judge_server.allow = "hold", 3
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while judge_server.requests < 4 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert judge_server.requests == 4, proc.stderr.read().decode() if proc.poll() is not None else "no 4th request"
    proc.send_signal(signal.SIGKILL)  # rows 1-3 graded, row 4 waiting on the judge
    proc.wait(30)
    assert list_shards(str(run / "rewarded")) == []
    assert len(RewardCache(str(run / "reward-cache")).entries) == 3

    judge_server.mode = "ok"
    judge_server.release.set()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["cache_hits"], summary["cache_misses"]) == (3, 3)
    assert judge_server.requests == 4 + 3  # the held request was never answered; 3 new ones
    rewards = {k: v[0] for k, v in rewards_of(run / "rewarded").items()}
    assert rewards == {"s0r0": 1.0, **{f"s0r{i}": 0.0 for i in range(1, 6)}}


def test_a_damaged_cache_file_is_ignored_with_a_warning(tmp_path, judge_server):
    src = rollouts(tmp_path / "rollouts", shards=2, per_shard=2)
    rubric = tmp_path / "rubric.yaml"
    rubric.write_text(RUBRIC)
    reward = build_reward("judge", [o.removeprefix("judge.") for o in judge_opts(judge_server, rubric)])
    cache_dir = tmp_path / "cache"
    reward_dir(src, str(tmp_path / "out1"), reward, cache=RewardCache(str(cache_dir)))
    assert judge_server.requests == 4
    files = sorted(cache_dir.glob("part-*.parquet"))
    assert len(files) == 2  # one per shard
    # File 1: cut in half (a torn copy). File 2: still valid Parquet, but its rewards changed behind their
    # checksums (damage that Parquet decodes): they must not be served.
    files[0].write_bytes(files[0].read_bytes()[: files[0].stat().st_size // 2])
    table = pq.read_table(files[1])
    changed = table.set_column(2, "reward", [[7.0] * table.num_rows])
    pq.write_table(changed.replace_schema_metadata(table.schema.metadata), files[1])
    (cache_dir / "part-garbage.parquet").write_text("not parquet")

    cache = RewardCache(str(cache_dir))
    assert len(cache.warnings) == 3 and cache.entries == {}
    assert any("2 of 2 rows" in w and "do not match their checksum" in w for w in cache.warnings)
    again = reward_dir(src, str(tmp_path / "out2"), reward, cache=cache)
    assert judge_server.requests == 8 and again.cache_hits == 0  # recomputed, not read from the damaged files
    assert rewards_of(tmp_path / "out2") == rewards_of(tmp_path / "out1")
    assert 7.0 not in {v[0] for v in rewards_of(tmp_path / "out2").values()}


def test_cli_cache_under_run_counts_and_metrics_and_no_cache(tmp_path):
    run = tmp_path / "run"
    rollouts(run / "rollouts", per_shard=3)
    runner = CliRunner()
    args = ["reward", "--run", str(run), "--reward", "math + 0.1*format", "--json"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    one = json.loads(first.stdout)
    assert one["cache"] == str(run / "reward-cache") and (one["cache_hits"], one["cache_misses"]) == (0, 6)
    assert "reward cache: 0 hits, 6 misses" in first.stderr

    second = runner.invoke(app, [*args, "--out", str(run / "rewarded-again")])
    two = json.loads(second.stdout)
    assert (two["cache_hits"], two["cache_misses"]) == (6, 0)
    metrics = sorted((run / "metrics").glob("reward-*.parquet"))
    rows = [pq.read_table(m).to_pylist()[0] for m in metrics]
    assert sorted((r["cache_hits"], r["cache_misses"]) for r in rows) == [(0, 6), (6, 0)]

    off = runner.invoke(app, [*args, "--out", str(run / "rewarded-off"), "--no-cache"])
    three = json.loads(off.stdout)
    assert three["cache"] is None and (three["cache_hits"], three["cache_misses"]) == (0, 0)
    # The file this invocation wrote: names sort by time, but two invocations in one second tie on it.
    (newest,) = set((run / "metrics").glob("reward-*.parquet")) - set(metrics)
    assert pq.read_table(newest).to_pylist()[0]["cache_hits"] is None  # no cache: not "0 hits"
    status = runner.invoke(app, ["status", str(run), "--json"])  # the metrics readers still read the files
    assert status.exit_code == 0, status.output
    clash = runner.invoke(app, [*args, "--cache", str(tmp_path / "c"), "--no-cache"])
    assert clash.exit_code == 2 and "contradict" in clash.output


def test_many_cache_files_are_compacted_into_one_and_versions_filter_what_is_kept(tmp_path):
    cache = RewardCache(str(tmp_path / "cache"))
    for i in range(5):
        cache.put("v-1" if i % 2 else "v-2", f"k{i}", (float(i) / 3, {"x": float(i)}, {"i": i}))
        cache.flush()
    only_v1 = RewardCache(str(tmp_path / "cache"), versions={"v-1"})
    assert sorted(only_v1.entries) == [("v-1", "k1"), ("v-1", "k3")] and len(only_v1.loaded) == 5
    merged = only_v1.compact(at=3)  # every version survives, whatever this run keeps in memory
    assert merged is not None and [p.name for p in (tmp_path / "cache").iterdir()] == [os.path.basename(merged)]
    final = RewardCache(str(tmp_path / "cache"))
    assert len(final.entries) == 5 and final.warnings == []
    assert final.get("v-1", "k1") == (1 / 3, {"x": 1.0}, {"i": 1})  # the float round-trips exactly


def test_cache_on_s3(tmp_path, s3_bucket):
    src = rollouts(tmp_path / "rollouts", per_shard=2)
    url = f"{s3_bucket}/shared/reward-cache"
    reward = build_reward("math + 0.1*format", [])
    first = reward_dir(src, str(tmp_path / "out1"), reward, cache=RewardCache(url))
    second = reward_dir(src, str(tmp_path / "out2"), reward, cache=RewardCache(url))
    assert (first.cache_misses, second.cache_hits, second.cache_misses) == (4, 4, 0)
    assert rewards_of(tmp_path / "out1") == rewards_of(tmp_path / "out2")
