"""`arlctl serve`: an OpenAI-compatible HTTP endpoint over any Policy that records training data.

Routes: POST /v1/chat/completions, POST /v1/completions, POST /v1/messages (Anthropic's Messages API,
arlctl.serve.anthropic), GET /v1/models, GET /health, POST /v1/sessions/{id}/end,
POST /v1/sessions/{id}/reward. aiohttp (already a dependency of the stack) keeps this small.

Sessions: the `X-Arlctl-Session` request header names one; without it, a chat request joins the open
session whose record it extends (conversation-prefix matching), else opens a new one. The response always
carries the session id in the same header. A session ends on POST /v1/sessions/{id}/end, after
`idle_timeout_s` without requests, or when the server stops; its segments become one group of trajectory
rows, and ended sessions are committed in batches (arlctl.serve.batcher: a shard per `flush_sessions`
sessions or `flush_seconds`, whichever comes first). POST /v1/sessions/{id}/end answers once the
session's rows are committed (a 503 when the write failed: the rows stay queued and are retried).

Outcomes: a black-box harness that knows how a session went posts {"reward": R, "info": {...}} to
/v1/sessions/{id}/reward before ending it; every row of the session is then written with reward R,
reward_info the info, reward_version "session-api" (so such rows can go straight to `filter`). R must be
a finite number (400 otherwise). An unknown session is a 404; a session already ended (its rows are
written and immutable) a 409. An outcome is posted once: posting the same outcome again is answered 200
(a client may retry), a different one 409.

Requests of one session are served one at a time (a lock per session), since each extends the last.
`stream: true` answers with server-sent events in OpenAI's chunk format (arlctl.serve.sse): the stream
opens before generation, the text follows once the turn is generated and recorded by the same code as a
non-streaming request (so the record is identical); a client that disconnects mid-stream leaves the turn
recorded. `stop` strings are not supported (ignored: stopping is on EOS, the chat template's end-of-turn
token, or max_tokens). With `tools`, the reply's hermes `<tool_call>` blocks
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
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web
from jinja2 import TemplateError

from arlctl.errors import TerminalError, TransientError, UsageError
from arlctl.inference.base import Generation, Policy, SamplingParams
from arlctl.inference.chat import ChatCodec
from arlctl.io.shards import Lineage
from arlctl.serve.batcher import DEFAULT_FLUSH_SECONDS, DEFAULT_FLUSH_SESSIONS, SessionBatcher
from arlctl.serve.recorder import Recorder, Session
from arlctl.serve.sse import (
    EventStream,
    chat_chunks,
    completion_chunks,
    role_chunk,
    string_pieces,
    text_pieces,
)
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
Opened = Callable[[list[int]], Awaitable[None]]  # runs after a request's prompt is ready, before generation


def anthropic_error(kind: str, message: str) -> dict[str, Any]:
    """Anthropic's error body: {"type": "error", "error": {"type", "message"}}."""
    kinds = {"server_error": "api_error"}
    return {"type": "error", "error": {"type": kinds.get(kind, kind), "message": message}}


