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

Routing is sticky per trajectory, to keep its KV prefix cached on one engine: a trajectory's first turn
goes to the least-loaded active engine, later turns to the same one. A trajectory is recognised either
by an explicit key (`route_key.set("traj-id")` in the trajectory's task, as the agent loop does; O(1)
per turn) or, without one (other callers), by token continuity itself: a later turn's prompt starts
with the exact ids of an earlier request plus its generated ids, so we remember a prefix hash of each (prompt + generated) sequence and
look up the longest remembered prefix of a new prompt (one O(n) rolling-hash pass per request).

The fleet is elastic (arlctl/inference/fleet.py): with `servers_file` the list is re-read while running;
new engines join after answering GET /health, removed ones drain (no new trajectories, their own finish
there), and an engine that fails (connection error, timeout, 5xx) is ejected with exponential backoff.
A request that failed is retried on another engine; a trajectory whose engine was ejected or is gone
moves with its full token prefix. Moving never re-tokenizes anything: every turn sends the complete
prompt ids, so only the prefix cache is lost, and the recorded row is the same as without the move.

Versions: each turn records the version of the engine that served it, not the rollout's. An engine's
version comes from the response when it carries one (`arlctl.policy_version`, SGLang's
`meta_info.weight_version`), else from its GET /v1/models (`version`, or a `vNNNNNN` model path),
re-read every poll for engines that report it, else from the last reload we made (or the policy's own).
A 4xx is a TerminalError.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from arlctl.errors import TerminalError, TransientError, UsageError
from arlctl.inference.base import Generation, SamplingParams, route_key
from arlctl.inference.fleet import Fleet, Server, base_url
from arlctl.inference.sampling_check import check_sampling
from arlctl.io import store
from arlctl.io.fs import basename
from arlctl.io.ledger import parse_version

log = logging.getLogger("arlctl.fleet")

_MOD = (1 << 61) - 1
_BASE = 1_000_003
PROBE_TIMEOUT_S = 2.0  # GET /health, /v1/models and /metrics: small answers, or the engine is not well

__all__ = ["OpenAIPolicy", "StickyRouter", "NoServer", "notify_reload", "prefix_hashes", "probe"]


def prefix_hashes(ids: list[int]) -> list[int]:
    """h[i] = polynomial hash of ids[:i] (h[0] = 0), mod 2^61 - 1; one pass."""
    out = [0] * (len(ids) + 1)
    h = 0
    for i, token in enumerate(ids):
        h = (h * _BASE + token + 1) % _MOD
        out[i + 1] = h
    return out


class NoServer(TransientError):
    """No engine can take this request now (all ejected, joining, draining or tried)."""


@dataclass
class _Route:
    server: Server
    length: int


@dataclass
class StickyRouter:
    """Maps trajectories to engines: explicit keys, or remembered (prompt + generated) prefixes.

    `servers` is the fleet's own list (engines join by being appended to it).
    """

    servers: list[Server]
    capacity: int = 100_000
    _keys: OrderedDict[str, Server] = field(default_factory=OrderedDict)
    _prefixes: OrderedDict[int, _Route] = field(default_factory=OrderedDict)

    def pick(self, prompt_ids: list[int], key: str | None, exclude: set[str] = frozenset()) -> Server:
        return self.route(prompt_ids, key, exclude)[0]

    def route(self, prompt_ids: list[int], key: str | None,
              exclude: set[str] = frozenset()) -> tuple[Server, str]:
        """(engine, how): "sticky" (its trajectory's engine), "new" (a first turn) or "moved" (its engine
        was ejected, is gone or failed this request). Draining engines keep their own trajectories only."""
        sticky = self._keys.get(key) if key is not None else self._lookup(prompt_ids)
        if sticky is not None and sticky.healthy and sticky.url not in exclude:
            return sticky, "sticky"
        candidates = [s for s in self.servers if s.state == "active" and s.url not in exclude]
        if not candidates:
            raise NoServer("no healthy inference server", hint="check the --server URLs or the servers file")
        best = min(candidates, key=lambda s: (s.in_flight, s.requests))
        return best, "new" if sticky is None else "moved"

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
    """A Policy over an elastic fleet of OpenAI-compatible engines: sticky routing, drain, ejection, failover.

    servers: base URLs given at start (pinned members). servers_file: a file of URLs re-read every poll_s
    seconds while running (arlctl/inference/fleet.py). drain_idle_s: a removed engine retires after this
    long with nothing in flight. down_s / down_max_s: an ejected engine's first and longest backoff.
    metrics_every_s: how often each engine's Prometheus /metrics is scraped (prefix-cache hit rate).
    """

    max_context = None  # the servers know their context; the rollout's --max-context bounds prompts here

    def __init__(self, servers: list[str], tokenizer_path: str, *, name: str | None = None, version: int = 0,
                 model: str | None = None, api_key: str | None = None, flavor: str = "vllm",
                 timeout_s: float = 600.0, retries: int = 4, backoff_s: float = 0.5, down_s: float = 5.0,
                 notify_on_reload: bool = True, servers_file: str | None = None, poll_s: float = 2.0,
                 drain_idle_s: float = 60.0, down_max_s: float = 60.0, metrics_every_s: float = 15.0):
        from transformers import AutoTokenizer

        if not servers and not servers_file:
            raise UsageError("the openai backend needs at least one --server URL or a servers file")
        if flavor not in ("vllm", "sglang"):
            raise UsageError(f"unknown server flavor {flavor!r}", hint="choose vllm or sglang")
        self.fleet = Fleet(list(servers), str(servers_file) if servers_file else None, poll_s=poll_s,
                           drain_idle_s=drain_idle_s, down_s=down_s, down_max_s=down_max_s)
        self.servers = self.fleet.engines  # every engine seen; the router reads the same list
        self.router = StickyRouter(self.servers)
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, local_files_only=True)
        self.name = name or str(tokenizer_path)
        self.model = model  # the served model name; asked from each engine's /v1/models when None
        self.version = version
        self.flavor = flavor
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY")
        self.timeout_s, self.retries, self.backoff_s, self.down_s = timeout_s, retries, backoff_s, down_s
        self.metrics_every_s = metrics_every_s
        self.notify_on_reload = notify_on_reload
        self._session: Any = None
        self._maintenance: asyncio.Task | None = None
        self._next_maintenance = 0.0
        self._next_scrape = 0.0
        self._describing: dict[str, asyncio.Lock] = {}  # one GET /v1/models per engine, however many first turns
        self.maintenance_error: str | None = None
        self.stats = {"requests": 0, "retries": 0, "failovers": 0, "moves": 0, "generated_tokens": 0,
                      "in_flight": 0}

    # ---- the Policy protocol ----

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)  # sampled ids must decode with the tokenizer the rollout uses

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        check_sampling(sampling)  # NaN/inf/out-of-range values never reach the model
        if not prompt_ids:
            raise UsageError("generate needs at least one prompt token")
        self._maintain_soon()
        key = route_key.get()
        tried: set[str] = set()
        last_error: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                self.stats["retries"] += 1
                await asyncio.sleep(self.backoff_s * (2 ** (attempt - 1)) * (0.5 + random.random()))
            try:
                server, how = self._route(prompt_ids, key, tried)
            except NoServer as err:
                last_error = last_error or err
                await self.refresh()  # membership and probes now, not at the next poll
                continue
            server.in_flight += 1
            self.stats["in_flight"] += 1
            server.first_sent = server.first_sent or time.monotonic()
            try:
                if not server.described:
                    await self._describe_once(server)
                # read before the request: a reload that lands meanwhile applies to later requests
                version = server.version if server.version is not None else self.version
                ids, logprobs, reason, reported = await self._request(server, prompt_ids, sampling)
            except TransientError as err:
                last_error = err
                self.fleet.fail(server, str(err), time.monotonic())
                tried.add(server.url)
                self.stats["failovers"] += 1
                continue
            finally:
                server.in_flight -= 1
                self.stats["in_flight"] -= 1
            server.requests += 1
            server.failures_in_row = 0
            server.generated_tokens += len(ids)
            server.last_done = time.monotonic()
            if reported is not None:
                version = server.version = reported
            if how == "moved":
                self.stats["moves"] += 1
                server.moved_in += 1
            elif how == "new":
                server.first_turns += 1
            self.stats["requests"] += 1
            self.stats["generated_tokens"] += len(ids)
            self.router.remember(server, prompt_ids, ids, key)
            return Generation(ids, logprobs, reason, version=version, info={"server": server.url, "route": how})
        raise TransientError(f"every inference server failed: {last_error}", hint="check the servers' logs")

    def _route(self, prompt_ids: list[int], key: str | None, tried: set[str]) -> tuple[Server, str]:
        """Avoid engines that failed this request; if that leaves none, any engine that can serve."""
        try:
            return self.router.route(prompt_ids, key, exclude=tried)
        except NoServer:
            if not tried:
                raise
            return self.router.route(prompt_ids, key)

    async def reload(self, policy_dir: str, version: int) -> None:
        """Tell every live engine to load `policy_dir` (unless `sync --notify` already did); record the version.

        An engine that fails to reload while others succeed is ejected and keeps its old version (turns it
        serves after coming back say so); when every engine fails, nothing changed: TransientError.
        """
        engines = [e for e in self.fleet.live() if e.state in ("active", "draining")]
        for engine in self.fleet.live():
            if engine not in engines and engine.version is None:
                engine.version = self.version  # joining or ejected: not told, so it still serves the old one
        if self.notify_on_reload and engines:
            outcome = await reload_each([e.url for e in engines], str(policy_dir), flavor=self.flavor,
                                        version=version)
            failed = {u: r for u, r in outcome.items() if not r.startswith("ok")}
            if len(failed) == len(engines):  # nothing changed anywhere: keep serving the old version
                raise TransientError(f"weight reload failed on every server: {failed}",
                                     hint="vLLM needs VLLM_SERVER_DEV_MODE=1 for /collective_rpc")
            now = time.monotonic()
            for engine in engines:
                if engine.url in failed:
                    engine.version = engine.version if engine.version is not None else self.version
                    self.fleet.fail(engine, f"reload failed: {failed[engine.url]}", now)
            engines = [e for e in engines if e.url not in failed]
        for engine in engines:
            if engine.version_reported:
                engine.described = False  # re-read what it reports before its next request
            else:
                engine.version = version
        self.version = version

    async def close(self) -> None:
        if self._maintenance is not None and not self._maintenance.done():
            self._maintenance.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._maintenance
        if self._session is not None:
            await self._session.close()
            self._session = None

    def metrics(self) -> dict[str, Any]:
        """Fleet counters and one set of columns per engine, `engine[host:port].requests` etc.

        The prefix-cache hit rate is a column only when the engine's /metrics reported one
        (`...prefix_cache_reported` = 1); otherwise the nested summary says "not reported", never 0.
        """
        flat: dict[str, Any] = {**self.stats}
        flat.update({f"engines_{state}": n for state, n in self.fleet.counts().items()})
        flat.update({f"fleet_{event}": n for event, n in self.fleet.events.items()})
        flat["fleet_file_errors"] = self.fleet.file_errors
        summaries = {}
        for engine in self.servers:
            summary = summaries[engine.url] = engine.summary()
            prefix = f"engine[{engine.label}]."
            for key in ("requests", "first_turns", "generated_tokens", "tokens_per_s", "errors", "ejections",
                        "moved_in"):
                flat[prefix + key] = summary[key]
            flat[prefix + "prefix_cache_reported"] = int(engine.cache_reported)
            if isinstance(summary["prefix_cache_hit_rate"], float):
                flat[prefix + "prefix_cache_hit_rate"] = summary["prefix_cache_hit_rate"]
        if self.fleet.last_file_error:
            flat["fleet_last_file_error"] = self.fleet.last_file_error
        if self.maintenance_error:
            flat["fleet_maintenance_error"] = self.maintenance_error
        return {**flat, "servers": summaries}

    # ---- fleet upkeep: membership, probes, versions, Prometheus scrapes ----

    def _maintain_soon(self) -> None:
        """Start one upkeep pass in the background when poll_s has passed since the last one."""
        if time.monotonic() >= self._next_maintenance and (self._maintenance is None or self._maintenance.done()):
            self._next_maintenance = time.monotonic() + self.fleet.poll_s
            self._maintenance = asyncio.ensure_future(self._maintain())

    async def refresh(self) -> None:
        """One upkeep pass now (or wait for the one running): membership, probes, versions, scrapes."""
        if self._maintenance is None or self._maintenance.done():
            self._next_maintenance = time.monotonic() + self.fleet.poll_s
            self._maintenance = asyncio.ensure_future(self._maintain())
        await asyncio.shield(self._maintenance)

    async def _maintain(self) -> None:
        """Re-read the servers file, retire drained engines, probe joining and ejected ones, refresh the
        versions engines report, and scrape /metrics every metrics_every_s. Never raises: a failure is
        kept in `maintenance_error` (a metrics column) and logged."""
        try:
            if self.fleet.servers_file is not None:
                if store.local_path(self.fleet.servers_file) is None:  # a GET: off the event loop
                    await asyncio.to_thread(self.fleet.poll_file)
                else:
                    self.fleet.poll_file()  # one stat when nothing changed
            now = time.monotonic()
            self.fleet.retire_idle(now)
            jobs = [self._probe(e) for e in self.fleet.due_probes(now)]
            jobs += [self._describe_quietly(e) for e in self.fleet.live() if e.healthy and e.version_reported]
            if now >= self._next_scrape:
                self._next_scrape = now + self.metrics_every_s
                jobs += [self._scrape(e) for e in self.fleet.live() if e.healthy]
            await asyncio.gather(*jobs)
        except Exception as err:  # noqa: BLE001 - upkeep must not kill generation; the cause is recorded
            self.maintenance_error = f"{type(err).__name__}: {err}"
            log.warning("fleet upkeep failed: %s", self.maintenance_error)

    async def _probe(self, server: Server) -> None:
        ok = await probe(server.url, timeout_s=PROBE_TIMEOUT_S, session=await self._http())
        if ok:
            try:
                await self._describe(server)
            except TransientError:
                ok = False
        self.fleet.probed(server, ok, time.monotonic())

    async def _describe_once(self, server: Server) -> None:
        """Describe an engine not yet described; concurrent first turns wait for one request, not one each
        (a thousand GET /v1/models at once would time out on their own connection pool and eject the engine)."""
        lock = self._describing.setdefault(server.url, asyncio.Lock())
        async with lock:
            if not server.described:
                await self._describe(server)

    async def _describe_quietly(self, server: Server) -> None:
        with contextlib.suppress(TransientError):
            await self._describe(server)

    async def _describe(self, server: Server) -> None:
        """Read GET /v1/models: the served model name and the policy version the engine reports.

        `version` (arlctl serve) is the engine's own word; a model path ending in vNNNNNN (vLLM started on a
        published version) gives the version it started with. A server without /v1/models is described
        with neither (the request then names --backend-opt model=, or none).
        """
        import aiohttp

        http = await self._http()
        try:
            async with http.get(server.url + "/v1/models", timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)) as resp:
                if resp.status >= 500:
                    raise TransientError(f"{server.url}/v1/models: HTTP {resp.status}")
                data = await resp.json() if resp.status == 200 else {}
        except (TimeoutError, aiohttp.ClientError, ConnectionError, ValueError) as err:
            raise TransientError(f"{server.url}/v1/models: {type(err).__name__}: {err}") from err
        models = data.get("data") if isinstance(data, dict) else None
        first = models[0] if isinstance(models, list) and models and isinstance(models[0], dict) else {}
        server.model = first.get("id") if isinstance(first.get("id"), str) else server.model
        reported = first.get("version")
        if isinstance(reported, int) and not isinstance(reported, bool):
            server.version, server.version_reported = reported, True
        elif not server.described:
            path_version = parse_version(basename(str(first.get("root") or first.get("id") or "").rstrip("/")))
            server.version = path_version if path_version is not None else server.version
        server.described = True

    async def _scrape(self, server: Server) -> None:
        """Prefix-cache counters from the engine's Prometheus /metrics; no endpoint: not reported."""
        import aiohttp

        from arlctl.inference.fleet import parse_prometheus

        http = await self._http()
        try:
            async with http.get(server.url + "/metrics", timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)) as resp:
                if resp.status != 200:
                    server.cache_reported = False
                    return
                text = await resp.text()
        except (TimeoutError, aiohttp.ClientError, ConnectionError):
            return  # unreachable now: the last scrape stands; request failures eject it
        server.cache_reported = server.cache.update(parse_prometheus(text))

    # ---- HTTP ----

    async def _http(self) -> Any:
        import aiohttp

        if self._session is None:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            # No connection cap: the trajectories in flight bound the requests, and a cap of aiohttp's default
            # 100 would queue thousands of turns behind it until their timeouts fire.
            self._session = aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(limit=0),
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
                       sampling: SamplingParams) -> tuple[list[int], list[float], str, int | None]:
        """(sampled ids, their log-probs, finish reason, the policy version the answer states or None)."""
        if self.flavor == "sglang":
            return await self._request_sglang(server, prompt_ids, sampling)
        body: dict[str, Any] = {
            "prompt": list(prompt_ids), "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "logprobs": 0,
            "return_token_ids": True, "return_tokens_as_token_ids": True, "skip_special_tokens": False,
            "stop_token_ids": list(sampling.stop_ids), "ignore_eos": sampling.ignore_eos,
        }
        model = self.model or server.model
        if model is not None:
            body["model"] = model
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        out = await self._post(server, "/v1/completions", body)
        choice = out["choices"][0]
        logprobs = choice.get("logprobs") or {}
        ids = choice.get("token_ids") or [int(t.split(":", 1)[1]) for t in logprobs.get("tokens", [])]
        values = [float(v) for v in logprobs.get("token_logprobs") or []]
        if len(values) != len(ids):
            raise TerminalError(f"{server.url} returned {len(ids)} tokens but {len(values)} log-probs",
                                hint="serve with a vLLM that supports logprobs and return_token_ids")
        extra = out.get("arlctl") if isinstance(out.get("arlctl"), dict) else {}
        reason = "length" if choice.get("finish_reason") == "length" else "stop"
        return list(ids), values, reason, _as_version(extra.get("policy_version"))

    async def _request_sglang(self, server: Server, prompt_ids: list[int],
                              sampling: SamplingParams) -> tuple[list[int], list[float], str, int | None]:
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
        return ([int(t[1]) for t in triples], [float(t[0]) for t in triples],
                "length" if reason == "length" else "stop", _as_version(meta.get("weight_version")))


