"""The `reasoning-gym` environment: the procedural datasets of the reasoning-gym package as tasks and reward.

Tasks (`--tasks 'reasoning-gym:leg_counting:2,basic_arithmetic?n=300&seed=1'`, or
`builtin:reasoning-gym?datasets=...&n=...`): comma-separated dataset names, each with an optional
`:WEIGHT` (a positive number, default 1). `n` (default 100) tasks in all are split by weight with the
largest-remainder rule (2:1 of 300 -> 200 and 100; every named dataset must get at least one), `seed`
(default 0) seeds every dataset, and `DATASET.FIELD=VALUE` sets a field of that dataset's config
(`leg_counting.max_animals=3`; VALUE is read as JSON when it parses, else as a string). The tasks of the
datasets are interleaved in proportion, so `--limit` keeps the mix. A task is
    {task_id: "rg-leg_counting-s1-n200-17", env, dataset, seed, size, index, config, question, rg_version}
where (dataset, seed, size, config) name one generated dataset of `size` entries and `index` one entry.
(`size` is in the id because a few generators, e.g. list_functions, depend on it.)

Regenerated, never trusted: the task row holds no answer. The reward regenerates the entry from
(dataset, seed, size, config, index), checks that its question is the row's question, and scores with
the reference entry; a row whose question differs (a forged row, or another reasoning-gym version) gets
reward null with the cause. Generation runs in a child interpreter with PYTHONHASHSEED=0 and the global
`random` seeded before each dataset, because some generators iterate over sets of strings (ransom_note,
isomorphic_strings: hash order) or draw from the global RNG (list_functions); in process they would give
other questions in the reward stage's process than in the rollout's. The child lives as long as its
process (importing reasoning-gym takes seconds), is killed past GENERATE_TIMEOUT_S and restarted on the
next request; a generator that failed so is an infrastructure failure (reward null, info.infra). Entries
and dataset objects are cached per process. String config values may not hold a path (`/`, `\\`, `..`): a row must not make the
generator read files.

Env: single turn by default: the system prompt asks for the final answer in `<answer>...</answer>`, the
model's one reply ends the episode and is the final_state. `--env-opt tools=calculator` adds the math
env's calculator tool (hermes tool calls; the episode ends at the first reply with an answer, or with
neither an answer nor a tool call).

Reward (`score`, REWARD_VERSION "reasoning-gym-1+rg<library version>"): the graded text is final_state
(the last reply), else the whole response text (an episode a bound cut). Its answer is
    1. the content of the last `<answer>...</answer>`, stripped; else
    2. after the last "answer:" or "answer is" (any case: `Answer: 7`, `**Final answer:** 7`, `So the
       answer is 7.`), the rest of that line without markdown `*`/`` ` `` and one final full stop; else
    3. with `--reward-opt fallback=last_line`, the last non-empty line; else none.
No answer: reward 0 (the policy's fault), info.note says so. Otherwise reward = the dataset's own
`score_answer(answer, entry)` in [0, 1] (partial credit is the dataset's). components: score, and
format = 1 when the answer came from the tag the system prompt asks for (info.form says which rule). A task that cannot be regenerated (unknown
dataset, bad fields, a different question, a generator that failed) is reward null with info.error.
"""

from __future__ import annotations

import atexit
import difflib
import hashlib
import json
import math
import os
import pickle
import re
import struct
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from importlib import metadata
from typing import Any
from urllib.parse import parse_qsl

from arlctl.envs.base import Action, EnvReset, StepResult
from arlctl.envs.calculator import calculate
from arlctl.envs.math import CALCULATOR_TOOL
from arlctl.envs.registry import register_env, register_reward
from arlctl.envs.tasks import int_option, register_task_scheme, register_task_source
from arlctl.errors import TerminalError, UsageError
from arlctl.tools.calls import ToolCall
from arlctl.tools.hermes import parse_hermes, strip_tool_calls
from arlctl.tools.render import format_parse_error, format_tool_result

try:
    RG_VERSION = metadata.version("reasoning-gym")
