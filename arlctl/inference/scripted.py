"""ScriptedPolicy: a Policy whose every reply is a function of the decoded prompt (the `oracle:` policies).

Each env that can be solved by a script (swe's gold patches, HumanEval's canonical solutions, reasoning-gym's
reference answers, TextArena games with a known winning line) writes only `script(prompt) -> reply text`;
this module turns it into a Policy. The prompt is decoded with the real tokenizer, the reply is encoded with
it and ends with the chat template's end-of-message token (so finish_reason is "stop", as a model's turn
would be), every log-prob is 0.0 (the script is deterministic), and `max_new_tokens` is honoured (cut,
"length"). It keeps no state between calls: the script reads where it is from the prompt, so any number of
trajectories can share one policy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from arlctl.inference.base import Generation, SamplingParams
from arlctl.inference.chat import ChatCodec
from arlctl.inference.sampling_check import check_sampling


def end_of_message_ids(tokenizer: Any) -> list[int]:
    """The template's end-of-message token (e.g. <|im_end|>) as ids, so a scripted turn ends as a model's."""
    return tokenizer(ChatCodec(tokenizer).closing, add_special_tokens=False)["input_ids"][:1]


def scripted_generation(tokenizer: Any, stop_ids: list[int], script: Callable[[str], str], prompt_ids: list[int],
                        sampling: SamplingParams, version: int) -> Generation:
    """The Generation a script gives for `prompt_ids`: its reply's ids + stop_ids, cut to the token budget."""
    check_sampling(sampling)  # NaN/inf/out-of-range values are refused as for any backend
    prompt = tokenizer.decode(prompt_ids, skip_special_tokens=False)
    ids = tokenizer(script(prompt), add_special_tokens=False)["input_ids"] + stop_ids
    finish = "stop"
    if len(ids) > sampling.max_new_tokens:  # honour the budget like a model would: cut, "length"
        ids, finish = ids[: sampling.max_new_tokens], "length"
    return Generation(ids=ids, logprobs=[0.0] * len(ids), finish_reason=finish, version=version)


class ScriptedPolicy:
    """The Policy protocol over `script(decoded prompt) -> reply text`."""

    max_context = None  # no context of its own: the rollout's --max-context bounds the prompts

    def __init__(self, tokenizer: Any, name: str, script: Callable[[str], str] | None = None):
        """script: the reply function; a subclass may define a `script` method instead (and pass None)."""
        self.tokenizer, self.name, self.version = tokenizer, name, 0
        if script is not None:
            self.script = script
        self.stop_ids = end_of_message_ids(tokenizer)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        return scripted_generation(self.tokenizer, self.stop_ids, self.script, prompt_ids, sampling, self.version)

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)  # it only ever emits ids its tokenizer made

    def metrics(self) -> dict[str, Any]:
        return {}  # no backend counters: a script costs nothing worth measuring

    async def reload(self, policy_dir: str, version: int) -> None:
        self.version = version

    async def close(self) -> None:
        return None
