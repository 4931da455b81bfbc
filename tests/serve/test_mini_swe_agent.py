"""mini-swe-agent (PyPI) drives a built-in swe task through a real `arlctl serve --policy tiny --record DIR`.

The black-box path end to end: `arlctl serve` runs as its own process on 127.0.0.1; mini-swe-agent's
Python API (DefaultAgent + LocalEnvironment in a git working copy of the task's repository snapshot, its
litellm model pointed at the endpoint as an OpenAI-compatible server, its own config files) runs with no
session header, so the server finds sessions by conversation prefix. Stopping the server (SIGINT) writes
the open sessions. Two runs against one server:

- stock `mini.yaml` (OpenAI tool calls): the random tiny model never writes a valid call; mini-swe-agent
  answers each malformed reply with an error message and drops the reply from its history, so no request
  extends the last: one single-turn row per request, until it gives up (3 format errors).
- `mini_textbased.yaml` with an action regex that takes every reply as one empty command: each reply is
  a valid action, executed by the local environment in the working copy, and the conversation grows by
  prefix (reply, observation, ...): one row holding every turn, observations mask 0.

Every row validates and its mask-1 log-probs match a re-scoring of the exact recorded ids; the working
copy's diff is graded by the swe grader (a real, trusted run of the hidden tests: reward 0).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from test_serve import assert_token_exact, read_rows

# Not imported here: importing minisweagent prints a banner and writes its config dir, and imports litellm
# (seconds); the test imports it after pointing both at its own temp dir.
pytestmark = [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("minisweagent") is None,
                                                   reason="mini-swe-agent is not installed (pip install -e '.[dev]')")]

ARLCTL = [sys.executable, "-m", "arlctl.cli.main"]
TASK_ID = "b64tools-019"
STEP_LIMIT = 4


@pytest.fixture(scope="module")
def reference_model():
    import torch
    from transformers import AutoModelForCausalLM

    from arlctl.models import tiny_model_dir

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir(), local_files_only=True,
                                                dtype=torch.float32).eval()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_serve(record_dir, log_path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    log = open(log_path, "w")  # noqa: SIM115 (lives as long as the process)
    proc = subprocess.Popen([*ARLCTL, "serve", "--policy", "tiny", "--port", str(port), "--record", str(record_dir),
                             "--max-tokens", "48"], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"arlctl serve exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                if json.load(response)["ok"]:
                    return proc, f"http://127.0.0.1:{port}/v1"
        except OSError:
            time.sleep(0.3)
    proc.kill()
    pytest.fail("arlctl serve did not come up")


def working_copy(task: dict, dest) -> str:
    """A writable git checkout of the task's one-commit snapshot (what the agent edits)."""
    from arlctl.envs.swe.tasks import prepare_snapshot

    snapshot = prepare_snapshot(task)
    subprocess.run(["git", "clone", "-q", snapshot, str(dest)], check=True, env={"PATH": os.environ["PATH"]})
    return str(dest)


def run_mini_swe_agent(task: dict, cwd: str, base_url: str, config_name: str, **model_overrides) -> dict:
    """mini-swe-agent's own config file, local environment, litellm model pointed at our endpoint."""
    import litellm
    import yaml
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.config import get_config_path
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.models import get_model

    litellm.suppress_debug_info = True  # else every cost look-up of the unknown model prints a banner
    config = yaml.safe_load(get_config_path(config_name).read_text())
    agent_config = {k: v for k, v in config["agent"].items() if k in ("system_template", "instance_template")}
    model_config = {**config.get("model", {}), **model_overrides, "cost_tracking": "ignore_errors"}
    model_config["model_kwargs"] = {**model_config.get("model_kwargs", {}), "api_base": base_url,
                                    "api_key": "unused", "temperature": 1.0, "max_tokens": 48, "seed": 0}
    model = get_model("openai/tiny", model_config)  # litellm's OpenAI-compatible provider
    env = LocalEnvironment(cwd=cwd, env=config.get("environment", {}).get("env") or {}, timeout=30)
    agent = DefaultAgent(model, env, **agent_config, step_limit=STEP_LIMIT, cost_limit=0.0)
    result = agent.run(task["problem_statement"])
    return {"result": result, "calls": agent.n_calls, "messages": agent.messages}


