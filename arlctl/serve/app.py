"""`arlctl serve`: an OpenAI-compatible HTTP endpoint over any Policy that records training data.

Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,
POST /v1/sessions/{id}/end, POST /v1/sessions/{id}/reward. aiohttp (already a dependency of the stack) keeps this small.

Sessions: the `X-Arlctl-Session` request header names one; without it, a chat request joins the open
session whose record it extends (conversation-prefix matching), else opens a new one. The response always
carries the session id in the same header. A session ends on POST /v1/sessions/{id}/end, after
`idle_timeout_s` without requests, or when the server stops; its segments are then written as one group
of trajectory rows (GroupShardWriter, one shard per ended session).

Outcomes: a black-box harness that knows how a session went posts {"reward": R, "info": {...}} to
/v1/sessions/{id}/reward before ending it; every row of the session is then written with reward R,
reward_info the info, reward_version "session-api" (so such rows can go straight to `filter`). R must be
a finite number (400 otherwise). An unknown session is a 404; a session already ended (its rows are
written and immutable) a 409. An outcome is posted once: posting the same outcome again is answered 200
(a client may retry), a different one 409.

Requests of one session are served one at a time (a lock per session), since each extends the last.
Streaming is not supported (400); `stop` strings are not supported (ignored: stopping is on EOS, the
chat template's end-of-turn token, or max_tokens). With `tools`, the reply's hermes `<tool_call>` blocks
are parsed (arlctl.tools) into OpenAI `tool_calls`; the text outside them becomes `content`.

Hostile clients (issue 12): every request is checked field by field before it touches a session
(arlctl.serve.validation: a 400 naming the field, never a 500 with a traceback); a body over
`max_body_bytes` is a 413 before it is read; parsing and tokenising run in a thread pool, so a large
body never stalls the event loop; a request that fails after its record was extended is rolled back;
and the idle reaper survives anything one session can do to it: a session whose rows cannot be written
is logged and marked (/health `sessions_failed`, the CLI's exit status), and the loop goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from aiohttp import web
from jinja2 import TemplateError

from arlctl.errors import TerminalError, TransientError, UsageError
from arlctl.inference.base import Generation, Policy, SamplingParams
from arlctl.inference.chat import ChatCodec
from arlctl.io.shards import Lineage
from arlctl.io.sink import GroupShardWriter
from arlctl.schemas.rows import TrajectoryRow
from arlctl.serve.recorder import Recorder, Session
from arlctl.serve.validation import (
    DEFAULT_MAX_BODY_BYTES,
    BodyTooLarge,
    chat_request,
    check_session_id,
    completion_request,
    parse_body,
    session_reward,
)
from arlctl.tools.hermes import parse_hermes, strip_tool_calls
from arlctl.tools.render import assistant_tool_calls

SESSION_HEADER = "X-Arlctl-Session"
MAX_FAILED_LISTED = 20  # failed session ids shown by /health (all are counted)
MAX_ENDED_REMEMBERED = 100_000  # ended session ids kept so a late outcome is a 409, not a 404

log = logging.getLogger("arlctl.serve")
T = TypeVar("T")


class ServeState:
    """Everything the handlers share: the policy, the recorder, the writer, per-session locks."""

    def __init__(self, policy: Policy, record_dir: str | None, idle_timeout_s: float = 600.0,
                 default_max_tokens: int = 256, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES):
        self.policy = policy
        self.codec = ChatCodec(policy.tokenizer)
        self.recorder = Recorder(self.codec, policy.name)
        self.idle_timeout_s = idle_timeout_s
        self.default_max_tokens = default_max_tokens
        self.max_body_bytes = max_body_bytes
        self.vocab_size = len(policy.tokenizer)  # prompt ids must decode: the tokenizer's vocabulary
        self.writer = GroupShardWriter(
            record_dir or "", lambda: Lineage(stage="serve", extra={"policy": policy.name}),
            flush_groups=1, prefix="serve", dry_run=record_dir is None)
        # Parsing and tokenising run here, never on the event loop (a 4 MB prompt takes seconds).
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="arlctl-serve")
        self.locks: dict[str, asyncio.Lock] = {}
        self.rows_written: list[TrajectoryRow] = []
        self.failed: dict[str, str] = {}  # session id -> why its rows could not be written
        self.ended: dict[str, None] = {}  # ids of ended sessions, oldest first (an ordered set)
        self.stats = {"requests": 0, "in_flight": 0, "preparing": 0, "generated_tokens": 0,
                      "sessions_ended": 0, "sessions_failed": 0, "sessions_rewarded": 0}

    def lock(self, session_id: str) -> asyncio.Lock:
        return self.locks.setdefault(session_id, asyncio.Lock())

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) in the worker pool. If the request is cancelled meanwhile, the thread (which cannot
        be stopped) is still waited for, so nobody rolls back a record while it is being written."""
        future = asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            await asyncio.wait([future])
            raise

    async def end_session(self, session_id: str, reason: str) -> int:
        """Close one session and write its rows; never raises (a failure is logged and marked)."""
        self.locks.pop(session_id, None)
        self.stats["sessions_ended"] += 1
        self.ended[session_id] = None
        if len(self.ended) > MAX_ENDED_REMEMBERED:
            del self.ended[next(iter(self.ended))]
        try:
            rows = self.recorder.end(session_id, reason)
            if rows:
                await self.writer.add_group(rows)
                self.rows_written.extend(rows)
            return len(rows)
        except Exception as err:  # one bad session must not stop the others being written
            self.recorder.sessions.pop(session_id, None)  # never retried forever
            self.mark_failed(session_id, err)
            return 0

    def mark_failed(self, session_id: str, err: BaseException) -> None:
        log.error("session %s could not be written: %s: %s", session_id, type(err).__name__, err,
                  exc_info=(type(err), err, err.__traceback__))
        self.failed[session_id] = f"{type(err).__name__}: {err}"[:500]
        self.stats["sessions_failed"] += 1

    async def end_all(self, reason: str) -> None:
        for sid in list(self.recorder.sessions):
            await self.end_session(sid, reason)
        try:
            await self.writer.flush()
        except Exception as err:
            self.mark_failed("(final flush)", err)


