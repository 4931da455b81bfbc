"""Policy specs: HF model directories, run policy directories with LATEST, aliases, and bad specs."""

from __future__ import annotations

import json
import shutil

import pytest

from arlctl.errors import TerminalError, UsageError
from arlctl.inference.loader import load_policy, resolve_policy
from arlctl.models import tiny_model_dir


def copy_model(dest, version: int | None = None):
    shutil.copytree(tiny_model_dir(), dest)
    if version is not None:
        (dest / "version.json").write_text(
            json.dumps({"version": version, "step": version, "source_checkpoint": "ckpt", "sha256": "x"})
        )
    return dest


def test_tiny_alias():
    resolved = resolve_policy("tiny")
    assert resolved.path == tiny_model_dir() and resolved.name == "tiny" and resolved.version == 0


def test_hf_model_dir_is_version_zero_or_its_version_json(tmp_path):
    plain = copy_model(tmp_path / "plain")
    assert resolve_policy(str(plain)).version == 0
    assert resolve_policy(str(plain)).path == plain
    versioned = copy_model(tmp_path / "versioned", version=5)
    assert resolve_policy(str(versioned)).version == 5


def test_policy_dir_follows_latest(tmp_path):
    policy = tmp_path / "run" / "policy"
    policy.mkdir(parents=True)
    copy_model(policy / "v000002", version=2)
    copy_model(policy / "v000003", version=3)
    (policy / "LATEST").write_text("v000003\n")
    resolved = resolve_policy(str(policy))
    assert resolved.path == policy / "v000003"
    assert resolved.version == 3
    assert resolved.policy_dir == policy
    # the run directory itself works too
    assert resolve_policy(str(tmp_path / "run")).version == 3
    (policy / "LATEST").write_text("v000002")
    assert resolve_policy(str(policy)).version == 2


@pytest.mark.parametrize("latest", ["v000009", "", "../elsewhere"])
def test_latest_naming_nothing_usable_is_terminal(tmp_path, latest):
    policy = tmp_path / "policy"
    copy_model(policy / "v000001", version=1)
    (policy / "LATEST").write_text(latest)
    with pytest.raises(TerminalError):
        resolve_policy(str(policy))


def test_bad_specs_are_terminal_with_a_hint(tmp_path):
    for spec in [str(tmp_path / "missing"), str(tmp_path)]:
        with pytest.raises(TerminalError) as err:
            resolve_policy(spec)
        assert err.value.hint and "LATEST" in err.value.hint
    file_spec = tmp_path / "model.bin"
    file_spec.write_text("x")
    with pytest.raises(TerminalError):
        resolve_policy(str(file_spec))


def test_version_json_without_version_is_terminal(tmp_path):
    model = copy_model(tmp_path / "m")
    (model / "version.json").write_text('{"step": 3}')
    with pytest.raises(TerminalError):
        resolve_policy(str(model))


def test_unavailable_backends_are_usage_errors():
    pytest.importorskip("transformers")
    try:
        import vllm.engine.arg_utils  # noqa: F401
    except ImportError:
        with pytest.raises(UsageError, match="needs vLLM installed"):
            load_policy("tiny", backend="vllm")
    with pytest.raises(UsageError, match="needs at least one server"):
        load_policy("tiny", backend="openai")
    with pytest.raises(UsageError, match="unknown inference backend"):
        load_policy("tiny", backend="tgi")


def test_load_policy_records_name_and_version(tmp_path):
    import asyncio

    from arlctl.inference.base import Policy, SamplingParams

    policy_dir = tmp_path / "policy"
    copy_model(policy_dir / "v000004", version=4)
    (policy_dir / "LATEST").write_text("v000004")
    policy = load_policy(str(policy_dir), max_batch=4)

    async def go():
        try:
            return await policy.generate([1, 2, 3], SamplingParams(temperature=0.0, max_new_tokens=3))
        finally:
            await policy.close()

    assert isinstance(policy, Policy)
    assert policy.name == str(policy_dir) and policy.version == 4
    assert asyncio.run(go()).version == 4
