"""The agent loop: one trajectory of a policy in an environment, turn by turn (DESIGN.md §6).

Per turn: generate from the exact token sequence so far, parse tool calls, step the environment, append
the observation segment, repeat until the env says done or a bound hits. The driver (stages/rollout.py)
runs many of these at once; while one waits on its tool, the others generate.

Faults never kill the batch: a tool exception or malformed call becomes an error observation; a step
timeout returns "timeout" to the model; an inference failure retries with backoff, then ends the
trajectory with status policy_error. Any other exception inside a trajectory ends it as `env_error`,
its cause counted in Stats.causes ("infra:" when the infrastructure, not the model, failed).

A reply the token budget cut (its generation ended "length": --max-new-tokens, what is left of
--max-tokens, the context, or the engine's own limit) is a cut turn. A trajectory that ends on a cut
turn, or whose --max-tokens / context budget runs out before a turn, is status `truncated` with
finish_reason "length", and its last turn's error says which budget cut it (`length: ...`); a cut turn
the episode goes on after is an ordinary turn.

Tokens reach the row only through schemas/builder.py (the one token-append rule). Text reaches it only
through schemas/safe_text.py. A generation whose token ids are not ints in [0, vocab) (or whose log-probs
are missing or non-finite) is an inference failure: retried, then policy_error naming the bad value.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import numbers
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from arlctl.envs.base import Action, Env, EnvFailure, StepResult, env_info
from arlctl.inference.base import DEFAULT_SAMPLING, Generation, Policy, SamplingParams, route_key
from arlctl.inference.chat import ChatCodec, Segment
from arlctl.schemas.builder import TrajectoryBuilder
from arlctl.schemas.rows import TrajectoryRow
from arlctl.schemas.safe_text import as_text, parquet_safe, parquet_safe_value
from arlctl.settings import setting
from arlctl.tools import TOOL_CALL_FORMATS, parse_tool_calls, parser_for_template


@dataclass
class RolloutConfig:
    env: str = setting("math", "Environment of tasks without their own (the CLI's --env).", cli=False)
    group_size: int = setting(4, "Samples per task (GRPO group).", short="-G")
    concurrency: int = setting(64, "Trajectories in flight.", short="-c")
    max_turns: int = setting(6, "Model turns per trajectory.")
    max_tokens: int = setting(2048, "Response tokens (generated + environment) per trajectory.")
    max_new_tokens: int = setting(DEFAULT_SAMPLING.max_new_tokens, "Generated tokens per turn.")
    max_context: int = setting(8192, "Prompt + response tokens, never exceeded (the policy's own when it "
                                     "declares one).", cli=False)
    step_timeout: float = setting(30.0, "Seconds per environment step.")
    trajectory_timeout: float = setting(3600.0, "Seconds per trajectory, queueing for the policy included.")
    max_obs_tokens: int = setting(512, "Observation tokens kept per turn.")
    temperature: float = setting(DEFAULT_SAMPLING.temperature, "Sampling temperature.")
    top_p: float = setting(DEFAULT_SAMPLING.top_p, "Nucleus sampling: keep the smallest token set with this much probability.")
    seed: int | None = setting(None, "Sampling seed (per trajectory and turn).")
    retries: int = setting(3, "Retries of a failed generation per turn (exponential backoff).", cli=False)
    retry_backoff: float = setting(0.5, "Seconds before the first retry, doubling.", cli=False)
    tool_format: str | None = setting(None, "Tool-call parser: hermes, llama3-json, mistral (default: the one "
                                            "of the chat template's family).", flag="--tool-parser")
    max_top_up: int = setting(0, "Per group: members that end env_error (infrastructure) are resampled this "
                                 "often (the CLI's --top-up sets it to --max-top-up).", cli=False)
    history: str = setting("full", "full: one prefix-consistent row per trajectory; per-turn: one row per turn, "
                                   "each rendered by the chat template itself.")
    template_kwargs: dict[str, Any] = setting(help="Extra chat-template variables (the CLI's "
                                                   "--chat-template-kwargs).", cli=False, factory=dict)
    harness: str | None = setting(None, "An agent harness run per sample instead of this loop (the CLI's "
                                  "--harness: mini-swe-agent, a plug-in or module:factory).", cli=False)
    harness_options: dict[str, Any] = setting(help="The harness's options (the CLI's --harness-opt).", cli=False,
                                              factory=dict)

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
    peak_in_flight: int = 0  # the most trajectories in flight at once
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


class Trajectory:
    """The growing state of one trajectory; whatever it holds becomes a row, even when aborted."""

    def __init__(self, task: dict[str, Any], group_id: str, sample_index: int, env_name: str, policy: Policy,
                 epoch: int = 0, attempt: int = 0):
        # The env, the prompt and the `task` column all see the same Parquet-safe copy of the task.
        self.task = parquet_safe_value(task)
        self.epoch, self.attempt = epoch, attempt
        self.builder = TrajectoryBuilder(TrajectoryRow(
            group_id=group_id, sample_index=sample_index, task_id=str(self.task.get("task_id", "")),
            env=env_name, env_version="", task=self.task, policy=policy.name, prompt_text="", prompt_ids=[],
            policy_version=policy.version, policy_version_last=policy.version, started_at=datetime.now(UTC),
        ))
        self.row = self.builder.row
        # --history per-turn: each turn's own prompt (the template's rendering of the conversation so
        # far) and the (assistant content, observations) pairs it is rendered from.
        self.turn_prompts: list[Segment] = []
        self.history: list[tuple[str, list[dict[str, Any]]]] = []

        self.cut_note: str | None = None  # the `length: ...` note on the last turn's error, when a budget cut it
        self.extra_rows: list[TrajectoryRow] = []  # a harness run's earlier segments (stages/harness_run.py)

    def finish(self, status: str, finish_reason: str) -> TrajectoryRow:
        return self.builder.finish(status, finish_reason)

    def finish_cut(self, note: str) -> TrajectoryRow:
        """End as cut by a token budget: truncated, finish_reason "length", `note` on the last turn's error."""
        if self.row.turns:
            last = self.row.turns[-1]
            self.cut_note = parquet_safe(note)
            last.error = f"{last.error}; {self.cut_note}" if last.error else self.cut_note
        return self.finish("truncated", "length")

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
                num_tool_calls=len(turn.tool_calls), env_errors=int(bool(turn.error) and turn.error != self.cut_note),
                retries=row.retries if k == last else 0,
                gen_time_s=turn.gen_latency_s, env_time_s=turn.env_latency_s))
        return rows



