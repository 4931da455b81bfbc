"""`arlctl reward-serve`: rewards over HTTP, and RemoteReward, the `--reward http://HOST:PORT/NAME` client.

Rewards then run on their own machines (the swe grader's sandboxes, a judge beside its GPU) while the
reward stage runs anywhere. The protocol is JSON over aiohttp:

  POST /score/NAME   {"rows": [{"final_state": str|null, "task": {...}, "response_text": str,
                                "trajectory_id": str, "group_id": str, "turns": [str, ...]}, ...],
                      "options": {KEY: VALUE, ...}}          (trajectory_id, group_id, turns optional)
    200 {"name": NAME, "version": V, "results": [{"reward": float|null, "components": {...}|null,
                                                  "info": {...}}, ...]}   one result per row, in order
    400 a malformed body or a bad option; 404 an unknown NAME (error.known lists the served names);
    413 a body over --max-request-bytes; 503 no scoring slot came free within --queue-timeout
  GET /health        {"ok": true, "rewards": [...], "concurrency": N, "scoring": n, "waiting": n, ...}

Rows are scored exactly as the stage scores them (arlctl/rewards/scoring.py): the reward is
get_reward(NAME, **options), so version, components and info are the ones a local run gives; rows of
one group_id go to a group reward's score_group together (a row without group_id is its own group); a
row the reward cannot grade comes back with reward null and info.error. An empty "rows" list answers
with the version alone: that is how a client learns reward_version before it scores anything.

Concurrency: at most --concurrency scoring calls (a row, or a group) run at once over all requests;
the others queue. A request whose calls wait longer than --queue-timeout for a slot gets 503 (the client
treats it as transient: the shard stays pending and is retried), so a burst is queued, never dropped.
Synchronous score functions run in worker threads, so one slow grader never stalls the event loop.

What is served: every built-in reward, every installed plugin (`arlctl.rewards` entry points), and the
`module:attribute` specs the server was started with (--spec). A client can never name another
module:attribute: a spec is code the server imports and calls with the client's data.

RemoteReward splits a shard's rows into up to `concurrency` requests (a group never split), each request
holding one of the stage's slots. A refused connection, a timeout or a 5xx is a TransientError (the
shard is retried later); a 400 or 404 is a UsageError; a 413 splits the request in two (a single row too
big for the server gets reward null with the cause).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import aiohttp
from aiohttp import web

from arlctl.envs.registry import REWARD_GROUP, builtin_names, entry_points, get_reward, is_spec
from arlctl.errors import TerminalError, TransientError, UsageError
from arlctl.rewards.scoring import Done, Item, ScoreContext, Scored, Slots, row_error, score_items
from arlctl.serve.validation import BodyTooLarge, parse_body

DEFAULT_CLIENT_TIMEOUT_S = 900.0  # one request's scoring: sandboxed tests of a whole chunk can take minutes
MAX_ROWS_PER_REQUEST = 256  # the client's chunks: smaller requests keep a slow server's queue fair
NOT_SERVED = {"auto"}  # a stage-side choice per row, not a reward

log = logging.getLogger("arlctl.reward_serve")
_dumps = functools.partial(json.dumps, default=str)  # info may hold values a reward did not make JSON


class RewardServer:
    """What the handlers share: the served names, the scoring slots and counters."""

    def __init__(self, concurrency: int, queue_timeout_s: float, max_request_bytes: int,
                 specs: list[str] | None = None):
        """The defaults are the command's (arlctl/cli/reward_serve.py)."""
        for spec in specs or []:
            if not is_spec(spec):
                raise UsageError(f"--spec takes package.module:attribute, got {spec!r}")
            get_reward(spec)  # load it now: a broken spec stops the server at start, not per request
        self.specs = sorted(set(specs or []))
        self.names = sorted((builtin_names("reward") | set(entry_points(REWARD_GROUP)) | set(self.specs))
                            - NOT_SERVED)
        self.slots = Slots(concurrency, queue_timeout_s)
        self.max_request_bytes = max_request_bytes
        self.stats = {"requests": 0, "rows": 0, "busy_refused": 0}


SERVER = web.AppKey("arlctl_reward_server", RewardServer)


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": {"message": message, **extra}}, status=status)