def git_diff(cwd: str) -> str:
    subprocess.run(["git", "-C", cwd, "add", "-A"], check=True)
    return subprocess.run(["git", "-C", cwd, "diff", "--cached"], check=True, capture_output=True,
                          text=True).stdout


def test_mini_swe_agent_through_arlctl_serve(tmp_path, monkeypatch, reference_model):
    # mini-swe-agent writes a global config dir on import and litellm fetches a price map unless told not to.
    monkeypatch.setenv("MSWEA_GLOBAL_CONFIG_DIR", str(tmp_path / "mswea"))
    monkeypatch.setenv("MSWEA_SILENT_STARTUP", "1")
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from arlctl.envs.swe.tasks import load_suite_task

    task = load_suite_task(TASK_ID)
    record = tmp_path / "rec"
    proc, base_url = start_serve(record, tmp_path / "serve.log")
    try:
        # 1. The stock config (mini.yaml: one `bash` tool, OpenAI tool calls). The tiny model never writes
        #    a valid call, and mini-swe-agent answers a malformed reply with a user message *without*
        #    keeping the reply in its history: no request extends the last, so each is its own session.
        stock_cwd = working_copy(task, tmp_path / "stock")
        stock = run_mini_swe_agent(task, stock_cwd, base_url, "mini.yaml")
        # 2. The text-based config (mini_textbased.yaml) with an action regex that matches every reply
        #    once, as an empty command: each reply is a valid action, run by the local environment, and
        #    mini-swe-agent keeps reply + observation, so the conversation grows by prefix: one session.
        text_cwd = working_copy(task, tmp_path / "textbased")
        text = run_mini_swe_agent(task, text_cwd, base_url, "mini_textbased.yaml",
                                  model_class="litellm_textbased", action_regex=r"\A()")
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: every open session is written, then exit
        proc.wait(60)
    assert proc.returncode == 0, (tmp_path / "serve.log").read_text()[-2000:]
    assert stock["result"]["exit_status"] == "RepeatedFormatError" and stock["calls"] == 3
    assert text["result"]["exit_status"] == "LimitsExceeded" and text["calls"] == STEP_LIMIT

    rows = read_rows(record)  # validates every shard
    for row in rows:
        assert row["env"] == "serve" and row["policy"] == "tiny"
        assert_token_exact(reference_model, row)
    stock_rows = [r for r in rows if json.loads(r["task"])["tools"]]
    (text_row,) = [r for r in rows if not json.loads(r["task"])["tools"]]
    assert len(stock_rows) == stock["calls"] and all(r["num_turns"] == 1 for r in stock_rows)
    assert all("bash" in r["prompt_text"] and "encode_token" in r["prompt_text"] for r in stock_rows)
    # One trajectory holds the whole text-based run: every reply (mask 1) and every observation (mask 0).
    assert text_row["num_turns"] == STEP_LIMIT > 1
    assert "encode_token" in text_row["prompt_text"]
    turns = text_row["turns"]
    assert all(t["obs_len"] > 0 and "<returncode>0</returncode>" in t["observation"] for t in turns[:-1])
    replies = [m for m in text["messages"] if m["role"] == "assistant"]
    assert [t["text"].strip() for t in turns] == [m["content"].strip() for m in replies]
    assert sum(text_row["response_mask"]) == text_row["generated_tokens"] == sum(t["gen_len"] for t in turns)

    # The agent's diff (none: its actions were empty) graded by the swe grader against the hidden tests.
    from arlctl.envs.swe.grader import grade, sandbox_factory
    from arlctl.envs.swe.tasks import test_ids

    diff = git_diff(text_cwd)
    reward, components, info = asyncio.run(grade(task, diff, sandbox_factory("bwrap"), timeout=60))
    assert reward == 0.0 and components["tests_passed"] == 0.0
    # The grade really ran: a trusted probe-graded run (a built-in task) in which exactly the FAIL_TO_PASS
    # tests still fail.
    assert info["mode"] == "probe" and info["trusted"] and info["apply_ok"], info
    assert info["failed"] == sorted(test_ids(task, "FAIL_TO_PASS")) and components["p2p"] == 1.0
    shutil.rmtree(stock_cwd, ignore_errors=True)