class BadGeneration(ValueError):
    """A backend answered with tokens no tokenizer or trainer can use (an inference failure)."""


def check_generation(gen: Generation, vocab_size: int) -> None:
    """Refuse ids outside [0, vocab_size) or not ints, and log-probs that are missing or not finite.

    Such ids crash decoding (a negative id) or silently decode to "" and later index past the
    embedding in training (an id >= vocab); non-finite log-probs poison the PPO ratio.
    """
    ids, logprobs = gen.ids, gen.logprobs
    # The common case in one pass each, without an ABC isinstance per token (a turn's largest loop cost).
    if (len(logprobs) == len(ids) and all(type(t) is int for t in ids)
            and (not ids or (min(ids) >= 0 and max(ids) < vocab_size))
            and all(type(v) is float for v in logprobs) and all(map(math.isfinite, logprobs))):
        return
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
    return int(policy.vocab_size)


def _seed_for(base: int | None, *parts: Any) -> int | None:
    if base is None:
        return None
    digest = hashlib.sha256(json.dumps([base, *parts], default=str).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _turn_seed(base: int | None, traj: Trajectory, turn_index: int) -> int | None:
    """Deterministic per (task, sample, turn); epochs after the first mix in their number so they differ."""
    row = traj.row
    if traj.epoch == 0 and traj.attempt == 0:
        return _seed_for(base, row.task_id, row.sample_index, turn_index)
    if traj.attempt == 0:
        return _seed_for(base, "epoch", traj.epoch, row.task_id, row.sample_index, turn_index)
    # a top-up: the same task and sample, a new seed
    return _seed_for(base, "attempt", traj.attempt, traj.epoch, row.task_id, row.sample_index, turn_index)


def _truncate_observation(codec: ChatCodec, content: str, max_tokens: int) -> str:
    if _token_count(codec, content) <= max_tokens:
        return content
    ids = codec.encode(content)
    kept = codec.decode(ids[:max_tokens])
    return f"{kept}\n...[observation truncated: {len(ids) - max_tokens} more tokens]"


def _token_count(codec: ChatCodec, content: str) -> int:
    """How many tokens `content` encodes to, as codec.encode counts them.

    A fast tokenizer's Rust backend counts without the Python wrapper around it (25x cheaper per call on a
    short observation); the count is the same because the wrapper calls the same backend encode.
    """
    backend = getattr(codec.tokenizer, "backend_tokenizer", None)
    # The wrapper resets truncation and padding on every call; a backend left with either set by some
    # other caller would count differently, so it is asked through the wrapper then.
    if backend is None or backend.truncation is not None or backend.padding is not None:
        return len(codec.encode(content))
    return len(backend.encode(content, add_special_tokens=False).ids)


def parse_action(env: Env, text: str, tools: list[dict[str, Any]], tool_format: str) -> Action:
    """The turn's tool calls, read by the family's parser (`tool_format`) against the env's tools.

    An env whose `tool_format` is a tool-call format (hermes, llama3-json, mistral) gets the family's
    parser, so the same env works under every chat template; an env with its own convention (fenced
    bash blocks, or a `parse_action` and no tool-call `tool_format`) parses its own turns.
    """
    if env.tool_format not in TOOL_CALL_FORMATS:
        own = env.parse_action(text)
        if own is not None:
            return own
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
                    traj: Trajectory) -> Generation:
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
        # A timeout scope, not wait_for: wait_for wraps the step in a task of its own, one more per turn.
        async with asyncio.timeout(cfg.step_timeout):
            return await env.step(action), None
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


