"""`arlctl doctor`: check this host for what rollout and reward need, one line per check with its fix."""

from __future__ import annotations

import typer
from rich.text import Text

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.doctor import DEFAULT_MIN_FREE_GB
from arlctl.render import plain

HELP = """Check this host before a run: bwrap starts a sandbox, the sandbox interpreter (the host's python3 the SWE grader runs inside bwrap) imports pytest, cgroup limits work, the default model is converted, and the run directory has free disk. With --sandbox docker: the engine answers and the base image is there; with --backend vllm: vLLM imports. The train line reports the device `arlctl train` gets, the CUDA and NCCL versions and the fast paths it will use (bf16, packed attention, flash-attn, Liger, torch.compile). Checks not asked for are shown as skipped. Each failed check prints the command that fixes it. Exit 0 when every required check passes, 1 otherwise (warnings, such as no cgroup or a model not converted yet, do not fail).

  arlctl doctor

  arlctl doctor --sandbox docker --backend vllm --run runs/r1

  arlctl doctor --json | jq -r '.[] | select(.status == "fail") | .fix'
"""

_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def register(app: typer.Typer) -> None:
    @app.command("doctor", help=HELP)
    @handle_errors
    def doctor_cmd(
        sandbox: str = typer.Option("bwrap", "--sandbox", help="Sandbox backend the run uses: bwrap, docker, "
                                    "subprocess."),
        backend: str = typer.Option("hf", "--backend", help="Inference backend the run uses: hf, vllm, openai."),
        run: str = typer.Option(".", "--run", help="Run directory whose free disk is checked."),
        min_free_gb: float = typer.Option(DEFAULT_MIN_FREE_GB, "--min-free-gb",
                                          help="Fail the disk check under this many GB free."),
        image: str = typer.Option(None, "--image", help="docker: the sandbox image [default: the base image]."),
        check: list[str] = typer.Option([], "--check", help="Run only this check (repeatable): bwrap, pytest, "
                                        "cgroups, docker, docker-image, vllm, model, disk, train."),
        as_json: bool = typer.Option(False, "--json", help="The checks as a JSON list on stdout."),
    ) -> None:
        from arlctl.doctor import DoctorOptions, failed, run_checks
        from arlctl.errors import UsageError
        from arlctl.inference.loader import BACKENDS
        from arlctl.sandbox import KINDS

        if sandbox not in KINDS:
            raise UsageError(f"unknown sandbox kind {sandbox!r}", hint=f"choose one of {', '.join(KINDS)}")
        if backend not in BACKENDS:
            raise UsageError(f"unknown inference backend {backend!r}", hint=f"choose one of {', '.join(BACKENDS)}")
        opts = DoctorOptions(sandbox=sandbox, backend=backend, run_dir=run, image=image, min_free_gb=min_free_gb)
        results = run_checks(opts, check or None)
        if as_json:
            print_json([r.to_dict() for r in results])
        else:
            width = max(len(r.name) for r in results)
            for r in results:
                line = Text.assemble((f"{r.status:<5}", _STYLE[r.status]), " ", plain(f"{r.name:<{width}}  {r.detail}"))
                if r.fix and r.status in ("fail", "warn"):
                    line.append_text(plain(f"   fix: {r.fix}", style="bold"))
                console.print(line, soft_wrap=True)
        bad = failed(results)
        if bad:
            if not as_json:
                console.print(plain(f"{len(bad)} required check(s) failed: {', '.join(r.name for r in bad)}"))
            raise typer.Exit(1)