except metadata.PackageNotFoundError:  # the registry turns this into "env 'reasoning-gym' is not available"
    raise ImportError("the reasoning-gym package is not installed (pip install reasoning-gym)") from None

ENV_NAME = "reasoning-gym"
ENV_VERSION = "reasoning-gym-1"
REWARD_VERSION = f"reasoning-gym-1+rg{RG_VERSION}"  # a new library may score differently
DEFAULT_N = 100
MAX_SIZE = 100_000  # entries per generated dataset: a row cannot ask the reward for a billion
MAX_ANSWER_CHARS = 10_000
GENERATE_TIMEOUT_S = 1800.0
SPEC_EXAMPLE = "reasoning-gym:leg_counting:2,basic_arithmetic:1?n=300&seed=1"

SYSTEM_PROMPT = ("Solve the task. Think briefly if you need to, then give your final answer inside answer tags, "
                 "for example <answer>42</answer>. Put only the answer itself inside the tags.")
SYSTEM_PROMPT_TOOLS = SYSTEM_PROMPT.replace("Think briefly", "You may use the calculator tool for arithmetic. "
                                            "Think briefly")


# ---- which entries: the generation key, spec parsing -----------------------------------------------------


@dataclass(frozen=True)
class DatasetKey:
    """What regenerates one dataset's entries (the config as canonical JSON, so the key hashes)."""

    name: str
    seed: int
    size: int
    config: str = "{}"

    @property
    def config_dict(self) -> dict[str, Any]:
        return json.loads(self.config)