def _as_version(value: Any) -> int | None:
    """A policy version an engine stated: an int, or a string of digits (SGLang's weight_version)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def _base(url: str) -> str:
    return base_url(url)


async def probe(url: str, timeout_s: float = 2.0, session: Any = None) -> bool:
    """True when GET URL/health answers 200."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        if session is not None:
            async with session.get(_base(url) + "/health", timeout=timeout) as resp:
                return resp.status == 200
        async with aiohttp.ClientSession(timeout=timeout) as http, http.get(_base(url) + "/health") as resp:
            return resp.status == 200
    except Exception:
        return False


async def reload_each(urls: list[str], policy_dir: str, flavor: str = "vllm", timeout_s: float = 300.0,
                      version: int | None = None) -> dict[str, str]:
    """Make each server load the weights in `policy_dir` and drop its prefix cache; {url: how or why not}.

    vLLM (started with VLLM_SERVER_DEV_MODE=1): POST /collective_rpc `arlctl_reload_weights` (our worker
    extension, `--worker-extension-cls arlctl.inference.vllm.ArlctlWorkerExtension`: also re-prepares a
    tied output head, see arlctl/inference/vllm.py), falling back to vLLM's own `reload_weights` on a
    server without it; then /reset_prefix_cache. SGLang: POST /update_weights_from_disk (with
    `weight_version` when `version` is given, which its answers then carry). Outcomes start with "ok".
    """
    import aiohttp

    async def post(http: Any, url: str, body: dict[str, Any] | None) -> str | None:
        async with http.post(url, json=body) as resp:
            return None if resp.status == 200 else f"HTTP {resp.status}: {(await resp.text())[:200]}"

    async def one(http: Any, url: str) -> str:
        base = _base(url)
        if flavor == "sglang":
            body: dict[str, Any] = {"model_path": policy_dir}
            if version is not None:
                body["weight_version"] = str(version)
            error = await post(http, base + "/update_weights_from_disk", body)
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
    return {u: (r if isinstance(r, str) else f"{type(r).__name__}: {r}") for u, r in zip(urls, results)}


async def notify_reload(urls: list[str], policy_dir: str, flavor: str = "vllm",
                        timeout_s: float = 300.0) -> dict[str, str]:
    """`reload_each` on every URL; raises TransientError naming the servers that failed (the others have
    reloaded). What `arlctl sync --notify` calls."""
    outcome = await reload_each(urls, policy_dir, flavor=flavor, timeout_s=timeout_s)
    failed = {u: r for u, r in outcome.items() if not r.startswith("ok")}
    if failed:
        raise TransientError(f"weight reload failed on {len(failed)} server(s): {failed}",
                             hint="vLLM needs VLLM_SERVER_DEV_MODE=1 for /collective_rpc")
    return outcome
