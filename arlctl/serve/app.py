"""`arlctl serve`: an OpenAI-compatible HTTP endpoint over any Policy that records training data.

Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,
POST /v1/sessions/{id}/end. aiohttp (already a dependency of the stack) keeps this small.

Sessions: the `X-Arlctl-Session` request header names one; without it, a chat request joins the open
session whose record it extends (conversation-prefix matching), else opens a new one. The response always
carries the session id in the same header. A session ends on POST /v1/sessions/{id}/end, after
`idle_timeout_s` without requests, or when the server stops; its segments are then written as one group
of trajectory rows (GroupShardWriter, one shard per ended session).

Requests of one session are served one at a time (a lock per session), since each extends the last.
Streaming is not supported (400); `stop` strings are not supported (ignored: stopping is on EOS, the
chat template's end-of-turn token, or max_tokens). With `tools`, the reply's hermes `<tool_call>` blocks
are parsed (arlctl.tools) into OpenAI `tool_calls`; the text outside them becomes `content`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

from aiohttp import web

from arlctl.errors import TerminalError, TransientError
from arlctl.inference.base import Policy, SamplingParams
from arlctl.inference.chat import ChatCodec
from arlctl.io.shards import Lineage
from arlctl.io.sink import GroupShardWriter
from arlctl.schemas.rows import TrajectoryRow
from arlctl.serve.recorder import Recorder, Session
from arlctl.tools.hermes import parse_hermes, strip_tool_calls
from arlctl.tools.render import assistant_tool_calls

SESSION_HEADER = "X-Arlctl-Session"


class ServeState:
    """Everything the handlers share: the policy, the recorder, the writer, per-session locks."""

    def __init__(self, policy: Policy, record_dir: str | None, idle_timeout_s: float = 600.0,
                 default_max_tokens: int = 256):
        self.policy = policy
        self.codec = ChatCodec(policy.tokenizer)
        self.recorder = Recorder(self.codec, policy.name)
        self.idle_timeout_s = idle_timeout_s
        self.default_max_tokens = default_max_tokens
        self.writer = GroupShardWriter(
            record_dir or "", lambda: Lineage(stage="serve", extra={"policy": policy.name}),
            flush_groups=1, prefix="serve", dry_run=record_dir is None)
        self.locks: dict[str, asyncio.Lock] = {}
        self.rows_written: list[TrajectoryRow] = []
        self.stats = {"requests": 0, "in_flight": 0, "generated_tokens": 0, "sessions_ended": 0}

    def lock(self, session_id: str) -> asyncio.Lock:
        return self.locks.setdefault(session_id, asyncio.Lock())

    async def end_session(self, session_id: str, reason: str) -> int:
        rows = self.recorder.end(session_id, reason)
        self.locks.pop(session_id, None)
        if rows:
            await self.writer.add_group(rows)
            self.rows_written.extend(rows)
        self.stats["sessions_ended"] += 1
        return len(rows)

    async def end_all(self, reason: str) -> None:
        for sid in list(self.recorder.sessions):
            await self.end_session(sid, reason)
        await self.writer.flush()


STATE = web.AppKey("arlctl_serve_state", ServeState)


def sampling_from(body: dict[str, Any], default_max_tokens: int) -> SamplingParams:
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or default_max_tokens
    temperature = body.get("temperature")
    top_p = body.get("top_p")
    return SamplingParams(
        temperature=1.0 if temperature is None else float(temperature),
        top_p=1.0 if top_p is None else float(top_p),
        max_new_tokens=int(max_tokens),
        seed=body.get("seed"),
    )


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


async def _request_body(request: web.Request) -> dict[str, Any] | web.Response:
    """The JSON body of a completion request, or the 400 response that rejects it."""
    try:
        body = await request.json()
    except ValueError:
        return _error(400, "the body is not JSON")
    if not isinstance(body, dict):
        return _error(400, "the body must be a JSON object")
    if body.get("stream"):
        return _error(400, "streaming is not supported by arlctl serve")
    return body


async def chat_completions(request: web.Request) -> web.Response:
    state: ServeState = request.app[STATE]
    body = await _request_body(request)
    if isinstance(body, web.Response):
        return body
    messages, tools = body.get("messages") or [], body.get("tools") or []
    if not messages:
        return _error(400, "messages must be a non-empty list")
    sid = request.headers.get(SESSION_HEADER)
    session = state.recorder.session(sid) if sid else (state.recorder.match_chat(messages, tools)
                                                        or state.recorder.session(None))
    async with state.lock(session.id):
        ids = state.recorder.prepare_chat(session, messages, tools)
        gen, latency = await _generate(state, session, ids, sampling_from(body, state.default_max_tokens))
        raw_text, _glue = state.codec.split_generation(gen.ids)
        content, tool_calls = split_reply(raw_text, tools)
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
    body = await _request_body(request)
    if isinstance(body, web.Response):
        return body
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # the OpenAI API allows a batch; one prompt per request here
    if not (isinstance(prompt, str) and prompt) and not (isinstance(prompt, list) and prompt
                                                         and all(isinstance(t, int) for t in prompt)):
        return _error(400, "prompt must be a non-empty string or list of token ids")
    session = state.recorder.session(request.headers.get(SESSION_HEADER))
    async with state.lock(session.id):
        ids = state.recorder.prepare_completion(session, prompt)
        gen, latency = await _generate(state, session, ids, sampling_from(body, state.default_max_tokens))
        text = state.recorder.record_completion(session, gen, latency)
    choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": gen.finish_reason,
                              "token_ids": gen.ids, "logprobs": None}
    if body.get("logprobs") is not None:
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
    sid = request.match_info["sid"]
    if sid not in state.recorder.sessions:
        return _error(404, f"no open session {sid!r}")
    async with state.lock(sid):
        rows = await state.end_session(sid, "ended")
    return web.json_response({"session": sid, "rows": rows})


async def models(request: web.Request) -> web.Response:
    state: ServeState = request.app[STATE]
    return web.json_response({"object": "list", "data": [
        {"id": state.policy.name, "object": "model", "owned_by": "arlctl", "version": state.policy.version}]})


async def health(request: web.Request) -> web.Response:
    state: ServeState = request.app[STATE]
    return web.json_response({"ok": True, "sessions": len(state.recorder.sessions), **state.stats})


async def _reaper(state: ServeState) -> None:
    """End sessions idle for longer than the timeout (checked several times per timeout)."""
    while True:
        await asyncio.sleep(max(0.05, state.idle_timeout_s / 4))
        for sid in state.recorder.idle(state.idle_timeout_s):
            lock = state.lock(sid)
            if not lock.locked():
                async with lock:
                    await state.end_session(sid, "idle")


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Typed errors become OpenAI-style error bodies: transient ones 503 (clients retry), others 400."""
    try:
        return await handler(request)
    except TransientError as err:
        return web.json_response({"error": {"message": str(err), "type": "server_error"}}, status=503)
    except TerminalError as err:
        return _error(400, str(err))


def build_app(state: ServeState) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[_errors])
    app[STATE] = state
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/sessions/{sid}/end", end_session)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)

    async def lifecycle(app: web.Application):
        reaper = asyncio.ensure_future(_reaper(state))
        yield
        reaper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reaper
        await state.end_all("server_stopped")

    app.cleanup_ctx.append(lifecycle)
    return app


async def serve_forever(state: ServeState, host: str, port: int, ready: asyncio.Event | None = None) -> None:
    """Run the app until cancelled; on the way out every open session is written."""
    runner = web.AppRunner(build_app(state), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    if ready is not None:
        ready.set()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
