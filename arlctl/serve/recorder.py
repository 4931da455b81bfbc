"""Per-session recording of what `arlctl serve` was given and generated, rebuilt as trajectory rows.

A black-box harness sends whole conversations each time. We never re-tokenize them: the first request
of a segment is rendered through the chat template once (its ids are the row's `prompt_ids`), and each
later request must extend what we recorded — the earlier messages unchanged, then the assistant message
we returned, then new messages (tool results, user turns). Only the new messages are tokenized, as one
mask-0 segment (ChatCodec.continuation, the same rule as rollout, DESIGN.md §6); the sampled ids are
appended as returned, mask 1, with their log-probs. A request that does not extend the record (the
harness rewrote or truncated history, changed the tools, or re-asked without new messages) closes the
current segment and starts a new one: each segment is one trajectory row, `group_id` = the session id,
`sample_index` = the segment number, `final_state` says why it ended.

A harness that knows the outcome (tests passed, the user was satisfied) posts it to the open session
(`Session.outcome`); when the session ends, every one of its rows gets it as reward, reward_info the
posted info, reward_version "session-api".

/v1/completions requests are recorded the same way on raw tokens: a list-of-ints prompt must start with
the recorded ids; a string prompt must start with the recorded text, and only its new suffix is
tokenized.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from arlctl.inference.base import Generation
from arlctl.inference.chat import ChatCodec
from arlctl.schemas.builder import TrajectoryBuilder
from arlctl.schemas.rows import TrajectoryRow

ENV_NAME = "serve"
SESSION_REWARD_VERSION = "session-api"  # reward_version of rows whose reward a client posted


def message_text(content: Any) -> str:
    """OpenAI message content as text: a string, None, or a list of {"type": "text", "text": ...} parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def _calls_key(tool_calls: Any) -> list[tuple[str, Any]]:
    key = []
    for call in tool_calls or []:
        function = call.get("function", call) if isinstance(call, dict) else {}
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                pass
        key.append((str(function.get("name", "")), json.dumps(arguments, sort_keys=True)))
    return key


def normalize(message: dict[str, Any]) -> tuple[Any, ...]:
    """What must be equal for a resent message to count as the one recorded."""
    return (message.get("role"), message_text(message.get("content")).strip(), _calls_key(message.get("tool_calls")))


def template_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message reduced to what chat templates read (role, text content, name)."""
    out: dict[str, Any] = {"role": message.get("role", "user"), "content": message_text(message.get("content"))}
    if message.get("name"):
        out["name"] = message["name"]
    return out


@dataclass
class Segment:
    """One contiguous token record: becomes one trajectory row (grown only through its builder)."""

    builder: TrajectoryBuilder
    mode: str  # "chat" or "completion"
    messages: list[tuple[Any, ...]] = field(default_factory=list)  # normalized history sent so far
    tools_key: str = ""
    replied: tuple[Any, ...] | None = None  # normalized assistant message we returned last
    replied_raw: tuple[Any, ...] | None = None  # the same with the raw text (tool-call blocks kept)
    last_ids: list[int] = field(default_factory=list)  # the last generation's ids (for the closing glue)
    text: str = ""  # completion mode: the text the record stands for
    t0: float = field(default_factory=time.monotonic)

    @property
    def row(self) -> TrajectoryRow:
        return self.builder.row

    @property
    def all_ids(self) -> list[int]:
        return self.row.prompt_ids + self.row.response_ids


@dataclass
class Session:
    id: str
    done: list[TrajectoryRow] = field(default_factory=list)
    current: Segment | None = None
    last_seen: float = field(default_factory=time.monotonic)
    requests: int = 0
    outcome: tuple[float, dict[str, Any]] | None = None  # POST /v1/sessions/{id}/reward: (reward, info)


@dataclass
class Undo:
    """A session's record as it was before one request (Recorder.checkpoint / rollback)."""

    current: Segment | None
    done: int
    response_len: int = 0
    last_obs: tuple[int, str | None] | None = None
    messages: list[tuple[Any, ...]] = field(default_factory=list)
    replied: tuple[Any, ...] | None = None
    replied_raw: tuple[Any, ...] | None = None
    text: str = ""