STATE = web.AppKey("arlctl_serve_state", ServeState)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)


def split_reply(raw_text: str, tools: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, OpenAI tool_calls) for one generated turn; content is None when only calls were written."""
    if not tools:
        return raw_text, []
    calls, _errors = parse_hermes(raw_text, tools)
    if not calls:
        return raw_text, []
    content = strip_tool_calls(raw_text).strip()
    return (content or None), assistant_tool_calls(calls)


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _read_body(request: web.Request, state: ServeState) -> dict[str, Any]:
    """The parsed JSON body; BodyTooLarge (413) before reading when it is over the limit."""
    limit = state.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(f"the body is {request.content_length} bytes; this server takes at most {limit}",
                           hint="raise --max-body-bytes")
    try:
        raw = await request.read()  # aiohttp stops reading past client_max_size (chunked bodies too)
    except web.HTTPRequestEntityTooLarge:
        raise BodyTooLarge(f"the body is over the {limit}-byte limit", hint="raise --max-body-bytes") from None
    return await state.offload(parse_body, raw)


def _header_session(request: web.Request) -> str | None:
    sid = request.headers.get(SESSION_HEADER)
    return None if sid is None else check_session_id(sid)


async def _turn(state: ServeState, session: Session, prepare: Callable[..., list[int]], args: tuple[Any, ...],
                sampling: SamplingParams) -> tuple[list[int], Generation, float]:
    """Extend the session's record (in the pool) and generate; on any failure undo the extension."""
    if not state.recorder.is_open(session):  # it ended (idle, or a failed first request) while we waited
        raise TransientError(f"session {session.id} ended while this request waited", hint="retry the request")
    undo = state.recorder.checkpoint(session)
    try:
        state.stats["preparing"] += 1
        try:
            ids = await state.offload(prepare, session, *args)
        except TemplateError as err:
            raise UsageError(f"the chat template cannot render these messages: {err}") from None
        finally:
            state.stats["preparing"] -= 1
        gen, latency = await _generate(state, session, ids, sampling)
    except BaseException:
        state.recorder.rollback(session, undo)
        raise
    return ids, gen, latency


