"""Server-sent events for `arlctl serve`: the stream itself, and the OpenAI chunk sequences sent over it.

The Policy protocol returns a whole Generation (no incremental output), so a streamed reply is sent in two
parts: the stream opens (headers and a first event: OpenAI's role chunk, Anthropic's message_start) as
soon as the prompt is tokenized, before generation starts, so a client sees its first byte at once; the
text follows in token-aligned pieces once the turn is generated and recorded. The record is written by
the same code as a non-streaming request, before any text is sent: a client that disconnects mid-stream
loses its copy of the reply, never the session's record of it (the tokens were sampled, so they are data).
Writes to a client that has gone are dropped (`EventStream.disconnected`), never raised into the session.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

log = logging.getLogger("arlctl.serve")

MAX_PIECE_TOKENS = 1  # tokens per streamed text piece (more would only save bytes, not time: text is ready)
DECODE_WINDOW = 4  # tokens of left context decoded with each piece, so merges across tokens stay right


class EventStream:
    """One SSE response: open it once, send events, close it; a vanished client turns writes into no-ops."""

    def __init__(self, request: web.Request, headers: dict[str, str]):
        self.request = request
        self.response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no",
            **headers})
        self.opened = False
        self.disconnected = False

    async def open(self) -> None:
        """Send the status line and headers (raises when the client has already gone: nothing sampled yet)."""
        await self.response.prepare(self.request)
        self.opened = True
        transport = self.request.transport
        if transport is None or transport.is_closing():  # gone before generation: sample nothing
            self.disconnected = True
            raise ConnectionResetError("the client disconnected before generation started")

    async def send(self, data: dict[str, Any] | str, event: str | None = None) -> None:
        text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        frame = (f"event: {event}\n" if event else "") + f"data: {text}\n\n"
        await self.send_raw(frame.encode())

    async def send_raw(self, frame: bytes) -> None:
        if self.disconnected:
            return
        try:
            await self.response.write(frame)
        except (ConnectionError, RuntimeError):  # reset, or a transport already closing
            self.disconnected = True

    async def close(self) -> web.StreamResponse:
        if not self.disconnected:
            try:
                await self.response.write_eof()
            except (ConnectionError, RuntimeError):
                self.disconnected = True
        return self.response


def text_pieces(decode: Callable[[list[int]], str], ids: list[int], text: str) -> list[tuple[str, list[int]]]:
    """`text` split at token boundaries as (piece, its ids), for streaming; the pieces join to `text` exactly.

    A token that ends inside a multi-byte character is held until the character is whole. Each piece is
    decoded with a few tokens of left context (a tokenizer may merge spaces across tokens). When the
    pieces do not rebuild `text` (ids that are not exactly `text`'s tokens) the whole text is one piece.
    """
    pieces: list[tuple[str, list[int]]] = []
    start = 0
    for end in range(1, len(ids) + 1):
        if end - start < MAX_PIECE_TOKENS and end < len(ids):
            continue
        left = max(0, start - DECODE_WINDOW)
        prefix, full = decode(ids[left:start]), decode(ids[left:end])
        if end < len(ids) and (full.endswith("\ufffd") or not full.startswith(prefix)):
            continue
        pieces.append((full[len(prefix):], ids[start:end]))
        start = end
    if "".join(piece for piece, _ in pieces) != text:
        return [(text, list(ids))] if text or ids else []
    return [(piece, piece_ids) for piece, piece_ids in pieces if piece or piece_ids]


def string_pieces(text: str, size: int = 32) -> list[str]:
    """`text` in pieces of at most `size` characters (for text that is not a run of the sampled tokens)."""
    return [text[i:i + size] for i in range(0, len(text), size)]


# ---- OpenAI chunk sequences (sent after the turn is recorded) ----

def chat_chunks(base: dict[str, Any], pieces: list[str], tool_calls: list[dict[str, Any]], finish: str,
                usage: dict[str, int] | None, extension: dict[str, Any]) -> list[dict[str, Any]]:
    """The `chat.completion.chunk` objects after the role chunk: content deltas, one tool call after another
    (its id, type and name first, then its arguments, as OpenAI streams them), the finish chunk (which
    carries arlctl's extension: session, version, token ids), then the usage chunk when asked for."""
    with_usage = usage is not None

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        out = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
        if with_usage:
            out["usage"] = None
        return out

    chunks = [chunk({"content": piece}) for piece in pieces]
    for index, call in enumerate(tool_calls):
        function = call["function"]
        chunks.append(chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                             "function": {"name": function["name"], "arguments": ""}}]}))
        chunks.extend(chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]})
                      for part in string_pieces(function["arguments"], 64))
    final = chunk({}, finish)
    final["arlctl"] = extension
    chunks.append(final)
    if usage is not None:
        chunks.append({**base, "choices": [], "usage": usage})
    return chunks


def role_chunk(base: dict[str, Any], with_usage: bool) -> dict[str, Any]:
    out = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None}]}
    if with_usage:
        out["usage"] = None
    return out


def completion_chunks(base: dict[str, Any], pieces: list[tuple[str, list[int]]], logprobs: list[float] | None,
                      finish: str, usage: dict[str, int] | None) -> list[dict[str, Any]]:
    """`text_completion` chunks: one per text piece with its token ids (and log-probs when asked for),
    then the finish chunk, then the usage chunk when asked for."""
    chunks = []
    at = 0
    for piece, ids in pieces:
        choice: dict[str, Any] = {"index": 0, "text": piece, "finish_reason": None, "token_ids": ids, "logprobs": None}
        if logprobs is not None:
            choice["logprobs"] = {"tokens": [f"token_id:{t}" for t in ids],
                                  "token_logprobs": [float(lp) for lp in logprobs[at:at + len(ids)]]}
        at += len(ids)
        chunks.append({**base, "choices": [choice]})
    chunks.append({**base, "choices": [{"index": 0, "text": "", "finish_reason": finish, "token_ids": [],
                                        "logprobs": None}]})
    if usage is not None:
        for chunk in chunks:
            chunk["usage"] = None
        chunks.append({**base, "choices": [], "usage": usage})
    return chunks
