"""`arlctl reward-serve`: every registered reward (and plugin) over HTTP, for `--reward http://HOST:PORT/NAME`."""

from __future__ import annotations

import asyncio
import math

import typer

from arlctl.cli.common import console, handle_errors, stop_on_signals
from arlctl.errors import UsageError

# Not imported from arlctl.rewards.server: that would load aiohttp for every arlctl command.
DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024  # a shard's worth of rows with their tasks and transcripts
DEFAULT_QUEUE_TIMEOUT_S = 600.0

HELP = """Serve reward functions over HTTP so they run on their own machines: the reward stage then scores with --reward http://HOST:PORT/NAME and gets the same rewards, components and reward_version as with --reward NAME.

  arlctl reward-serve --port 8100 --concurrency 8

  arlctl reward --run runs/r1 --reward http://grader:8100/swe --reward-opt sandbox=docker --concurrency 32

  arlctl reward-serve --host 0.0.0.0 --port 8100 --spec mypkg.rewards:score

POST /score/NAME takes {"rows": [{"final_state", "task", "response_text"}, ...], "options": {...}} and answers {"version", "results": [{"reward", "components", "info"}, ...]}; GET /health says what is served and how busy it is. Every built-in reward and installed plugin is served, plus the module:attribute specs given with --spec (a client cannot name other code). At most --concurrency rows (or groups) are scored at once; the rest queue, and a request that waits longer than --queue-timeout for a slot gets 503 (the stage retries the shard later). A body over --max-request-bytes gets 413 (the stage then sends smaller requests); an unknown NAME gets 404 listing the served names. It listens on 127.0.0.1 unless --host says otherwise: anyone who can reach it can spend its graders. Ctrl-C or SIGTERM answers the requests in flight, then exits."""


def register(app: typer.Typer) -> None:
    @app.command("reward-serve", help=HELP)
    @handle_errors
    def reward_serve_cmd(
        host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
        port: int = typer.Option(8100, "--port", help="Port to listen on."),
        concurrency: int = typer.Option(8, "--concurrency", help="Rows (or groups) scored at once, over all "
                                                                 "requests; the rest queue."),
        queue_timeout: float = typer.Option(DEFAULT_QUEUE_TIMEOUT_S, "--queue-timeout",
                                            help="Seconds a request may wait for a scoring slot before 503."),
        max_request_bytes: int = typer.Option(DEFAULT_MAX_REQUEST_BYTES, "--max-request-bytes",
                                              help="Largest request body accepted (bigger: 413)."),
        spec: list[str] = typer.Option([], "--spec", help="Also serve this package.module:attribute reward "
                                                          "(repeatable)."),
    ) -> None:
        from arlctl.rewards import composite  # noqa: F401  (registers the rewards defined beside it)
        from arlctl.rewards.server import RewardServer

        if concurrency < 1 or max_request_bytes < 1 or not 1 <= port <= 65535:
            raise UsageError("--concurrency and --max-request-bytes must be >= 1, --port in 1..65535")
        if not (math.isfinite(queue_timeout) and queue_timeout > 0):
            raise UsageError(f"--queue-timeout must be a positive number of seconds, got {queue_timeout}")
        server = RewardServer(concurrency, queue_timeout, max_request_bytes, spec)
        console.print(f"serving {len(server.names)} rewards on http://{host}:{port}/score/NAME "
                      f"(concurrency {concurrency}): {', '.join(server.names)}", soft_wrap=True)
        try:
            asyncio.run(_main(server, host, port))
        except KeyboardInterrupt:
            pass
        console.print(f"scored {server.stats['rows']} rows in {server.stats['requests']} requests")


async def _main(server, host: str, port: int) -> None:
    from arlctl.rewards.server import serve_forever

    stop = stop_on_signals("answering the requests in flight, then exiting")
    await serve_forever(server, host, port, stop)
