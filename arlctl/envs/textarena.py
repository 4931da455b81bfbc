"""TextArena single-player games as multi-turn envs: `--env textarena:TowerOfHanoi-v0`.

One family member per TextArena game id (registry FAMILIES): importing this module registers the family,
and `register_member(GAME)` registers, under the name `textarena:GAME`, the env, its reward and a builtin
task source (`builtin:textarena:GAME?n=8&seed=0`). The member is probed once (a game made and reset), so
an unknown id, a multi-player game, or a game whose NLTK word lists are not installed (Wordle, WordLadder,
Hangman, SpellingBee here: no network to download them) is one UsageError before any work.

Episode. reset(task): a system message naming the game, and the game's opening messages (its rules and
board) as the user message. Every model turn is one move: the whole reply text is the action
(`tool_format = None`, `parse_action`), handed to the game as TextArena's own `make(GAME)` built it (its
default wrappers, e.g. ActionFormattingWrapper, which puts a reply without brackets inside [...]). The
game's new messages after the move (what it says about the move, the new board, an invalid-move warning)
come back as one user message; the player's echoed move is left out. The game's own rules end the
episode (a win, a loss, too many invalid moves, its turn limit); env option `max_turns` ends it sooner.
The rollout's --max-turns (default 6) bounds it too: raise it for longer games (Tower of Hanoi with 3
disks needs 7 moves; the game itself allows 14).

Determinism. A task carries `seed` (else one derived from its task_id). TextArena games draw from the
global `random` (a few, whose code names numpy.random, from numpy's global RNG too); each Game keeps its
own state of them and swaps it in around every call into the game (under a lock), so a game's cards, mines
and tiles depend on its seed and its moves only, never on other games played in the same process at the
same time, and the caller's random streams are left as they were. (Another thread drawing from `random`
during one of those sub-millisecond calls is the one thing the lock cannot see.)

Reward (REWARD_VERSION): the game's own reward for the episode, obtained by REPLAY. final_state is a JSON
record {game, seed, actions, done, reward, reason}; the reward function checks that the recorded actions
are exactly the trajectory's turns (joined by newlines they must equal response_text), plays them again
in a fresh game from the task's seed, and returns that game's reward. So a forged final_state cannot lie
about the outcome: a different outcome or different moves are either replayed to the true outcome or
rejected (reward null, cause in reward_info). What the replay still trusts: the task (its seed, as math
trusts its gold answer) and the turns' text — and how that text is split into moves, which comes from the
record (a forger can only re-split the same text). A game the moves did not finish (cut by the rollout's
--max-turns or token bounds, or the env's max_turns) scores `unfinished` (default 0.0), components
finished = 0. An exception inside TextArena while stepping is EnvFailure (env_error, never graded); the
same exception during the replay is a null reward with its cause.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import random
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache, partial
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import textarena as ta

from arlctl.envs.base import Action, EnvFailure, EnvReset, StepResult
from arlctl.envs.registry import PlainEnvFactory, register_env, register_family, register_reward
from arlctl.envs.tasks import int_option, register_task_source, reject_unknown_options
from arlctl.errors import TerminalError, UsageError
from arlctl.schemas.safe_text import parquet_safe

FAMILY = "textarena"
TEXTARENA_VERSION = metadata.version("textarena")
# The games' rules and rewards are TextArena's: its version is part of ours.
ENV_VERSION = f"textarena-1+ta{TEXTARENA_VERSION}"
REWARD_VERSION = f"textarena-1+ta{TEXTARENA_VERSION}"
# Single-player games that start offline here (no NLTK data, no API key): shown when an id is unknown.
OFFLINE_GAMES = ("TowerOfHanoi-v0", "GuessTheNumber-v0", "Sudoku-v0", "Minesweeper-v0", "Crosswords-v0",
                 "FrozenLake-v0", "2048-v0", "Mastermind-v0", "LightsOut-v0")
SYSTEM_PROMPT = ("You are playing the TextArena game {game}. Each reply of yours is one move: the game reads "
                 "your whole reply, so write the move in the format the game asks for.")
_RANDOM_LOCK = threading.Lock()  # the global RNGs are swapped per call; never two swaps at once


def member_name(game_id: str) -> str:
    return f"{FAMILY}:{game_id}"


# ---------------------------------------------------------------------------------------------- one game
class Game:
    """One TextArena game played from a seed: moves in, the game's new messages and final outcome out.

    Construction makes and resets the game (TextArena's exceptions propagate: see `probe` for what they
    mean). Not async and not shared: the env and the reward's replay each play their own.
    """

    def __init__(self, game_id: str, seed: int):
        self.game_id, self.seed = game_id, seed
        self.actions: list[str] = []
        self.done = False
        self.reward: float | None = None
        self.reason: str | None = None
        self.invalid_move = False
        self._py_state = random.Random(seed).getstate()
        self._np_state: Any = None  # numpy's global RNG, only for games whose code uses it (see _uses_numpy_random)
        with self._own_random():
            self.env = ta.make(game_id)
        self.inner = self.env
        while isinstance(self.inner, ta.Wrapper):  # observations are read raw, not through the wrappers
            self.inner = self.inner.env
        if _uses_numpy_random(type(self.inner).__module__):
            self._np_state = np.random.RandomState(seed % 2**32).get_state()
        with self._own_random():
            self.env.reset(num_players=1, seed=seed)

    @contextmanager
    def _own_random(self) -> Iterator[None]:
        """Run with this game's RNG state in `random` (and numpy's, if it draws from it), then put the
        caller's back."""
        with _RANDOM_LOCK:
            saved_py = random.getstate()
            saved_np = np.random.get_state() if self._np_state is not None else None
            random.setstate(self._py_state)
            if saved_np is not None:
                np.random.set_state(self._np_state)
            try:
                yield
            finally:
                self._py_state = random.getstate()
                random.setstate(saved_py)
                if saved_np is not None:
                    self._np_state = np.random.get_state()
                    np.random.set_state(saved_np)

    def new_messages(self) -> str:
        """What the game said since the last call, without the player's own echoed move."""
        _, messages = self.inner.get_observation()
        texts = [str(text).strip() for _, text, kind in messages if kind != ta.ObservationType.PLAYER_ACTION]
        return "\n\n".join(text for text in texts if text)

    def act(self, text: str) -> bool:
        """Play one move; True when the game is over (its outcome is then in reward / reason)."""
        if self.done:
            raise TerminalError(f"{self.game_id}: a move after the game ended")
        self.actions.append(text)
        with self._own_random():
            done, _ = self.env.step(text)
        if done:
            self._finish()
        return bool(done)

    def _finish(self) -> None:
        closed = self.env.close()
        rewards, info = closed if isinstance(closed, tuple) else (closed, {})
        self.done = True
        value = (rewards or {}).get(0)
        self.reward = None if value is None else float(value)
        player = (info or {}).get(0, {}) if isinstance(info, dict) else {}
        self.reason = None if player.get("reason") is None else str(player["reason"])
        self.invalid_move = bool(player.get("invalid_move"))

    def record(self) -> dict[str, Any]:
        """final_state: what the reward replays (actions) and what the game said (outcome, for reading)."""
        return {"game": self.game_id, "seed": self.seed, "actions": list(self.actions), "done": self.done,
                "reward": self.reward, "reason": self.reason}