class ServeState:
    """Everything the handlers share: the policy, the recorder, the writer, per-session locks."""

    def __init__(self, policy: Policy, record_dir: str | None, idle_timeout_s: float = 600.0,
                 default_max_tokens: int = 256, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 flush_sessions: int = DEFAULT_FLUSH_SESSIONS, flush_seconds: float = DEFAULT_FLUSH_SECONDS):
        self.policy = policy
        self.codec = ChatCodec(policy.tokenizer)
        self.recorder = Recorder(self.codec, policy.name)
        self.idle_timeout_s = idle_timeout_s
        self.default_max_tokens = default_max_tokens
        self.max_body_bytes = max_body_bytes
        self.vocab_size = len(policy.tokenizer)  # prompt ids must decode: the tokenizer's vocabulary
        # Parsing, tokenising and shard writes run here, never on the event loop (a 4 MB prompt takes seconds).
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="arlctl-serve")
        self.writer = SessionBatcher(
            record_dir or "", lambda: Lineage(stage="serve", extra={"policy": policy.name}), self.offload,
            flush_sessions=flush_sessions, flush_seconds=flush_seconds, dry_run=record_dir is None)
        self.locks: dict[str, asyncio.Lock] = {}
        self.failed: dict[str, str] = {}  # session id -> why its rows could not be written
        self.ended: dict[str, None] = {}  # ids of ended sessions, oldest first (an ordered set)
        self.stats = {"requests": 0, "in_flight": 0, "preparing": 0, "generated_tokens": 0,
                      "sessions_ended": 0, "sessions_failed": 0, "sessions_rewarded": 0,
                      "sessions_waiting": 0, "shards_written": 0, "flush_failures": 0,
                      "streams": 0, "streams_disconnected": 0}

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
        """Close one session and queue its rows for the next shard (committed at once when a batch is
        full); never raises (a session the schema refuses is logged and marked; a failed write is
        logged and retried by the next flush)."""
        self.locks.pop(session_id, None)
        self.stats["sessions_ended"] += 1
        self.ended[session_id] = None
        if len(self.ended) > MAX_ENDED_REMEMBERED:
            del self.ended[next(iter(self.ended))]
        try:
            rows = self.recorder.end(session_id, reason)
            if rows:
                await self.writer.add(session_id, rows)
        except Exception as err:  # one bad session must not stop the others being written
            self.recorder.sessions.pop(session_id, None)  # never retried forever
            self.mark_failed(session_id, err)
            return 0
        await self.flush_if_due()
        return len(rows)

    async def flush_if_due(self) -> None:
        """Commit a shard if one is due; a failed write is logged and counted, its batch kept for the next."""
        try:
            await self.writer.flush_if_due()
        except Exception as err:
            self.flush_failed(err)
        self.count_batches()

    def flush_failed(self, err: BaseException) -> None:
        log.error("writing %d ended sessions failed (kept for the next flush): %s: %s", len(self.writer.waiting),
                  type(err).__name__, err, exc_info=(type(err), err, err.__traceback__))
        self.stats["flush_failures"] += 1

    def count_batches(self) -> None:
        self.stats["sessions_waiting"] = len(self.writer.waiting)
        self.stats["shards_written"] = len(self.writer.written)

    def mark_failed(self, session_id: str, err: BaseException) -> None:
        log.error("session %s could not be written: %s: %s", session_id, type(err).__name__, err,
                  exc_info=(type(err), err, err.__traceback__))
        self.failed[session_id] = f"{type(err).__name__}: {err}"[:500]
        self.stats["sessions_failed"] += 1

    async def end_all(self, reason: str) -> None:
        """End every open session and commit everything waiting; a session whose rows the last write
        could not store is marked failed by name."""
        for sid in list(self.recorder.sessions):
            await self.end_session(sid, reason)
        try:
            await self.writer.flush()
        except Exception as err:
            for sid in self.writer.unwritten:
                self.mark_failed(sid, err)
        self.count_batches()


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


async def read_body(request: web.Request, state: ServeState) -> dict[str, Any]:
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


def check_fits(state: ServeState, ids: list[int]) -> None:
    """The backend's own context check, made before a stream opens (after it, an error is no longer a 400)."""
    limit = getattr(state.policy, "max_context", None)
    if limit and len(ids) >= limit:
        raise TerminalError(f"prompt of {len(ids)} tokens does not fit the {limit}-token context")


async def _turn(state: ServeState, session: Session, prepare: Callable[..., list[int]], args: tuple[Any, ...],
                sampling: SamplingParams, opened: Opened | None = None) -> tuple[list[int], Generation, float]:
    """Extend the session's record (in the pool) and generate; on any failure undo the extension.

    `opened(ids)` runs between the two: a streaming request opens its stream there, so its first byte
    leaves before generation starts; if that fails (the client has gone) nothing was sampled and the
    extension is undone like any other failure.
    """
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
        if opened is not None:
            await opened(ids)
        gen, latency = await _generate(state, session, ids, sampling)
    except BaseException:
        state.recorder.rollback(session, undo)
        raise
    return ids, gen, latency


@dataclass
class ChatTurn:
    """One recorded chat turn: the ids generated from, the generation, and the reply split into parts."""

    ids: list[int]
    gen: Generation
    raw_text: str  # the reply as sampled (tool-call blocks kept)
    content: str | None  # the text outside tool-call blocks; None when the reply is only calls
    tool_calls: list[dict[str, Any]]  # OpenAI format


async def chat_session(state: ServeState, request: web.Request, messages: list[dict[str, Any]],
                       tools: list[dict[str, Any]]) -> Session:
    """The session a chat request belongs to: its header's, else the one whose record it extends, else new."""
    sid = _header_session(request)
    matched = None if sid else await state.offload(state.recorder.match_chat, messages, tools)
    return matched or state.recorder.session(sid)


async def chat_turn(state: ServeState, session: Session, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                    sampling: SamplingParams, opened: Opened | None = None,
                    call_id: Callable[[int], str] | None = None) -> ChatTurn:
    """Prepare, generate and record one chat turn (the same for every endpoint and for streaming).

    call_id(index): the id each parsed tool call is answered and recorded with (default call_<index>).
    """
    async with state.lock(session.id):
        ids, gen, latency = await _turn(state, session, state.recorder.prepare_chat, (messages, tools), sampling,
                                        opened)
        raw_text, _glue = state.codec.split_generation(gen.ids)
        content, tool_calls = split_reply(raw_text, tools)
        if call_id is not None:
            tool_calls = [{**call, "id": call_id(index)} for index, call in enumerate(tool_calls)]
        state.recorder.record_chat(session, gen, raw_text, content, tool_calls, latency)
    return ChatTurn(ids, gen, raw_text, content, tool_calls)