def parse_rows(body: dict[str, Any]) -> tuple[list[Item], dict[str, Any]]:
    """The request's rows as Items and its options; a UsageError (400) names the first bad field."""
    rows, options = body.get("rows"), body.get("options", {})
    if not isinstance(rows, list):
        raise UsageError("`rows` must be a list of row objects")
    if not isinstance(options, dict):
        raise UsageError("`options` must be an object of reward options")
    items = []
    for i, row in enumerate(rows):
        where = f"rows[{i}]"
        if not isinstance(row, dict):
            raise UsageError(f"{where} must be an object")
        final_state, task, text = row.get("final_state"), row.get("task"), row.get("response_text")
        if final_state is not None and not isinstance(final_state, str):
            raise UsageError(f"{where}.final_state must be a string or null")
        if not isinstance(task, dict):
            raise UsageError(f"{where}.task must be an object")
        if not isinstance(text, str):
            raise UsageError(f"{where}.response_text must be a string")
        turns = row.get("turns", [])
        if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
            raise UsageError(f"{where}.turns must be a list of strings")
        ids = {k: row.get(k, default) for k, default in (("trajectory_id", ""), ("group_id", f"\0row-{i}"))}
        if not all(isinstance(v, str) for v in ids.values()):
            raise UsageError(f"{where}: trajectory_id and group_id must be strings")
        items.append(Item(final_state, task, text, ids["trajectory_id"], ids["group_id"], turns))
    return items, options


async def _read_body(request: web.Request, limit: int) -> dict[str, Any]:
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(f"the body is {request.content_length} bytes; this server takes at most {limit}")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise BodyTooLarge(f"the body is over the {limit}-byte limit") from None
    return await asyncio.to_thread(parse_body, raw)


def _result(scored: Scored) -> dict[str, Any]:
    reward, components, info = scored
    return {"reward": reward, "components": components, "info": info}


async def score(request: web.Request) -> web.Response:
    server = request.app[SERVER]
    name = unquote(request.match_info["name"])
    if name not in server.names:
        return _error(404, f"unknown reward {name!r}", known=server.names)
    body = await _read_body(request, server.max_request_bytes)
    items, options = parse_rows(body)
    reward = get_reward(name, **options)  # a bad option is a UsageError: 400
    server.stats["requests"] += 1
    server.stats["rows"] += len(items)
    results = await score_items(reward, items, ScoreContext(server.slots, cache=None, offload=True))
    return web.json_response({"name": name, "version": reward.version, "results": [_result(r) for r in results]},
                             dumps=_dumps)