async def run_trajectory(traj: Trajectory, policy: Policy, env: Env, codec: ChatCodec, cfg: RolloutConfig,
                         stats: Stats, turn_hook: Callable[[], Awaitable[None]] | None = None) -> TrajectoryRow:
    """One episode, start to finish. Bounded by cfg; every fault ends up recorded in the row."""
    row = traj.row
    row.env_version = as_text(env.version) or ""
    # Sticky routing by trajectory (this task's context only): a fleet sends every turn of this attempt
    # to the engine that holds its prefix without hashing the context each turn.
    route_key.set(f"{row.group_id}/{row.sample_index}/{traj.attempt}")
    try:
        # Reset may wait for a free sandbox, so it gets the trajectory's budget, not a step's.
        reset = await asyncio.wait_for(env.reset(traj.task), cfg.trajectory_timeout)
    except Exception as err:  # includes the reset timing out
        row.env_errors += 1
        cause = ("infra:reset_timeout" if isinstance(err, TimeoutError)
                 else "infra:reset_failed" if isinstance(err, EnvFailure) else "reset_error")
        message = f"reset failed: {type(err).__name__}: {err}"
        stats.fault(cause, message)
        # No turn exists to carry the cause (no sandbox, no prompt): the row's env_info does.
        row.env_info = {"error": cause, "reset_error": parquet_safe_value(message[:2000])}
        return traj.finish("env_error", "error")
    # A plugin env may put unencodable text in its messages; the tokenizer refuses lone surrogates.
    messages = parquet_safe_value(reset.messages)
    prompt = codec.prompt(messages, reset.tools)
    row.prompt_text, row.prompt_ids = prompt.text, prompt.ids
    deadline = traj.builder.t0 + cfg.trajectory_timeout
    try:
        async with asyncio.timeout_at(asyncio.get_running_loop().time() + (deadline - time.monotonic())):
            return await _turns(traj, policy, env, codec, cfg, stats, messages, reset.tools, turn_hook)
    except TimeoutError:
        stats.fault("timeout", f"trajectory timed out after {cfg.trajectory_timeout:g}s")
        return traj.finish("timeout", "timeout")


