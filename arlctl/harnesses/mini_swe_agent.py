"""mini-swe-agent as an arlctl harness: the installed package, unmodified, driven through its own extension points.

    arlctl rollout --env swe --harness mini-swe-agent --harness-opt step_limit=8 --tasks 'builtin:swe?n=4' -G 4

What is the package's own: its agent (`DefaultAgent`: the loop, limits, format-error handling, the submit
protocol), its text-based model class (`LitellmTextbasedModel`: litellm's OpenAI client, the action regex,
the observation template) and its `mini_textbased.yaml` config (system and instance templates). What is
ours: where they point. The model is litellm's `openai/<model>` at the gateway's base URL, every request
carrying the run's session header, with the rollout's sampling settings; cost tracking is off (a local
model has no price). The environment is the package's LocalEnvironment with one method replaced:
`execute` runs the command in the task's sandbox (bash, stdout and stderr together, the rollout's command
timeout) instead of on this machine, so the package's own submit check (`_check_finished`) still decides
when the agent is done. Template variables come from the config and the machine's uname, never from this
process's environment.

The agent is synchronous; each run gets a thread, and its sandbox calls are handed back to the rollout's
event loop. The package prints a banner and looks for a remote price list on import: both are switched
off (MSWEA_SILENT_STARTUP, LITELLM_LOCAL_MODEL_COST_MAP), and its model retries are limited to `retries`
attempts (MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT; the default 10 waits minutes on a request the gateway
refuses, say a context that no longer fits).
"""

from __future__ import annotations

import asyncio
import functools
import os
import platform
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from arlctl.errors import UsageError
from arlctl.harnesses.base import HarnessContext, HarnessResult
from arlctl.serve.app import SESSION_HEADER

# mini-swe-agent's exit statuses, in the protocol's words (anything else: the harness failed)
_STATUS = {"Submitted": "submitted", "LimitsExceeded": "limit", "TimeExceeded": "timeout",
           "RepeatedFormatError": "format"}
_RUNS = ThreadPoolExecutor(max_workers=64, thread_name_prefix="arlctl-mini-swe-agent")
_ENV_LOCK = threading.Lock()


@functools.cache
def _package() -> Any:
    """The package's modules, imported once with its start-up chatter and network lookups off."""
    with _ENV_LOCK:
        os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
    try:
        import litellm
        import yaml
        from minisweagent.agents.default import DefaultAgent
        from minisweagent.config import get_config_path
        from minisweagent.environments.local import LocalEnvironment
        from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel
    except ImportError as err:
        raise UsageError(f"--harness mini-swe-agent needs the mini-swe-agent package ({err})",
                         hint="pip install 'arlctl[harness]'  (mini-swe-agent>=2.4,<3)") from None
    litellm.suppress_debug_info = True  # else it prints a provider list per request it cannot price
    return type("MiniSweAgentPackage", (), {"DefaultAgent": DefaultAgent, "LocalEnvironment": LocalEnvironment,
                                            "Model": LitellmTextbasedModel, "config_path": get_config_path,
                                            "yaml": yaml})


def _sandbox_environment(ctx: HarnessContext, loop: asyncio.AbstractEventLoop, env_vars: dict[str, str]) -> Any:
    """The package's LocalEnvironment, executing in the task's sandbox."""
    base = _package().LocalEnvironment

    class SandboxEnvironment(base):  # type: ignore[misc, valid-type]
        def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
            command = str(action.get("command", ""))
            limit = float(timeout or ctx.command_timeout_s)
            exports = "".join(f"export {k}={_quote(v)}\n" for k, v in env_vars.items())
            script = f"exec 2>&1\ncd {_quote(cwd or ctx.sandbox.workdir)}\n{exports}{command}\n"
            try:
                result = asyncio.run_coroutine_threadsafe(ctx.sandbox.exec(["bash", "-c", script], timeout=limit),
                                                          loop).result(limit + 60)
                output = {"output": result.stdout, "returncode": result.exit_code, "exception_info": ""}
                if getattr(result, "timed_out", False):
                    output["exception_info"] = f"the command timed out after {limit:g} s"
            except Exception as err:  # a sandbox failure: shown to the agent as the package shows its own
                output = {"output": "", "returncode": -1,
                          "exception_info": f"An error occurred while executing the command: {err}",
                          "extra": {"exception_type": type(err).__name__, "exception": str(err)}}
            self._check_finished(output)  # the package's own submit rule
            return output

        def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
            return {**self.config.model_dump(), **platform.uname()._asdict(), "cwd": ctx.sandbox.workdir, **kwargs}

    return SandboxEnvironment(cwd=ctx.sandbox.workdir, timeout=int(ctx.command_timeout_s))


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


class MiniSweAgent:
    name = "mini-swe-agent"

    def __init__(self, config: str = "mini_textbased", step_limit: int | str = 8, retries: int | str = 1,
                 wall_time_limit: int | str = 0):
        try:
            self.step_limit, self.retries = int(step_limit), int(retries)
            self.wall_time_limit = int(wall_time_limit)
        except ValueError as err:
            raise UsageError(f"--harness-opt for mini-swe-agent: {err}") from None
        if self.step_limit < 1 or self.retries < 1 or self.wall_time_limit < 0:
            raise UsageError("--harness-opt step_limit and retries must be >= 1, wall_time_limit >= 0")
        sb = _package()
        try:
            self.config = sb.yaml.safe_load(sb.config_path(config).read_text())
        except FileNotFoundError as err:
            raise UsageError(f"--harness-opt config={config}: {err}") from None
        with _ENV_LOCK:
            os.environ["MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT"] = str(self.retries)

    async def run(self, ctx: HarnessContext) -> HarnessResult:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_RUNS, self._run, ctx, loop)

    def _run(self, ctx: HarnessContext, loop: asyncio.AbstractEventLoop) -> HarnessResult:
        sb = _package()
        agent_config = {**self.config.get("agent", {}), "step_limit": self.step_limit, "cost_limit": 0.0,
                        "wall_time_limit_seconds": self.wall_time_limit or int(ctx.deadline_s)}
        sampling = {"temperature": ctx.temperature, "top_p": ctx.top_p, "max_tokens": ctx.max_new_tokens}
        if ctx.seed is not None:
            sampling["seed"] = ctx.seed
        model_config = self.config.get("model", {})
        model = sb.Model(**{**model_config, "model_name": f"openai/{ctx.model}", "cost_tracking": "ignore_errors",
                            "model_kwargs": {**model_config.get("model_kwargs", {}), **sampling,
                                             "api_base": ctx.base_url, "api_key": "arlctl",
                                             "extra_headers": {SESSION_HEADER: ctx.session_id}}})
        env_vars = {str(k): str(v) for k, v in (self.config.get("environment", {}).get("env") or {}).items()}
        agent = sb.DefaultAgent(model, _sandbox_environment(ctx, loop, env_vars), **agent_config)
        try:
            outcome = agent.run(ctx.problem)
        except Exception as err:  # the package re-raises what it did not expect (a refused request, ...)
            return HarnessResult("error", f"{type(err).__name__}: {err}"[:2000], agent.n_calls)
        exit_status = str(outcome.get("exit_status", ""))
        return HarnessResult(_STATUS.get(exit_status, "error"), exit_status, agent.n_calls,
                             {"exit_status": exit_status, "format_errors": sum(
                                 1 for m in agent.messages if (m.get("extra") or {}).get("interrupt_type") == "FormatError")})