async def health(request: web.Request) -> web.Response:
    server = request.app[SERVER]
    return web.json_response({"ok": True, "rewards": server.names, "specs": server.specs,
                              "concurrency": server.slots.n, "scoring": server.slots.active,
                              "waiting": server.slots.waiting, "peak_scoring": server.slots.peak_active,
                              "peak_waiting": server.slots.peak_waiting, **server.stats})


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """413 over the size limit, 400 for a usage error, 503 when busy (retry), 500 (logged) for anything else."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except BodyTooLarge as err:
        return _error(413, str(err))
    except TransientError as err:
        request.app[SERVER].stats["busy_refused"] += 1
        return web.json_response({"error": {"message": str(err)}}, status=503, headers={"Retry-After": "5"})
    except TerminalError as err:
        return _error(400, str(err))
    except Exception as err:
        log.exception("%s %s failed", request.method, request.path)
        return _error(500, f"internal error ({type(err).__name__}: {err}); see the server log")


def build_app(server: RewardServer) -> web.Application:
    app = web.Application(client_max_size=server.max_request_bytes, middlewares=[_errors])
    app[SERVER] = server
    app.router.add_post("/score/{name}", score)
    app.router.add_get("/health", health)
    return app


async def serve_forever(server: RewardServer, host: str, port: int, stop: asyncio.Event) -> None:
    """Serve until `stop` is set; requests in flight are answered before the server closes."""
    runner = web.AppRunner(build_app(server), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


# ----------------------------------------------------------------------------------------------- the client


def _http_failure(url: str, status: int, body: bytes) -> Exception:
    """The typed error of a non-200 answer (what a UsageError or TransientError says)."""
    try:
        error = json.loads(body).get("error", {})
        message, known = str(error.get("message", "")), error.get("known")
    except (ValueError, AttributeError):
        message, known = body[:300].decode("utf-8", "replace"), None
    text = f"reward server {url} answered {status}: {message}"
    if status in (400, 404, 401, 403, 405, 422):
        return UsageError(text, hint=f"served: {', '.join(known)}" if known else None)
    return TransientError(text, hint="the shard stays pending; re-run once the reward server is healthy")


class RemoteReward:
    """A reward scored by an `arlctl reward-serve` (see the module docstring). Its version is the server's."""

    cacheable = True  # keyed by the server's version, which names the reward, its options and rubric

    def __init__(self, url: str, options: dict[str, Any] | None = None,
                 timeout_s: float = DEFAULT_CLIENT_TIMEOUT_S):
        parts = urlsplit(url)
        prefix, _, reward_name = parts.path.rstrip("/").rpartition("/")
        if parts.scheme not in ("http", "https") or not parts.netloc or not reward_name:
            raise UsageError(f"--reward {url!r}: a remote reward is http://HOST:PORT/NAME")
        self.name, self.reward_name, self.options = url, unquote(reward_name), dict(options or {})
        self.score_url = f"{parts.scheme}://{parts.netloc}{prefix}/score/{quote(self.reward_name, safe=':')}"
        self.timeout_s = timeout_s
        self.version = self._describe()

    def _describe(self) -> str:
        """The remote reward's version (a request with no rows): also checks the name and the options."""
        data = json.dumps({"rows": [], "options": self.options}).encode()
        request = urllib.request.Request(self.score_url, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 (http(s) checked above)
                return str(json.load(response)["version"])
        except urllib.error.HTTPError as err:
            raise _http_failure(self.score_url, err.code, err.read()) from None
        except (OSError, ValueError, KeyError) as err:
            raise TransientError(f"reward server {self.score_url} unreachable: {type(err).__name__}: {err}",
                                 hint="start `arlctl reward-serve` there (and check --reward), then re-run") from None

    async def score_batch(self, items: list[Item], ctx: ScoreContext, done: Done) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=self.timeout_s)
        # No connection cap of aiohttp's own (100): the stage's slots bound the requests in flight.
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as http:
            await asyncio.gather(*(self._score_chunk(http, items, chunk, ctx, done)
                                   for chunk in chunks(items, ctx.slots.n)))

    async def _score_chunk(self, http: aiohttp.ClientSession, items: list[Item], chunk: list[int],
                           ctx: ScoreContext, done: Done) -> None:
        rows = [{**items[j].as_dict(), "group_id": items[j].group_id, "turns": items[j].turns} for j in chunk]
        async with ctx.slots.hold():
            status, body = await self._post(http, {"rows": rows, "options": self.options})
        if status == 413:  # too big for the server: halve it (keeping groups whole), down to one row
            halves = chunks([items[j] for j in chunk], 2) if len(chunk) > 1 else []
            if len(halves) < 2:
                for j in chunk:
                    done(j, row_error(f"too large for the reward server: {self.score_url} answered 413 to a "
                                      f"request of {len(chunk)} rows of one group"))
                return
            await asyncio.gather(*(self._score_chunk(http, items, [chunk[k] for k in half], ctx, done)
                                   for half in halves))
            return
        if status != 200:
            raise _http_failure(self.score_url, status, body)
        self._record(json.loads(body), chunk, done)

    def _record(self, answer: dict[str, Any], chunk: list[int], done: Done) -> None:
        if answer.get("version") != self.version:  # the server now runs another reward under this name
            raise TerminalError(f"reward server {self.score_url} now scores version {answer.get('version')!r}, "
                                f"not {self.version!r} as when this run started",
                                hint="re-run: each invocation asks the server for its version once")
        results = answer.get("results")
        if not isinstance(results, list) or len(results) != len(chunk):
            for j in chunk:
                done(j, row_error(f"the reward server sent {len(results) if isinstance(results, list) else 'no'} "
                                  f"results for {len(chunk)} rows"))
            return
        for j, result in zip(chunk, results, strict=True):
            result = result if isinstance(result, dict) else {}
            info = result.get("info") if isinstance(result.get("info"), dict) else {}
            done(j, (result.get("reward"), result.get("components"), info))

    async def _post(self, http: aiohttp.ClientSession, payload: dict[str, Any]) -> tuple[int, bytes]:
        try:
            async with http.post(self.score_url, data=_dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"}) as response:
                return response.status, await response.read()
        except (aiohttp.ClientError, TimeoutError) as err:
            raise TransientError(f"reward server {self.score_url} failed: {type(err).__name__}: {err}",
                                 hint="the shard stays pending; re-run once the reward server is up") from None


def chunks(items: list[Item], n: int) -> list[list[int]]:
    """Indices of `items` in at most `n` chunks of about equal size (at most MAX_ROWS_PER_REQUEST rows
    each, so more when needed), consecutive groups together and no group split."""
    groups: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(item.group_id, []).append(i)
    size = max(1, min(MAX_ROWS_PER_REQUEST, math.ceil(len(items) / max(1, n))))
    out: list[list[int]] = []
    for members in groups.values():
        if not out or (out[-1] and len(out[-1]) + len(members) > size):
            out.append([])
        out[-1].extend(members)
    return [sorted(chunk) for chunk in out if chunk]
