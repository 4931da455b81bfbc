"""Inference backends: the Policy protocol (base.py) and its implementations (hf, vllm, openai)."""

from arlctl.inference.base import Generation, Policy, SamplingParams

__all__ = ["Generation", "Policy", "SamplingParams"]