def _next_context(traj: Trajectory, codec: ChatCodec, cfg: RolloutConfig, messages: list[dict[str, Any]],
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


async def _turns(traj: Trajectory, policy: Policy, env: Env, codec: ChatCodec, cfg: RolloutConfig,
                 stats: Stats, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                 turn_hook: Callable[[], Awaitable[None]] | None) -> TrajectoryRow:
    row = traj.row
    tool_format = tool_parser_for(codec, cfg)
    for turn_index in range(cfg.max_turns):
        # 1. Budget: never exceed the response budget or the model's context.
        context, used = _next_context(traj, codec, cfg, messages, tools)
        limits = {"max_tokens": cfg.max_tokens - used, "context": cfg.max_context - len(context),
                  "max_new_tokens": cfg.max_new_tokens}
        budget = min(limits.values())
        if budget <= 0:
            if traj.turn_prompts and len(traj.turn_prompts) > len(row.turns):
                traj.turn_prompts.pop()  # no turn was generated from it
            spent = "max_tokens" if limits["max_tokens"] <= 0 else "context"
            return traj.finish_cut(f"{_cut_note(spent, cfg)}, before turn {turn_index}")
        if turn_hook is not None:
            await turn_hook()  # weight reloads happen only here, at a turn boundary
        # 2. Generate from the exact ids so far.
        t_gen = time.monotonic()
        try:
            gen = await _generate(policy, context, cfg.sampling(budget, _turn_seed(cfg.seed, traj, turn_index)),
                                  cfg, traj)
        except asyncio.CancelledError as err:
            if being_cancelled():
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
        turn = traj.builder.add_generation(gen.ids, gen.logprobs, gen.version, text, calls, time.monotonic() - t_gen)
        stats.generated_tokens += len(gen.ids)
        cut_by = _cut_by(gen, limits)
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
            if cut_by:  # the env took the cut reply as the answer: graded on a cut text
                return traj.finish_cut(f"{_cut_note(cut_by, cfg)}; the env ended it ({result.finish_reason or 'stop'})")
            return traj.finish("truncated" if cut else "ok", result.finish_reason or "stop")
        if cut_by in ("max_tokens", "context") or (cut_by and turn_index == cfg.max_turns - 1):
            return traj.finish_cut(_cut_note(cut_by, cfg))  # no budget left, or no turn left to finish it
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
            traj.builder.add_observation([], shown)
        else:
            segment = codec.continuation(glue, observations)
            traj.builder.add_observation(segment.ids, shown)
    return traj.finish("ok", "max_turns")


def _cut_by(gen: Generation, limits: dict[str, int]) -> str | None:
    """Which budget stopped a generation that ended "length" (None: it was not cut).

    The trajectory's budgets are named before --max-new-tokens when they bound the turn as tightly: raising
    --max-new-tokens alone would not have let the reply finish. "engine": the backend stopped it short of
    every budget we set (a server's own context or max-tokens limit).
    """
    if gen.finish_reason != "length":
        return None
    return next((name for name, left in limits.items() if len(gen.ids) >= left), "engine")


def _cut_note(cut_by: str, cfg: RolloutConfig) -> str:
    """The `length: ...` text on a cut trajectory's last turn: which budget, and how large it was."""
    return "length: " + {
        "max_new_tokens": f"the reply reached --max-new-tokens ({cfg.max_new_tokens} tokens)",
        "max_tokens": f"the trajectory reached --max-tokens ({cfg.max_tokens} response tokens)",
        "context": f"the context reached the policy's limit ({cfg.max_context} tokens)",
        "engine": "the inference engine stopped the reply at its own length limit",
    }[cut_by]


async def final_state_after_bound(row: TrajectoryRow, env: Env, cfg: RolloutConfig, stats: Stats) -> None:
    """Ended by a bound, not by the agent: keep what it left behind (the swe diff) for grading."""
    try:
        row.final_state = await asyncio.wait_for(env.final_state(), cfg.step_timeout)
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
    reason = env.final_state_truncated
    return str(reason) if reason else None


def record_env_info(row: TrajectoryRow, env: Env, stats: Stats) -> None:
    """Store where the env ran (its optional env_info()) in the row's env_info, whatever its status.

    Called once the episode is over and before the env closes. An env_info() that raises or returns a
    non-dict is counted (cause env_info_error) and leaves the column null: it never costs the row.
    """
    try:
        info = env_info(env)
    except Exception as err:
        stats.fault("env_info_error", f"env_info failed: {type(err).__name__}: {err}")
        return
    if info is not None:  # kept beside what the loop recorded (a failed reset's cause)
        row.env_info = {**(row.env_info or {}), **parquet_safe_value(info)}


def crashed(traj: Trajectory, err: BaseException, stats: Stats) -> TrajectoryRow:
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


def being_cancelled() -> bool:
    """True when the current task has a cancellation request pending (a stop), not a stray CancelledError."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