@cache
def _uses_numpy_random(module_name: str) -> bool:
    """Whether a game's package draws from numpy's RNG. Swapping numpy's state costs ~1 ms per move (ten
    times Python's), and the games that need it are few (SpellingBee, IteratedStagHunt), so only they pay."""
    module = sys.modules.get(module_name)
    if module is None or not getattr(module, "__file__", None):
        return True  # cannot tell: keep it exact
    sources = Path(module.__file__).parent.glob("*.py")
    return any(_NUMPY_RANDOM.search(path.read_text(encoding="utf-8", errors="replace")) for path in sources)


_NUMPY_RANDOM = re.compile(r"\b(?:np|numpy)\.random\b")


def task_seed(task: dict[str, Any]) -> int:
    """The task's `seed` (an int), else one derived from its task_id (stable across runs and machines)."""
    seed = task.get("seed")
    if seed is None:
        digest = hashlib.sha256(str(task.get("task_id", "")).encode("utf-8")).digest()
        return int.from_bytes(digest[:4], "little")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise TerminalError(f"textarena task {task.get('task_id')!r}: seed must be a non-negative integer, "
                            f"got {seed!r}")
    return seed


def _check_task_game(task: dict[str, Any], game_id: str) -> None:
    game = task.get("game")
    if game is not None and game != game_id:
        raise TerminalError(f"textarena task {task.get('task_id')!r} is for game {game!r}, not {game_id!r}",
                            hint=f"run it with --env textarena:{game}")


