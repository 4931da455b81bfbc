"""The rollout stage: multi-turn episodes of a policy in an environment, written as trajectory rows.

One coroutine per trajectory (DESIGN.md §6). Per turn: generate from the exact token sequence so far,
parse tool calls, step the environment, append the observation segment, repeat until the env says done
or a bound hits. While one trajectory waits on its tool, the others generate: the policy backend
batches whatever requests are waiting.

Faults never kill the batch: a tool exception or malformed call becomes an error observation; a step
timeout returns "timeout" to the model; an inference failure retries with backoff, then ends the
trajectory with status policy_error. Cancellation (Ctrl-C) ends in-flight trajectories as `aborted`
with everything they had recorded. Any other exception inside a trajectory ends it as `env_error` with
the cause in the stats; a group is never dropped.

Text safety: every string that reaches a row is valid UTF-8 by construction (`parquet_safe`), so one
lone surrogate in a task, a tool call or an observation cannot fail the flush of a whole shard. A
generation whose token ids are not ints in [0, vocab) (or whose log-probs are missing or non-finite) is
an inference failure: it is retried, then ends the trajectory as policy_error naming the bad value.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import numbers
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any

from arlctl.envs.base import Action, Env, EnvFailure, StepResult
from arlctl.inference.base import Generation, Policy, SamplingParams
from arlctl.inference.chat import ChatCodec, Segment
from arlctl.schemas.rows import TrajectoryRow, Turn
from arlctl.tools import TOOL_CALL_FORMATS, parse_tool_calls, parser_for_template


@dataclass
class RolloutConfig:
    env: str = "math"
    group_size: int = 4
    concurrency: int = 64
    max_turns: int = 6
    max_tokens: int = 2048  # response tokens (generated + environment) per trajectory
    max_new_tokens: int = 256  # per turn
    max_context: int = 8192  # prompt + response, never exceeded
    step_timeout: float = 30.0
    trajectory_timeout: float = 3600.0
    max_obs_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    retries: int = 3
    retry_backoff: float = 0.5
    tool_format: str | None = None  # tool-call parser; None: the one the chat template's family uses
    max_top_up: int = 0  # per group: members that end env_error (infrastructure) are resampled this often
    history: str = "full"  # "full": one prefix-consistent row per trajectory; "per-turn": one row per turn
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # extra chat-template variables

    def sampling(self, max_new_tokens: int, seed: int | None) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, max_new_tokens=max_new_tokens,
                              seed=seed)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Stats:
    """Live counters for the progress display and the summary."""

    groups_done: int = 0
    trajectories_done: int = 0
    in_flight: int = 0
    generated_tokens: int = 0
    env_calls: int = 0
    env_time_s: float = 0.0
    errors: int = 0
    last_error: str | None = None
    causes: dict[str, int] = field(default_factory=dict)  # error cause -> count; "infra:" = not the model's
    outcomes: dict[str, int] = field(default_factory=dict)  # final status -> trajectories (not rows)
    template_rewrites_history: bool = False  # the chat template re-renders earlier turns (think gate)
    top_ups: int = 0  # env_error members resampled (same task, new seed) to keep groups at G
    groups_started: int = 0
    epoch: int = 0  # the epoch whose tasks are being issued
    epochs_done: int = 0  # epochs whose every group has been started
    started: float = field(default_factory=time.monotonic)

    def fault(self, cause: str, message: str) -> None:
        """Count one error under its cause and keep its message as the last error."""
        self.errors += 1
        self.causes[cause] = self.causes.get(cause, 0) + 1
        self.last_error = parquet_safe(message)

    def error_fraction(self) -> float:
        """Share of finished trajectories that ended env_error or policy_error."""
        failed = self.outcomes.get("env_error", 0) + self.outcomes.get("policy_error", 0)
        return failed / max(sum(self.outcomes.values()), 1)

    def tokens_per_s(self) -> float:
        return self.generated_tokens / max(time.monotonic() - self.started, 1e-9)

    def mean_env_latency_s(self) -> float:
        return self.env_time_s / max(self.env_calls, 1)


class _Trajectory:
    """The growing state of one trajectory; whatever it holds becomes a row, even when aborted."""

    def __init__(self, task: dict[str, Any], group_id: str, sample_index: int, env_name: str, policy: Policy,
                 epoch: int = 0, attempt: int = 0):
        # The env, the prompt and the `task` column all see the same Parquet-safe copy of the task.
        self.task = parquet_safe_value(task)
        self.epoch, self.attempt = epoch, attempt
        self.row = TrajectoryRow(
            group_id=group_id, sample_index=sample_index, task_id=str(self.task.get("task_id", "")),
            env=env_name, env_version="", task=self.task, policy=policy.name, prompt_text="", prompt_ids=[],
            policy_version=policy.version, policy_version_last=policy.version, started_at=datetime.now(UTC),
        )
        self.t0 = time.monotonic()
        # --history per-turn: each turn's own prompt (the template's rendering of the conversation so
        # far) and the (assistant content, observations) pairs it is rendered from.
        self.turn_prompts: list[Segment] = []
        self.history: list[tuple[str, list[dict[str, Any]]]] = []

    def add_generation(self, gen: Generation, text: str, calls: list[dict[str, Any]], latency: float) -> Turn:
        row = self.row
        turn = Turn(index=len(row.turns), gen_start=len(row.response_ids), gen_len=len(gen.ids), obs_len=0,
                    text=text, tool_calls=calls, policy_version=gen.version, gen_latency_s=latency)
        row.response_ids.extend(gen.ids)
        row.response_mask.extend([1] * len(gen.ids))
        row.response_logprobs.extend(float(lp) for lp in gen.logprobs)
        row.turns.append(turn)
        row.gen_time_s += latency
        if turn.index == 0:
            row.policy_version = gen.version  # a reload may land between creation and the first turn
        row.policy_version_last = gen.version
        return turn

    def add_observation(self, turn: Turn, ids: list[int], observation: str) -> None:
        self.row.response_ids.extend(ids)
        self.row.response_mask.extend([0] * len(ids))
        self.row.response_logprobs.extend([0.0] * len(ids))
        turn.obs_len = len(ids)
        turn.observation = observation

    def finish(self, status: str, finish_reason: str) -> TrajectoryRow:
        row = self.row
        row.status, row.finish_reason = status, finish_reason
        row.finished_at = datetime.now(UTC)
        row.wall_time_s = time.monotonic() - self.t0
        return row

    def turn_rows(self) -> list[TrajectoryRow]:
        """--history per-turn: the finished trajectory as one row per turn.

        Row k: the template's own prompt for turn k and that turn's sampled ids (mask 1), nothing after.
        All rows share trajectory_id, group and the trajectory's status; all but the last have
        finish_reason "continued", the last keeps the real one and the final state. A trajectory that
        never reached a turn stays one row.
        """
        row = self.row
        if not row.turns:
            return [row]
        rows = []
        last = len(row.turns) - 1
        for k, turn in enumerate(row.turns):
            span = slice(turn.gen_start, turn.gen_start + turn.gen_len)
            prompt = self.turn_prompts[k]
            rows.append(replace(
                row, prompt_text=prompt.text, prompt_ids=list(prompt.ids), response_ids=row.response_ids[span],
                response_mask=[1] * turn.gen_len, response_logprobs=row.response_logprobs[span],
                turns=[replace(turn, gen_start=0, obs_len=0)],
                finish_reason=row.finish_reason if k == last else "continued",
                final_state=row.final_state if k == last else None,
                policy_version=turn.policy_version, policy_version_last=turn.policy_version,
                num_tool_calls=len(turn.tool_calls), env_errors=int(bool(turn.error)),
                retries=row.retries if k == last else 0,
                gen_time_s=turn.gen_latency_s, env_time_s=turn.env_latency_s))
        return rows


# ------------------------------------------------------------------------------------------- text safety


def parquet_safe(text: str) -> str:
    """`text` as a string that encodes to valid UTF-8 (what Parquet/Arrow strings must be).

    Python strings may hold lone surrogates (JSON's "\\ud800" escape, bytes decoded with surrogateescape)
    that no UTF-8 writer accepts. Decision: a surrogate pair split over two code points is joined back
    into its character; every lone surrogate becomes U+FFFD. Lossy for those code points only, never an
    exception. Surrogates are the only code points UTF-8 cannot encode, so this covers every case.
    """
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def parquet_safe_value(value: Any) -> Any:
    """parquet_safe applied to every string (keys included) inside JSON-like lists and dicts."""
    if isinstance(value, str):
        return parquet_safe(value)
    if isinstance(value, dict):
        return {parquet_safe_value(k): parquet_safe_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [parquet_safe_value(v) for v in value]
    return value


def _as_text(value: Any) -> str | None:
    """An env-supplied text field as a safe string (a plugin env may hand back a dict or bytes)."""
    if value is None or isinstance(value, str):
        return None if value is None else parquet_safe(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return parquet_safe(json.dumps(value, ensure_ascii=False, default=str))


def _as_float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def safe_row(row: TrajectoryRow) -> TrajectoryRow:
    """Make every text of a row Parquet-safe and every env-supplied field its schema type, in place.

    The one gate between a finished group and the sink, so that the flush can never fail on a row's
    content and take other groups' rows down with it.
    """
    for f in fields(row):
        value = getattr(row, f.name)
        if isinstance(value, str | dict):
            setattr(row, f.name, parquet_safe_value(value))
    row.final_state = _as_text(row.final_state)
    for turn in row.turns:
        turn.text = _as_text(turn.text) or ""
        turn.observation = _as_text(turn.observation)
        turn.error = _as_text(turn.error)
        turn.tool_calls = parquet_safe_value(turn.tool_calls)
        turn.reward_step = _as_float(turn.reward_step)
    return row


class BadGeneration(ValueError):
    """A backend answered with tokens no tokenizer or trainer can use (an inference failure)."""


def check_generation(gen: Generation, vocab_size: int) -> None:
    """Refuse ids outside [0, vocab_size) or not ints, and log-probs that are missing or not finite.

    Such ids crash decoding (a negative id) or silently decode to "" and later index past the
    embedding in training (an id >= vocab); non-finite log-probs poison the PPO ratio.
    """
    for position, token in enumerate(gen.ids):
        if isinstance(token, bool) or not isinstance(token, numbers.Integral) or not 0 <= token < vocab_size:
            raise BadGeneration(f"backend returned token id {token!r} at position {position}, "
                                f"outside [0, {vocab_size})")
    if len(gen.logprobs) != len(gen.ids):
        raise BadGeneration(f"backend returned {len(gen.logprobs)} log-probs for {len(gen.ids)} tokens")
    for position, logprob in enumerate(gen.logprobs):
        if not isinstance(logprob, numbers.Real) or not math.isfinite(logprob):
            raise BadGeneration(f"backend returned log-prob {logprob!r} at position {position}")


def vocab_size(policy: Policy) -> int:
    """The id range a policy may sample from: its own `vocab_size` when it says, else the tokenizer's."""
    return int(getattr(policy, "vocab_size", None) or len(policy.tokenizer))


def _seed_for(base: int | None, *parts: Any) -> int | None:
    if base is None:
        return None
    digest = hashlib.sha256(json.dumps([base, *parts], default=str).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _turn_seed(base: int | None, traj: _Trajectory, turn_index: int) -> int | None:
    """Deterministic per (task, sample, turn); epochs after the first mix in their number so they differ."""
    row = traj.row
    if traj.epoch == 0 and traj.attempt == 0:
        return _seed_for(base, row.task_id, row.sample_index, turn_index)
    if traj.attempt == 0:
        return _seed_for(base, "epoch", traj.epoch, row.task_id, row.sample_index, turn_index)
    # a top-up: the same task and sample, a new seed
    return _seed_for(base, "attempt", traj.attempt, traj.epoch, row.task_id, row.sample_index, turn_index)


def _truncate_observation(codec: ChatCodec, content: str, max_tokens: int) -> str:
    ids = codec.encode(content)
    if len(ids) <= max_tokens:
        return content
    kept = codec.decode(ids[:max_tokens])
    return f"{kept}\n...[observation truncated: {len(ids) - max_tokens} more tokens]"


def parse_action(env: Env, text: str, tools: list[dict[str, Any]], tool_format: str) -> Action:
    """The turn's tool calls, read by the family's parser (`tool_format`) against the env's tools.

    An env whose `tool_format` is a tool-call format (hermes, llama3-json, mistral) gets the family's
    parser, so the same env works under every chat template; an env with its own convention (fenced
    bash blocks, or a `parse_action` and no tool-call `tool_format`) parses its own turns.
    """
    own = getattr(env, "parse_action", None)
    if own is not None and getattr(env, "tool_format", None) not in TOOL_CALL_FORMATS:
        return own(text)
    calls, errors = parse_tool_calls(text, tool_format, tools)
    return Action(text=text, tool_calls=calls, parse_errors=errors)


def tool_parser_for(codec: ChatCodec, cfg: RolloutConfig) -> str:
    """--tool-parser when given, else the parser of the chat template's family."""
    return cfg.tool_format or parser_for_template(codec.chat_template)


def _safe_action(action: Action) -> Action:
    """JSON lets a model write a lone surrogate ("\\ud800") into tool arguments: replace it before the
    env (which may encode it) or the row (which must) sees it."""
    for call in action.tool_calls:
        call.name = parquet_safe(str(call.name))
        call.arguments = parquet_safe_value(call.arguments)
    return action


async def _generate(policy: Policy, ids: list[int], sampling: SamplingParams, cfg: RolloutConfig,
                    traj: _Trajectory) -> Generation:
    """Generate with retries and exponential backoff; the last failure propagates.

    An unusable answer (check_generation) counts as a failure: a backend glitch may pass on retry."""
    for attempt in range(cfg.retries + 1):
        try:
            gen = await policy.generate(ids, sampling)
            check_generation(gen, vocab_size(policy))
            return gen
        except asyncio.CancelledError:
            raise
        except Exception:
            if attempt == cfg.retries:
                raise
            traj.row.retries += 1
            await asyncio.sleep(cfg.retry_backoff * (2**attempt))
    raise AssertionError("unreachable")


async def _step(env: Env, action: Action, cfg: RolloutConfig) -> tuple[StepResult, str | None]:
    """Step the env under the step timeout; exceptions and timeouts become error observations."""
    names = [c.name for c in action.tool_calls] or ["environment"]
    try:
        return await asyncio.wait_for(env.step(action), cfg.step_timeout), None
    except EnvFailure:
        raise  # the environment broke: the trajectory ends as env_error, not as the model's mistake
    except TimeoutError:
        message = f"error: timeout: the tool did not finish within {cfg.step_timeout:g}s"
    except asyncio.CancelledError:
        raise
    except Exception as err:
        message = f"error: {type(err).__name__}: {err}"
    observations = [{"role": "tool", "name": n, "content": message} for n in names]
    return StepResult(observations=observations, done=False, error=message), message


async def run_trajectory(traj: _Trajectory, policy: Policy, env: Env, codec: ChatCodec, cfg: RolloutConfig,
                         stats: Stats, turn_hook: Callable[[], Awaitable[None]] | None = None) -> TrajectoryRow:
    """One episode, start to finish. Bounded by cfg; every fault ends up recorded in the row."""
    row = traj.row
    row.env_version = _as_text(getattr(env, "version", "")) or ""
    try:
        # Reset may wait for a free sandbox, so it gets the trajectory's budget, not a step's.
        reset = await asyncio.wait_for(env.reset(traj.task), cfg.trajectory_timeout)
    except Exception as err:  # includes the reset timing out
        row.env_errors += 1
        cause = ("infra:reset_timeout" if isinstance(err, TimeoutError)
                 else "infra:reset_failed" if isinstance(err, EnvFailure) else "reset_error")
        stats.fault(cause, f"reset failed: {type(err).__name__}: {err}")
        return traj.finish("env_error", "error")
    # A plugin env may put unencodable text in its messages; the tokenizer refuses lone surrogates.
    messages = parquet_safe_value(reset.messages)
    prompt = codec.prompt(messages, reset.tools)
    row.prompt_text, row.prompt_ids = prompt.text, prompt.ids
    deadline = traj.t0 + cfg.trajectory_timeout
    try:
        async with asyncio.timeout_at(asyncio.get_running_loop().time() + (deadline - time.monotonic())):
            return await _turns(traj, policy, env, codec, cfg, stats, messages, reset.tools, turn_hook)
    except TimeoutError:
        stats.fault("timeout", f"trajectory timed out after {cfg.trajectory_timeout:g}s")
        return traj.finish("timeout", "timeout")


def _next_context(traj: _Trajectory, codec: ChatCodec, cfg: RolloutConfig, messages: list[dict[str, Any]],
                  tools: list[dict[str, Any]]) -> tuple[list[int], int]:
    """(the ids the next turn generates from, response tokens used so far).

    Full history: the prompt plus every recorded id. Per-turn: the template's own rendering of the
    conversation so far; the tokens it adds beyond the first prompt count against --max-tokens the way
    the observation segments do in full history.
    """
    row = traj.row
    if cfg.history != "per-turn":
        return row.prompt_ids + row.response_ids, len(row.response_ids)
    if not traj.history:
        prompt = Segment(row.prompt_text, row.prompt_ids)
    else:
        prompt = codec.turn_prompt(messages, tools, traj.history)
    traj.turn_prompts.append(prompt)
    return prompt.ids, len(prompt.ids) - len(row.prompt_ids)


async def _turns(traj: _Trajectory, policy: Policy, env: Env, codec: ChatCodec, cfg: RolloutConfig,
                 stats: Stats, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                 turn_hook: Callable[[], Awaitable[None]] | None) -> TrajectoryRow:
    row = traj.row
    tool_format = tool_parser_for(codec, cfg)
    for turn_index in range(cfg.max_turns):
        # 1. Budget: never exceed the response budget or the model's context.
        context, used = _next_context(traj, codec, cfg, messages, tools)
        budget = min(cfg.max_new_tokens, cfg.max_tokens - used, cfg.max_context - len(context))
        if budget <= 0:
            if traj.turn_prompts and len(traj.turn_prompts) > len(row.turns):
                traj.turn_prompts.pop()  # no turn was generated from it
            return traj.finish("truncated", "max_tokens")
        if turn_hook is not None:
            await turn_hook()  # weight reloads happen only here, at a turn boundary
        # 2. Generate from the exact ids so far.
        t_gen = time.monotonic()
        try:
            gen = await _generate(policy, context, cfg.sampling(budget, _turn_seed(cfg.seed, traj, turn_index)),
                                  cfg, traj)
        except asyncio.CancelledError as err:
            if _being_cancelled():
                raise
            message = f"policy error: the backend cancelled the generation ({err or 'CancelledError'})"
            stats.fault("policy_error", message)
            if row.turns:
                row.turns[-1].error = row.turns[-1].error or parquet_safe(message)
            return traj.finish("policy_error", "error")
        except Exception as err:
            message = f"policy error: {type(err).__name__}: {err}"
            stats.fault("policy_error", message)  # in the summary and the metrics row even with no turn yet
            if row.turns:
                row.turns[-1].error = row.turns[-1].error or parquet_safe(message)
            return traj.finish("policy_error", "error")
        text, glue = codec.split_generation(gen.ids)
        action = _safe_action(parse_action(env, text, tools, tool_format))
        calls = [{"name": c.name, "arguments": c.arguments, "id": c.id} for c in action.tool_calls]
        turn = traj.add_generation(gen, text, calls, time.monotonic() - t_gen)
        stats.generated_tokens += len(gen.ids)
        row.num_tool_calls += len(action.tool_calls)
        cut = gen.finish_reason == "length" and used + len(gen.ids) >= cfg.max_tokens
        # 3. Step the environment (the slow part; other trajectories generate meanwhile).
        t_env = time.monotonic()
        result, error = await _step(env, action, cfg)
        turn.env_latency_s = time.monotonic() - t_env
        row.env_time_s += turn.env_latency_s
        stats.env_calls += 1
        stats.env_time_s += turn.env_latency_s
        turn.reward_step = result.reward_step
        turn.error = error or result.error
        if turn.error:
            row.env_errors += 1
            stats.fault("step_timeout" if error and error.startswith("error: timeout:") else "tool_error",
                        str(turn.error))
        if result.done:
            row.final_state = result.final_state
            cut = _artifact_cut(env)
            if cut:
                turn.error = f"{turn.error}; {cut}" if turn.error else cut
                return traj.finish("truncated", result.finish_reason or "stop")
            return traj.finish("ok", result.finish_reason or "stop")
        if cut:
            return traj.finish("truncated", "max_tokens")
        if turn_index == cfg.max_turns - 1:
            break  # the last allowed turn: no observation segment the policy would never read
        # 4. Append the observation segment (mask 0): closing glue + observations + next header.
        observations = [{**parquet_safe_value(m),
                         "content": _truncate_observation(codec, parquet_safe(str(m.get("content", ""))),
                                                          cfg.max_obs_tokens)}
                        for m in result.observations]
        shown = "\n".join(str(m["content"]) for m in observations)
        if cfg.history == "per-turn":
            traj.history.append((text, observations))  # the next turn's prompt renders it
            traj.add_observation(turn, [], shown)
        else:
            segment = codec.continuation(glue, observations)
            traj.add_observation(turn, segment.ids, shown)
    return traj.finish("ok", "max_turns")


# --------------------------------------------------------------------------------------------- the driver

GroupSink = Callable[[list[TrajectoryRow]], Awaitable[None]]


EnvChooser = Callable[[str], Callable[[], Env]]  # env name -> factory (per-row `env`, --env-mix)


async def run_group(task: dict[str, Any], policy: Policy, env_factory: Callable[[], Env], codec: ChatCodec,
                    cfg: RolloutConfig, stats: Stats, slots: asyncio.Semaphore,
                    turn_hook: Callable[[], Awaitable[None]] | None = None, epoch: int = 0,
                    env_for: EnvChooser | None = None) -> list[TrajectoryRow]:
    """The G samples of one task; a group is always returned whole (aborted members included).

    env_for: when given, the group runs the env named by the task's own "env" field (cfg.env if it has
    none); an env that cannot be made ends the group's rows as env_error with the cause.
    """
    group_id = str(uuid.uuid4())
    env_name = str(task.get("env") or cfg.env) if env_for is not None else cfg.env
    trajs = [_Trajectory(task, group_id, i, env_name, policy, epoch) for i in range(cfg.group_size)]
    top_ups_left = [cfg.max_top_up]

    async def member(index: int) -> TrajectoryRow:
        """One sample; while it ends env_error (an infrastructure failure) and the group's top-up budget
        lasts, it is run again from scratch with a new seed, so the group stays at G usable rows."""
        row = await one(trajs[index])
        while row.status == "env_error" and top_ups_left[0] > 0:
            top_ups_left[0] -= 1
            stats.top_ups += 1
            trajs[index] = _Trajectory(task, group_id, index, env_name, policy, epoch, trajs[index].attempt + 1)
            row = await one(trajs[index])
        stats.outcomes[row.status] = stats.outcomes.get(row.status, 0) + 1
        return row

    async def one(traj: _Trajectory) -> TrajectoryRow:
        async with slots:
            stats.in_flight += 1
            env: Env | None = None
            try:
                env = (env_for(env_name) if env_for is not None else env_factory)()
                row = await run_trajectory(traj, policy, env, codec, cfg, stats, turn_hook)
                if row.final_state is None and row.turns and hasattr(env, "final_state"):
                    await _final_state_after_bound(row, env, cfg, stats)
                return row
            except asyncio.CancelledError as err:
                if _being_cancelled():
                    raise  # the rollout is stopping: the group turns this into aborted rows
                return _crashed(traj, err, stats)  # an env or backend cancelled its own work
            except Exception as err:  # a bug or a hostile value anywhere above: a row with a status, not a lost group
                return _crashed(traj, err, stats)
            finally:
                stats.in_flight -= 1
                stats.trajectories_done += 1
                if env is not None:
                    await _close_env(env, cfg, stats)

    tasks = [asyncio.ensure_future(member(i)) for i in range(len(trajs))]
    try:
        # return_exceptions: one member that raised never leaves its siblings running unawaited
        results = await asyncio.gather(*tasks, return_exceptions=True)
    except asyncio.CancelledError:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        rows = [t.result() if t.done() and not t.cancelled() and t.exception() is None
                else _aborted(trajs[i], stats) for i, t in enumerate(tasks)]
        stats.groups_done += 1
        raise GroupAborted(_emit(cfg, trajs, rows)) from None
    rows = [r if isinstance(r, TrajectoryRow) else _crashed(trajs[i], r, stats) for i, r in enumerate(results)]
    stats.groups_done += 1
    return _emit(cfg, trajs, rows)


def _being_cancelled() -> bool:
    """True when the current task has a cancellation request pending (a stop), not a stray CancelledError."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _aborted(traj: _Trajectory, stats: Stats) -> TrajectoryRow:
    stats.outcomes["aborted"] = stats.outcomes.get("aborted", 0) + 1
    return traj.finish("aborted", "error")


def _emit(cfg: RolloutConfig, trajs: list[_Trajectory], rows: list[TrajectoryRow]) -> list[TrajectoryRow]:
    """The group's rows as written: one per trajectory, or one per turn with --history per-turn."""
    if cfg.history != "per-turn":
        return rows
    return [turn_row for traj in trajs for turn_row in traj.turn_rows()]


def _retrieve(fut: asyncio.Future) -> None:
    """Done callback: mark a background future's outcome as seen (no "exception was never retrieved")."""
    if not fut.cancelled():
        fut.exception()


async def _close_env(env: Env, cfg: RolloutConfig, stats: Stats) -> None:
    """Close an env, bounded by the step timeout; a close that fails or hangs is counted, never raised.

    The row is already final: a broken close says nothing about the trajectory, but it is not hidden.
    """
    try:
        closing = asyncio.ensure_future(env.close())
    except Exception as err:  # close() missing or not a coroutine
        stats.fault("close_error", f"env close failed: {type(err).__name__}: {err}")
        return
    closing.add_done_callback(_retrieve)
    try:
        await asyncio.wait_for(asyncio.shield(closing), cfg.step_timeout)
    except TimeoutError:
        stats.fault("infra:close_timeout", f"env close did not finish within {cfg.step_timeout:g}s")
    except asyncio.CancelledError:
        if _being_cancelled():
            raise
        stats.fault("close_error", "env close was cancelled")
    except Exception as err:
        stats.fault("close_error", f"env close failed: {type(err).__name__}: {err}")


async def _final_state_after_bound(row: TrajectoryRow, env: Env, cfg: RolloutConfig, stats: Stats) -> None:
    """Ended by a bound, not by the agent: keep what it left behind (the swe diff) for grading."""
    try:
        row.final_state = await asyncio.wait_for(env.final_state(), cfg.step_timeout)  # type: ignore[attr-defined]
    except Exception as err:
        message = f"final_state failed: {type(err).__name__}: {err}"
        if not isinstance(err, EnvFailure | TimeoutError):  # counted; graded on what the row has
            stats.fault("final_state_error", message)
        else:  # no artifact to grade because the env broke or hung: not the model's 0
            stats.fault("infra:final_state_timeout" if isinstance(err, TimeoutError)
                        else "infra:final_state_failed", message)
            row.status, row.finish_reason, row.env_errors = "env_error", "error", row.env_errors + 1
            if row.turns:
                row.turns[-1].error = row.turns[-1].error or parquet_safe(stats.last_error)
        return
    cut = _artifact_cut(env)
    if cut:
        if row.status == "ok":  # a failure status (timeout, policy_error) says more; keep it
            row.status = "truncated"
        if row.turns:
            last = row.turns[-1]
            last.error = f"{last.error}; {cut}" if last.error else cut


def _artifact_cut(env: Env) -> str | None:
    """Why the env cut its final state (e.g. a swe diff over its byte limit), or None.

    Optional env attribute `final_state_truncated`: an env that has to cut its artifact says so there,
    and the row becomes status `truncated` with the reason in the last turn's error.
    """
    reason = getattr(env, "final_state_truncated", None)
    return str(reason) if reason else None


def _crashed(traj: _Trajectory, err: BaseException, stats: Stats) -> TrajectoryRow:
    """End a trajectory that raised out of the loop as env_error, its cause in the stats and last turn.

    An EnvFailure (the sandbox died) is infrastructure; a CancelledError that did not come from stopping
    the rollout (an env cancelled its own work) and any other exception (a bug, a hostile value) are
    counted as crashes.
    """
    message = parquet_safe(f"rollout error: {type(err).__name__}: {err}")
    cause = ("infra:env_failure" if isinstance(err, EnvFailure)
             else "cancelled" if isinstance(err, asyncio.CancelledError) else "crash")
    stats.fault(cause, message)
    row = traj.row
    if row.turns:
        row.turns[-1].error = row.turns[-1].error or message
    row.env_errors += 1
    return traj.finish("env_error", "error")


def _failed_group(task: Any, policy: Policy, cfg: RolloutConfig, epoch: int, stats: Stats) -> list[TrajectoryRow]:
    """G env_error rows for a group that could not be set up, so the failure is in the output, not only
    in the summary. A task that is not a JSON object is kept as its repr."""
    kept = task if isinstance(task, dict) else {"task_id": "", "invalid_task": repr(task)[:1000]}
    try:
        group_id = str(uuid.uuid4())
        name = str(kept.get("env") or cfg.env)
        rows = [_Trajectory(kept, group_id, i, name, policy, epoch).finish("env_error", "error")
                for i in range(cfg.group_size)]
    except Exception:
        return []  # nothing sensible can be built; the cause is already counted
    stats.outcomes["env_error"] = stats.outcomes.get("env_error", 0) + len(rows)
    return rows


class GroupAborted(Exception):
    """Raised out of a cancelled group, carrying its rows (finished ones as they were, others aborted)."""

    def __init__(self, rows: list[TrajectoryRow]):
        super().__init__("group aborted")
        self.rows = rows


async def rollout(tasks: Iterable[dict[str, Any]], policy: Policy, env_factory: Callable[[], Env],
                  cfg: RolloutConfig, sink: GroupSink, stats: Stats | None = None,
                  stop: asyncio.Event | None = None,
                  turn_hook: Callable[[], Awaitable[None]] | None = None,
                  epochs: int | None = 1,
                  before_group: Callable[[], Awaitable[None]] | None = None,
                  env_for: EnvChooser | None = None) -> Stats:
    """Run every task as a group of cfg.group_size trajectories, handing each finished group to sink.

    At most cfg.concurrency trajectories are in flight. When `stop` is set, no new group starts and the
    groups in flight are aborted; their rows still reach the sink (status aborted), so nothing completed
    is lost.

    epochs: how many passes over `tasks` (None: until stopped). Epoch e > 0 seeds its sampling with e,
        so with a --seed the passes differ yet stay reproducible.
    before_group: awaited before each new group starts (daemon backpressure); a stop cuts it short.
    env_for: env name -> factory; each group then runs the env its task names (per-row `env`, --env-mix).
    """
    stats = stats or Stats()
    stop = stop or asyncio.Event()
    task_list = tasks if epochs == 1 else list(tasks)  # one pass may stream; epochs re-iterate a list
    codec = ChatCodec(policy.tokenizer, cfg.template_kwargs)
    stats.template_rewrites_history = codec.rewrites_history
    slots = asyncio.Semaphore(cfg.concurrency)
    # Keep enough groups started that every trajectory slot stays busy, but not the whole task list.
    group_slots = asyncio.Semaphore(max(1, -(-cfg.concurrency // cfg.group_size) + 1))
    running: set[asyncio.Task] = set()  # the group runners; cancelled on stop
    sinking: set[asyncio.Task] = set()  # runner + sink per group; never cancelled, so nothing is lost
    sink_failures: list[BaseException] = []  # a sink that cannot write stops the rollout, then re-raises

    async def one_group(task: dict[str, Any], epoch: int) -> None:
        runner = asyncio.ensure_future(
            run_group(task, policy, env_factory, codec, cfg, stats, slots, turn_hook, epoch, env_for))
        running.add(runner)
        try:
            rows = await asyncio.shield(runner)
        except GroupAborted as aborted:
            rows = aborted.rows
        except Exception as err:  # the group could not even be set up (e.g. a task that is not a dict)
            stats.fault("group_error", f"group failed: {type(err).__name__}: {err}")
            stats.groups_done += 1
            rows = _failed_group(task, policy, cfg, epoch, stats)
        finally:
            running.discard(runner)
            group_slots.release()
        try:
            await sink([safe_row(r) for r in rows])
        except Exception as err:
            sink_failures.append(err)
            stop.set()

    epoch = 0
    while task_list and (epochs is None or epoch < epochs) and not stop.is_set():
        stats.epoch = epoch
        for task in task_list:
            if not await _until_or_stop(group_slots.acquire(), stop, on_stop=group_slots.release):
                break
            if before_group is not None and not await _until_or_stop(before_group(), stop):
                group_slots.release()
                break
            stats.groups_started += 1
            t = asyncio.ensure_future(one_group(task, epoch))
            sinking.add(t)
            t.add_done_callback(sinking.discard)
        else:
            stats.epochs_done += 1
        epoch += 1
    await _drain(running, sinking, stop)
    if sink_failures:
        raise sink_failures[0]
    return stats


async def _until_or_stop(awaitable: Awaitable[Any], stop: asyncio.Event,
                         on_stop: Callable[[], Any] | None = None) -> bool:
    """Await `awaitable` unless `stop` fires first (then cancel it). True when it completed and no stop.

    on_stop: undoes a completion that raced with the stop (e.g. releases a semaphore just acquired).
    """
    work = asyncio.ensure_future(awaitable)
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    if stop.is_set():
        if work.done() and not work.cancelled() and work.exception() is None and on_stop is not None:
            on_stop()
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        return False
    work.result()  # a failure in the awaitable propagates
    return True


async def _drain(running: set[asyncio.Task], sinking: set[asyncio.Task], stop: asyncio.Event) -> None:
    """Wait for the groups in flight; if `stop` fires meanwhile, abort them (their rows still flush)."""
    while sinking:
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait(set(sinking) | {stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if stop.is_set():
            break
    # Cancelling a runner delivers CancelledError into run_group's gather, which turns it into
    # GroupAborted with the partial rows; one_group then still hands those rows to the sink.
    for runner in list(running):
        runner.cancel()
    await asyncio.gather(*list(sinking), return_exceptions=True)


# ---------------------------------------------------------------------------------------------- daemon mode


class PolicyFollower:
    """Follows a run's policy directory: when LATEST names a newer version, reload the policy.

    Called from the turn hook (so weights change only at a turn boundary) and from the backpressure
    gate; LATEST is read at most every `poll_s` seconds. One reload at a time: a turn that arrives while
    another reloads carries on (the backend queues its generation behind the swap). Versions only move
    forward; a failed reload is recorded and retried at the next check.
    """

    def __init__(self, policy: Policy, policy_dir: str, poll_s: float,
                 on_reload: Callable[[int, int], None] | None = None):
        self.policy = policy
        self.policy_dir = policy_dir
        self.poll_s = poll_s
        self.on_reload = on_reload
        self.reloads = 0
        self.last_error: str | None = None
        self._last_check = float("-inf")
        self._lock = asyncio.Lock()

    async def maybe_reload(self) -> bool:
        if self._lock.locked() or time.monotonic() - self._last_check < self.poll_s:
            return False
        async with self._lock:
            self._last_check = time.monotonic()
            try:
                newest = await asyncio.to_thread(self._newest)
                if newest is None or newest[1] <= self.policy.version:
                    return False
                path, version = newest
                previous = self.policy.version
                await self.policy.reload(path, version)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # a half-pruned version, a bad file: keep the old weights, retry later
                self.last_error = f"reload failed: {type(err).__name__}: {err}"
                return False
            self.reloads += 1
            if self.on_reload is not None:
                self.on_reload(previous, version)
            return True

    def _newest(self) -> tuple[str, int] | None:
        """(model directory, version) when LATEST names a version newer than the loaded one, else None."""
        from arlctl.inference import loader

        named = loader.latest_version(self.policy_dir)  # one small read of LATEST, local or remote
        if named is None or named <= self.policy.version:
            return None  # nothing published yet, or nothing newer
        path = loader.latest_version_dir(self.policy_dir)  # a URL's version is downloaded to a local cache
        return str(path), loader.read_version(path)


class Backpressure:
    """The gate before each new group in daemon mode (README "Running as daemons").

    A group of G starts only when (1) backlog + G <= max_pending, where backlog is the untrained rows of
    the run (arlctl.runstate.backlog) plus the rows this process started but has not committed, so the
    backlog never exceeds max_pending; and (2) trainer_version - policy.version <= max_staleness, where
    trainer_version = max(newest checkpoint step, LATEST). While blocked it commits buffered groups at
    every poll (so downstream can consume them), tries a reload, and logs each wait once.
    """

    def __init__(self, run: str, group_size: int, policy: Policy, in_flight: Callable[[], int],
                 max_pending: int | None = None, max_staleness: int | None = None, poll_s: float = 5.0,
                 follower: PolicyFollower | None = None, flush: Callable[[], Awaitable[None]] | None = None,
                 log: Callable[[str], None] = print):
        from arlctl.runstate import ShardCache

        self.run, self.group_size, self.policy, self.in_flight = run, group_size, policy, in_flight
        self.max_pending, self.max_staleness, self.poll_s = max_pending, max_staleness, poll_s
        self.follower, self.flush, self.log = follower, flush, log
        self.cache = ShardCache()
        self.waited_s = {"backlog": 0.0, "staleness": 0.0}
        self.waits = {"backlog": 0, "staleness": 0}
        self.max_backlog = 0  # the largest backlog (new group included) this gate let through
        self.max_staleness_started = 0  # the largest trainer_version - policy.version a group started at

    async def wait(self) -> None:
        reason, since = None, time.monotonic()
        while True:
            blocked, message, backlog_now, lag = await self._check()
            now = time.monotonic()
            if reason is not None:
                self.waited_s[reason] += now - since
            since = now
            if blocked is None:
                self.max_backlog = max(self.max_backlog, backlog_now)
                self.max_staleness_started = max(self.max_staleness_started, lag)
                return
            if blocked != reason:
                self.waits[blocked] += 1
                self.log(message)
            if self.flush is not None:
                await self.flush()  # groups that finished while we wait count as backlog only once committed
            reason = blocked
            await asyncio.sleep(self.poll_s)

    async def _check(self) -> tuple[str | None, str, int, int]:
        from arlctl.runstate import backlog

        if self.follower is not None:
            await self.follower.maybe_reload()  # a newer LATEST may clear the staleness bound
        state = await asyncio.to_thread(backlog, self.run, self.cache, self.in_flight())
        after = state["total"] + self.group_size
        lag = state["trainer_version"] - self.policy.version
        if self.max_pending is not None and after > self.max_pending:
            return ("backlog", f"waiting: backlog {after} > max-pending {self.max_pending} "
                    f"(rollouts {state['rollouts']}, rewarded {state['rewarded']}, batches {state['batches']}, "
                    f"in flight {state['in_flight']}, next group {self.group_size})", after, lag)
        if self.max_staleness is not None and lag > self.max_staleness:
            how = "waiting for a newer policy/LATEST" if self.follower else "no policy directory to reload from"
            return ("staleness", f"waiting: trainer version {state['trainer_version']} is {lag} ahead of policy "
                    f"version {self.policy.version} > max-staleness {self.max_staleness} ({how})", after, lag)
        return None, "", after, lag