def reply_pieces(state: ServeState, turn: ChatTurn) -> list[str]:
    """The reply's content in streaming pieces: token-aligned when it is the sampled text itself."""
    if turn.content is None:
        return []
    if turn.content == turn.raw_text:
        ids = turn.gen.ids
        last = state.codec.decode(ids[-1:]) if ids else ""
        if last and state.codec.closing.startswith(last):
            ids = ids[:-1]  # the end-of-message token is the template's, not content (split_generation)
        return [piece for piece, _ids in text_pieces(state.codec.decode, ids, turn.content)]
    return string_pieces(turn.content)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state: ServeState = request.app[STATE]
    body = await read_body(request, state)
    chat = chat_request(body, state.default_max_tokens)
    session = await chat_session(state, request, chat.messages, chat.tools)
    base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": state.policy.name}
    if chat.stream:
        return await _stream_chat(request, state, session, chat, base)
    turn = await chat_turn(state, session, chat.messages, chat.tools, chat.sampling)
    message: dict[str, Any] = {"role": "assistant", "content": turn.content}
    if turn.tool_calls:
        message["tool_calls"] = turn.tool_calls
    payload = {
        **base, "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": _chat_finish(turn), "logprobs": None}],
        "usage": _usage(len(turn.ids), len(turn.gen.ids)),
        "arlctl": _extension(session, turn.gen),
    }
    return web.json_response(payload, headers={SESSION_HEADER: session.id})


def _chat_finish(turn: ChatTurn) -> str:
    return "tool_calls" if turn.tool_calls else turn.gen.finish_reason


def _extension(session: Session, gen: Generation) -> dict[str, Any]:
    return {"session": session.id, "policy_version": gen.version, "token_ids": gen.ids}


async def _stream_chat(request: web.Request, state: ServeState, session: Session, chat: Any,
                       base: dict[str, Any]) -> web.StreamResponse:
    base = {**base, "object": "chat.completion.chunk"}
    stream = EventStream(request, {SESSION_HEADER: session.id})

    async def opened(ids: list[int]) -> None:
        check_fits(state, ids)
        await stream.open()
        await stream.send(role_chunk(base, chat.include_usage))

    try:
        turn = await chat_turn(state, session, chat.messages, chat.tools, chat.sampling, opened)
    except Exception as err:
        if not stream.opened:
            raise
        return await stream_failed(state, stream, err, openai_error_event)
    usage = _usage(len(turn.ids), len(turn.gen.ids)) if chat.include_usage else None
    for chunk in chat_chunks(base, reply_pieces(state, turn), turn.tool_calls, _chat_finish(turn), usage,
                             _extension(session, turn.gen)):
        await stream.send(chunk)
    await stream.send("[DONE]")
    return await stream_done(state, stream)


async def stream_failed(state: ServeState, stream: EventStream, err: Exception,
                         event: Callable[[int, str, str], tuple[str | None, dict[str, Any]]]) -> web.StreamResponse:
    """A request that failed after its stream opened: an error event (the status can no longer change).
    A client that left before generation started gets nothing: its request was rolled back."""
    if stream.disconnected:
        return await stream_done(state, stream)
    status, kind, message = classify_error(err, stream.request)
    name, data = event(status, kind, message)
    await stream.send(data, name)
    return await stream_done(state, stream)


async def stream_done(state: ServeState, stream: EventStream) -> web.StreamResponse:
    state.stats["streams"] += 1
    response = await stream.close()
    if stream.disconnected:  # the turn is recorded all the same (see arlctl.serve.sse)
        state.stats["streams_disconnected"] += 1
    return response


def openai_error_event(status: int, kind: str, message: str) -> tuple[str | None, dict[str, Any]]:
    return None, {"error": {"message": message, "type": kind, "code": status}}


