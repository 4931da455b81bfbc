"""Rubrics of the model-based rewards (`--reward judge`, `--reward genrm`): what to ask, and how to read the reply.

A rubric is a YAML file. `rubric=NAME` takes one shipped beside this module (default, math, pairwise,
listwise); `rubric=PATH` any file. Keys:

    kind:      judge (grade one trajectory; the default), pairwise or listwise (genrm: compare members)
    system:    optional system message
    template:  the user message, with {field} slots (below); other braces are left as written
    verdict:   a regex with one group; the LAST match in the judge's reply is the verdict
               (matched ignoring case, ^ and $ at line ends)
    scores:    verdict -> score in [0, 1], e.g. {PASS: 1, FAIL: 0} (verdicts compared ignoring case)
    scale:     [low, high] instead of scores: a numeric verdict v scores (v - low) / (high - low);
               a verdict outside the range is unparseable
    step_template: (judge only, optional) the message that grades one assistant turn (`steps=1`)
    max_tokens:    the judge's reply budget (default 256)
    max_field_chars: longer field values are cut in the middle, marked, and listed in reward_info (6000)

Fields by kind:
    judge:     {task} the task as JSON, {prompt} its question text, {answer} the final_state,
               {response} the policy's transcript, {gold} the task's reference `answer`
    step:      {task} {prompt} {gold}, {step} the turn's text, {index} its number (1-based), {previous}
    pairwise:  {task} {prompt} {gold}, {response_a} {response_b} {answer_a} {answer_b}; the score is how
               much A is preferred (1 = A, 0 = B, 0.5 = a tie)
    listwise:  {task} {prompt} {gold}, {responses} (numbered 1..n), {n}; the verdict is a ranking of all
               n numbers, best first ("3 > 1 > 2"); no scores or scale

A slot naming an unknown field is a usage error when the rubric is loaded, as is a task without an
`answer` for a rubric that uses {gold} (that row gets reward null with the cause). The rubric's content
hash (sha256 of the file's bytes) is part of the reward's version: an edited rubric is another reward.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from arlctl.errors import UsageError

HERE = Path(__file__).resolve().parent
KINDS = ("judge", "pairwise", "listwise")
FIELDS = {
    "judge": {"task", "prompt", "answer", "response", "gold"},
    "step": {"task", "prompt", "gold", "step", "index", "previous"},
    "pairwise": {"task", "prompt", "gold", "response_a", "response_b", "answer_a", "answer_b"},
    "listwise": {"task", "prompt", "gold", "responses", "n"},
}
_SLOT = re.compile(r"\{([a-z_]+)\}")
QUESTION_KEYS = ("question", "problem", "prompt", "problem_statement", "instruction")
NO_ANSWER = "(no final answer)"


class FieldMissing(Exception):
    """The row lacks a field the rubric needs (e.g. {gold} without a task `answer`): a row error."""


@dataclass(frozen=True)
class Rubric:
    name: str
    digest: str  # first 12 hex digits of the sha256 of the file's bytes
    kind: str
    template: str
    verdict: re.Pattern[str]
    system: str | None = None
    scores: dict[str, float] | None = None  # upper-cased verdict -> score
    scale: tuple[float, float] | None = None
    step_template: str | None = None
    max_tokens: int = 256
    max_field_chars: int = 6000
    uses: frozenset[str] = field(default_factory=frozenset)  # fields the templates name

    @property
    def label(self) -> str:
        """What reward_version and reward_info name this rubric by: name@digest."""
        return f"{self.name}@{self.digest}"

    def messages(self, values: dict[str, Any], step: bool = False) -> tuple[list[dict[str, str]], list[str]]:
        """The chat messages for one request, and the fields that were cut to max_field_chars."""
        template = self.step_template if step else self.template
        assert template is not None
        cut: list[str] = []

        def fill(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in values:
                return match.group(0)  # not a field of this kind: checked at load, so literal text
            text = str(values[name])
            if len(text) > self.max_field_chars:
                cut.append(name)
                text = shorten(text, self.max_field_chars)
            return text

        user = _SLOT.sub(fill, template)
        messages = [{"role": "system", "content": self.system}] if self.system else []
        return [*messages, {"role": "user", "content": user}], cut

    def read_verdict(self, reply: str) -> tuple[float, str]:
        """(score in [0, 1], raw verdict) from the judge's reply; ValueError naming why it cannot be read."""
        matches = list(self.verdict.finditer(reply))
        if not matches:
            raise ValueError(f"unparseable verdict: no match of /{self.verdict.pattern}/ in the judge's reply")
        raw = (matches[-1].group(1) or "").strip()
        if self.scores is not None:
            if raw.upper() not in self.scores:
                raise ValueError(f"unparseable verdict: {raw[:40]!r} is not one of {', '.join(self.scores)}")
            return self.scores[raw.upper()], raw
        low, high = self.scale  # type: ignore[misc]
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"unparseable verdict: {raw[:40]!r} is not a number") from None
        if not low <= value <= high:
            raise ValueError(f"unparseable verdict: {value:g} is outside the scale [{low:g}, {high:g}]")
        return (value - low) / (high - low), raw


