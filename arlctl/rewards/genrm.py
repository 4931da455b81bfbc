"""`--reward genrm`: a generative reward model compares the members of one GRPO group with each other.

The judge endpoint and its options are the judge reward's (arlctl/rewards/judge.py: server=URL model=NAME,
or judge=default|tiny|PATH in process; concurrency, timeout, retries, backoff, max_tokens). The rubric's
kind says how members are compared (arlctl/rewards/rubrics/):

  pairwise (rubric=pairwise, the default)  every pair once, A = the earlier member; both_orders=1 asks
      each pair a second time with the members swapped, which cancels the judge's position bias. A
      verdict's score s in [0, 1] is how much A is preferred: A earns s, B earns 1 - s (0.5 each: a tie).
  listwise (rubric=listwise)  one request shows all members, numbered; the verdict ranks them best
      first, and every member is taken to beat each member ranked below it.

Per-row scores (aggregate=):
  winrate (default)  earned / comparisons: the share of its comparisons a member won, ties as half.
      Bounded, exact, and needs no model; GRPO normalises within the group anyway.
  bt  Bradley–Terry strengths p by Hunter's MM iterations (bt_iterations=50), with one virtual tie per
      compared pair so an unbeaten member keeps a finite strength; the score is the member's mean
      modelled chance of beating each other scored member, p_i / (p_i + p_j).

Failures: a comparison whose request failed or whose verdict could not be read is dropped and counted
(reward_info.comparisons_failed, first_error). A member with no successful comparison gets reward None
with the cause; so does every member of a group of 1 (nothing to compare with).

Interface with the reward stage: the score function carries `score_group(items, **options)`, an async
function taking one group's rows in row order — dicts {"final_state", "task", "response_text",
"trajectory_id"} — and returning one (reward, components, info) per item. The plain `score` gives every
row reward None: genrm cannot grade a row alone.
"""

from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass
from typing import Any

from arlctl.envs.registry import register_reward
from arlctl.errors import UsageError
from arlctl.rewards import rubrics
from arlctl.rewards.judge import Endpoint, JudgeFailure, ask, endpoint

VERSION = "genrm-1"
NAME = "genrm"
AGGREGATES = ("winrate", "bt")
MAX_VERDICTS_KEPT = 16  # per member, in reward_info
Scored = tuple[float | None, dict[str, float] | None, dict[str, Any]]


@dataclass(frozen=True)
class Comparison:
    """One judged comparison of members i and j: i earned `credit` (j earned 1 - credit), or it failed."""

    i: int
    j: int
    credit: float | None
    order: str  # "AB" (i shown first), "BA" (j shown first) or "list"
    verdict: str | None = None
    error: str | None = None


def score(final_state: str | None, task: dict[str, Any], response_text: str, *, server: str | None = None,
          model: str | None = None, judge: str | None = None, rubric: str = "pairwise", aggregate: str = "winrate",
          both_orders: int = 0, bt_iterations: int = 50, concurrency: int = 8, timeout: float = 120.0,
          retries: int = 2, backoff: float = 0.5, max_tokens: int | None = None) -> tuple[None, None, dict[str, Any]]:
    """A row alone cannot be compared: reward None with the cause (the stage calls score_group instead).
    The keywords are score_group's, so get_reward refuses a misspelt option before any row."""
    return None, None, {"error": "genrm scores groups: it needs the reward stage to call score_group with the "
                                 "members of one group"}


async def score_group(items: list[dict[str, Any]], *, server: str | None = None, model: str | None = None,
                      judge: str | None = None, rubric: str = "pairwise", aggregate: str = "winrate",
                      both_orders: int = 0, bt_iterations: int = 50, concurrency: int = 8, timeout: float = 120.0,
                      retries: int = 2, backoff: float = 0.5, max_tokens: int | None = None) -> list[Scored]:
    """Score the members of one group against each other (see the module docstring)."""
    ep = endpoint(server, model, judge, timeout, retries, backoff, concurrency)
    rb = rubrics.load(rubric, ("pairwise", "listwise"))
    _check_aggregate(aggregate, both_orders, bt_iterations)
    base = {"judge_model": ep.label, "rubric": rb.label, "aggregate": aggregate, "group_size": len(items)}
    if len(items) < 2:
        return [(None, None, {**base, "error": "genrm: a group of 1 has nothing to compare with"}) for _ in items]
    try:
        shared = rubrics.task_values(items[0]["task"], rb.uses)
    except rubrics.FieldMissing as err:
        return [(None, None, {**base, "error": f"genrm: {err}"}) for _ in items]
    if rb.kind == "pairwise":
        comparisons = await _pairwise(ep, rb, shared, items, bool(both_orders), max_tokens)
    else:
        comparisons = await _listwise(ep, rb, shared, items, max_tokens)
    scores = (win_rates(len(items), comparisons) if aggregate == "winrate"
              else bradley_terry(len(items), comparisons, bt_iterations))
    return [_member_result(k, items, comparisons, scores[k], base) for k in range(len(items))]


