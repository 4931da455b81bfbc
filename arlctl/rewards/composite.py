"""Composite rewards (`--reward 'swe + 0.2*judge + 0.1*format'`) and the one place a --reward spec is built.

An expression is a sum of terms, each a reward with an optional weight: `NAME`, `W*NAME` or `NAME*W`,
joined by `+` (or ` - `, with spaces, since names such as first-token hold a hyphen; `-W*NAME` works
too). NAME is anything --reward takes alone: a registered name, a plugin's name, a `module:attribute`
spec, or `http://HOST:PORT/NAME` (a reward served by `arlctl reward-serve`). Weights are plain decimals.

Each component is scored on its own (through arlctl/rewards/scoring.py, so a group reward such as genrm is
scored per group while the others are scored per row, and each component has its own cache entries: a
changed weight re-runs no judge). For one row:

    reward            = sum of weight_i * reward_i
    reward_components = {LABEL_i: reward_i} plus each component's own components as LABEL_i.NAME
                        (except a part named LABEL_i equal to reward_i, e.g. judge's {"judge": r})
    reward_info       = {"parts": {LABEL_i: info_i}, "weights": {LABEL_i: weight_i}}
    reward_version    = composite(VERSION_1+W_2*VERSION_2+...)    (weight 1 is not written)

A component that gives no reward makes the total null, with reward_info.error naming the component and
its cause: a missing part is never counted as 0. LABEL is the name as written (the reward's name on the
server for a URL); `--reward-opt LABEL.KEY=VALUE` gives KEY=VALUE to that component only.
"""

from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass
from typing import Any

from arlctl.envs.registry import get_reward
from arlctl.errors import UsageError
from arlctl.rewards import format as _format  # noqa: F401  (registers `--reward format`)
from arlctl.rewards.scoring import Done, Item, ScoreContext, Scored, Scorer, score_items
from arlctl.settings import parse_env_options

NAME = "composite"
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_TERM = re.compile(rf"^(?P<sign>-?)\s*(?:(?P<before>{_NUMBER})\s*\*\s*)?(?P<name>[^*\s]+)"
                   rf"(?:\s*\*\s*(?P<after>{_NUMBER}))?$")
_OPERATOR = re.compile(r"(\+|\s-\s)")


@dataclass(frozen=True)
class Component:
    label: str  # its key in reward_components and in LABEL.KEY=VALUE options
    weight: float
    spec: str  # what --reward would take alone
    reward: Scorer


def is_expression(spec: str) -> bool:
    """Whether a --reward value is an expression rather than one reward."""
    text = spec.strip()
    return "+" in text or "*" in text or _OPERATOR.search(text) is not None or text.startswith("-")


def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


def parse_expression(text: str) -> list[tuple[float, str]]:
    """`swe + 0.2*judge - 0.1*len` -> [(1.0, "swe"), (0.2, "judge"), (-0.1, "len")]."""
    pieces = _OPERATOR.split(text.strip())
    terms: list[tuple[float, str]] = []
    for index in range(0, len(pieces), 2):
        term = pieces[index].strip()
        negated = index > 0 and pieces[index - 1].strip() == "-"
        match = _TERM.match(term)
        if match is None:
            raise UsageError(f"--reward {text!r}: cannot read the term {term!r}" if term else
                             f"--reward {text!r}: an operator has no term beside it",
                             hint="terms are NAME, W*NAME or NAME*W, joined by + (e.g. 'swe + 0.2*judge')")
        if match["before"] and match["after"]:
            raise UsageError(f"--reward {text!r}: the term {term!r} has two weights")
        weight = float(match["before"] or match["after"] or 1.0)
        weight = -weight if bool(match["sign"]) != negated else weight
        if re.fullmatch(_NUMBER, match["name"]):
            raise UsageError(f"--reward {text!r}: the term {term!r} names no reward")
        terms.append((weight, match["name"]))
    return terms


