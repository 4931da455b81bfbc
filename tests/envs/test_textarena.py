"""TextArena single-player games as envs: the game's own rules and reward, replayed; seeds; the oracle.

The scripted policy `oracle:textarena` wins Tower of Hanoi and Guess The Number through the real CLI
(rollout, then reward by the game's reward name); random (tiny model) and wrong play lose; a forged
final_state cannot change the replayed reward; games are deterministic per seed and isolated from each
other's random draws; the multi-turn rows stay token-exact.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from arlctl.envs.base import Action
from arlctl.envs.registry import env_factory, get_reward, make_env
from arlctl.envs.tasks import load_tasks
from arlctl.envs.textarena import Game, derive_seed
from arlctl.envs.textarena_oracle import hanoi_moves, load_textarena_oracle, script, textarena_oracle
from arlctl.errors import UsageError
from arlctl.inference.chat import ChatCodec
from arlctl.inference.loader import load_policy
from arlctl.stages.agent_loop import RolloutConfig
from tests.stages.test_rollout import RecordingEnv, rescore, run

HANOI, GUESS = "textarena:TowerOfHanoi-v0", "textarena:GuessTheNumber-v0"
# The optimal solution of 3 disks, A -> C (2^3 - 1 = 7 moves): the classic recursion written out.
HANOI_3 = ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]
ARLCTL = [sys.executable, "-m", "arlctl.cli.main"]


@pytest.fixture(scope="module")
def policy():
    pol = load_policy("tiny", max_batch=16, progress=False)
    yield pol
    asyncio.run(pol.close())


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    from arlctl.models import tiny_model_dir

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir()), local_files_only=True).eval()


def play(env_name: str, task: dict, moves: list[str], **options):
    """Reset a real env on `task`, play `moves` until it ends; (reset messages, step results)."""
    env = make_env(env_name, **options)

    async def go():
        reset = await env.reset(task)
        results = []
        for move in moves:
            results.append(await env.step(Action(text=move)))
            if results[-1].done:
                break
        return reset, results, await env.final_state()

    try:
        return asyncio.run(go())
    finally:
        asyncio.run(env.close())


def task_for(env_name: str, seed: int = 0) -> dict:
    return load_tasks(f"builtin:{env_name}?n=1&seed={seed}", env=env_name)[0]


def secret_of(task: dict) -> int:
    """The number GuessTheNumber drew for this task's seed (read from the game, as the replay would)."""
    return Game("GuessTheNumber-v0", task["seed"]).inner.game_number


# ------------------------------------------------------------------------------- rules, reward, replay
def test_optimal_hanoi_wins_and_the_replay_gives_the_games_reward():
    task = task_for(HANOI)
    reset, results, record = play(HANOI, task, HANOI_3)
    assert "the TextArena game TowerOfHanoi-v0" in reset.messages[0]["content"]
    assert "Tower of Hanoi with 3 disks" in reset.messages[1]["content"] and reset.messages[1]["role"] == "user"
    assert [r.done for r in results] == [False] * 6 + [True]
    assert results[0].observations == [{"role": "user", "content": "You moved disk 1 from A to C.\n\n"
                                                                   "Current Board: \nA: [3, 2]\nB: []\nC: [1]\n."}]
    assert results[-1].finish_reason == "submit" and json.loads(results[-1].final_state)["actions"] == HANOI_3
    reward, parts, info = get_reward(HANOI).score(results[-1].final_state, task, "\n".join(HANOI_3))
    assert (reward, parts) == (1.0, {"finished": 1.0, "game_reward": 1.0})
    assert info["moves"] == 7 and "solved" in info["reason"] and "record_disagrees" not in info


def test_wrong_play_loses_with_the_games_own_reward():
    task = task_for(HANOI)
    # Two illegal moves: the first gets a warning, the second ends the game (error allowance 1) with
    # TextArena's reward for it, the share of disks already on C in order: none -> 0 / 3 = 0.0.
    moves = ["[A C]", "[A C]", "[B C]", "[A B]"]  # disk 2 onto disk 1; then from the empty B; then nothing
    _, results, _ = play(HANOI, task, moves)
    assert [r.done for r in results] == [False, False, True]
    assert "invalid move" in results[1].observations[0]["content"]
    reward, parts, info = get_reward(HANOI).score(results[-1].final_state, task, "\n".join(moves[:3]))
    assert (reward, parts["finished"]) == (0.0, 1.0) and info["invalid_move"] is True
    # Guess The Number, wrong guesses only: TextArena checks its limit of 10 turns before counting the
    # move, so the 11th guess ends it, with 1 - |last guess - secret| / (20 - 1).
    task = task_for(GUESS, seed=5)
    secret = secret_of(task)
    guesses = [f"[{n}]" for n in range(1, 21) if n != secret]
    _, results, _ = play(GUESS, task, guesses)
    assert len(results) == 11 and results[-1].done
    last = int(guesses[10].strip("[]"))
    reward, _, _ = get_reward(GUESS).score(results[-1].final_state, task, "\n".join(guesses[:11]))
    assert reward == pytest.approx(1 - abs(last - secret) / 19)