def _canonical(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def known_datasets() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def check_dataset(name: str) -> None:
    """A UsageError naming close matches and a few known datasets for a name reasoning-gym lacks."""
    known = known_datasets()
    if name in known:
        return
    close = difflib.get_close_matches(name, known, n=3)
    hint = (f"did you mean {', '.join(close)}? " if close else "") + \
        f"known: {', '.join(known[:8])}, ... ({len(known)} in all)"
    raise UsageError(f"reasoning-gym has no dataset {name!r}", hint=hint)


def _check_config_value(value: Any, where: str) -> None:
    """JSON values only; no string that could be a path (some configs name a data file)."""
    if isinstance(value, str):
        if "/" in value or "\\" in value or ".." in value:
            raise UsageError(f"{where}: {value!r} looks like a path; reasoning-gym config strings may not name files")
    elif isinstance(value, list):
        for item in value:
            _check_config_value(item, where)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_config_value(str(key), where)
            _check_config_value(item, where)
    elif not (value is None or isinstance(value, bool | int) or (isinstance(value, float) and math.isfinite(value))):
        raise UsageError(f"{where}: {value!r} is not a JSON value")


def _parse_weights(text: str, where: str) -> list[tuple[str, float]]:
    """`a:2,b,c:0.5` -> [("a", 2.0), ("b", 1.0), ("c", 0.5)]."""
    items: list[tuple[str, float]] = []
    for position, item in enumerate(text.split(","), start=1):
        name, colon, raw = item.strip().partition(":")
        if not name:
            raise UsageError(f"{where}: dataset {position} is empty", hint=f"e.g. {SPEC_EXAMPLE}")
        weight = 1.0
        if colon:
            try:
                weight = float(raw)
            except ValueError:
                raise UsageError(f"{where}: weight {raw!r} of {name!r} is not a number",
                                 hint=f"e.g. {SPEC_EXAMPLE}") from None
            if not (math.isfinite(weight) and weight > 0):
                raise UsageError(f"{where}: weight of {name!r} must be a positive finite number, got {raw!r}")
        if any(name == seen for seen, _ in items):
            raise UsageError(f"{where}: dataset {name!r} is given twice")
        check_dataset(name)
        items.append((name, weight))
    return items


def split_counts(n: int, weights: list[float]) -> list[int]:
    """n split in proportion to weights, largest remainder first (ties: the earlier dataset)."""
    total = sum(weights)
    quotas = [n * w / total for w in weights]
    counts = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    return counts


def parse_spec(datasets: str, options: dict[str, str], where: str) -> list[tuple[DatasetKey, float]]:
    """The datasets of a task spec as generation keys with their weights (options are consumed)."""
    weights = _parse_weights(datasets, where)
    n = int_option(options, "n", DEFAULT_N, where)
    seed = int_option(options, "seed", 0, where)
    if n < 1:
        raise UsageError(f"{where}: n must be >= 1, got {n}")
    configs: dict[str, dict[str, Any]] = {name: {} for name, _ in weights}
    for key in list(options):
        name, dot, field = key.partition(".")
        if not dot or name not in configs or not field:
            raise UsageError(f"{where}: unknown option {key!r}",
                             hint="allowed: n, seed, DATASET.FIELD=VALUE for a dataset of the spec")
        raw = options.pop(key)
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw  # a bare word: a string
        _check_config_value(value, f"{where}: {key}")
        if field in ("seed", "size"):
            raise UsageError(f"{where}: {key}: seed and size are set by the spec (seed=..., n=...)")
        configs[name][field] = value
    counts = split_counts(n, [w for _, w in weights])
    for (name, weight), count in zip(weights, counts, strict=True):
        if count == 0:
            raise UsageError(f"{where}: n={n} leaves dataset {name!r} (weight {weight:g}) without a task",
                             hint="raise n or that dataset's weight")
    return [(DatasetKey(name, seed, count, _canonical(configs[name])), weight)
            for (name, weight), count in zip(weights, counts, strict=True)]


def task_id(key: DatasetKey, index: int) -> str:
    tag = "" if key.config == "{}" else "-c" + hashlib.sha256(key.config.encode()).hexdigest()[:8]
    return f"rg-{key.name}-s{key.seed}-n{key.size}{tag}-{index}"


def make_tasks(keys: list[DatasetKey]) -> list[dict[str, Any]]:
    """One task per entry of every dataset, interleaved in proportion (entry i of n at (i + 0.5) / n)."""
    generated = generate(keys)
    placed = []
    for position, key in enumerate(keys):
        result = generated[key]
        if isinstance(result, str):
            raise UsageError(f"reasoning-gym dataset {key.name!r} with config {key.config}: {result}")
        for index, entry in enumerate(result):
            task = {"task_id": task_id(key, index), "env": ENV_NAME, "dataset": key.name, "seed": key.seed,
                    "size": key.size, "index": index, "config": key.config_dict, "question": entry["question"],
                    "rg_version": RG_VERSION}
            placed.append(((index + 0.5) / key.size, position, task))
    placed.sort(key=lambda item: (item[0], item[1]))
    return [task for _, _, task in placed]


@register_task_scheme(ENV_NAME)
def _scheme(rest: str) -> list[dict[str, Any]]:
    """`reasoning-gym:DATASETS?OPTIONS` (see the module docstring)."""
    datasets, _, query = rest.partition("?")
    where = f"reasoning-gym:{rest}"
    options = _query(query, where)
    return make_tasks([key for key, _ in parse_spec(datasets, options, where)])


@register_task_source(ENV_NAME)
def _builtin(options: dict[str, str]) -> list[dict[str, Any]]:
    """`builtin:reasoning-gym?datasets=leg_counting,basic_arithmetic&n=...` (the default: both, n=100)."""
    datasets = options.pop("datasets", "leg_counting,basic_arithmetic")
    return make_tasks([key for key, _ in parse_spec(datasets, options, "builtin:reasoning-gym")])


def _query(query: str, where: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key in options:
            raise UsageError(f"{where}: option {key} given twice")
        options[key] = value
    return options


# ---- generation: in a child interpreter, so entries do not depend on this process's hash seed -------------

# The child: run with PYTHONHASHSEED=0. Per request, one JSON line [[name, seed, size, config], ...] on stdin;
# the answer, a pickled list of ("ok", entries) / ("error", message), goes to the real stdout after its
# 8-byte length. A generator that prints writes to stderr instead. It exits when stdin closes.
_CHILD = r"""
import json, pickle, random, struct, sys
out, sys.stdout = sys.stdout.buffer, sys.stderr
import reasoning_gym
for line in sys.stdin.buffer:
    results = []
    for name, seed, size, config in json.loads(line):
        random.seed(0)
        try:
            import numpy
            numpy.random.seed(0)
        except ImportError:
            pass
        try:
            dataset = reasoning_gym.create_dataset(name, seed=seed, size=size, **config)
            results.append(("ok", [dataset[i] for i in range(size)]))
        except Exception as exc:
            results.append(("error", f"{type(exc).__name__}: {exc}".strip()))
    data = pickle.dumps(results)
    out.write(struct.pack(">Q", len(data)) + data)
    out.flush()
"""


class GenerationFailed(Exception):
    """The generator process itself failed (not a bad dataset or config): an infrastructure failure."""


class _Generator:
    """One long-lived child interpreter per process (importing reasoning-gym costs seconds), restarted
    after it dies or is killed for taking longer than GENERATE_TIMEOUT_S."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.stderr: Any = None
        self.lock = threading.Lock()
        atexit.register(self.stop)

    def request(self, keys: list[DatasetKey]) -> list[tuple[str, Any]]:
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            proc, timed_out = self.proc, threading.Event()

            def kill() -> None:
                timed_out.set()
                proc.kill()

            timer = threading.Timer(GENERATE_TIMEOUT_S, kill)
            timer.start()
            try:
                request = [[k.name, k.seed, k.size, k.config_dict] for k in keys]
                proc.stdin.write(json.dumps(request).encode() + b"\n")
                proc.stdin.flush()
                header = proc.stdout.read(8)
                data = proc.stdout.read(struct.unpack(">Q", header)[0]) if len(header) == 8 else b""
            except OSError:  # the child is gone (a broken pipe): reported below
                header, data = b"", b""
            finally:
                timer.cancel()
            if timed_out.is_set():
                self.stop()
                raise GenerationFailed(f"generating {', '.join(k.name for k in keys)} took over "
                                       f"{GENERATE_TIMEOUT_S:g} s")
            if len(header) < 8 or len(data) < struct.unpack(">Q", header)[0]:
                raise GenerationFailed(f"the reasoning-gym generator process died: {self._stop_with_tail()}")
            return pickle.loads(data)  # our own child's output: it ran only the generator code above

    def _start(self) -> None:
        self.stop()
        # A file, not a pipe (a pipe nobody reads could fill up and block the child); it lives as long as the child.
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr,
                                     env={**os.environ, "PYTHONHASHSEED": "0"})

    def _stop_with_tail(self) -> str:
        code = self.proc.wait() if self.proc is not None else None
        self.stderr.seek(0)
        lines = self.stderr.read().decode(errors="replace").strip().splitlines()
        self.stop()
        return f"exit {code}: {lines[-1][:300] if lines else 'no output'}"

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout):
                pipe.close()
            self.proc = None
        if self.stderr is not None:
            self.stderr.close()
            self.stderr = None


_GENERATOR = _Generator()
_ENTRIES: dict[DatasetKey, list[dict[str, Any]] | str] = {}  # entries, or why the dataset cannot be made
_DATASETS: dict[DatasetKey, Any] = {}  # the dataset objects whose score_answer grades


def generate(keys: list[DatasetKey]) -> dict[DatasetKey, list[dict[str, Any]] | str]:
    """Each key's entries (or the generator's error message), from the cache or the child process."""
    missing = list(dict.fromkeys(k for k in keys if k not in _ENTRIES))
    for key in missing:
        if not 1 <= key.size <= MAX_SIZE:
            _ENTRIES[key] = f"size {key.size} is outside 1..{MAX_SIZE}"
    missing = [k for k in missing if k not in _ENTRIES]
    if missing:
        for key, (kind, value) in zip(missing, _GENERATOR.request(missing), strict=True):
            _ENTRIES[key] = value if kind == "ok" else str(value)[:500]
    return {key: _ENTRIES[key] for key in keys}


def _dataset(key: DatasetKey) -> Any:
    if key not in _DATASETS:
        import reasoning_gym

        _DATASETS[key] = reasoning_gym.create_dataset(key.name, seed=key.seed, size=key.size, **key.config_dict)
    return _DATASETS[key]


def task_key(task: dict[str, Any]) -> tuple[DatasetKey, int]:
    """The generation key and index a task names; TerminalError with the cause when its fields are wrong."""
    name, index, config = task.get("dataset"), task.get("index"), task.get("config", {})
    if not isinstance(name, str) or not name:
        raise TerminalError("task has no 'dataset' name")
    try:
        check_dataset(name)
    except UsageError as exc:
        raise TerminalError(str(exc)) from None
    fields = {"seed": task.get("seed"), "size": task.get("size"), "index": index}
    for field, value in fields.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise TerminalError(f"task field {field!r} must be an integer, got {json.dumps(value)[:40]}")
    if not isinstance(config, dict):
        raise TerminalError("task field 'config' must be an object")
    try:
        _check_config_value(config, "task config")
    except UsageError as exc:
        raise TerminalError(str(exc)) from None
    key = DatasetKey(name, fields["seed"], fields["size"], _canonical(config))
    if not 0 <= index < key.size:
        raise TerminalError(f"task index {index} is outside 0..{key.size - 1}")
    return key, index


def reference_entry(task: dict[str, Any]) -> tuple[DatasetKey, dict[str, Any]]:
    """The regenerated entry of a task, checked against its question (TerminalError with the cause if not)."""
    key, index = task_key(task)
    result = generate([key])[key]
    if isinstance(result, str):
        raise TerminalError(f"dataset {key.name!r} cannot be generated with config {key.config}: {result}")
    entry = result[index]
    if entry["question"] != task.get("question"):
        raise TerminalError(f"the task's question is not the one {key.name} generates at index {index} "
                            f"(reasoning-gym {RG_VERSION}; the task says {task.get('rg_version', 'nothing')}): "
                            "a forged or edited row, or another library version")
    return key, entry


# ---- answer extraction and the reward ----------------------------------------------------------------------

_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
# "answer:" / "answer is" / "answer is:" and the rest of its line (small models write "So, the answer is 15.")
_ANSWER_PHRASE_RE = re.compile(r"\banswer(?:[ \t]+is\b[ \t]*:?|[ \t]*[:：])[ \t]*([^\n]*)", re.IGNORECASE)
FALLBACKS = ("none", "last_line")


def _clean_phrase(rest: str) -> str:
    rest = rest.strip().strip("*`").strip()
    return rest[:-1].rstrip() if rest.endswith(".") else rest


def extract_answer(text: str, fallback: str = "none") -> tuple[str | None, str]:
    """(answer or None, where it came from: answer_tag | answer_phrase | last_line | none)."""
    tags = _ANSWER_TAG_RE.findall(text)
    if tags:
        return tags[-1].strip(), "answer_tag"
    phrases = [_clean_phrase(m) for m in _ANSWER_PHRASE_RE.findall(text)]
    phrases = [p for p in phrases if p]
    if phrases:
        return phrases[-1], "answer_phrase"
    if fallback == "last_line":
        rest = [line.strip() for line in text.splitlines() if line.strip()]
        if rest:
            return rest[-1], "last_line"
    return None, "none"


def score(final_state: str | None, task: dict[str, Any], response_text: str, *,
          fallback: str = "none") -> tuple[float | None, dict[str, float], dict[str, Any]]:
    """The reasoning-gym reward (module docstring): the dataset's own score of the extracted answer."""
    if fallback not in FALLBACKS:
        raise UsageError(f"reasoning-gym reward: fallback must be one of {', '.join(FALLBACKS)}, got {fallback!r}")
    info: dict[str, Any] = {"dataset": task.get("dataset"), "index": task.get("index")}
    try:
        key, entry = reference_entry(task)
    except TerminalError as exc:
        return None, {}, {**info, "error": f"cannot regenerate the task: {exc}"}
    except GenerationFailed as exc:
        return None, {}, {**info, "error": str(exc), "infra": True}
    text = final_state if final_state is not None else (response_text or "")
    answer, source = extract_answer(text, fallback)
    info.update(source="final_state" if final_state is not None else "response_text", form=source,
                reference=str(entry["answer"])[:200])
    if answer is None or len(answer) > MAX_ANSWER_CHARS:
        note = "no final answer (no <answer> tag, no 'answer:' / 'answer is')" if answer is None else \
            f"answer longer than {MAX_ANSWER_CHARS} characters"
        return 0.0, {"score": 0.0, "format": 0.0}, {**info, "note": note}
    info["answer"] = answer[:200]
    try:
        value = float(_dataset(key).score_answer(answer, entry))
    except Exception as exc:  # the library's scorer broke on this answer: no grade, not the policy's 0
        return None, {}, {**info, "error": f"{key.name}.score_answer failed: {type(exc).__name__}: {exc}"[:400]}
    form = 1.0 if source == "answer_tag" else 0.0
    return value, {"score": value, "format": form}, info


# ---- the environment ---------------------------------------------------------------------------------------


class ReasoningGymEnv:
    """One episode of one reasoning-gym task: one reply (or calculator turns, then a reply)."""

    name = ENV_NAME
    version = ENV_VERSION
    final_state_truncated = None

    def __init__(self, tools: str = "none", max_calls_per_turn: int = 8):
        if tools not in ("none", "calculator"):
            raise UsageError(f"reasoning-gym env: tools must be 'none' or 'calculator', got {tools!r}")
        self.tools = [CALCULATOR_TOOL] if tools == "calculator" else []
        # hermes: the loop reads calculator calls with the chat family's parser; None: parse_action below
        self.tool_format = "hermes" if self.tools else None
        self.max_calls_per_turn = max_calls_per_turn
        self.task: dict[str, Any] | None = None

    def parse_action(self, text: str) -> Action:
        if not self.tools:
            return Action(text=text)  # single turn: the whole reply is the answer
        calls, errors = parse_hermes(text, self.tools)
        return Action(text=text, tool_calls=calls, parse_errors=errors)

    async def reset(self, task: dict[str, Any]) -> EnvReset:
        question = task.get("question")
        if not isinstance(question, str) or not question.strip():
            raise TerminalError(f"reasoning-gym task {task.get('task_id')!r} has no 'question' text")
        self.task = task
        system = SYSTEM_PROMPT_TOOLS if self.tools else SYSTEM_PROMPT
        return EnvReset(messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
                        tools=list(self.tools))

    async def step(self, action: Action) -> StepResult:
        if self.task is None:
            raise TerminalError("ReasoningGymEnv.step called before reset")
        reply = strip_tool_calls(action.text) if self.tools else action.text
        answered = extract_answer(reply)[0] is not None
        if answered or not (action.tool_calls or action.parse_errors):
            return StepResult(observations=[], done=True, final_state=reply,
                              finish_reason="submit" if answered else "stop")
        observations = [format_parse_error(error) for error in action.parse_errors]
        errors = [error.message for error in action.parse_errors]
        for index, call in enumerate(action.tool_calls):
            observation, error = self._run_call(index, call)
            observations.append(observation)
            if error is not None:
                errors.append(error)
        return StepResult(observations=observations, done=False, error="; ".join(errors) or None)

    def _run_call(self, index: int, call: ToolCall) -> tuple[dict[str, Any], str | None]:
        if index >= self.max_calls_per_turn:
            error = f"error: at most {self.max_calls_per_turn} calculator calls per turn; this call was skipped"
        elif call.name != "calculator":
            error = f"error: unknown tool {call.name!r}; available tools: calculator"
        elif not isinstance(call.arguments.get("expression"), str):
            error = 'error: calculator needs an "expression" string argument'
        else:  # a bad expression is an "error: ..." result: the model's arithmetic, not an env error
            return format_tool_result(call, calculate(call.arguments["expression"])), None
        return format_tool_result(call, error), error

    async def final_state(self) -> str | None:
        return None  # cut by a bound: the reward reads the response text

    async def close(self) -> None:
        self.task = None


register_env(ENV_NAME, ReasoningGymEnv, version=ENV_VERSION)
register_reward(ENV_NAME, score, REWARD_VERSION)