async def completions(request: web.Request) -> web.StreamResponse:
    state: ServeState = request.app[STATE]
    body = await read_body(request, state)
    req = completion_request(body, state.default_max_tokens, state.vocab_size)
    session = state.recorder.session(_header_session(request))
    base = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": state.policy.name}
    stream = EventStream(request, {SESSION_HEADER: session.id}) if req.stream else None

    async def opened(ids: list[int]) -> None:
        check_fits(state, ids)
        assert stream is not None
        await stream.open()
        await stream.send_raw(b": generating\n\n")  # an SSE comment: the first byte, before generation

    try:
        async with state.lock(session.id):
            ids, gen, latency = await _turn(state, session, state.recorder.prepare_completion, (req.prompt,),
                                            req.sampling, opened if stream else None)
            text = state.recorder.record_completion(session, gen, latency)
    except Exception as err:
        if stream is None or not stream.opened:
            raise
        return await stream_failed(state, stream, err, openai_error_event)
    usage = _usage(len(ids), len(gen.ids))
    logprobs = [float(lp) for lp in gen.logprobs] if req.logprobs else None
    if stream is not None:
        pieces = text_pieces(state.codec.decode, gen.ids, text)
        for chunk in completion_chunks(base, pieces, logprobs, gen.finish_reason,
                                       usage if req.include_usage else None):
            await stream.send(chunk)
        await stream.send("[DONE]")
        return await stream_done(state, stream)
    choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": gen.finish_reason,
                              "token_ids": gen.ids, "logprobs": None}
    if logprobs is not None:
        choice["logprobs"] = {"tokens": [f"token_id:{t}" for t in gen.ids], "token_logprobs": logprobs}
    payload = {**base, "choices": [choice], "usage": usage, "arlctl": _extension(session, gen)}
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
    if sid not in state.recorder.sessions and not state.writer.pending(sid):
        return _error(404, f"no open session {sid!r}")
    if sid in state.recorder.sessions:
        async with state.lock(sid):
            rows = await state.end_session(sid, "ended")
    else:  # ended, its rows still queued (a retry after a 503, or an idle end racing this one)
        rows = state.writer.rows_of(sid)
    if sid in state.failed:
        return web.json_response({"error": {"message": f"session {sid} could not be written: {state.failed[sid]}",
                                            "type": "server_error"}}, status=500)
    try:
        await state.writer.commit(sid)  # answered once committed (with every session waiting meanwhile)
    except Exception as err:
        state.flush_failed(err)
        raise TransientError(f"session {sid} ended but its rows are not written yet ({type(err).__name__}: "
                             f"{err}); they stay queued and the next flush retries them",
                             hint="check the record directory; the server log has the error") from None
    finally:
        state.count_batches()
    return web.json_response({"session": sid, "rows": rows})


async def post_session_reward(request: web.Request) -> web.Response:
    """Attach a harness's outcome to an open session (see the module docstring)."""
    state: ServeState = request.app[STATE]
    sid = check_session_id(request.match_info["sid"])
    posted = session_reward(await read_body(request, state))
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


async def _flusher(state: ServeState) -> None:
    """Commit a shard whenever one is due by time (a full batch is committed by the session that fills it)."""
    while True:
        await asyncio.sleep(max(0.05, min(1.0, state.writer.flush_seconds / 4)))
        try:
            await state.flush_if_due()
        except Exception:
            log.exception("flusher: a pass failed; the next one runs as usual")


async def _reap_once(state: ServeState) -> None:
    for sid in state.recorder.idle(state.idle_timeout_s):
        lock = state.lock(sid)
        if not lock.locked():
            async with lock:
                await state.end_session(sid, "idle")
    for sid in [s for s, lock in state.locks.items() if s not in state.recorder.sessions and not lock.locked()]:
        del state.locks[sid]  # a lock left by a request that failed before anything was recorded


def classify_error(err: Exception, request: web.Request) -> tuple[int, str, str]:
    """(HTTP status, error type, message) for an exception a handler raised: 413 over the size limit, 503
    transient (clients retry), 400 typed terminal errors, 500 anything else (traceback to the log only)."""
    if isinstance(err, BodyTooLarge):
        return 413, "request_too_large", str(err)
    if isinstance(err, TransientError):
        return 503, "server_error", str(err)
    if isinstance(err, TerminalError):
        return 400, "invalid_request_error", str(err)
    log.error("%s %s failed", request.method, request.path, exc_info=(type(err), err, err.__traceback__))
    return 500, "server_error", f"internal error ({type(err).__name__}); see the server log"


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Errors become JSON bodies in the API's own shape (OpenAI's, or Anthropic's under /v1/messages)."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception as err:
        status, kind, message = classify_error(err, request)
        if request.path.startswith("/v1/messages"):
            return web.json_response(anthropic_error(kind, message), status=status)
        if kind == "request_too_large":
            kind = "invalid_request_error"
        return web.json_response({"error": {"message": message, "type": kind}}, status=status)


def build_app(state: ServeState) -> web.Application:
    from arlctl.serve.anthropic import count_tokens, messages  # it builds on this module

    app = web.Application(client_max_size=state.max_body_bytes, middlewares=[_errors])
    app[STATE] = state
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
    app.router.add_post("/v1/sessions/{sid}/end", end_session)
    app.router.add_post("/v1/sessions/{sid}/reward", post_session_reward)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)

    async def lifecycle(app: web.Application):
        tasks = [asyncio.ensure_future(_reaper(state)), asyncio.ensure_future(_flusher(state))]
        yield
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
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
