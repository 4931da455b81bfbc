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
big for the server gets reward null with the cause). The client trusts the server no more than it must:
every request has one total deadline ($ARLCTL_REWARD_TIMEOUT_S, default 900 s: a server dripping its
answer a byte at a time is cut off there), an answer is read up to $ARLCTL_MAX_REWARD_ANSWER_BYTES
(256 MiB), and a 200 that is not a JSON object (a list, a string, invalid JSON, HTML) is a TransientError
naming the server (exit 75), never a traceback. Only JSON numbers are rewards: a result whose reward or
components are strings ("1.0"), booleans or anything else gets reward null with a cause naming the server
(NaN and inf: null as for a local reward). A stage stopped by SIGTERM cancels its requests in flight.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
import math
import os
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import aiohttp
from aiohttp import web

from arlctl.envs.registry import REWARD_GROUP, builtin_names, entry_points, get_reward, is_spec
from arlctl.errors import TerminalError, TransientError, UsageError
from arlctl.rewards.scoring import Done, Item, ScoreContext, Scored, Slots, number, row_error, score_items
from arlctl.serve.validation import BodyTooLarge, parse_body

DEFAULT_CLIENT_TIMEOUT_S = 900.0  # one request's scoring: sandboxed tests of a whole chunk can take minutes
MAX_CLIENT_TIMEOUT_S = 86_400.0
TIMEOUT_ENV = "ARLCTL_REWARD_TIMEOUT_S"  # the client's total deadline per request, in seconds
DEFAULT_MAX_ANSWER_BYTES = 256 << 20  # one answer: 256 rows with their info
MAX_ANSWER_ENV = "ARLCTL_MAX_REWARD_ANSWER_BYTES"
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


