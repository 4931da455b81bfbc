"""The `openai` inference backend: a fleet of OpenAI-compatible servers (vLLM, SGLang) behind one Policy.

Prompts go out as token ids and sampled token ids come back with their log-probs, so token continuity
holds exactly as with the in-process backends (DESIGN.md §6, §8).

vLLM (`vllm serve MODEL --logprobs-mode processed_logprobs`): POST /v1/completions with `prompt` a list
of ints, `logprobs: 0` (the sampled token's log-prob only), `return_token_ids: true` (the sampled ids as
`choices[0].token_ids`) and `return_tokens_as_token_ids: true` (logprob tokens spelled `token_id:N`, used
when a server predates return_token_ids), `skip_special_tokens: false`, `stop_token_ids`, `ignore_eos`.
`--logprobs-mode processed_logprobs` makes the log-probs those of the distribution actually sampled from
(after temperature and top-p), as the Policy protocol requires; the default is the raw model's.

SGLang (`flavor="sglang"`): POST /generate with `input_ids`, `sampling_params` {temperature, top_p,
max_new_tokens, stop_token_ids, ignore_eos, skip_special_tokens: false} and `return_logprob: true`; the
answer's `meta_info.output_token_logprobs` holds (logprob, token id, text) per sampled token and
`meta_info.finish_reason.type` is "stop" or "length". Weight reload: POST /update_weights_from_disk
{"model_path": DIR} (it flushes the radix cache itself).

Routing is sticky per trajectory, to keep its KV prefix cached on one server: a trajectory's first turn
goes to the least-loaded healthy server, later turns to the same one. A trajectory is recognised either
by an explicit key (`route_key.set("traj-id")` in the trajectory's task; contextvars are per task) or,
without one, by token continuity itself: a later turn's prompt starts with the exact ids of an earlier
request plus its generated ids, so we remember a prefix hash of each (prompt + generated) sequence and
look up the longest remembered prefix of a new prompt (one O(n) rolling-hash pass per request).

Faults: a connection error, timeout or 5xx marks the server down and the request is retried on another
server after a backoff (the trajectory's cache is lost, its tokens are not: the prompt is complete).
A down server is probed with GET /health again after `down_s` seconds. A 4xx is a TerminalError.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import random
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from arlctl.errors import TerminalError, TransientError, UsageError
from arlctl.inference.base import Generation, SamplingParams
from arlctl.inference.sampling_check import check_sampling

# Set per trajectory task for explicit sticky routing (optional; prefix matching works without it).
route_key: contextvars.ContextVar[str | None] = contextvars.ContextVar("arlctl_route_key", default=None)

_MOD = (1 << 61) - 1
_BASE = 1_000_003


def prefix_hashes(ids: list[int]) -> list[int]:
    """h[i] = polynomial hash of ids[:i] (h[0] = 0), mod 2^61 - 1; one pass."""
    out = [0] * (len(ids) + 1)
    h = 0
    for i, token in enumerate(ids):
        h = (h * _BASE + token + 1) % _MOD
        out[i + 1] = h
    return out


@dataclass
class Server:
    url: str  # base URL without /v1, e.g. http://127.0.0.1:8000
    in_flight: int = 0
    healthy: bool = True
    down_until: float = 0.0
    requests: int = 0
    failures: int = 0
    generated_tokens: int = 0


@dataclass
class _Route:
    server: Server
    length: int


@dataclass
class StickyRouter:
    """Maps trajectories to servers: explicit keys, or remembered (prompt + generated) prefixes."""

    servers: list[Server]
    capacity: int = 100_000
    _keys: OrderedDict[str, Server] = field(default_factory=OrderedDict)
    _prefixes: OrderedDict[int, _Route] = field(default_factory=OrderedDict)

    def pick(self, prompt_ids: list[int], key: str | None, exclude: set[str] = frozenset()) -> Server:
        sticky = self._keys.get(key) if key is not None else self._lookup(prompt_ids)
        if sticky is not None and sticky.healthy and sticky.url not in exclude:
            return sticky
        candidates = [s for s in self.servers if s.healthy and s.url not in exclude]
        if not candidates:
            raise TransientError("no healthy inference server", hint="check the --server URLs")
        return min(candidates, key=lambda s: (s.in_flight, s.requests))

    def remember(self, server: Server, prompt_ids: list[int], generated: list[int], key: str | None) -> None:
        if key is not None:
            self._keys[key] = server
            self._keys.move_to_end(key)
            while len(self._keys) > self.capacity:
                self._keys.popitem(last=False)
            return
        full = prompt_ids + generated
        h = prefix_hashes(full)[-1]
        self._prefixes[h] = _Route(server, len(full))
        self._prefixes.move_to_end(h)
        while len(self._prefixes) > self.capacity:
            self._prefixes.popitem(last=False)

    def _lookup(self, prompt_ids: list[int]) -> Server | None:
        if not self._prefixes:
            return None
        hashes = prefix_hashes(prompt_ids)
        for length in range(len(prompt_ids), 0, -1):
            route = self._prefixes.get(hashes[length])
            if route is not None and route.length == length:
                return route.server
        return None


class OpenAIPolicy:
    """A Policy over one or more OpenAI-compatible servers, with sticky routing, retries and failover."""

    max_context = None  # the servers know their context; the rollout's --max-context bounds prompts here

    def __init__(self, servers: list[str], tokenizer_path: str, *, name: str | None = None, version: int = 0,
                 model: str | None = None, api_key: str | None = None, flavor: str = "vllm",
                 timeout_s: float = 600.0, retries: int = 4, backoff_s: float = 0.5, down_s: float = 5.0,
                 notify_on_reload: bool = True):
        from transformers import AutoTokenizer

        if not servers:
            raise UsageError("the openai backend needs at least one --server URL")
        if flavor not in ("vllm", "sglang"):
            raise UsageError(f"unknown server flavor {flavor!r}", hint="choose vllm or sglang")
        self.servers = [Server(_base(u)) for u in servers]
        self.router = StickyRouter(self.servers)
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, local_files_only=True)
        self.name = name or str(tokenizer_path)
        self.model = model  # the served model name; asked from /v1/models when None
        self.version = version
        self.flavor = flavor
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY")
        self.timeout_s, self.retries, self.backoff_s, self.down_s = timeout_s, retries, backoff_s, down_s
        self.notify_on_reload = notify_on_reload
        self._session: Any = None
        self.stats = {"requests": 0, "retries": 0, "failovers": 0, "generated_tokens": 0, "in_flight": 0}

    # ---- the Policy protocol ----

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)  # sampled ids must decode with the tokenizer the rollout uses

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        check_sampling(sampling)  # NaN/inf/out-of-range values never reach the model
        if not prompt_ids:
            raise UsageError("generate needs at least one prompt token")
        key = route_key.get()
        tried: set[str] = set()
        last_error: Exception | None = None
        for attempt in range(self.retries + 1):
            await self._revive()
            server = self.router.pick(prompt_ids, key, exclude=tried if len(tried) < len(self.servers) else set())
            if attempt:
                self.stats["retries"] += 1
                await asyncio.sleep(self.backoff_s * (2 ** (attempt - 1)) * (0.5 + random.random()))
            server.in_flight += 1
            self.stats["in_flight"] += 1
            version = self.version
            try:
                ids, logprobs, reason = await self._request(server, prompt_ids, sampling)
            except TransientError as err:
                last_error = err
                server.failures += 1
                server.healthy, server.down_until = False, time.monotonic() + self.down_s
                tried.add(server.url)
                self.stats["failovers"] += 1
                continue
            finally:
                server.in_flight -= 1
                self.stats["in_flight"] -= 1
            server.requests += 1
            server.generated_tokens += len(ids)
            self.stats["requests"] += 1
            self.stats["generated_tokens"] += len(ids)
            self.router.remember(server, prompt_ids, ids, key)
            return Generation(ids, logprobs, reason, version=version, info={"server": server.url})
        raise TransientError(f"every inference server failed: {last_error}", hint="check the servers' logs")

    async def reload(self, policy_dir: str, version: int) -> None:
        """Tell every server to load `policy_dir` (unless `sync --notify` already did); record the version."""
        if self.notify_on_reload:
            await notify_reload([s.url for s in self.servers], str(policy_dir), flavor=self.flavor)
        self.version = version

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def metrics(self) -> dict[str, Any]:
        return {**self.stats, "servers": {s.url: {"healthy": s.healthy, "in_flight": s.in_flight,
                                                   "requests": s.requests, "failures": s.failures}
                                          for s in self.servers}}

    # ---- HTTP ----

    async def _http(self) -> Any:
        import aiohttp

        if self._session is None:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._session = aiohttp.ClientSession(headers=headers,
                                                  timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self._session

    async def _post(self, server: Server, path: str, body: dict[str, Any]) -> dict[str, Any]:
        import aiohttp

        http = await self._http()
        try:
            async with http.post(server.url + path, json=body) as resp:
                if resp.status >= 500:
                    raise TransientError(f"{server.url}{path}: HTTP {resp.status}: {(await resp.text())[:300]}")
                if resp.status >= 400:
                    raise TerminalError(f"{server.url}{path}: HTTP {resp.status}: {(await resp.text())[:300]}")
                return await resp.json()
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as err:
            raise TransientError(f"{server.url}{path}: {type(err).__name__}: {err}") from err

    async def _request(self, server: Server, prompt_ids: list[int],
                       sampling: SamplingParams) -> tuple[list[int], list[float], str]:
        if self.flavor == "sglang":
            return await self._request_sglang(server, prompt_ids, sampling)
        if self.model is None:
            self.model = await self._served_model(server)
        body: dict[str, Any] = {
            "model": self.model, "prompt": list(prompt_ids), "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "logprobs": 0,
            "return_token_ids": True, "return_tokens_as_token_ids": True, "skip_special_tokens": False,
            "stop_token_ids": list(sampling.stop_ids), "ignore_eos": sampling.ignore_eos,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        choice = (await self._post(server, "/v1/completions", body))["choices"][0]
        logprobs = choice.get("logprobs") or {}
        ids = choice.get("token_ids") or [int(t.split(":", 1)[1]) for t in logprobs.get("tokens", [])]
        values = [float(v) for v in logprobs.get("token_logprobs") or []]
        if len(values) != len(ids):
            raise TerminalError(f"{server.url} returned {len(ids)} tokens but {len(values)} log-probs",
                                hint="serve with a vLLM that supports logprobs and return_token_ids")
        return list(ids), values, "length" if choice.get("finish_reason") == "length" else "stop"

    async def _request_sglang(self, server: Server, prompt_ids: list[int],
                              sampling: SamplingParams) -> tuple[list[int], list[float], str]:
        params: dict[str, Any] = {"temperature": sampling.temperature, "top_p": sampling.top_p,
                                  "max_new_tokens": sampling.max_new_tokens, "ignore_eos": sampling.ignore_eos,
                                  "stop_token_ids": list(sampling.stop_ids), "skip_special_tokens": False}
        if sampling.seed is not None:
            params["sampling_seed"] = sampling.seed
        out = await self._post(server, "/generate", {"input_ids": list(prompt_ids), "sampling_params": params,
                                                     "return_logprob": True})
        meta = out["meta_info"]
        triples = meta.get("output_token_logprobs") or []
        reason = (meta.get("finish_reason") or {}).get("type", "stop")
        return [int(t[1]) for t in triples], [float(t[0]) for t in triples], "length" if reason == "length" else "stop"

    async def _served_model(self, server: Server) -> str:
        http = await self._http()
        try:
            async with http.get(server.url + "/v1/models") as resp:
                data = await resp.json()
            return data["data"][0]["id"]
        except Exception as err:
            raise TransientError(f"{server.url}/v1/models: {err}") from err

    async def _revive(self) -> None:
        """Probe servers whose down time has passed; a healthy /health brings one back."""
        now = time.monotonic()
        for server in self.servers:
            if not server.healthy and now >= server.down_until:
                server.down_until = now + self.down_s
                server.healthy = await probe(server.url, timeout_s=2.0)


def _base(url: str) -> str:
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


async def probe(url: str, timeout_s: float = 2.0) -> bool:
    """True when GET URL/health answers 200."""
    import aiohttp

    try:
        async with (aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http,
                    http.get(_base(url) + "/health") as resp):
            return resp.status == 200
    except Exception:
        return False


async def notify_reload(urls: list[str], policy_dir: str, flavor: str = "vllm",
                        timeout_s: float = 300.0) -> dict[str, str]:
    """Make each server load the weights in `policy_dir` and drop its prefix cache; {url: how}.

    vLLM (started with VLLM_SERVER_DEV_MODE=1): POST /collective_rpc `arlctl_reload_weights` (our worker
    extension, `--worker-extension-cls arlctl.inference.vllm.ArlctlWorkerExtension`: also re-prepares a
    tied output head, see arlctl/inference/vllm.py), falling back to vLLM's own `reload_weights` on a
    server without it; then /reset_prefix_cache. SGLang: POST /update_weights_from_disk. Raises
    TransientError naming the servers that failed (the others have reloaded).
    """
    import aiohttp

    async def post(http: Any, url: str, body: dict[str, Any] | None) -> str | None:
        async with http.post(url, json=body) as resp:
            return None if resp.status == 200 else f"HTTP {resp.status}: {(await resp.text())[:200]}"

    async def one(http: Any, url: str) -> str:
        base = _base(url)
        if flavor == "sglang":
            error = await post(http, base + "/update_weights_from_disk", {"model_path": policy_dir})
            return error or "ok"
        how = "arlctl_reload_weights"
        error = await post(http, base + "/collective_rpc", {"method": how, "kwargs": {"weights_path": policy_dir}})
        if error is not None:
            how = "reload_weights"
            error = await post(http, base + "/collective_rpc", {
                "method": how, "kwargs": {"weights_path": policy_dir, "is_checkpoint_format": True}})
        if error is not None:
            return f"/collective_rpc: {error}"
        error = await post(http, base + "/reset_prefix_cache", None)
        return f"/reset_prefix_cache: {error}" if error else f"ok ({how})"

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http:
        results = await asyncio.gather(*(one(http, u) for u in urls), return_exceptions=True)
    outcome = {u: (r if isinstance(r, str) else f"{type(r).__name__}: {r}") for u, r in zip(urls, results)}
    failed = {u: r for u, r in outcome.items() if not r.startswith("ok")}
    if failed:
        raise TransientError(f"weight reload failed on {len(failed)} server(s): {failed}",
                             hint="vLLM needs VLLM_SERVER_DEV_MODE=1 for /collective_rpc")
    return outcome
