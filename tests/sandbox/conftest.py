"""Fixtures for the sandbox tests: a small repository snapshot, backend availability, host-state probes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from sandbox_helpers import LIMITS

from arlctl.sandbox import make_pool


@pytest.fixture
def snapshot(tmp_path) -> Path:
    """A tiny but real repository: a package, a test, a file with a known checksum."""
    root = tmp_path / "snapshot"
    (root / "calc").mkdir(parents=True)
    (root / "calc" / "__init__.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_calc.py").write_text(
        "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    )
    (root / "README").write_text("pristine\n")
    return root


def _engine_reason() -> str | None:
    try:
        from arlctl.sandbox.docker import DEFAULT_IMAGE, docker_client

        client = docker_client(timeout=5)
        client.images.get(DEFAULT_IMAGE)
        client.close()
        return None
    except Exception as e:
        return f"no docker engine with image arlctl/sandbox-base:1 ({e}); run .ci/docker_setup.sh"


BACKENDS = [
    pytest.param("bwrap", id="bwrap"),
    pytest.param("docker", id="docker", marks=pytest.mark.docker),
]


@pytest.fixture
def backend(request) -> str:
    kind = request.param
    if kind == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bwrap not installed (apt-get install bubblewrap)")
    if kind == "docker" and (reason := _engine_reason()):
        pytest.skip(reason)
    return kind


def pytest_generate_tests(metafunc):
    if "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", BACKENDS, indirect=True)


@pytest.fixture
def pool_factory(snapshot):
    def factory(kind: str, size: int = 1, **overrides):
        return make_pool(kind, str(snapshot), size=size, max_wait_s=60, **{**LIMITS, **overrides})

    return factory


@pytest.fixture(scope="module")
def engine_b():
    """A second real docker engine on its own socket (docker_engines.ExtraEngine), for one module's tests;
    modules that use it share the xdist group `engine-b` (one socket, one data root)."""
    from docker_engines import IMAGE, MAIN_URL, ExtraEngine, engine_answers, has_image

    if not engine_answers(MAIN_URL) or not has_image(MAIN_URL):
        pytest.skip(f"no docker engine with {IMAGE} at {MAIN_URL}; run .ci/docker_setup.sh")
    engine = ExtraEngine("b").start()
    yield engine
    engine.stop()