async def chat_completions(request: web.Request) -> web.Response:
    state: ServeState = request.app[STATE]
    body = await _read_body(request, state)
    chat = chat_request(body, state.default_max_tokens)
    sid = _header_session(request)
    matched = None if sid else await state.offload(state.recorder.match_chat, chat.messages, chat.tools)
    session = matched or state.recorder.session(sid)
    async with state.lock(session.id):
        ids, gen, latency = await _turn(state, session, state.recorder.prepare_chat, (chat.messages, chat.tools),
                                        chat.sampling)
        raw_text, _glue = state.codec.split_generation(gen.ids)
        content, tool_calls = split_reply(raw_text, chat.tools)
        state.recorder.record_chat(session, gen, raw_text, content, tool_calls, latency)
    finish = "tool_calls" if tool_calls else gen.finish_reason
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    payload = {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
        "model": state.policy.name,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": _usage(len(ids), len(gen.ids)),
        "arlctl": {"session": session.id, "policy_version": gen.version, "token_ids": gen.ids},
    }
    return web.json_response(payload, headers={SESSION_HEADER: session.id})


async def completions(request: web.Request) -> web.Response:
    state: ServeState = request.app[STATE]
    body = await _read_body(request, state)
    req = completion_request(body, state.default_max_tokens, state.vocab_size)
    session = state.recorder.session(_header_session(request))
    async with state.lock(session.id):
        ids, gen, latency = await _turn(state, session, state.recorder.prepare_completion, (req.prompt,),
                                        req.sampling)
        text = state.recorder.record_completion(session, gen, latency)
    choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": gen.finish_reason,
                              "token_ids": gen.ids, "logprobs": None}
    if req.logprobs:
        choice["logprobs"] = {"tokens": [f"token_id:{t}" for t in gen.ids],
                              "token_logprobs": [float(lp) for lp in gen.logprobs]}
    payload = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
               "model": state.policy.name, "choices": [choice], "usage": _usage(len(ids), len(gen.ids))}
    return web.json_response(payload, headers={SESSION_HEADER: session.id})


async def _generate(state: ServeState, session: Session, ids: list[int], sampling: SamplingParams):
    state.stats["requests"] += 1
    state.stats["in_flight"] += 1
    session.requests += 1
    t0 = time.monotonic()
    try:
        gen = await state.policy.generate(ids, sampling)
    finally:
        state.stats["in_flight"] -= 1
        session.last_seen = time.monotonic()
    state.stats["generated_tokens"] += len(gen.ids)
    return gen, time.monotonic() - t0


async def end_session(request: web.Request) -> web.Response:
    state: ServeState = request.app[STATE]
    sid = check_session_id(request.match_info["sid"])
    if sid not in state.recorder.sessions:
        return _error(404, f"no open session {sid!r}")
    async with state.lock(sid):
        rows = await state.end_session(sid, "ended")
    if sid in state.failed:
        return web.json_response({"error": {"message": f"session {sid} could not be written: {state.failed[sid]}",
                                            "type": "server_error"}}, status=500)
    return web.json_response({"session": sid, "rows": rows})


