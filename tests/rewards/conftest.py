"""Shared by the judge and GenRM tests: `scripted(reply)` starts a scripted OpenAI-compatible judge
(tests/rewards/fixtures/scripted_judge.py) and stops every one started when the test ends."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from scripted_judge import ScriptedJudge  # noqa: E402


@pytest.fixture
def scripted():
    servers: list[ScriptedJudge] = []

    def start(reply) -> ScriptedJudge:
        servers.append(ScriptedJudge(reply))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()