def test_a_forged_final_state_does_not_change_the_reward():
    task = task_for(HANOI)
    moves = ["[A B]", "[A B]", "[A B]"]  # illegal after the first: lost with 0.0
    _, results, _ = play(HANOI, task, moves)
    record = json.loads(results[-1].final_state)
    score = get_reward(HANOI).score
    assert score(results[-1].final_state, task, "\n".join(moves))[0] == 0.0
    # 1. The outcome forged to a win: the replay gives the true 0.0 and says the record disagrees.
    lying = json.dumps({**record, "done": True, "reward": 1.0})
    reward, _, info = score(lying, task, "\n".join(moves))
    assert reward == 0.0 and info["record_disagrees"] == {"done": True, "reward": 1.0}
    # 2. The moves forged to the winning ones: they are not the turns the policy played -> no reward.
    forged = json.dumps({**record, "actions": HANOI_3})
    reward, _, info = score(forged, task, "\n".join(moves))
    assert reward is None and "not the trajectory's turns" in info["error"]
    # 3. Moves after the game ended, and records that are not records: no reward, the cause said.
    extra = moves + ["[A C]"]
    assert "after the game ended" in score(json.dumps({**record, "actions": extra}), task, "\n".join(extra))[2]["error"]
    assert score("not json", task, "\n".join(moves))[0] is None
    assert score(None, task, "\n".join(moves))[0] is None
    assert score(None, task, "")[:2] == (0.0, {"finished": 0.0})  # no move at all: an unfinished game


def test_unfinished_games_score_the_unfinished_option_and_max_turns_ends_them():
    task = task_for(HANOI)
    _, results, record = play(HANOI, task, HANOI_3, max_turns=3)
    assert len(results) == 3 and results[-1].done and results[-1].finish_reason == "max_turns"
    assert json.loads(record)["done"] is False and json.loads(record)["actions"] == HANOI_3[:3]
    text = "\n".join(HANOI_3[:3])
    assert get_reward(HANOI).score(record, task, text)[:2] == (0.0, {"finished": 0.0})
    shifted = get_reward(HANOI, unfinished=-1.0)
    assert shifted.score(record, task, text)[0] == -1.0 and shifted.version.endswith("+unfinished=-1.0")
    with pytest.raises(UsageError, match="unfinished must be a finite number"):
        get_reward(HANOI, unfinished="lots").score(record, task, text)
    with pytest.raises(UsageError, match="max_turns"):
        env_factory(HANOI, max_turns=0)  # checked when the run starts, not once per trajectory


# ---------------------------------------------------------------------------------- seeds and tasks
def test_games_are_deterministic_per_seed_and_isolated_from_each_other():
    moves = ["[up]", "[left]", "[down]", "[right]"] * 2  # 2048 spawns a random tile after every move

    def observations(seed: int, interleave: bool) -> list[str]:
        game, other = Game("2048-v0", seed), Game("2048-v0", seed + 1)
        seen = [game.new_messages()]
        for move in moves:
            if interleave:  # another game and the caller draw from `random` between our moves
                other.act(move)
                random.random()
            game.act(move)
            seen.append(game.new_messages())
        return seen

    alone = observations(7, interleave=False)
    assert observations(7, interleave=True) == alone
    assert observations(8, interleave=False) != alone  # another seed, another game
    state = random.getstate()
    Game("Minesweeper-v0", 3).act("[3 3]")
    assert random.getstate() == state  # a game never moves the caller's random stream
    numpy_state = np.random.get_state()[1].copy()
    sokoban = Game("Sokoban-v0", 2)  # its package names numpy.random: numpy's global state is swapped too
    sokoban.act("[up]")
    assert sokoban._np_state is not None and (np.random.get_state()[1] == numpy_state).all()
    first, second = (play("textarena:Minesweeper-v0", {"task_id": "m", "seed": 11}, ["[2 2]"])
                     for _ in range(2))
    assert first[0].messages == second[0].messages
    assert first[1][0].observations == second[1][0].observations