def shorten(text: str, limit: int) -> str:
    """`text` cut in the middle to about `limit` characters, with a marker saying how much went."""
    keep = max(limit // 2, 1)
    return f"{text[:keep]}\n[... {len(text) - 2 * keep} characters cut ...]\n{text[-keep:]}"


def question(task: dict[str, Any]) -> str:
    """The task's question text ({prompt}): its first question-like field, else the task as JSON."""
    for key in QUESTION_KEYS:
        if isinstance(task.get(key), str) and task[key].strip():
            return task[key].strip()
    return json.dumps(task, sort_keys=True, default=str)


def task_values(task: dict[str, Any], uses: frozenset[str]) -> dict[str, str]:
    """{task}, {prompt} and {gold} of one task; FieldMissing when the rubric uses {gold} and there is none."""
    values = {"task": json.dumps(task, sort_keys=True, default=str), "prompt": question(task)}
    if "gold" in uses:
        if task.get("answer") is None:
            raise FieldMissing("the rubric uses {gold} but the task has no 'answer' field")
        values["gold"] = str(task["answer"]).rsplit("####", 1)[-1].strip()  # GSM8K: the part after ####
    return values


def shipped() -> list[str]:
    """Names of the rubrics shipped with arlctl."""
    return sorted(p.stem for p in HERE.glob("*.yaml"))


def resolve(spec: str) -> Path:
    """The file a `rubric=` option names: an existing path, else a shipped rubric's name."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path.resolve()
    if (HERE / f"{spec}.yaml").is_file():
        return HERE / f"{spec}.yaml"
    raise UsageError(f"rubric {spec!r} is neither a file nor a shipped rubric",
                     hint=f"shipped: {', '.join(shipped())}; or give a YAML file (docs/environments.md: model-based rewards)")


def load(spec: str, kinds: tuple[str, ...] = KINDS) -> Rubric:
    """The rubric `spec` names, checked; a UsageError naming the file and the problem otherwise.

    Read once per process and path: the version computed when the reward was built is the content used."""
    rubric = _load(str(resolve(spec)))
    if rubric.kind not in kinds:
        raise UsageError(f"rubric {spec!r} is of kind {rubric.kind!r}; this reward takes {' or '.join(kinds)}")
    return rubric


@lru_cache(maxsize=64)
def _load(path: str) -> Rubric:
    raw = Path(path).read_bytes()
    try:
        doc = yaml.safe_load(raw.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as err:
        raise UsageError(f"rubric {path}: not readable YAML ({' '.join(str(err).split())[:200]})") from None
    if not isinstance(doc, dict):
        raise UsageError(f"rubric {path}: expected a mapping of keys (template, verdict, ...)")
    return _build(path, hashlib.sha256(raw).hexdigest()[:12], doc)


def _build(path: str, digest: str, doc: dict[str, Any]) -> Rubric:
    def bad(why: str) -> UsageError:
        return UsageError(f"rubric {path}: {why}", hint="see docs/environments.md: model-based rewards (rubric files)")

    unknown = set(doc) - {"name", "kind", "system", "template", "verdict", "scores", "scale", "step_template",
                          "max_tokens", "max_field_chars", "description"}
    if unknown:
        raise bad(f"unknown keys {', '.join(sorted(unknown))}")
    kind = str(doc.get("kind", "judge"))
    if kind not in KINDS:
        raise bad(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    template, step_template = doc.get("template"), doc.get("step_template")
    if not isinstance(template, str) or not template.strip():
        raise bad("needs a non-empty `template`")
    if step_template is not None and (kind != "judge" or not isinstance(step_template, str)):
        raise bad("`step_template` is a string, and only judge rubrics have one")
    uses = _check_slots(template, FIELDS[kind], bad) | (_check_slots(step_template, FIELDS["step"], bad)
                                                        if step_template else frozenset())
    try:
        verdict = re.compile(str(doc.get("verdict", "")), re.IGNORECASE | re.MULTILINE)
    except re.error as err:
        raise bad(f"`verdict` is not a valid regex: {err}") from None
    if verdict.groups < 1 or not verdict.pattern:
        raise bad("`verdict` must be a regex with one capture group, e.g. 'Score: (\\d+)'")
    scores, scale = _mapping(doc, kind, bad)
    return Rubric(name=str(doc.get("name") or Path(path).stem), digest=digest, kind=kind, template=template,
                  verdict=verdict, system=doc.get("system") or None, scores=scores, scale=scale,
                  step_template=step_template, max_tokens=_positive(doc, "max_tokens", 256, bad),
                  max_field_chars=_positive(doc, "max_field_chars", 6000, bad), uses=uses)


def _check_slots(template: str, allowed: set[str], bad: Any) -> frozenset[str]:
    named = set(_SLOT.findall(template))
    if named - allowed:
        raise bad(f"unknown fields {', '.join('{' + n + '}' for n in sorted(named - allowed))} "
                  f"(this kind has {', '.join('{' + n + '}' for n in sorted(allowed))})")
    return frozenset(named)


def _mapping(doc: dict[str, Any], kind: str, bad: Any) -> tuple[dict[str, float] | None, tuple[float, float] | None]:
    scores, scale = doc.get("scores"), doc.get("scale")
    if kind == "listwise":
        if scores is not None or scale is not None:
            raise bad("a listwise rubric's verdict is a ranking: no `scores` or `scale`")
        return None, None
    if (scores is None) == (scale is None):
        raise bad("give exactly one of `scores` (verdict -> score) or `scale` ([low, high])")
    if scores is not None:
        if not isinstance(scores, dict) or not scores:
            raise bad("`scores` must map verdicts to numbers")
        try:
            mapped = {str(k).upper(): float(v) for k, v in scores.items()}
        except (TypeError, ValueError):
            raise bad("`scores` must map verdicts to numbers") from None
        if not all(0.0 <= v <= 1.0 for v in mapped.values()):
            raise bad("every score must lie in [0, 1]")
        return mapped, None
    try:
        low, high = (float(x) for x in scale)
    except (TypeError, ValueError):
        raise bad("`scale` must be [low, high]") from None
    if not low < high:
        raise bad("`scale` needs low < high")
    return None, (low, high)


def _positive(doc: dict[str, Any], key: str, default: int, bad: Any) -> int:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad(f"`{key}` must be a positive integer")
    return value
