"""The openai backend's engine fleet: who is in it, in which state, and the fleet file `arlctl fleet` edits.

Membership has two sources: the URLs given at start (`--server`: pinned, always members) and a servers
file re-read while the rollout runs (`--backend-opt servers_file=FILE`, RUN/fleet.json by convention).
The file is checked every `poll_s` by its mtime and size (local) or its bytes (object store), so a check
that finds nothing new costs one stat.

An engine is in one of five states:

  joining   listed, not yet answering GET /health; takes nothing (an engine still booting is not an error)
  active    takes the first turns of new trajectories (the least loaded: fewest requests in flight) and
            the later turns of the trajectories it started (sticky: its prefix cache holds them)
  draining  removed from the list: no new trajectories, the ones it serves finish there. It retires
            (gone) once nothing was in flight on it for `drain_idle_s`, or at once when it stops
            answering; a trajectory whose engine is gone moves to another with its full token prefix
  ejected   a connection error, timeout or 5xx: out for a backoff that doubles per consecutive failure
            (down_s, 2 down_s, ... at most down_max_s), then probed with GET /health
  gone      retired; listed again, it joins afresh

Each engine also keeps what it told us about itself (served model name, policy version from /v1/models)
and its counters for RUN/metrics, including the prefix-cache hit rate scraped from its Prometheus
/metrics endpoint when it has one (`parse_prometheus`, `CacheCounters`).

File format: JSON {"servers": ["http://host:8000", ...]} (what `arlctl fleet` writes), a JSON list of
URLs, or plain text with one URL per line (`#` starts a comment).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

from arlctl.errors import TerminalError, UsageError
from arlctl.io import store
from arlctl.io.run import RunLayout

log = logging.getLogger("arlctl.fleet")

STATES = ("joining", "active", "draining", "ejected", "gone")
NOT_REPORTED = "not reported"

# Prefix-cache counters, newest vLLM names first (prometheus_client appends _total to a Counter's name;
# vLLM's v1 engine counts queried and hit tokens), then gauges of a ready-made rate (vLLM v0, SGLang).
CACHE_COUNTERS = (("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
                  ("vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total"))
CACHE_GAUGES = ("vllm:gpu_prefix_cache_hit_rate", "sglang:cache_hit_rate")


def base_url(url: str) -> str:
    """A server's base URL: without a trailing slash or /v1 (http://host:8000)."""
    url = url.strip().rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


# An engine URL is exactly this shape (an allowlist: whatever it does not describe is refused), checked
# further below: the host a DNS name, an IPv4 or a bracketed IPv6 address, the port in 1-65535.
_URL = re.compile(r"(?P<scheme>https?)://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::(?P<port>[0-9]{1,5}))?"
                  r"(?P<path>(?:/[A-Za-z0-9._~-]+)*)")
_HOST_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")  # one DNS label
CREDENTIALS_HINT = ("give the engines' bearer token in the OPENAI_API_KEY environment variable of the rollout "
                    "(from a file: OPENAI_API_KEY=$(cat FILE)); a URL with user:password@ is refused, never "
                    "stored in the fleet file")


