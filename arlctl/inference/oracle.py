"""Moved to arlctl.envs.swe.oracle; this re-export goes once the loader imports from there."""

from arlctl.envs.swe.oracle import OraclePolicy, gold_tool_calls, load_oracle, render_calls  # noqa: F401