class Recorder:
    """Keeps every open session and turns them into rows; pure bookkeeping, no I/O."""

    def __init__(self, codec: ChatCodec, policy_name: str):
        self.codec = codec
        self.policy_name = policy_name
        self.sessions: dict[str, Session] = {}

    # ---- sessions ----

    def session(self, session_id: str | None) -> Session:
        sid = session_id or uuid.uuid4().hex
        if sid not in self.sessions:
            self.sessions[sid] = Session(sid)
        session = self.sessions[sid]
        session.last_seen = time.monotonic()
        return session

    def match_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Session | None:
        """The open session (without an explicit id) whose record this conversation extends."""
        for session in list(self.sessions.values()):  # a snapshot: this may run off the loop while it adds one
            seg = session.current
            if seg is not None and seg.mode == "chat" and self._extends_chat(seg, messages, tools):
                return session
        return None

    def end(self, session_id: str, reason: str = "ended") -> list[TrajectoryRow]:
        """Close a session: its finished segments plus the open one, as rows (may be empty). An outcome
        posted for the session becomes every row's reward (reward_version SESSION_REWARD_VERSION)."""
        session = self.sessions.pop(session_id, None)
        if session is None:
            return []
        self._close_segment(session, reason)
        if session.outcome is not None:
            reward, info = session.outcome
            for row in session.done:  # the outcome is the whole session's, like a trajectory's last-turn reward
                row.reward, row.reward_components = reward, {}
                row.reward_info = json.dumps(info, sort_keys=True)
                row.reward_version = SESSION_REWARD_VERSION
        return session.done

    def is_open(self, session: Session) -> bool:
        """Whether `session` is still the registered one (it may have ended while a request waited)."""
        return self.sessions.get(session.id) is session

    def checkpoint(self, session: Session) -> Undo:
        """What `rollback` needs to put the session's record back as it is now."""
        seg = session.current
        if seg is None:
            return Undo(None, len(session.done))
        last = seg.row.turns[-1] if seg.row.turns else None
        return Undo(seg, len(session.done), len(seg.row.response_ids),
                    (last.obs_len, last.observation) if last else None,
                    list(seg.messages), seg.replied, seg.replied_raw, seg.text)

    def rollback(self, session: Session, undo: Undo) -> None:
        """Undo a prepare whose request then failed: the record is exactly as at `checkpoint`.

        Without this a rejected request left its prompt in the record (a 4 MB prompt held until the idle
        timeout) or an observation with no generation after it, so the client's retry no longer matched.
        A session left with nothing recorded is dropped.
        """
        del session.done[undo.done:]  # a segment closed by this prepare becomes the open one again
        session.current = seg = undo.current
        if seg is not None:
            seg.builder.truncate(undo.response_len, undo.last_obs)
            seg.messages, seg.replied, seg.replied_raw, seg.text = (undo.messages, undo.replied, undo.replied_raw,
                                                                    undo.text)
        if seg is None and not session.done and self.is_open(session):
            del self.sessions[session.id]

    def idle(self, timeout_s: float) -> list[str]:
        now = time.monotonic()
        return [sid for sid, s in self.sessions.items() if now - s.last_seen >= timeout_s]

    # ---- chat requests ----

    def prepare_chat(self, session: Session, messages: list[dict[str, Any]],
                     tools: list[dict[str, Any]]) -> list[int]:
        """The exact ids to generate from, extending the session's record or starting a new segment."""
        seg = session.current
        if seg is not None and seg.mode == "chat" and self._extends_chat(seg, messages, tools):
            new = messages[len(seg.messages) + 1:]
            _text, glue = self.codec.split_generation(seg.last_ids)
            segment = self.codec.continuation(glue, [template_message(m) for m in new])
            self._add_observation(seg, segment.ids, "\n".join(message_text(m.get("content")) for m in new))
            seg.messages = [normalize(m) for m in messages]
            seg.replied = seg.replied_raw = None
            return seg.all_ids
        self._close_segment(session, "rewritten" if seg is not None else "ended")
        prompt = self.codec.prompt([template_message(m) for m in messages], tools)
        seg = self._new_segment(session, "chat", prompt.text, prompt.ids, {"messages": messages, "tools": tools})
        seg.messages = [normalize(m) for m in messages]
        seg.tools_key = json.dumps(tools, sort_keys=True)
        return seg.all_ids

    def _extends_chat(self, seg: Segment, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> bool:
        n = len(seg.messages)
        if seg.replied is None or len(messages) <= n + 1 or json.dumps(tools, sort_keys=True) != seg.tools_key:
            return False
        if [normalize(m) for m in messages[:n]] != seg.messages:
            return False
        echoed = normalize(messages[n])
        return echoed in (seg.replied, seg.replied_raw)

    def record_chat(self, session: Session, gen: Generation, raw_text: str, content: str | None,
                    tool_calls: list[dict[str, Any]], latency_s: float) -> None:
        """Append one generation; remember the assistant message we answered with."""
        seg = session.current
        assert seg is not None, "prepare_chat comes first"
        calls = [{"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"]),
                  "id": c["id"]} for c in tool_calls]
        self._add_generation(seg, gen, raw_text, calls, latency_s)
        assistant = {"role": "assistant", "content": content, "tool_calls": tool_calls}
        seg.replied = normalize(assistant)
        seg.replied_raw = normalize({**assistant, "content": raw_text})

    # ---- completion requests ----

    def prepare_completion(self, session: Session, prompt: str | list[int]) -> list[int]:
        seg = session.current
        if seg is not None and seg.mode == "completion" and seg.last_ids:
            if isinstance(prompt, list) and len(prompt) > len(seg.all_ids) and prompt[:len(seg.all_ids)] == seg.all_ids:
                new_ids = prompt[len(seg.all_ids):]
                self._add_observation(seg, new_ids, self.codec.decode(new_ids))
                return seg.all_ids
            if isinstance(prompt, str) and len(prompt) > len(seg.text) and prompt.startswith(seg.text):
                suffix = prompt[len(seg.text):]
                self._add_observation(seg, self.codec.encode(suffix), suffix)
                seg.text = prompt
                return seg.all_ids
        self._close_segment(session, "rewritten" if seg is not None else "ended")
        if isinstance(prompt, list):
            text, ids = self.codec.decode(prompt), list(prompt)
        else:
            text, ids = prompt, self.codec.encode(prompt)
        seg = self._new_segment(session, "completion", text, ids, {"prompt": text})
        seg.text = text
        return seg.all_ids

    def record_completion(self, session: Session, gen: Generation, latency_s: float) -> str:
        seg = session.current
        assert seg is not None, "prepare_completion comes first"
        text = self.codec.decode(gen.ids)
        self._add_generation(seg, gen, text, [], latency_s)
        seg.text += text
        return text

    # ---- rows ----

    def _new_segment(self, session: Session, mode: str, prompt_text: str, prompt_ids: list[int],
                     task: dict[str, Any]) -> Segment:
        row = TrajectoryRow(
            group_id=session.id, sample_index=len(session.done), task_id=session.id, env=ENV_NAME,
            env_version="", task=task, policy=self.policy_name, prompt_text=prompt_text,
            prompt_ids=list(prompt_ids), started_at=datetime.now(UTC),
        )
        session.current = Segment(builder=TrajectoryBuilder(row), mode=mode)
        return session.current

    def _add_generation(self, seg: Segment, gen: Generation, text: str, calls: list[dict[str, Any]],
                        latency_s: float) -> None:
        seg.builder.add_generation(gen.ids, gen.logprobs, gen.version, text, calls, latency_s)
        # The schema's vocabulary: a reply cut by max_tokens leaves the segment truncated unless more follows.
        seg.row.status, seg.row.finish_reason = (("truncated", "length") if gen.finish_reason == "length"
                                                 else ("ok", "stop"))
        seg.last_ids = list(gen.ids)

    def _add_observation(self, seg: Segment, ids: list[int], observation: str) -> None:
        seg.builder.add_observation(ids, observation)  # counted into the turn it follows

    def _close_segment(self, session: Session, reason: str) -> None:
        seg, session.current = session.current, None
        if seg is None or not seg.row.turns:
            return  # a segment that never generated holds no training signal
        row = seg.row
        row.finished_at = datetime.now(UTC)
        row.wall_time_s = time.monotonic() - seg.t0
        row.final_state = json.dumps({"session": session.id, "segment": row.sample_index, "ended_by": reason})
        session.done.append(row)