def _check_aggregate(aggregate: str, both_orders: Any, bt_iterations: Any) -> None:
    if aggregate not in AGGREGATES:
        raise UsageError(f"genrm aggregate must be one of {', '.join(AGGREGATES)}, got {aggregate!r}")
    if both_orders not in (0, 1, True, False):
        raise UsageError(f"genrm both_orders must be 0 or 1, got {both_orders!r}")
    if isinstance(bt_iterations, bool) or not isinstance(bt_iterations, int) or bt_iterations < 1:
        raise UsageError(f"genrm bt_iterations must be a positive integer, got {bt_iterations!r}")


def _answer(item: dict[str, Any]) -> str:
    return rubrics.NO_ANSWER if item.get("final_state") is None else str(item["final_state"])


async def _pairwise(ep: Endpoint, rb: rubrics.Rubric, shared: dict[str, str], items: list[dict[str, Any]],
                    both_orders: bool, max_tokens: int | None) -> list[Comparison]:
    async def compare(i: int, j: int, order: str) -> Comparison:
        first, second = (items[i], items[j]) if order == "AB" else (items[j], items[i])
        messages, _cut = rb.messages({**shared, "response_a": first["response_text"], "answer_a": _answer(first),
                                      "response_b": second["response_text"], "answer_b": _answer(second)})
        try:
            reply = await ask(ep, messages, max_tokens or rb.max_tokens)
            preference, raw = rb.read_verdict(reply.text)  # how much the member shown first is preferred
        except (JudgeFailure, ValueError) as err:
            return Comparison(i, j, None, order, error=f"genrm: {err}")
        return Comparison(i, j, preference if order == "AB" else 1.0 - preference, order, raw)

    orders = ("AB", "BA") if both_orders else ("AB",)
    pairs = [(i, j, o) for i in range(len(items)) for j in range(i + 1, len(items)) for o in orders]
    return list(await asyncio.gather(*(compare(i, j, o) for i, j, o in pairs)))


async def _listwise(ep: Endpoint, rb: rubrics.Rubric, shared: dict[str, str], items: list[dict[str, Any]],
                    max_tokens: int | None) -> list[Comparison]:
    n = len(items)
    shown = "\n\n".join(f"Response {k + 1}:\n{item['response_text']}\nFinal answer of {k + 1}: {_answer(item)}"
                        for k, item in enumerate(items))
    messages, _cut = rb.messages({**shared, "responses": shown, "n": n})
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    try:
        reply = await ask(ep, messages, max_tokens or rb.max_tokens)
        ranking = read_ranking(rb, reply.text, n)
    except (JudgeFailure, ValueError) as err:
        return [Comparison(i, j, None, "list", error=f"genrm: {err}") for i, j in pairs]
    place = {member: rank for rank, member in enumerate(ranking)}
    raw = " > ".join(str(m + 1) for m in ranking)
    return [Comparison(i, j, 1.0 if place[i] < place[j] else 0.0, "list", raw) for i, j in pairs]


def read_ranking(rb: rubrics.Rubric, reply: str, n: int) -> list[int]:
    """The 0-based member order (best first) from a listwise reply; ValueError unless it orders all of 1..n."""
    matches = list(rb.verdict.finditer(reply))
    if not matches:
        raise ValueError(f"unparseable verdict: no match of /{rb.verdict.pattern}/ in the judge's reply")
    raw = matches[-1].group(1) or ""
    numbers = [int(x) for x in re.findall(r"\d+", raw)]
    if sorted(numbers) != list(range(1, n + 1)):
        raise ValueError(f"unparseable verdict: ranking {raw.strip()[:60]!r} is not an order of 1..{n}")
    return [x - 1 for x in numbers]


# ---- from comparisons to scores (pure) ----------------------------------------------------------------

