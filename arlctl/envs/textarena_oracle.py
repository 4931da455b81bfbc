"""A scripted Policy for `--policy oracle:textarena`: plays TextArena games it can solve, perfectly.

It proves the textarena pipeline end to end without a model: rollout -> reward must give each game's
win reward. Games it plays (by id prefix):
- TowerOfHanoi-*: the optimal 2^n - 1 moves for the n disks the game states;
- GuessTheNumber-*: binary search over the game's range, narrowed by its "higher" / "lower" hints.
Each generate call decodes the prompt, finds the game from the system line the textarena env writes
("the TextArena game GAME"), and derives the next move from the conversation so far (the moves the game
acknowledged, the hints it gave), so the policy keeps no state between calls and any number of
trajectories can share it. Token ids come from the real tokenizer; every log-prob is 0.0 (the script is
deterministic) and each turn ends with the chat template's end-of-message token, so finish_reason is
"stop". It lives with the textarena env because it reads the prompt that env writes; inference/ never
imports it (the rollout command picks it by name).
"""

from __future__ import annotations

import re
from typing import Any

from arlctl.envs.textarena import FAMILY
from arlctl.errors import UsageError
from arlctl.inference.scripted import ScriptedPolicy

SPEC = "oracle:textarena"
PLAYABLE = ("TowerOfHanoi", "GuessTheNumber")  # game id prefixes the script can solve
_GAME_RE = re.compile(r"the TextArena game ([A-Za-z0-9_\-]+)")
_DISKS_RE = re.compile(r"Tower of Hanoi with (\d+) disks")
_RANGE_RE = re.compile(r"guess the number between (\d+) and (\d+)")
_GUESS_OR_HINT_RE = re.compile(r"\[(\d+)\]|target number is (higher|lower)")


def hanoi_moves(disks: int, source: str = "A", spare: str = "B", target: str = "C") -> list[str]:
    """The optimal move list, as the game's '[X Y]' moves (2^disks - 1 of them)."""
    if disks == 0:
        return []
    return [*hanoi_moves(disks - 1, source, target, spare), f"[{source} {target}]",
            *hanoi_moves(disks - 1, spare, source, target)]


def _hanoi(conversation: str) -> str:
    found = _DISKS_RE.search(conversation)
    if found is None:
        raise UsageError("oracle:textarena: no 'Tower of Hanoi with N disks' in the prompt")
    plan = hanoi_moves(int(found.group(1)))
    done = conversation.count("You moved disk")  # the game acknowledges every legal move this way
    return plan[min(done, len(plan) - 1)]


def _guess(conversation: str) -> str:
    found = _RANGE_RE.search(conversation)
    if found is None:
        raise UsageError("oracle:textarena: no 'guess the number between A and B' in the prompt")
    low, high = int(found.group(1)), int(found.group(2))
    last: int | None = None
    # After the game's rules: our guesses ("[n]") and its hints, in order; each hint is about the last guess.
    for guess, hint in _GUESS_OR_HINT_RE.findall(conversation[found.end():].split("Enter your guess.", 1)[-1]):
        if guess:
            last = int(guess)
        elif last is not None and hint == "higher":
            low = max(low, last + 1)
        elif last is not None:
            high = min(high, last - 1)
    return f"[{(low + high) // 2}]"


def script(prompt: str) -> str:
    """The next move for a decoded prompt of a textarena conversation."""
    match = _GAME_RE.search(prompt)
    if match is None:
        raise UsageError("oracle:textarena works only with --env textarena:GAME prompts (no game line found)")
    game = match.group(1)
    if game.startswith("TowerOfHanoi"):
        return _hanoi(prompt[match.end():])
    if game.startswith("GuessTheNumber"):
        return _guess(prompt[match.end():])
    raise UsageError(f"oracle:textarena cannot play {game}", hint=f"it plays {', '.join(PLAYABLE)} games")


def textarena_oracle(tokenizer: Any, name: str = SPEC) -> ScriptedPolicy:
    """The Policy that plays `script` above."""
    return ScriptedPolicy(tokenizer, name, script)


def load_textarena_oracle(spec: str, tokenizer: Any, tasks: list[dict[str, Any]] | None = None) -> ScriptedPolicy:
    """`oracle:textarena` -> a TextArenaOracle, after checking it can play every task's game."""
    if spec != SPEC:
        raise UsageError(f"unknown oracle policy {spec!r}", hint=f"the TextArena scripted policy is {SPEC}")
    for task in tasks or []:
        family, _, game = str(task.get("env", "")).partition(":")
        if family != FAMILY or not game.startswith(PLAYABLE):
            raise UsageError(f"{SPEC} cannot play task {task.get('task_id')!r} (env {task.get('env')!r})",
                             hint=f"it plays textarena:GAME envs of {', '.join(PLAYABLE)}")
    return textarena_oracle(tokenizer)