async def post_session_reward(request: web.Request) -> web.Response:
    """Attach a harness's outcome to an open session (see the module docstring)."""
    state: ServeState = request.app[STATE]
    sid = check_session_id(request.match_info["sid"])
    posted = session_reward(await _read_body(request, state))
    outcome = (posted.reward, posted.info)
    async with state.lock(sid):
        session = state.recorder.sessions.get(sid)
        if session is None and sid in state.ended:
            return _error(409, f"session {sid!r} has ended and its rows are written; post the reward before "
                               "POST /v1/sessions/{id}/end")
        if session is None:
            return _error(404, f"no open session {sid!r}")
        if session.outcome is not None and session.outcome != outcome:
            return _error(409, f"session {sid!r} already has reward {session.outcome[0]!r}; an outcome is "
                               "posted once")
        if session.outcome is None:
            state.stats["sessions_rewarded"] += 1
        session.outcome = outcome
        session.last_seen = time.monotonic()
    return web.json_response({"session": sid, "reward": posted.reward})


async def models(request: web.Request) -> web.Response:
    state: ServeState = request.app[STATE]
    return web.json_response({"object": "list", "data": [
        {"id": state.policy.name, "object": "model", "owned_by": "arlctl", "version": state.policy.version}]})


async def health(request: web.Request) -> web.Response:
    state: ServeState = request.app[STATE]
    return web.json_response({"ok": True, "sessions": len(state.recorder.sessions), **state.stats,
                              "failed_sessions": list(state.failed)[:MAX_FAILED_LISTED]})


async def _reaper(state: ServeState) -> None:
    """End sessions idle for longer than the timeout (checked several times per timeout).

    It cannot die: end_session never raises, and anything else one pass throws is logged and the next
    pass runs (before, one unwritable session ended the task and no session was ever written again).
    """
    while True:
        await asyncio.sleep(max(0.05, state.idle_timeout_s / 4))
        try:
            await _reap_once(state)
        except Exception:
            log.exception("idle reaper: a pass failed; the next one runs as usual")


async def _reap_once(state: ServeState) -> None:
    for sid in state.recorder.idle(state.idle_timeout_s):
        lock = state.lock(sid)
        if not lock.locked():
            async with lock:
                await state.end_session(sid, "idle")
    for sid in [s for s, lock in state.locks.items() if s not in state.recorder.sessions and not lock.locked()]:
        del state.locks[sid]  # a lock left by a request that failed before anything was recorded


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Errors become OpenAI-style JSON bodies: 413 over the size limit, 503 transient (clients retry),
    400 for typed terminal errors, 500 for anything else (its traceback goes to the log, not the client)."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except BodyTooLarge as err:
        return _error(413, str(err))
    except TransientError as err:
        return web.json_response({"error": {"message": str(err), "type": "server_error"}}, status=503)
    except TerminalError as err:
        return _error(400, str(err))
    except Exception as err:
        log.exception("%s %s failed", request.method, request.path)
        return web.json_response({"error": {"message": f"internal error ({type(err).__name__}); see the server log",
                                            "type": "server_error"}}, status=500)


def build_app(state: ServeState) -> web.Application:
    app = web.Application(client_max_size=state.max_body_bytes, middlewares=[_errors])
    app[STATE] = state
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/sessions/{sid}/end", end_session)
    app.router.add_post("/v1/sessions/{sid}/reward", post_session_reward)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)

    async def lifecycle(app: web.Application):
        reaper = asyncio.ensure_future(_reaper(state))
        yield
        reaper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reaper
        await state.end_all("server_stopped")
        state.executor.shutdown(wait=False)

    app.cleanup_ctx.append(lifecycle)
    return app


async def serve_forever(state: ServeState, host: str, port: int, ready: asyncio.Event | None = None,
                        stop: asyncio.Event | None = None) -> None:
    """Run the app until `stop` is set (or the task is cancelled); on the way out every open session is written."""
    runner = web.AppRunner(build_app(state), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    if ready is not None:
        ready.set()
    try:
        await (stop or asyncio.Event()).wait()
    finally:
        await runner.cleanup()