def client_timeout_s() -> float:
    """The total deadline of one request to a reward server, in seconds: $ARLCTL_REWARD_TIMEOUT_S, else
    DEFAULT_CLIENT_TIMEOUT_S. It bounds the whole exchange (connect, headers, body), so a server that
    drips its answer a byte at a time is cut off at the deadline like one that never answers."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_CLIENT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 < value <= MAX_CLIENT_TIMEOUT_S:
        raise UsageError(f"{TIMEOUT_ENV}={raw[:40]!r} is not a number of seconds in (0, {MAX_CLIENT_TIMEOUT_S:g}]",
                         hint=f"unset it, or e.g. {TIMEOUT_ENV}={DEFAULT_CLIENT_TIMEOUT_S:g}")
    return value


def max_answer_bytes() -> int:
    """The largest answer body the client reads: $ARLCTL_MAX_REWARD_ANSWER_BYTES, else DEFAULT_MAX_ANSWER_BYTES."""
    raw = os.environ.get(MAX_ANSWER_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_ANSWER_BYTES
    if not raw.isdigit() or int(raw) < 1:
        raise UsageError(f"{MAX_ANSWER_ENV}={raw[:40]!r} is not a positive number of bytes",
                         hint=f"unset it, or e.g. {MAX_ANSWER_ENV}={DEFAULT_MAX_ANSWER_BYTES}")
    return int(raw)


def _http_failure(url: str, status: int, body: bytes) -> Exception:
    """The typed error of a non-200 answer (what a UsageError or TransientError says)."""
    try:
        error = json.loads(body).get("error", {})
        message, known = str(error.get("message", "")), error.get("known")
    except (ValueError, AttributeError, RecursionError):
        message, known = body[:300].decode("utf-8", "replace"), None
    if not isinstance(known, list) or not all(isinstance(k, str) for k in known):
        known = None
    message = " ".join(message.split())[:300]
    text = f"reward server {url} answered {status}: {message}"
    if status in (400, 404, 401, 403, 405, 422):
        return UsageError(text, hint=f"served: {', '.join(known)}" if known else None)
    return TransientError(text, hint=RETRY_HINT)


RETRY_HINT = "the shard stays pending; re-run once the reward server is healthy"


def _bad_answer(url: str, what: str) -> TransientError:
    """A 200 whose body is not the protocol's answer: the server is broken (or not an arlctl reward-serve);
    the shard stays pending, and the command exits 75 naming the server."""
    return TransientError(f"reward server {url} answered 200 with {what}, not a JSON object of results",
                          hint=RETRY_HINT + " (is it an `arlctl reward-serve`?)")


def parse_answer(url: str, body: bytes) -> dict[str, Any]:
    """A 200 body as the JSON object it must be; a TransientError naming the server for anything else
    (invalid JSON, HTML, a list, a string, a number)."""
    try:
        answer = json.loads(body)
    except (ValueError, RecursionError) as err:
        start = " ".join(body[:60].decode("utf-8", "replace").split())
        raise _bad_answer(url, f"a body that is not JSON ({type(err).__name__}; it starts {start!r})") from None
    if not isinstance(answer, dict):
        raise _bad_answer(url, f"JSON {type(answer).__name__}")
    return answer


def remote_result(url: str, result: Any) -> Scored:
    """One entry of `results` as (reward, components, info); a row error naming the server when the reward
    is not a number or null, or the components not an object of numbers (a string "1.0" or true is no
    reward: only JSON numbers are; NaN and inf are refused by `checked` like a local reward's)."""
    if not isinstance(result, dict):
        return row_error(f"reward server {url} sent a result that is JSON {type(result).__name__}, not an object")
    reward, components = result.get("reward"), result.get("components")
    info = result.get("info") if isinstance(result.get("info"), dict) else {}
    if reward is None:
        return None, None, info
    try:
        number(reward)
        if not isinstance(components, dict):
            raise TypeError(f"components are {type(components).__name__}, not an object")
        for value in components.values():
            number(value)
    except TypeError as err:
        return row_error(f"reward server {url} sent no usable reward ({err})")
    return reward, components, info


class RemoteReward:
    """A reward scored by an `arlctl reward-serve` (see the module docstring). Its version is the server's.

    Every request (the version request included) has one total deadline, timeout_s (client_timeout_s()),
    and reads at most max_answer_bytes of answer; past either it is a TransientError naming the server.
    A 200 that is not a JSON object is one too (exit 75, the shard stays pending)."""

    cacheable = True  # keyed by the server's version, which names the reward, its options and rubric

    def __init__(self, url: str, options: dict[str, Any] | None = None, timeout_s: float | None = None):
        parts = urlsplit(url)
        prefix, _, reward_name = parts.path.rstrip("/").rpartition("/")
        if parts.scheme not in ("http", "https") or not parts.netloc or not reward_name:
            raise UsageError(f"--reward {url!r}: a remote reward is http://HOST:PORT/NAME")
        self.name, self.reward_name, self.options = url, unquote(reward_name), dict(options or {})
        self.score_url = f"{parts.scheme}://{parts.netloc}{prefix}/score/{quote(self.reward_name, safe=':')}"
        self.timeout_s = client_timeout_s() if timeout_s is None else timeout_s
        self.max_answer_bytes = max_answer_bytes()
        self.version = self._describe()

    def _describe(self) -> str:
        """The remote reward's version (a request with no rows): also checks the name and the options."""
        status, body = _run_sync(self._describe_request())
        if status != 200:
            raise _http_failure(self.score_url, status, body)
        version = parse_answer(self.score_url, body).get("version")
        if not isinstance(version, str) or not version:
            raise _bad_answer(self.score_url, f"an object whose version is {type(version).__name__}")
        return version

    async def _describe_request(self) -> tuple[int, bytes]:
        async with self._session() as http:
            return await self._post(http, {"rows": [], "options": self.options}, unreachable=True)

    def _session(self) -> aiohttp.ClientSession:
        # total bounds the whole request; asyncio.timeout in _post bounds it again, body read included.
        timeout = aiohttp.ClientTimeout(total=self.timeout_s, sock_connect=min(30.0, self.timeout_s))
        # No connection cap of aiohttp's own (100): the stage's slots bound the requests in flight.
        return aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0))

    async def score_batch(self, items: list[Item], ctx: ScoreContext, done: Done) -> None:
        async with self._session() as http:
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
        self._record(parse_answer(self.score_url, body), chunk, done)

    def _record(self, answer: dict[str, Any], chunk: list[int], done: Done) -> None:
        if answer.get("version") != self.version:  # the server now runs another reward under this name
            raise TerminalError(f"reward server {self.score_url} now scores version {str(answer.get('version'))[:80]!r}, "
                                f"not {self.version!r} as when this run started",
                                hint="re-run: each invocation asks the server for its version once")
        results = answer.get("results")
        if not isinstance(results, list) or len(results) != len(chunk):
            for j in chunk:
                done(j, row_error(f"the reward server sent {len(results) if isinstance(results, list) else 'no'} "
                                  f"results for {len(chunk)} rows"))
            return
        for j, result in zip(chunk, results, strict=True):
            done(j, remote_result(self.score_url, result))

    async def _post(self, http: aiohttp.ClientSession, payload: dict[str, Any],
                    unreachable: bool = False) -> tuple[int, bytes]:
        """(status, body) of one POST, within timeout_s in all and at most max_answer_bytes of body."""
        try:
            async with asyncio.timeout(self.timeout_s):
                async with http.post(self.score_url, data=_dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"}) as response:
                    return response.status, await self._read(response)
        except TimeoutError:
            raise TransientError(f"reward server {self.score_url} did not answer within {self.timeout_s:g} s",
                                 hint=f"{RETRY_HINT}; ${TIMEOUT_ENV} sets this deadline") from None
        except aiohttp.ClientError as err:
            what = "unreachable" if unreachable else "failed"
            raise TransientError(f"reward server {self.score_url} {what}: {type(err).__name__}: {err}",
                                 hint="start `arlctl reward-serve` there (and check --reward), then re-run"
                                 if unreachable else RETRY_HINT) from None

    async def _read(self, response: aiohttp.ClientResponse) -> bytes:
        limit = self.max_answer_bytes
        if response.content_length is not None and response.content_length > limit:
            raise self._too_big(f"{response.content_length} bytes")
        body = bytearray()
        async for piece in response.content.iter_chunked(1 << 16):
            body += piece
            if len(body) > limit:
                raise self._too_big(f"more than {limit} bytes")
        return bytes(body)

    def _too_big(self, size: str) -> TransientError:
        return TransientError(f"reward server {self.score_url} answered {size}; at most {self.max_answer_bytes} "
                              "are read", hint=f"{RETRY_HINT}; ${MAX_ANSWER_ENV} raises the cap")


def _run_sync(work: Any) -> Any:
    """Run a coroutine to its end from synchronous code (in a thread of its own inside a running loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, work).result()


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
