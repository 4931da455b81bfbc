"""Rewards that are more than a rule: model-based graders (judge.py: an LLM grades each trajectory against
a rubric; genrm.py: a generative reward model compares the members of a GRPO group), their rubrics
(rubrics/), and the machinery around rewards (composites, a reward cache, `arlctl reward-serve`).

Importing a reward module registers its name (`--reward judge`, `--reward genrm`) in arlctl.envs.registry.
"""
