"""arlctl: composable, crash-safe, file-connected stages for agentic RL of language models."""

__version__ = "0.1.0"
