"""The swe environment (DESIGN.md §7): repository bug fixing in sandboxes, graded by hidden tests.

Importing this package registers `--env swe`, `--reward swe` and the `builtin:swe` task source.
"""

from arlctl.envs.registry import register_env, register_reward
from arlctl.envs.swe import tasks as _tasks  # noqa: F401  (registers builtin:swe)
from arlctl.envs.swe.env import ENV_VERSION, SweEnv, SweEnvFactory
from arlctl.envs.swe.grader import REWARD_VERSION, grade, score, self_check
from arlctl.envs.swe.tasks import ENV_NAME

register_env(ENV_NAME, SweEnv, version=ENV_VERSION, factory=SweEnvFactory)
register_reward(ENV_NAME, score, REWARD_VERSION)

__all__ = ["SweEnv", "SweEnvFactory", "grade", "score", "self_check", "REWARD_VERSION"]