def redact(url: str) -> str:
    """`url` with any user:password@ part replaced by ***@: what an error message may show of it."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, tail = rest.partition("/")
    if sep and "@" in netloc:
        return f"{scheme}://***@{netloc.rsplit('@', 1)[1]}{slash}{tail}"
    return url


def check_url(url: str) -> str:
    """`url` as a base URL (scheme://host[:port][/prefix], no trailing / or /v1), or a UsageError.

    Accepted: http or https; a host that is a DNS name, an IPv4 address or a bracketed IPv6 address; an
    optional port 1-65535; an optional path prefix of plain characters (a gateway's /engines/a).
    Refused: anything else (a query, a fragment, spaces, control or non-ASCII characters, an empty host)
    and credentials (user:password@host), which would sit in the fleet file in plain text and in logs.
    """
    if not isinstance(url, str):
        raise UsageError(f"{url!r} is not a URL string")
    base = base_url(url)
    scheme, sep, rest = base.partition("://")
    if sep and "@" in rest.partition("/")[0]:
        raise UsageError(f"{_shown(base)}: credentials in a server URL are refused", hint=CREDENTIALS_HINT)
    match = _URL.fullmatch(base)
    problem = None
    if match is None:
        problem = "the shape is http(s)://HOST[:PORT][/PREFIX], in letters, digits and . _ ~ - only"
    elif not _valid_host(match["host"]):
        problem = "the host is not a DNS name, an IPv4 address or a [bracketed] IPv6 address"
    elif match["port"] is not None and not 1 <= int(match["port"]) <= 65535:
        problem = "the port is not in 1-65535"
    if problem:
        raise UsageError(f"{_shown(url)} is not an http(s) server URL: {problem}", hint="e.g. http://10.0.0.5:8000")
    return base


def _valid_host(host: str) -> bool:
    if host.startswith("["):
        try:
            return isinstance(ipaddress.ip_address(host[1:-1]), ipaddress.IPv6Address)
        except ValueError:
            return False
    labels = host.split(".")
    if all(label.isdigit() for label in labels):  # all-numeric: must be a real IPv4 address
        try:
            return isinstance(ipaddress.ip_address(host), ipaddress.IPv4Address)
        except ValueError:
            return False
    return len(host) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels)


def _shown(url: str) -> str:
    """A refused URL as an error message may show it: credentials redacted, every character printable."""
    return ascii(redact(url))


def fleet_path(run: str) -> str:
    """RUN/fleet.json: the servers file of a run (what `arlctl fleet` edits and `rollout --run` reads)."""
    return RunLayout(str(run)).fleet


# ----------------------------------------------------------------------------------------- the fleet file


def parse_servers(data: bytes, source: str) -> list[str]:
    """The URLs in a servers file's bytes (see the module docstring), checked, in order, deduplicated."""
    text = data.decode("utf-8", "replace")
    stripped = text.strip()
    if stripped.startswith(("{", "[")):
        try:
            doc = json.loads(stripped)
        except json.JSONDecodeError as err:
            raise TerminalError(f"{source} is not valid JSON: {err}") from None
        items = doc.get("servers") if isinstance(doc, dict) else doc
        if not isinstance(items, list):
            raise TerminalError(f"{source} has no \"servers\" list", hint='write {"servers": ["http://host:8000"]}')
        urls = [item.get("url") if isinstance(item, dict) else item for item in items]
    else:
        urls = [line.split("#", 1)[0].strip() for line in text.splitlines()]
        urls = [u for u in urls if u]
    out: list[str] = []
    for url in urls:
        if not isinstance(url, str):
            raise TerminalError(f"{source}: {url!r} is not a URL string")
        base = check_url(url)
        if base not in out:
            out.append(base)
    return out


def read_servers_file(path: str) -> list[str]:
    """The URLs in the servers file at `path`; [] when it does not exist yet."""
    data = store.read_file(path)
    return [] if data is None else parse_servers(data, path)


def edit_fleet(run: str, add: list[str] = (), remove: list[str] = (), dry_run: bool = False,
               wait_s: float = 30.0) -> tuple[list[str], list[str]]:
    """Add and remove URLs in RUN/fleet.json under the run's `fleet` lock; (before, after).

    The file is rewritten whole through the atomic write helper, so a rollout polling it reads either
    the old list or the new one; the lock keeps two concurrent edits from losing one of them.
    """
    from arlctl.io.lock import RunLock

    add = [check_url(u) for u in add]
    remove = [check_url(u) for u in remove]
    path = fleet_path(run)
    with RunLock(str(run), "fleet", wait_s=wait_s):
        before = read_servers_file(path)
        after = [u for u in before if u not in remove] + [u for u in dict.fromkeys(add) if u not in before]
        if not dry_run and after != before:
            store.write_file(path, json.dumps({"servers": after}, indent=1) + "\n")
    return before, after


# ----------------------------------------------------------------------------------------- engines


@dataclass
class CacheCounters:
    """Prefix-cache numbers scraped from one engine: counters since our first scrape, or a gauge."""

    hits0: float | None = None  # counter values at the first scrape: the window starts there
    queries0: float | None = None
    hits: float | None = None
    queries: float | None = None
    gauge: float | None = None  # a ready-made rate, when the engine exposes only that

    def update(self, samples: dict[str, float]) -> bool:
        """Take one scrape; False when it has no prefix-cache metric we know."""
        for hits_name, queries_name in CACHE_COUNTERS:
            if hits_name in samples and queries_name in samples:
                hits, queries = samples[hits_name], samples[queries_name]
                if self.hits0 is None or self.queries0 is None or queries < self.queries0:
                    self.hits0, self.queries0 = hits, queries  # first scrape, or the engine restarted
                self.hits, self.queries = hits, queries
                return True
        for name in CACHE_GAUGES:
            if name in samples:
                self.gauge = samples[name]
                return True
        return False

    def hit_rate(self) -> float | None:
        """Hit tokens / queried tokens since the first scrape; None before any query."""
        if self.hits is not None and self.queries is not None and self.hits0 is not None and self.queries0 is not None:
            queried = self.queries - self.queries0
            return (self.hits - self.hits0) / queried if queried > 0 else None
        return self.gauge


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {metric name: value summed over its label sets}."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, rest = line.split("{", 1)[0], line.rsplit("}", 1)[-1]
        else:
            name, _, rest = line.partition(" ")
        parts = rest.split()
        if not parts:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        if math.isfinite(value):
            totals[name.strip()] = totals.get(name.strip(), 0.0) + value
    return totals


@dataclass
class Server:
    """One engine of the fleet (the name predates the fleet; README and tests call engines servers)."""

    url: str  # base URL without /v1, e.g. http://127.0.0.1:8000
    state: str = "active"
    pinned: bool = True  # given with --server: the servers file does not remove it
    in_flight: int = 0
    requests: int = 0
    first_turns: int = 0  # trajectories started here (the first turn routed as new)
    failures: int = 0  # requests that failed here (connection errors, timeouts, 5xx)
    ejections: int = 0
    failures_in_row: int = 0  # consecutive failures: the backoff's exponent
    down_until: float = 0.0
    generated_tokens: int = 0
    moved_in: int = 0  # trajectories that moved here from an engine that was ejected or gone
    first_sent: float | None = None  # monotonic time of the first request, for tokens/s
    last_done: float | None = None  # ... and of the last answer
    draining_since: float | None = None
    model: str | None = None  # served model name from /v1/models
    version: int | None = None  # policy version the engine reports (or we told it); None: unknown
    version_reported: bool = False  # /v1/models has an explicit `version`: re-read it, never assume
    described: bool = False  # /v1/models has been read
    cache: CacheCounters = field(default_factory=CacheCounters)
    cache_reported: bool = False  # its /metrics had a prefix-cache metric at the last scrape
    last_error: str | None = None

    @property
    def healthy(self) -> bool:
        """Answering: may serve its own trajectories (active or draining)."""
        return self.state in ("active", "draining")

    @healthy.setter
    def healthy(self, value: bool) -> None:
        self.state = "active" if value else "ejected"

    @property
    def label(self) -> str:
        """host:port, the engine's name in metric columns."""
        return self.url.split("://", 1)[-1]

    def tokens_per_s(self) -> float:
        if self.first_sent is None or self.last_done is None or self.last_done <= self.first_sent:
            return 0.0
        return self.generated_tokens / (self.last_done - self.first_sent)

    def summary(self) -> dict[str, Any]:
        """Its row in the backend metrics (`prefix_cache_hit_rate` is "not reported" without /metrics)."""
        rate = self.cache.hit_rate() if self.cache_reported else None
        return {"state": self.state, "in_flight": self.in_flight, "requests": self.requests,
                "first_turns": self.first_turns, "generated_tokens": self.generated_tokens, "tokens_per_s": round(self.tokens_per_s(), 3),
                "errors": self.failures, "ejections": self.ejections, "moved_in": self.moved_in,
                "version": self.version, "healthy": self.healthy,
                "prefix_cache_hit_rate": rate if self.cache_reported else NOT_REPORTED}


class Fleet:
    """The engines and their states; membership changes come from `apply` (the servers file) only.

    Every method is synchronous and called from the event loop, so a change never interleaves with a
    routing decision.
    """

    def __init__(self, servers: list[str], servers_file: str | None = None, *, poll_s: float = 2.0,
                 drain_idle_s: float = 60.0, down_s: float = 5.0, down_max_s: float = 60.0):
        self.engines: list[Server] = []  # every engine ever seen, in order of arrival (gone ones too)
        self.servers_file = servers_file
        self.poll_s, self.drain_idle_s = poll_s, drain_idle_s
        self.down_s, self.down_max_s = down_s, max(down_s, down_max_s)
        self.events = {"joined": 0, "drained": 0, "retired": 0, "ejected": 0, "revived": 0}
        self.file_reads = 0
        self.file_errors = 0
        self.last_file_error: str | None = None
        self._stamp: Any = None
        for url in servers:
            if self.get(check_url(url)) is None:
                self.engines.append(Server(check_url(url)))
        if servers_file is not None:
            self.apply(read_servers_file(servers_file))  # a bad file at start is an error, not a warning
            self._stamp = self._file_stamp()
            self.file_reads += 1
        if not self.engines:
            raise UsageError("the openai backend has no server: no --server and an empty servers file",
                             hint="pass --server URL, or `arlctl fleet add RUN URL` before the rollout")

    def get(self, url: str) -> Server | None:
        return next((e for e in self.engines if e.url == url), None)

    def live(self) -> list[Server]:
        """Engines that may be asked something: every state but gone."""
        return [e for e in self.engines if e.state != "gone"]

    def counts(self) -> dict[str, int]:
        return {state: sum(e.state == state for e in self.engines) for state in STATES}

    # ---- membership

    def apply(self, urls: list[str]) -> None:
        """Make the servers file's list the unpinned membership: new URLs join, missing ones drain."""
        now = time.monotonic()
        listed = set(urls)
        for url in urls:
            engine = self.get(url)
            if engine is None:
                self.engines.append(Server(url, state="joining", pinned=False))
                self.events["joined"] += 1
                log.info("fleet: %s joins", url)
            elif engine.state == "gone":
                engine.state, engine.pinned, engine.described = "joining", False, False
                self.events["joined"] += 1
            elif engine.state == "draining":
                engine.state, engine.draining_since = "active", None  # listed again before it retired
        for engine in self.engines:
            if engine.pinned or engine.url in listed or engine.state in ("gone", "draining"):
                continue
            if engine.state == "active":
                engine.state, engine.draining_since = "draining", now
                self.events["drained"] += 1
                log.info("fleet: %s drains", engine.url)
            else:  # joining or ejected: serving nothing that could finish there
                self.retire(engine, "removed from the servers file")

    def poll_file(self) -> bool:
        """Re-read the servers file if it changed since the last read; True when it was applied.

        A file that cannot be read or parsed while running keeps the current membership and is counted
        (`file_errors`, `last_file_error`); an editor's half-written save is retried at the next poll.
        """
        if self.servers_file is None:
            return False
        try:
            stamp = self._file_stamp()
            if stamp == self._stamp:
                return False
            urls = read_servers_file(self.servers_file)
        except Exception as err:  # noqa: BLE001 - any failure is counted and reported, membership kept
            self.file_errors += 1
            self.last_file_error = f"{self.servers_file}: {type(err).__name__}: {err}"
            log.warning("fleet: %s", self.last_file_error)
            return False
        self._stamp = stamp
        self.file_reads += 1
        self.apply(urls)
        return True

    def _file_stamp(self) -> Any:
        return store.stamp(str(self.servers_file))

    def retire(self, engine: Server, why: str) -> None:
        if engine.state != "gone":
            engine.state = "gone"
            if why != "drained":
                engine.last_error = why
            self.events["retired"] += 1
            log.info("fleet: %s retired (%s)", engine.url, why)

    def retire_idle(self, now: float) -> None:
        """Draining engines with nothing in flight for drain_idle_s are retired."""
        for engine in self.engines:
            if engine.state == "draining" and engine.in_flight == 0:
                quiet_since = max(engine.draining_since or now, engine.last_done or 0.0)
                if now - quiet_since >= self.drain_idle_s:
                    self.retire(engine, "drained")

    # ---- health

    def fail(self, engine: Server, error: str, now: float) -> None:
        """A request failed there: a draining engine retires, any other is ejected with backoff."""
        engine.failures += 1
        engine.failures_in_row += 1
        engine.last_error = error
        if engine.state in ("draining", "gone"):
            self.retire(engine, f"unreachable while draining: {error}")
            return
        engine.state = "ejected"
        engine.ejections += 1
        self.events["ejected"] += 1
        engine.down_until = now + min(self.down_max_s, self.down_s * 2 ** (engine.failures_in_row - 1))

    def due_probes(self, now: float) -> list[Server]:
        """Joining engines, and ejected ones whose backoff has passed."""
        return [e for e in self.engines
                if e.state == "joining" or (e.state == "ejected" and now >= e.down_until)]

    def probed(self, engine: Server, ok: bool, now: float) -> None:
        if ok:
            if engine.state == "ejected":
                self.events["revived"] += 1
            engine.state = "active"
        elif engine.state == "ejected":  # still down: back off again (the failure streak is unchanged)
            engine.down_until = now + min(self.down_max_s, self.down_s * 2 ** max(engine.failures_in_row - 1, 0))