def component_label(spec: str) -> str:
    """A component's name in reward_components: the spec as written; for a URL, the served reward's name."""
    return spec.rstrip("/").rsplit("/", 1)[-1] if is_url(spec) else spec


def split_options(pairs: list[str], labels: list[str]) -> dict[str, list[str]]:
    """LABEL.KEY=VALUE pairs -> {label: ["KEY=VALUE", ...]} (the longest label that prefixes the pair wins:
    a module.path:attr label holds dots itself)."""
    out: dict[str, list[str]] = {label: [] for label in labels}
    for pair in pairs:
        matches = [label for label in labels if pair.startswith(label + ".")]
        if not matches:
            raise UsageError(f"with a composite reward, --reward-opt takes COMPONENT.KEY=VALUE, got {pair!r}",
                             hint=f"components: {', '.join(labels)} (e.g. --reward-opt {labels[-1]}.KEY=VALUE)")
        label = max(matches, key=len)
        out[label].append(pair[len(label) + 1:])
    return out


def single_reward(spec: str, pairs: list[str]) -> Scorer:
    """One reward by spec: a URL is a remote reward (arlctl/rewards/server.py), anything else the registry's."""
    options = parse_env_options(pairs, "--reward-opt")
    if is_url(spec):
        from arlctl.rewards.server import RemoteReward

        return RemoteReward(spec, options)
    return get_reward(spec, **options)


def build_reward(spec: str, pairs: list[str]) -> Scorer:
    """The reward `--reward SPEC --reward-opt PAIR...` names (not `auto`, which the CLI builds)."""
    if not is_expression(spec):
        return single_reward(spec, pairs)
    terms = parse_expression(spec)
    labels = [component_label(name) for _, name in terms]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise UsageError(f"--reward {spec!r} names {', '.join(twice)} more than once",
                         hint="give each component once, with the sum of its weights")
    options = split_options(pairs, labels)
    return CompositeReward([Component(label, weight, name, single_reward(name, options[label]))
                            for (weight, name), label in zip(terms, labels, strict=True)])


def _weighted(weight: float, version: str) -> str:
    return version if weight == 1.0 else f"{weight:g}*{version}"


class CompositeReward:
    """A weighted sum of rewards (see the module docstring); the stage calls score_batch."""

    name = NAME
    cacheable = False  # each component has its own cache entries, so a changed weight re-runs nothing

    def __init__(self, components: list[Component]):
        if not components:
            raise UsageError("a composite reward needs at least one component")
        for c in components:
            if not math.isfinite(c.weight):
                raise UsageError(f"the weight of {c.label} must be a finite number, not {c.weight}")
        self.components = components
        self.version = "composite(" + "+".join(_weighted(c.weight, c.reward.version) for c in components) + ")"

    async def score_batch(self, items: list[Item], ctx: ScoreContext, done: Done) -> None:
        """Score every component over all items (concurrently), then add each row's parts up."""
        parts = await asyncio.gather(*(score_items(c.reward, items, ctx) for c in self.components))
        for j in range(len(items)):
            done(j, self.combine([p[j] for p in parts]))

    def combine(self, results: list[Scored]) -> Scored:
        """One row's total from its components' (reward, components, info), in component order."""
        total, components, missing = 0.0, {}, []
        info: dict[str, Any] = {"parts": {}, "weights": {c.label: c.weight for c in self.components}}
        for c, (value, parts, part_info) in zip(self.components, results, strict=True):
            info["parts"][c.label] = part_info
            if value is None:
                missing.append(f"component {c.label} gave no reward ({part_info.get('error', 'no cause given')})")
                continue
            components[c.label] = value
            # A part that only repeats the component (judge's {"judge": r}) is not written twice.
            components.update({f"{c.label}.{name}": v for name, v in (parts or {}).items()
                               if not (name == c.label and v == value)})
            total += c.weight * value
        if missing:  # never a partial sum: a missing judge is not a judge that said 0
            return None, None, {**info, "error": "; ".join(missing), "scored_components": components}
        return total, components, info
