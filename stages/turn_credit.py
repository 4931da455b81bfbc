"""Turn-level credit for `arlctl filter --adv turn|turn-mean` (DESIGN.md §9; schema v2 `turns[].advantage`).

Each turn t of a trajectory has a step reward r_t: the env's `reward_step` (swe: the share of the visible
tests passing after a run_tests call), else a judge's `reward_info.step_rewards[t]`, else 0
(arlctl.rl.advantages.step_rewards). Its return is R_t = r_t + gamma * R_{t+1}, with R_last = r_last +
the outcome reward; its advantage is R_t less the group's baseline at the same turn index (arlctl.rl.
advantages.turn_advantages). filter's rules use `turn_step_rewards` (rows whose step rewards are unusable
are invalid values) and `uniform_per_turn` (a group is zero-variance only when every turn index is);
`with_turn_credit` fills a packed batch's turns[].advantage, which train applies to each turn's tokens.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa

from arlctl.rl.advantages import discounted_returns, group_ids_to_index, step_rewards, turn_advantages
from arlctl.schemas.trajectory import set_turn_advantages
from arlctl.schemas.values import BadValue
from arlctl.stages.configs import FilterConfig
from arlctl.turn_rows import CONTINUED


def turn_step_rewards(table: pa.Table) -> tuple[list[list[float | None] | None], list[BadValue]]:
    """Per row, the step reward of each of its turns (arlctl.rl.advantages.step_rewards; None for a turn
    the judge could not grade), or None with a BadValue for a row whose step rewards are unusable. A
    whole-trajectory row's non-empty reward_info step_rewards must hold exactly one entry per turn; a
    per-turn row's must reach its turn index."""
    import pyarrow.compute as pc

    turns = table.column("turns")
    lengths = [n or 0 for n in pc.list_value_length(turns).to_pylist()]  # [N]
    flat = pc.list_flatten(turns)  # [T] every row's turns in order
    index = pc.struct_field(flat, "index").to_pylist()  # [T]
    recorded = pc.struct_field(flat, "reward_step").to_pylist()  # [T]
    reasons = table.column("finish_reason").to_pylist()
    out: list[list[float | None] | None] = []
    bad: list[BadValue] = []
    start = 0
    for row, (n, info) in enumerate(zip(lengths, table.column("reward_info").to_pylist(), strict=True)):
        span = slice(start, start + n)
        start += n
        try:
            judged = judged_step_rewards(info)
            whole = reasons[row] != CONTINUED and (not n or index[span][0] == 0)
            if judged and whole and isinstance(judged, list) and len(judged) != n:
                raise ValueError(f"reward_info step_rewards has {len(judged)} entries for {n} turns")
            out.append(step_rewards(recorded[span], index[span], judged))
        except ValueError as err:
            out.append(None)
            bad.append(BadValue(row, "turns", f"step rewards unusable: {err}"))
    return out, bad


def judged_step_rewards(info: str | None) -> Any:
    """reward_info["step_rewards"] (a judge's per-turn scores), or None when there are none."""
    if info is None:
        return None
    try:
        parsed = json.loads(info)
    except (ValueError, RecursionError):
        raise ValueError("reward_info is not JSON") from None
    return parsed.get("step_rewards") if isinstance(parsed, dict) else None


def trajectory_returns(rows: list[int], first: list[int], steps: list[list[float | None] | None], outcome: float,
             gamma: float) -> list[float]:
    """The returns of the trajectory made of `rows` (one, or its per-turn rows), turns in index order."""
    ordered = sorted(rows, key=lambda r: first[r])
    return discounted_returns([r for i in ordered for r in steps[i] or []], outcome, gamma)


def uniform_per_turn(returns: list[list[float]]) -> bool:
    """True when every turn index has one return value across the trajectories: no turn gets a signal."""
    seen: dict[int, float] = {}
    for trajectory in returns:
        for t, value in enumerate(trajectory):
            if seen.setdefault(t, value) != value:
                return False
    return True


def with_turn_credit(batch: pa.Table, owner: np.ndarray, rewards: np.ndarray, traj_groups: list[str],
                      cfg: FilterConfig) -> pa.Table:
    """The batch with turns[].advantage filled (turn modes). owner: [n] trajectory of each row, whose rows
    come in turn order (pack_batches sorts them so); rewards: [T] outcome of each trajectory."""
    steps, unusable = turn_step_rewards(batch)
    if unusable or any(None in s for s in steps if s):
        raise ValueError("a row with unusable or ungraded step rewards (apply_rules drops such rows first)")
    per_trajectory: list[list[float]] = [[] for _ in range(len(rewards))]
    for row, k in enumerate(owner.tolist()):
        per_trajectory[k].extend(steps[row] or [])
    returns = [discounted_returns(s, r, cfg.gamma) for s, r in zip(per_trajectory, rewards.tolist(), strict=True)]
    advantages = turn_advantages(returns, group_ids_to_index(traj_groups), cfg.adv)  # [T][turns]
    flat: list[float | None] = []
    used = [0] * len(rewards)
    for row, k in enumerate(owner.tolist()):
        n = len(steps[row] or [])
        flat.extend(advantages[k][used[k] : used[k] + n])
        used[k] += n
    return set_turn_advantages(batch, flat)
