"""The real `arlctl` CLI run in this process, answered in the shape of a finished process.

A test that only needs a command's exit code, stdout and stderr gets them from Typer's CliRunner in a
fraction of a second; a fresh interpreter costs seconds (imports, torch, the tiny model). Tests that need a
real process (signals, concurrent processes, the installed entry point, what a pipe receives) stay as
subprocesses and are marked `e2e`.
"""

from __future__ import annotations

import subprocess

from typer.testing import CliRunner

from arlctl.cli.main import app

runner = CliRunner()


def arlctl(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`arlctl ARGS` in process: returncode, stdout and stderr as `subprocess.run(..., text=True)` gives
    them; `env` is added to os.environ for the call only."""
    argv = [str(a) for a in args]
    result = runner.invoke(app, argv, env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(["arlctl", *argv], result.exit_code, result.stdout, result.stderr)
