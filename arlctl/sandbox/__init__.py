"""Sandboxes where model-written code runs: the Sandbox protocol (base.py), backends and a warm pool."""

from arlctl.sandbox.base import ExecResult, Sandbox, SandboxError

__all__ = ["ExecResult", "Sandbox", "SandboxError"]
