"""The embedded model: the GGUF in the wheel, tiny test models, the real SmolLM2 conversion (slow), the CLI."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
import typer
from safetensors.torch import load_file
from typer.testing import CliRunner

from arlctl import models
from arlctl.errors import TerminalError


def test_gguf_is_found_in_the_installed_wheel():
    path = models.find_gguf()
    assert path.name == models.GGUF_FILE
    assert path.stat().st_size > 50_000_000
    with open(path, "rb") as handle:
        assert handle.read(4) == b"GGUF"


def test_unknown_embedded_model_is_terminal():
    with pytest.raises(TerminalError):
        models.pull("llama-70b")


@pytest.mark.slow
def test_make_tiny_is_deterministic_and_has_the_smollm2_tokenizer(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    a = models.make_tiny(tmp_path / "a", seed=0)
    b = models.make_tiny(tmp_path / "b", seed=0)
    c = models.make_tiny(tmp_path / "c", seed=1)
    weights_a, weights_b, weights_c = (load_file(d / "model.safetensors") for d in (a, b, c))
    assert weights_a.keys() == weights_b.keys()
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
    assert not torch.equal(weights_a["model.embed_tokens.weight"], weights_c["model.embed_tokens.weight"])

    config = AutoConfig.from_pretrained(a)
    assert config.num_hidden_layers == 2 and config.hidden_size == 64
    tokenizer = AutoTokenizer.from_pretrained(a)
    assert len(tokenizer) == config.vocab_size == 49152
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], tokenize=False, add_generation_prompt=True
    )
    # SmolLM2's ChatML template with its default system prompt
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"


@pytest.mark.slow
def test_tiny_model_dir_is_built_once(tmp_path, monkeypatch):
    monkeypatch.setenv("ARLCTL_HOME", str(tmp_path))
    first = models.tiny_model_dir()
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert first.parent == tmp_path / "models"
    assert json.loads((first / models.MARKER_FILE).read_text())["seed"] == 0
    again = models.tiny_model_dir()
    assert again == first and (again / "model.safetensors").stat().st_mtime_ns == stamp
    # nothing half-built is left beside it
    assert sorted(p.name for p in (tmp_path / "models").iterdir() if ".tmp-" in p.name) == []


def _cli() -> typer.Typer:
    from arlctl.cli import model

    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    model.register(app)
    return app


@pytest.mark.slow
def test_cli_make_tiny_and_info(tmp_path):
    runner = CliRunner()
    result = runner.invoke(_cli(), ["model", "make-tiny", str(tmp_path / "tiny"), "--seed", "3", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["path"] == str(tmp_path / "tiny")
    (tmp_path / "tiny" / "version.json").write_text('{"version": 12}')
    result = runner.invoke(_cli(), ["model", "info", str(tmp_path / "tiny"), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["version"] == 12 and info["layers"] == 2 and info["vocab"] == 49152
    # embeddings 49152*64 (tied with the head) + 2 layers of 4 attention matrices and 3 MLP matrices + norms:
    # attention q,o: 64*64 each; k,v: 64*32 each (2 kv heads of 16); mlp: 3 * 64*128; norms 2*64; final 64
    per_layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64
    assert info["params"] == 49152 * 64 + 2 * per_layer + 64


def test_cli_info_bad_spec_exits_2_with_hint(tmp_path):
    result = CliRunner().invoke(_cli(), ["model", "info", str(tmp_path / "nope")])
    assert result.exit_code == 2  # a spec that names no policy is a usage error
    assert "not found" in result.output and "hint" in result.output


@pytest.mark.slow
def test_pull_real_smollm2_is_idempotent_and_answers(tmp_path, monkeypatch):
    monkeypatch.setenv("ARLCTL_HOME", str(tmp_path))
    path = models.pull()
    assert (path / "model.safetensors").is_file() and (path / models.MARKER_FILE).is_file()
    config = json.loads((path / "config.json").read_text())
    assert config["num_hidden_layers"] == 30 and "quantization_config" not in config
    # The second call does no work: no conversion step is announced and nothing on disk is rewritten.
    def listing():
        return {f.relative_to(tmp_path): (f.stat().st_ino, f.stat().st_mtime_ns) for f in tmp_path.rglob("*")}

    before, steps = listing(), []
    assert models.pull(progress=steps.append) == path
    assert steps == [] and listing() == before

    from arlctl.inference.base import SamplingParams
    from arlctl.inference.hf import HFPolicy

    policy = HFPolicy(path, name="smollm2-135m")
    prompt = policy.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, tokenize=False
    )
    ids = policy.tokenizer(prompt, add_special_tokens=False).input_ids

    async def go():
        try:
            return await policy.generate(ids, SamplingParams(temperature=0.0, max_new_tokens=32))
        finally:
            await policy.close()

    gen = asyncio.run(go())
    text = policy.tokenizer.decode(gen.ids)
    assert "5" in text, text
    assert gen.finish_reason == "stop" and text.endswith("<|im_end|>")