def win_rates(n: int, comparisons: list[Comparison]) -> list[float | None]:
    """Each member's earned credit over its successful comparisons; None with none."""
    earned, played = [0.0] * n, [0] * n
    for c in comparisons:
        if c.credit is None:
            continue
        earned[c.i] += c.credit
        earned[c.j] += 1.0 - c.credit
        played[c.i] += 1
        played[c.j] += 1
    return [earned[k] / played[k] if played[k] else None for k in range(n)]


def bradley_terry(n: int, comparisons: list[Comparison], iterations: int = 50) -> list[float | None]:
    """Bradley–Terry scores: mean over the other scored members j of p_k / (p_k + p_j).

    Strengths by the MM update p_k <- W_k / sum_j n_kj / (p_k + p_j) (Hunter 2004), W_k the credit earned,
    n_kj the comparisons of k and j, each compared pair given one virtual tie (0.5 each, n_kj + 1).
    """
    wins = [0.0] * n
    games: dict[tuple[int, int], float] = {}
    for c in comparisons:
        if c.credit is None:
            continue
        key = (min(c.i, c.j), max(c.i, c.j))
        if key not in games:  # the virtual tie, once per compared pair
            games[key] = 1.0
            wins[c.i] += 0.5
            wins[c.j] += 0.5
        games[key] += 1.0
        wins[c.i] += c.credit
        wins[c.j] += 1.0 - c.credit
    scored = sorted({k for pair in games for k in pair})
    if not scored:
        return [None] * n
    strength = [1.0] * n
    for _ in range(iterations):
        new = list(strength)
        for k in scored:
            denominator = sum(count / (strength[k] + strength[j if k == i else i])
                              for (i, j), count in games.items() if k in (i, j))
            new[k] = wins[k] / denominator
        mean_log = sum(math.log(new[k]) for k in scored) / len(scored)  # fix the scale: geometric mean 1
        strength = [s / math.exp(mean_log) for s in new]
    out: list[float | None] = [None] * n
    for k in scored:
        others = [j for j in scored if j != k]
        out[k] = sum(strength[k] / (strength[k] + strength[j]) for j in others) / len(others)
    return out


def _member_result(k: int, items: list[dict[str, Any]], comparisons: list[Comparison], value: float | None,
                   base: dict[str, Any]) -> Scored:
    mine = [c for c in comparisons if k in (c.i, c.j)]
    ok = [c for c in mine if c.credit is not None]
    failed = [c for c in mine if c.credit is None]
    earned = [c.credit if c.i == k else 1.0 - c.credit for c in ok]  # type: ignore[operator]
    info: dict[str, Any] = {**base, "comparisons": len(ok), "comparisons_failed": len(failed),
                            "wins": sum(e > 0.5 for e in earned), "losses": sum(e < 0.5 for e in earned),
                            "ties": sum(e == 0.5 for e in earned)}
    if failed:
        info["first_error"] = failed[0].error
    info["verdicts"] = [{"vs": items[c.j if c.i == k else c.i].get("trajectory_id"), "order": c.order,
                         "verdict": c.verdict, "earned": e} for c, e in zip(ok, earned)][:MAX_VERDICTS_KEPT]
    if value is None:
        cause = f"none of this member's {len(mine)} comparisons succeeded (first: {failed[0].error})" if failed \
            else "this member was in no comparison"
        return None, None, {**info, "error": f"genrm: {cause}"}
    return value, {"genrm": value}, info


def version_suffix(*, server: str | None = None, model: str | None = None, judge: str | None = None,
                   rubric: str = "pairwise", aggregate: str = "winrate", both_orders: int = 0,
                   bt_iterations: int = 50, concurrency: int = 8, timeout: float = 120.0, retries: int = 2,
                   backoff: float = 0.5, **_: Any) -> str:
    """The rubric's name and content hash and the judge model, for reward_version; checks the options now."""
    ep = endpoint(server, model, judge, timeout, retries, backoff, concurrency)
    rb = rubrics.load(rubric, ("pairwise", "listwise"))
    _check_aggregate(aggregate, both_orders, bt_iterations)
    return f"+rubric:{rb.label}+judge:{ep.label}"


score.score_group = score_group  # type: ignore[attr-defined]
score.version_suffix = version_suffix  # type: ignore[attr-defined]
# How the judge is reached, not what it judges (the model is in version_suffix): not part of reward_version.
score.unversioned_options = ("server", "concurrency", "timeout", "retries", "backoff")  # type: ignore[attr-defined]
register_reward(NAME, score, VERSION)
