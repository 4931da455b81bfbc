"""`arlctl serve`: an OpenAI-compatible server over a policy that records every session as trajectory rows."""

from __future__ import annotations

import asyncio
from typing import Any

import typer

from arlctl.cli.common import console, handle_errors

HELP = """Serve a policy behind an OpenAI-compatible API (/v1/chat/completions, /v1/completions) and record
each session's exact token ids and log-probs as trajectory rows, so any OpenAI-client agent produces
training data.

  arlctl serve --policy default --port 8000 --record runs/r1/rollouts

  OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=x my-agent ...

A session is named by the X-Arlctl-Session request header (else found by matching the conversation
prefix). It ends on POST /v1/sessions/ID/end, after --idle-timeout seconds, or when the server stops;
its rows are written then. Ctrl-C writes every open session and exits.
"""


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
        max_batch: int = typer.Option(16, "--max-batch", help="Sequences per forward pass (hf, vllm)."),
        server: list[str] = typer.Option([], "--server", help="Upstream server URL (openai backend; repeatable)."),
    ) -> None:
        from arlctl.inference.loader import load_policy
        from arlctl.serve.app import ServeState

        opts: dict[str, Any] = {"max_batch": max_batch} if backend == "hf" else {}
        pol = load_policy(policy, backend=backend, **opts)
        state = ServeState(pol, record, idle_timeout_s=idle_timeout, default_max_tokens=max_tokens)
        console.print(f"serving {pol.name} (v{pol.version}) on http://{host}:{port}/v1"
                      + (f", recording to {record}" if record else ", not recording"))
        try:
            asyncio.run(_main(state, host, port))
        except KeyboardInterrupt:
            pass
        console.print(f"wrote {len(state.rows_written)} rows in {len(state.writer.written)} shards")


async def _main(state: Any, host: str, port: int) -> None:
    from arlctl.serve.app import serve_forever

    try:
        await serve_forever(state, host, port)
    finally:
        await state.policy.close()
