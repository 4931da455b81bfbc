"""`arlctl serve`: an OpenAI-compatible server over a policy that records every session as trajectory rows."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from typing import Any

import typer

from arlctl.cli.common import console, handle_errors, stop_on_signals
from arlctl.errors import TerminalError, UsageError
from arlctl.serve.batcher import DEFAULT_FLUSH_SECONDS, DEFAULT_FLUSH_SESSIONS
from arlctl.serve.validation import DEFAULT_MAX_BODY_BYTES
from arlctl.stages.jobs import PolicyOptions

# --max-batch is rollout's and eval's (PolicyOptions): one default, one help. A server batches whatever
# requests are waiting, so a larger bound costs a lone client nothing.
MAX_BATCH = next(f for f in dataclasses.fields(PolicyOptions) if f.name == "max_batch")

HELP = """Serve a policy behind an OpenAI-compatible API (/v1/chat/completions, /v1/completions) and Anthropic's Messages API (/v1/messages), streaming or not, and record each session's exact token ids and log-probs as trajectory rows, so any OpenAI-client agent produces training data.

  arlctl serve --policy default --port 8000 --record runs/r1/rollouts

  OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=x my-agent ...

  ANTHROPIC_BASE_URL=http://127.0.0.1:8000 ANTHROPIC_API_KEY=x my-claude-agent ...

  arlctl serve --policy tiny --reply 'Done.' --port 8000    # fixed replies, no model: harness and load tests

A session is named by the X-Arlctl-Session request header (else found by matching the conversation prefix). It ends on POST /v1/sessions/ID/end, after --idle-timeout seconds, or when the server stops. Ended sessions are written in batches: one shard per --flush-sessions sessions, or once the oldest waited --flush-seconds; POST /v1/sessions/ID/end answers only once that session's rows are committed (sessions ended at the same time share a shard). A harness can attach its outcome first: POST /v1/sessions/ID/reward {"reward": R, "info": {...}} writes the session's rows with that reward and reward_version session-api. Ctrl-C or SIGTERM writes every open session and exits (a second one exits at once). A request body over --max-body-bytes is refused with 413; malformed requests get a 400 naming the field. Exit status 1 when some session's rows could not be written (each is logged)."""


def register(app: typer.Typer) -> None:
    @app.command("serve", help=HELP)
    @handle_errors
    def serve_cmd(
        policy: str = typer.Option("default", "--policy", help="HF dir, RUN/policy (uses LATEST), default, tiny."),
        backend: str = typer.Option("hf", "--backend", help="Inference backend: hf, vllm, openai."),
        host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
        port: int = typer.Option(8000, "--port", help="Port to listen on."),
        record: str = typer.Option(None, "--record", help="Directory (any fsspec URL) for recorded shards."),
        idle_timeout: float = typer.Option(600.0, "--idle-timeout", help="End a session after T idle seconds."),
        max_tokens: int = typer.Option(256, "--max-tokens", help="Default max tokens per reply."),
        max_batch: int = typer.Option(MAX_BATCH.default, "--max-batch", help=MAX_BATCH.metadata["help"]),
        server: list[str] = typer.Option([], "--server", help="Upstream server URL (openai backend; repeatable)."),
        max_body_bytes: int = typer.Option(DEFAULT_MAX_BODY_BYTES, "--max-body-bytes",
                                           help="Largest request body accepted (bigger: 413)."),
        flush_sessions: int = typer.Option(DEFAULT_FLUSH_SESSIONS, "--flush-sessions", help="Ended sessions per shard."),
        flush_seconds: float = typer.Option(DEFAULT_FLUSH_SECONDS, "--flush-seconds",
                                            help="Commit a shard once its oldest ended session waited S seconds."),
        reply: list[str] = typer.Option([], "--reply", help="Answer with fixed text instead of a model (repeatable: "
                                        "turn i gets reply i); loads only --policy's tokenizer. For harness and "
                                        "load tests."),
    ) -> None:
        from arlctl.inference.sampling_check import MAX_NEW_TOKENS, check_int
        from arlctl.serve.app import ServeState
        from arlctl.stages import policy_job

        check_int("--max-tokens", max_tokens, 1, MAX_NEW_TOKENS)
        check_int("--max-body-bytes", max_body_bytes, 1, 1 << 40)
        check_int("--flush-sessions", flush_sessions, 1, 1 << 20)
        for flag, value in (("--idle-timeout", idle_timeout), ("--flush-seconds", flush_seconds)):
            if not (math.isfinite(value) and value > 0):
                raise UsageError(f"{flag} must be a positive number of seconds, got {value}")
        choice = policy_job.choose(PolicyOptions(policy=policy, backend=backend, server=server, max_batch=max_batch),
                                   scripted_ok=False)
        pol = _scripted(choice, reply) if reply else policy_job.load(choice)
        state = ServeState(pol, record, idle_timeout_s=idle_timeout, default_max_tokens=max_tokens,
                           max_body_bytes=max_body_bytes, flush_sessions=flush_sessions, flush_seconds=flush_seconds)
        console.print(f"serving {pol.name} (v{pol.version}) on http://{host}:{port}/v1"
                      + (f", recording to {record}" if record else ", not recording"))
        try:
            asyncio.run(_main(state, host, port))
        except KeyboardInterrupt:
            pass
        console.print(f"wrote {state.writer.rows_written} rows of {state.writer.sessions_written} sessions in "
                      f"{len(state.writer.written)} shards")
        if state.failed:
            first = next(iter(state.failed.items()))
            raise TerminalError(f"{len(state.failed)} sessions could not be written (first: {first[0]}: {first[1]})",
                                hint="see the log above for each session's error")


def _scripted(choice: Any, replies: list[str]) -> Any:
    """The --reply policy over --policy's tokenizer (no weights loaded)."""
    from transformers import AutoTokenizer

    from arlctl.serve.replies import replies_policy

    tokenizer = AutoTokenizer.from_pretrained(str(choice.resolved.path), local_files_only=True)
    return replies_policy(tokenizer, choice.resolved.name, replies)


async def _main(state: Any, host: str, port: int) -> None:
    """Serve until SIGINT or SIGTERM; both end the same way: every open session written, then exit."""
    from arlctl.serve.app import serve_forever

    stop = stop_on_signals("writing every open session, then exiting")
    try:
        await serve_forever(state, host, port, stop=stop)
    finally:
        await state.policy.close()