# ------------------------------------------------------------------------------------------------ the env
class TextArenaEnv:
    """One episode of one TextArena single-player game. Cheap to build: the loop makes one per trajectory."""

    version = ENV_VERSION
    tool_format = None  # no tools: the whole reply is the move (parse_action), never a tool-call parser's
    final_state_truncated = None

    def __init__(self, game_id: str, max_turns: int | None = None):
        if max_turns is not None and (isinstance(max_turns, bool) or not isinstance(max_turns, int)
                                      or max_turns < 1):
            raise UsageError(f"textarena env: max_turns must be a positive integer, got {max_turns!r}")
        self.game_id, self.max_turns = game_id, max_turns
        self.name = member_name(game_id)
        self.game: Game | None = None

    def parse_action(self, text: str) -> Action:
        return Action(text=text)

    async def reset(self, task: dict[str, Any]) -> EnvReset:
        _check_task_game(task, self.game_id)
        self.game = Game(self.game_id, task_seed(task))
        messages = [{"role": "system", "content": SYSTEM_PROMPT.format(game=self.game_id)},
                    {"role": "user", "content": self.game.new_messages()}]
        return EnvReset(messages=messages, tools=[])

    async def step(self, action: Action) -> StepResult:
        if self.game is None:
            raise TerminalError("TextArenaEnv.step called before reset")
        try:
            # parquet_safe: the action as the row's turn text stores it, so the replay sees the same move
            done = self.game.act(parquet_safe(action.text))
        except Exception as err:  # the game itself broke on this move: infrastructure, not the policy's 0
            raise EnvFailure(f"TextArena {self.game_id} raised {type(err).__name__}: {err}") from err
        if done:
            return StepResult(observations=[], done=True, final_state=self._record(), finish_reason="submit")
        if self.max_turns is not None and len(self.game.actions) >= self.max_turns:
            return StepResult(observations=[], done=True, final_state=self._record(), finish_reason="max_turns")
        content = self.game.new_messages() or "(the game has nothing to add; make your next move)"
        return StepResult(observations=[{"role": "user", "content": content}], done=False)

    def _record(self) -> str:
        assert self.game is not None
        return json.dumps(self.game.record(), ensure_ascii=False)

    async def final_state(self) -> str | None:
        """The record so far when a bound, not the game, ended the episode (graded as unfinished)."""
        return self._record() if self.game is not None else None

    async def close(self) -> None:
        self.game = None


# --------------------------------------------------------------------------------------------- the reward
def _recorded_actions(final_state: str | None, response_text: str) -> list[str] | str:
    """The moves to replay, or why there are none to trust (the row then gets a null reward)."""
    if final_state is None:
        # No record: only an episode without a single move can be replayed (to its start).
        return [] if not response_text else "no final_state record of the moves: nothing to replay"
    try:
        record = json.loads(final_state)
    except ValueError as err:
        return f"final_state is not a textarena record (not JSON: {err})"
    actions = record.get("actions") if isinstance(record, dict) else None
    if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
        return "final_state is not a textarena record (no list of actions)"
    if "\n".join(actions) != response_text:
        return "final_state's actions are not the trajectory's turns (a forged or mismatched record)"
    return actions


def score(final_state: str | None, task: dict[str, Any], response_text: str, *, game_id: str,
          unfinished: float = 0.0) -> tuple[float | None, dict[str, float], dict[str, Any]]:
    """The game's own reward for the recorded moves, by replaying them from the task's seed."""
    if isinstance(unfinished, bool) or not isinstance(unfinished, int | float) or not math.isfinite(unfinished):
        raise UsageError(f"textarena reward: unfinished must be a finite number, got {unfinished!r}")
    _check_task_game(task, game_id)
    seed = task_seed(task)
    info: dict[str, Any] = {"game": game_id, "seed": seed, "replayed": True}
    actions = _recorded_actions(final_state, response_text or "")
    if isinstance(actions, str):
        return None, {}, {**info, "error": actions}
    game = Game(game_id, seed)
    for position, action in enumerate(actions):
        if game.done:
            return None, {}, {**info, "error": f"the record holds {len(actions) - position} move(s) after the "
                                               "game ended (a forged or mismatched record)"}
        try:
            game.act(action)
        except Exception as err:  # TextArena broke on this move: it cannot be graded, and is not a 0
            return None, {}, {**info, "error": f"replay: TextArena raised {type(err).__name__} on move "
                                               f"{position + 1}: {err}"}
    info.update(moves=len(actions), done=game.done, reason=game.reason, invalid_move=game.invalid_move)
    recorded = json.loads(final_state) if final_state else {}
    if recorded and (recorded.get("done"), recorded.get("reward")) != (game.done, game.reward):
        info["record_disagrees"] = {"done": recorded.get("done"), "reward": recorded.get("reward")}
    if not game.done or game.reward is None:
        info["note"] = "the game did not end: scored as unfinished"
        return float(unfinished), {"finished": 0.0}, info
    return game.reward, {"finished": 1.0, "game_reward": game.reward}, info