def test_builtin_tasks_carry_distinct_seeds_and_bad_tasks_are_errors():
    tasks = load_tasks(f"builtin:{GUESS}?n=4&seed=2", env=GUESS)
    assert [t["seed"] for t in tasks] == [derive_seed(2, i) for i in range(4)]
    assert len({t["seed"] for t in tasks}) == 4 and all(t["game"] == "GuessTheNumber-v0" for t in tasks)
    assert load_tasks(f"builtin:{GUESS}?n=4&seed=2", env=GUESS) == tasks
    assert [t["task_id"] for t in load_tasks(f"builtin:{GUESS}", env=GUESS)][:2] == [
        "GuessTheNumber-v0-s0-0", "GuessTheNumber-v0-s0-1"]
    with pytest.raises(UsageError, match="unknown option"):
        load_tasks(f"builtin:{GUESS}?rounds=3")
    from arlctl.envs.mix import _builtin_default

    assert len(_builtin_default(HANOI)) == 64  # --env-mix without --tasks: the member's builtin source
    env = make_env(HANOI)
    with pytest.raises(Exception, match="seed must be a non-negative integer"):
        asyncio.run(env.reset({"task_id": "t", "seed": "seven"}))
    with pytest.raises(Exception, match="is for game 'Sudoku-v0'"):
        asyncio.run(env.reset({"task_id": "t", "seed": 1, "game": "Sudoku-v0"}))


def test_games_that_cannot_run_are_usage_errors():
    with pytest.raises(UsageError, match="unknown TextArena game 'TowerOfHanoi-v9'") as err:
        make_env("textarena:TowerOfHanoi-v9")
    assert "TowerOfHanoi-v0" in str(err.value) and "textarena:GuessTheNumber-v0" in err.value.hint
    with pytest.raises(UsageError, match="unknown TextArena game"):
        load_tasks("builtin:textarena:NoSuchGame-v0?n=2")
    with pytest.raises(UsageError, match="not a single-player game"):
        make_env("textarena:TicTacToe-v0")
    import nltk

    try:
        nltk.data.find("corpora/words")
        pytest.skip("NLTK words are installed here: Wordle starts")
    except LookupError:
        pass
    with pytest.raises(UsageError, match="needs the NLTK data 'words'") as err:
        make_env("textarena:Wordle-v0")
    assert "nltk.downloader words" in err.value.hint


# ----------------------------------------------------------------------------------------- the oracle
def test_oracle_script_plays_hanoi_and_binary_search():
    assert hanoi_moves(3) == HANOI_3
    assert [len(hanoi_moves(n)) for n in range(1, 6)] == [1, 3, 7, 15, 31]  # 2^n - 1
    head = "the TextArena game GuessTheNumber-v0 ...guess the number between 1 and 20 ... [5]. Enter your guess."
    assert script(head) == "[10]"  # (1 + 20) // 2
    # lower than 10 -> [1, 9] -> 5; higher than 5 -> [6, 9] -> 7
    assert script(head + "[10] The target number is lower.") == "[5]"
    assert script(head + "[10] The target number is lower. [5] The target number is higher.") == "[7]"
    hanoi = "the TextArena game TowerOfHanoi-v0 Tower of Hanoi with 3 disks" + " You moved disk" * 2
    assert script(hanoi) == HANOI_3[2]
    with pytest.raises(UsageError, match="cannot play Sudoku-v0"):
        script("the TextArena game Sudoku-v0")
    with pytest.raises(UsageError):
        script("a math question")
    with pytest.raises(UsageError, match="cannot play task"):
        load_textarena_oracle("oracle:textarena", None, tasks=[{"task_id": "m", "env": "math"}])
    with pytest.raises(UsageError, match="unknown oracle policy"):
        load_textarena_oracle("oracle:silver", None)


def test_loop_bound_keeps_the_record_and_grades_it_unfinished(policy):
    """--max-turns below the game's need: the loop ends it; final_state() gives the record to grade."""
    tasks = load_tasks(f"builtin:{HANOI}?n=2&seed=1", env=HANOI)
    cfg = RolloutConfig(group_size=1, concurrency=2, max_turns=3, max_new_tokens=16, max_tokens=400, seed=0)
    groups, stats = run(textarena_oracle(policy.tokenizer), tasks, cfg, env_factory(HANOI))
    rows = [r for g in groups for r in g]
    assert stats.errors == 0 and len(rows) == 2
    for row in rows:
        assert (row.status, row.finish_reason, len(row.turns)) == ("ok", "max_turns", 3)
        record = json.loads(row.final_state)
        assert record["actions"] == HANOI_3[:3] and record["done"] is False
        text = "\n".join(t.text for t in row.turns)
        assert get_reward(HANOI).score(row.final_state, row.task, text)[0] == 0.0


