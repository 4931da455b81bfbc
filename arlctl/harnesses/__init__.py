"""Agent harnesses: someone else's agent loop run G times per task, its model calls recorded as rows.

    arlctl rollout --env swe --harness mini-swe-agent --tasks 'builtin:swe?n=4' -G 4 --policy tiny

A harness is a plug-in with a small protocol (base.Harness): given a sandbox holding the task's
repository, the base URL of the recording gateway and a session id to send with every model call, it runs
its agent and returns how the run ended. The rollout owns everything else: the sandbox (the env's, as the
built-in loop's), the gateway (arlctl/serve/gateway.py), the final diff (the env's final_state), grouping,
writing and resuming. Built in: `mini-swe-agent` (the installed package, unmodified: mini_swe_agent.py).
Others register under the `arlctl.harnesses` entry point group, or are named as `module:factory`.
"""

from arlctl.harnesses.base import Harness, HarnessContext, HarnessResult, harness_names, make_harness

__all__ = ["Harness", "HarnessContext", "HarnessResult", "harness_names", "make_harness"]