def _reward_for(game_id: str):
    """The score function of one game: `game_id` fixed, so --reward-opt cannot change which game grades."""

    def score_game(final_state: str | None, task: dict[str, Any], response_text: str, *,
                   unfinished: float = 0.0) -> tuple[float | None, dict[str, float], dict[str, Any]]:
        return score(final_state, task, response_text, game_id=game_id, unfinished=unfinished)

    return score_game


def _factory_for(game_id: str):
    """The run's EnvFactory maker: options are checked once, so a bad --env-opt is a usage error up front."""

    def make_factory(max_turns: int | None = None) -> PlainEnvFactory:
        TextArenaEnv(game_id, max_turns)  # raises the UsageError now, not once per trajectory
        return PlainEnvFactory(member_name(game_id), {} if max_turns is None else {"max_turns": max_turns})

    return make_factory


# ------------------------------------------------------------------------------------ tasks and registry
def derive_seed(seed: int, index: int) -> int:
    """Task `index`'s game seed under source seed `seed`: distinct sources give unrelated games."""
    digest = hashlib.sha256(f"textarena:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def builtin_tasks(game_id: str, options: dict[str, str]) -> list[dict[str, Any]]:
    source = f"builtin:{member_name(game_id)}"
    n = int_option(options, "n", 64, source)
    seed = int_option(options, "seed", 0, source)
    reject_unknown_options(options, source, ["n", "seed"])
    if n < 1:
        raise UsageError(f"{source}: n must be >= 1, got {n}")
    return [{"task_id": f"{game_id}-s{seed}-{i}", "env": member_name(game_id), "game": game_id,
             "seed": derive_seed(seed, i)} for i in range(n)]


_NLTK_RESOURCE = re.compile(r"Resource\W+(\w+)\W+not found")


def _startup_error(game_id: str, err: BaseException) -> UsageError:
    """A TextArena failure to make or reset a game, as the one-line reason a user can act on."""
    text = " ".join(str(err).split())
    if isinstance(err, ValueError) and "not found in registry" in text:
        close = difflib.get_close_matches(game_id, list(ta.envs.registration.ENV_REGISTRY), n=3)
        return UsageError(f"unknown TextArena game {game_id!r}" + (f" (did you mean {', '.join(close)}?)"
                                                                     if close else ""),
                          hint="e.g. " + ", ".join(member_name(g) for g in OFFLINE_GAMES[:5]))
    if isinstance(err, LookupError):
        match = _NLTK_RESOURCE.search(text)
        resource = match.group(1) if match else "its word lists"
        return UsageError(f"TextArena game {game_id!r} needs the NLTK data {resource!r}, which is not installed "
                          "(and could not be downloaded)",
                          hint=f"on a machine with network: python -m nltk.downloader {resource if match else 'words'}"
                               " (or point NLTK_DATA at a copy); offline games: " + ", ".join(OFFLINE_GAMES[:4]))
    if isinstance(err, AssertionError) and "number of players" in text:
        return UsageError(f"TextArena game {game_id!r} is not a single-player game ({text})",
                          hint="arlctl plays single-player games, e.g. " + ", ".join(OFFLINE_GAMES[:4]))
    return UsageError(f"TextArena game {game_id!r} failed to start: {type(err).__name__}: {text[:300]}")


def probe(game_id: str) -> Game:
    """Make and reset the game once; every way that fails is a UsageError naming the cause."""
    try:
        return Game(game_id, seed=0)
    except Exception as err:
        raise _startup_error(game_id, err) from None


def register_member(game_id: str) -> None:
    """Register env, reward and builtin task source `textarena:GAME` (once; after probing the game)."""
    name = member_name(game_id)
    if name in _REGISTERED:
        return
    probe(game_id)
    register_env(name, partial(TextArenaEnv, game_id), version=ENV_VERSION, factory=_factory_for(game_id))
    register_reward(name, _reward_for(game_id), REWARD_VERSION)
    register_task_source(name)(partial(builtin_tasks, game_id))
    _REGISTERED.add(name)


_REGISTERED: set[str] = set()
register_family(FAMILY, register_member)