def test_token_exactness_multi_turn(policy, model):
    """The real tiny model (random play: two invalid moves end a game) and the oracle (7-move games):
    log-probs re-score, the ids decode to what the template renders, and the offsets hold the mask."""
    codec = ChatCodec(policy.tokenizer)
    cfg = RolloutConfig(group_size=2, concurrency=4, max_turns=8, max_new_tokens=12, max_tokens=600, seed=3)
    tasks = load_tasks(f"builtin:{HANOI}?n=2&seed=4", env=HANOI)
    sampled, _ = run(policy, tasks, cfg, lambda: RecordingEnv(make_env(HANOI)))
    scripted_tasks = [{**t, "task_id": f"oracle-{t['task_id']}"} for t in tasks]
    scripted, _ = run(textarena_oracle(policy.tokenizer), scripted_tasks, cfg, lambda: RecordingEnv(make_env(HANOI)))
    rows = [r for g in sampled + scripted for r in g]
    for row in rows:
        assert len(row.turns) >= 2, row.task_id  # multi-turn: at least one game reply between turns
        if not row.task_id.startswith("oracle-"):
            scored = rescore(model, row.prompt_ids, row.response_ids)
            for pos, (mask, recorded) in enumerate(zip(row.response_mask, row.response_logprobs)):
                assert recorded == (pytest.approx(scored[pos], abs=2e-3) if mask else 0.0), (row.task_id, pos)
        rec = RecordingEnv.log[row.task_id]
        turns = [(t.text, rec["observations"][i] if i < len(row.turns) - 1 else None)
                 for i, t in enumerate(row.turns)]
        rendered = codec.render_conversation(rec["messages"], rec["tools"], turns)
        _, owed = codec.split_generation(row.response_ids[row.turns[-1].gen_start:])
        assert codec.decode(row.prompt_ids + row.response_ids) + owed == rendered
        for t in row.turns:
            assert row.response_mask[t.gen_start:t.gen_start + t.gen_len] == [1] * t.gen_len
            end = t.gen_start + t.gen_len
            assert row.response_mask[end:end + t.obs_len] == [0] * t.obs_len
    assert max(len(r.turns) for r in rows if r.task_id.startswith("oracle-")) == 7


# ------------------------------------------------------------------------------------ the real CLI
def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run([*ARLCTL, *args], capture_output=True, text=True, cwd=cwd, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def _rows(directory: Path) -> list[dict]:
    return [row for path in sorted(directory.glob("*.parquet")) for row in pq.read_table(path).to_pylist()]


@pytest.mark.integration
@pytest.mark.parametrize("env_name, tasks, turns", [
    (HANOI, f"builtin:{HANOI}?n=2&seed=0", {7}),  # 2^3 - 1 moves, every time
    (GUESS, None, {1, 2, 3, 4, 5}),  # binary search over 1..20: at most ceil(log2(21)) = 5 guesses
])
def test_oracle_wins_through_the_cli(tmp_path, env_name, tasks, turns):
    rollout = ["rollout", "--env", env_name, "--policy", "oracle:textarena", "--max-turns", "14", "-G", "2",
               "--out", str(tmp_path / "rollouts"), "-q", "--limit", "3"]
    _cli(*rollout, *(["--tasks", tasks] if tasks else []), cwd=tmp_path)  # no --tasks: builtin:ENV
    _cli("reward", "--in", str(tmp_path / "rollouts"), "--out", str(tmp_path / "rewarded"), "--reward", env_name,
         cwd=tmp_path)
    rows = _rows(tmp_path / "rewarded")
    assert len(rows) == (4 if tasks else 6)
    for row in rows:
        assert (row["status"], row["finish_reason"], row["reward"]) == ("ok", "submit", 1.0), row["reward_info"]
        assert row["num_turns"] in turns and json.loads(row["reward_info"])["replayed"] is True
        assert row["reward_version"].startswith("textarena-1+ta")


@pytest.mark.integration
def test_random_play_loses_through_the_cli(tmp_path):
    _cli("rollout", "--env", HANOI, "--tasks", f"builtin:{HANOI}?n=3&seed=9", "--policy", "tiny", "--max-turns", "14",
         "--max-new-tokens", "16", "-G", "2", "--out", str(tmp_path / "rollouts"), "-q", cwd=tmp_path)
    _cli("reward", "--in", str(tmp_path / "rollouts"), "--out", str(tmp_path / "rewarded"), "--reward", HANOI,
         cwd=tmp_path)
    rows = _rows(tmp_path / "rewarded")
    assert len(rows) == 6
    for row in rows:
        record = json.loads(row["final_state"])
        assert row["reward"] is not None and row["reward"] < 1.0, row["reward_info"]
        assert row["reward"] == pytest.approx(record["reward"])  # the replay agrees with the live game
