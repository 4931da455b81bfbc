"""vLLM's logs go to stderr once the vllm backend starts, so `arlctl rollout --backend vllm --json` keeps
stdout to its one JSON summary (vLLM's default stream is stdout; the engine's child processes log too)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm.engine.arg_utils", reason="the vllm lane needs .venv-vllm (.ci/vllm_lane.sh)")

SCRIPT = """
import logging, subprocess, sys
import vllm  # configures vllm's handler on the stream of the moment: stdout
from arlctl.inference.vllm import logs_to_stderr
logs_to_stderr()
logging.getLogger("vllm.arlctl_test").warning("parent-marker")
# A child process (as the engine core is) configures its own handler from the environment.
subprocess.run([sys.executable, "-c",
                "import logging, vllm; logging.getLogger('vllm.arlctl_test').warning('child-marker')"], check=True)
print('{"summary": 1}')
"""


def test_vllm_logs_leave_stdout_to_json():
    env = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_STREAM"}
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == '{"summary": 1}'
    assert "parent-marker" in result.stderr and "child-marker" in result.stderr
