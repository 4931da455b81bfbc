"""Silent loss in rollout (issue 12, class 5) and the cut swe diff (class 8), attacked through the real loop.

Before the fix, one lone surrogate in a task or in a model's tool call made a whole shard fail to flush
(0 of 12 rows written) or dropped groups with `errors: 0`, and a backend answering with a bad token id
dropped every group with exit 0. Here every attack runs through the real rollout loop (the real tiny
model, the real math calculator env or a real bwrap swe sandbox, the real shard writer) and, where exit
codes matter, through the real `arlctl rollout` CLI, and asserts: every row is written, every text in it
is valid UTF-8, every failure is a row status counted in the summary, and a run with no usable row
exits non-zero naming the cause.

Policies here are Policy-protocol objects around the real tokenizer or the real hf backend: a scripted
agent (like oracle:gold) that types a given reply, and a wrapper that corrupts the real model's output.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.envs.base import EnvReset, StepResult
from arlctl.inference.base import Generation
from arlctl.inference.chat import ChatCodec
from arlctl.inference.loader import load_policy
from arlctl.io.shards import Lineage, list_shards, read_shard
from arlctl.io.sink import GroupShardWriter
from arlctl.schemas.safe_text import parquet_safe
from arlctl.stages.agent_loop import RolloutConfig, Stats
from arlctl.stages.rollout import rollout

runner = CliRunner()
REPLACEMENT = "\ufffd"


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    """A failed generation is retried after 0.01 s doubling, not the default 0.5 s (3.5 s for a trajectory
    that fails all 3 retries). Through the CLI too: its RolloutConfig takes the default, which has no option.
    What is asserted is how many retries happen and how they end, never how long they waited."""
    names = [name for name in inspect.signature(RolloutConfig.__init__).parameters if name != "self"]
    defaults = RolloutConfig.__init__.__defaults__
    assert len(defaults) == len(names)  # every field has a default: they line up by position
    monkeypatch.setattr(RolloutConfig.__init__, "__defaults__",
                        tuple(0.01 if name == "retry_backoff" else d for name, d in zip(names, defaults)))
    assert RolloutConfig().retry_backoff == 0.01


@pytest.fixture(scope="module")
def tiny():
    pol = load_policy("tiny", max_batch=16, progress=False)
    yield pol
    asyncio.run(pol.close())


class ScriptedPolicy:
    """An agent that types `replies[turn]` (token ids from the real tokenizer, log-prob 0, ends with the
    template's end-of-message token), like oracle:gold. Stateless: the turn is read from the prompt."""

    def __init__(self, tokenizer: Any, replies: list[str]):
        self.tokenizer, self.replies, self.name, self.version = tokenizer, replies, "scripted", 0
        closing = ChatCodec(tokenizer).closing
        self.stop_ids = tokenizer(closing, add_special_tokens=False)["input_ids"][:1]

    async def generate(self, prompt_ids, sampling) -> Generation:
        turn = self.tokenizer.decode(prompt_ids).count("<|im_start|>assistant") - 1
        text = self.replies[min(turn, len(self.replies) - 1)]
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + self.stop_ids
        return Generation(ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop", version=self.version)

    async def reload(self, policy_dir, version):
        self.version = version

    async def close(self):
        return None


class CorruptingPolicy:
    """The real hf tiny policy, with its answer corrupted the way a broken backend would corrupt it.

    `corrupt(generation) -> generation` edits what the real model returned; `only` limits the damage to
    prompts that contain that text (one task), so the other trajectories of the run stay healthy.
    """

    def __init__(self, inner, corrupt, only: str | None = None):
        self.inner, self.corrupt, self.only = inner, corrupt, only
        self.name, self.version, self.tokenizer = inner.name, inner.version, inner.tokenizer
        self.max_context = getattr(inner, "max_context", None)

    async def generate(self, prompt_ids, sampling) -> Generation:
        gen = await self.inner.generate(prompt_ids, sampling)
        if self.only is None or self.only in self.tokenizer.decode(prompt_ids):
            gen = self.corrupt(gen)
        return gen

    async def reload(self, policy_dir, version):
        await self.inner.reload(policy_dir, version)

    def metrics(self):
        return {}

    async def close(self):
        return None  # the module fixture owns the real policy


def replace_id(value):
    def corrupt(gen: Generation) -> Generation:
        ids = list(gen.ids)
        ids[len(ids) // 2] = value
        return Generation(ids=ids, logprobs=gen.logprobs, finish_reason=gen.finish_reason, version=gen.version)

    return corrupt


def replace_logprobs(logprobs_of):
    def corrupt(gen: Generation) -> Generation:
        return Generation(ids=gen.ids, logprobs=logprobs_of(gen), finish_reason=gen.finish_reason,
                          version=gen.version)

    return corrupt


def write_tasks(path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def all_strings(value):
    """Every string inside a row (nested lists, dicts and map entries included)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from all_strings(k)
            yield from all_strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from all_strings(v)


def read_rows(out: str) -> list[dict[str, Any]]:
    rows = []
    for shard in list_shards(out):
        rows.extend(pq.read_table(shard).to_pylist())  # the raw file, not only our validating reader
        read_shard(shard)  # and the validating reader accepts it
    return rows


def assert_valid_utf8(rows):
    for row in rows:
        for text in all_strings(row):
            text.encode("utf-8")  # raises on a lone surrogate


def cli_rollout(monkeypatch, policy, args: list[str]):
    """The real `arlctl rollout` command, its policy loader handing back `policy`.

    The real tiny policy goes in wrapped, so the command's closing it leaves the module's copy alive."""
    import arlctl.stages.policy_job as policy_job

    if not isinstance(policy, CorruptingPolicy | ScriptedPolicy):
        policy = CorruptingPolicy(policy, lambda gen: gen)
    monkeypatch.setattr(policy_job, "load_resolved", lambda *a, **k: policy)  # the resolver's one load
    return runner.invoke(app, ["rollout", "--policy", "tiny", "--json", "-q", *args])


def summary_of(result) -> dict[str, Any]:
    return json.loads(result.stdout.strip().splitlines()[0])


# ------------------------------------------------------------------------------------ the text itself


@pytest.mark.parametrize(("text", "expected"), [
    ("plain ascii", "plain ascii"),
    ("ünïcode ✓ 你好 😀", "ünïcode ✓ 你好 😀"),
    ("lone \ud800 high", f"lone {REPLACEMENT} high"),
    ("lone \udfff low", f"lone {REPLACEMENT} low"),
    ("escaped byte \udcff", f"escaped byte {REPLACEMENT}"),  # surrogateescape of b"\xff"
    ("\ud83d\ude00", "😀"),  # a pair split over two code points is joined back
    ("\ude00\ud83d", REPLACEMENT * 2),  # a reversed pair is two lone surrogates
    ("nul \x00 kept", "nul \x00 kept"),  # NUL is valid UTF-8; terminal safety is show's job
])
def test_parquet_safe(text, expected):
    assert parquet_safe(text) == expected
    parquet_safe(text).encode("utf-8")


# ------------------------------------------------------------------------ lone surrogates, end to end


def test_lone_surrogate_in_task_file_through_the_cli(tmp_path, tiny, monkeypatch):
    """The JSONL escape \\ud800 makes json.loads yield a lone surrogate (in a value and in a key)."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", [
        '{"task_id": "s1", "question": "What is 2+2? \\ud800", "answer": "4"}',
        '{"task_id": "s2", "question": "What is 3+3?", "answer": "6", "note\\udcff": "\\udfff"}',
        '{"task_id": "s3", "question": "\\ud83d\\ude00 What is 1+1? \\ude00\\ud83d", "answer": "2"}',
    ])
    out = str(tmp_path / "out")
    result = cli_rollout(monkeypatch, tiny, ["--env", "math", "--tasks", tasks, "--out", out, "-G", "4",
                                             "--max-turns", "2", "--max-new-tokens", "8", "--seed", "0",
                                             "--flush-groups", "8"])
    assert result.exit_code == 0, result.output
    summary = summary_of(result)
    assert summary["rows_written"] == 12 and summary["groups"] == 3 and summary["errors"] == 0
    rows = read_rows(out)
    assert len(rows) == 12 and {r["status"] for r in rows} <= {"ok", "truncated"}
    assert_valid_utf8(rows)
    by_task = {r["task_id"]: r for r in rows}
    assert f"2+2? {REPLACEMENT}" in by_task["s1"]["prompt_text"]
    assert json.loads(by_task["s1"]["task"])["question"] == f"What is 2+2? {REPLACEMENT}"
    assert json.loads(by_task["s2"]["task"])[f"note{REPLACEMENT}"] == REPLACEMENT
    assert "😀 What is 1+1?" in by_task["s3"]["prompt_text"]


SURROGATE_CALLS = [
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+\\ud800"}}\n</tool_call>',
    '<tool_call>\n{"name": "calc\\udfffulator", "arguments": {"expression": "2*3"}}\n</tool_call>',
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "\\ud83d"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "calculator", "arguments": {"\\udcffexpression": "3"}}\n</tool_call>',
    'The answer is \\ud800 <tool_call>\n{"name": "calculator", "arguments": {"expression": "\\ud800\\ud800"}}'
    '\n</tool_call>',
]


def test_lone_surrogate_in_tool_calls_through_the_cli(tmp_path, tiny, monkeypatch):
    """A model writes JSON escapes for lone surrogates into its tool calls: 12 of 12 rows are written."""
    policy = ScriptedPolicy(tiny.tokenizer, SURROGATE_CALLS)
    out = str(tmp_path / "out")
    result = cli_rollout(monkeypatch, policy, ["--env", "math", "--tasks", "builtin:math?n=3&seed=1", "--out", out,
                                               "-G", "4", "--max-turns", "4", "--max-new-tokens", "64",
                                               "--flush-groups", "16"])
    assert result.exit_code == 0, result.output
    summary = summary_of(result)
    assert summary["rows_written"] == 12 and summary["shards_written"] == 1
    rows = read_rows(out)
    assert len(rows) == 12
    assert_valid_utf8(rows)
    for row in rows:
        assert row["num_turns"] == 4 and row["status"] == "ok"
        calls = [json.loads(t["tool_calls"]) for t in row["turns"]]
        assert calls[0][0]["arguments"]["expression"] == f"1+{REPLACEMENT}"
        assert calls[1] == []  # an unknown tool: a parse error the model sees, naming it escaped
        assert "unknown tool 'calc\\udfffulator'" in row["turns"][1]["observation"]
        assert calls[2][0]["arguments"] == {"expression": REPLACEMENT}
        assert "missing required argument(s): expression" in row["turns"][2]["observation"]  # the bad key
        assert calls[3][0]["arguments"]["expression"] == REPLACEMENT * 2
        # the env saw the safe text too: its observation is an ordinary calculator answer or error
        assert row["turns"][0]["observation"] is not None


class HostileEnv:
    """A plugin env that hands back what a careless one might: surrogates in its prompt and observation,
    a final state that is a dict, a reward_step that is a string."""

    name, version = "hostile", "1"

    async def reset(self, task):
        return EnvReset(messages=[{"role": "system", "content": "sys \ud800"},
                                  {"role": "user", "content": f"do {task['task_id']} \udfff"}], tools=[])

    async def step(self, action):
        return StepResult(observations=[{"role": "user", "content": "obs \ud800"}], done=True,
                          final_state={"answer": "\ud800"}, reward_step="0.5", error="err \udcff")

    async def close(self):
        return None


def run_to_shards(policy, tasks, cfg, env_factory, out) -> tuple[Stats, list[dict]]:
    async def main():
        writer = GroupShardWriter(out, lambda: Lineage(stage="rollout"), flush_groups=100)
        stats = await rollout(tasks, policy, env_factory, cfg, writer.add_group)  # a swe env closes its own pool
        await writer.flush()
        return stats

    stats = asyncio.run(main())
    return stats, read_rows(out)


def test_hostile_env_values_are_written(tmp_path, tiny):
    cfg = RolloutConfig(env="hostile", group_size=2, concurrency=4, max_turns=2, max_new_tokens=4, seed=0)
    stats, rows = run_to_shards(tiny, [{"task_id": f"h{i}"} for i in range(3)], cfg, HostileEnv,
                                str(tmp_path / "out"))
    assert len(rows) == 6
    assert_valid_utf8(rows)
    for row in rows:
        assert row["final_state"] == json.dumps({"answer": REPLACEMENT}, ensure_ascii=False)
        assert row["turns"][0]["reward_step"] == 0.5 and row["turns"][0]["error"].split("; length: ")[0] == f"err {REPLACEMENT}"
        assert f"sys {REPLACEMENT}" in row["prompt_text"]


# ----------------------------------------------------------------- any exception: a status, counted


class BrokenEnv:
    """Faults the loop had no handler for: a malformed observation, or a crash while being built."""

    name, version = "broken", "1"

    def __init__(self, mode: str):
        if mode == "construct":
            raise RuntimeError("env factory exploded")
        self.mode = mode

    async def reset(self, task):
        return EnvReset(messages=[{"role": "user", "content": "go"}], tools=[])

    async def step(self, action):
        return StepResult(observations=["not a message dict"], done=False)  # type: ignore[list-item]

    async def close(self):
        return None


@pytest.mark.parametrize("mode", ["construct", "bad_observation"])
def test_exceptions_in_a_group_end_rows_with_a_status(tmp_path, tiny, mode):
    cfg = RolloutConfig(env="broken", group_size=3, concurrency=4, max_turns=3, max_new_tokens=4, seed=0)
    stats, rows = run_to_shards(tiny, [{"task_id": "b0"}, {"task_id": "b1"}], cfg, lambda: BrokenEnv(mode),
                                str(tmp_path / "out"))
    assert len(rows) == 6 and stats.groups_done == 2
    assert {r["status"] for r in rows} == {"env_error"}
    assert stats.errors == 6 and stats.last_error.startswith("rollout error: ")
    expected = "env factory exploded" if mode == "construct" else "TypeError"
    assert expected in stats.last_error
    if mode == "bad_observation":
        assert all(expected in r["turns"][-1]["error"] for r in rows)


# ------------------------------------------------------------------------------ bad tokens from a backend


BAD_GENERATIONS = [
    ("negative id", replace_id(-1), "token id -1"),
    ("id past the vocab", replace_id(49152 + 5), "token id 49157"),
    ("id at the vocab size", replace_id(49152), "token id 49152"),
    ("huge id", replace_id(2**40), f"token id {2**40}"),
    ("string id", replace_id("17"), "token id '17'"),
    ("float id", replace_id(3.0), "token id 3.0"),
    ("bool id", replace_id(True), "token id True"),
    ("none id", replace_id(None), "token id None"),
    ("nan log-prob", replace_logprobs(lambda g: [math.nan] * len(g.ids)), "log-prob nan"),
    ("-inf log-prob", replace_logprobs(lambda g: [0.0] * (len(g.ids) - 1) + [-math.inf]), "log-prob -inf"),
    ("missing log-probs", replace_logprobs(lambda g: g.logprobs[:-1]), "log-probs for"),
]


@pytest.mark.parametrize(("name", "corrupt", "cause"), BAD_GENERATIONS, ids=[b[0] for b in BAD_GENERATIONS])
def test_bad_generation_is_policy_error_and_the_cli_fails(tmp_path, tiny, monkeypatch, name, corrupt, cause):
    out = str(tmp_path / "out")
    result = cli_rollout(monkeypatch, CorruptingPolicy(tiny, corrupt), [
        "--env", "math", "--tasks", "builtin:math?n=2&seed=0", "--out", out, "-G", "2",
        "--max-turns", "2", "--max-new-tokens", "8", "--seed", "0"])
    assert result.exit_code == 1, result.output
    summary = summary_of(result)
    assert summary["rows_written"] == 4 and summary["status"].get("policy_error") == 4
    assert summary["errors"] == 4 and cause in summary["last_error"]
    assert "every trajectory failed (policy_error 4)" in result.stderr and cause in result.stderr
    rows = read_rows(out)
    assert [r["status"] for r in rows] == ["policy_error"] * 4
    for row in rows:  # nothing of the bad answer reached the row
        assert row["response_ids"] == [] and row["retries"] == 3


def test_bad_ids_in_one_task_fail_only_its_rows(tmp_path, tiny, monkeypatch):
    """One poisoned task among healthy ones: its group is written as policy_error and counted; the run
    still succeeds with the others (exit 0)."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", [
        json.dumps({"task_id": f"t{i}", "question": f"What is {i} + {i}? POISON{i}", "answer": str(2 * i)})
        for i in range(3)])
    out = str(tmp_path / "out")
    result = cli_rollout(monkeypatch, CorruptingPolicy(tiny, replace_id(-1), only="POISON1"), [
        "--env", "math", "--tasks", tasks, "--out", out, "-G", "2", "--max-turns", "2",
        "--max-new-tokens", "8", "--seed", "0"])
    assert result.exit_code == 0, result.output
    summary = summary_of(result)
    assert summary["rows_written"] == 6 and summary["errors"] == 2 and summary["status"]["policy_error"] == 2
    statuses = {(r["task_id"], r["status"]) for r in read_rows(out)}
    assert ("t1", "policy_error") in statuses and ("t0", "policy_error") not in statuses


def test_error_fraction_over_max_error_frac_exits_nonzero(tmp_path, tiny, monkeypatch):
    """One task in three poisoned: under the default --max-error-frac 0.5 the run passes (above); with
    0.2 the same run exits 1 naming the share, the limit and the cause, after writing every row."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", [
        json.dumps({"task_id": f"t{i}", "question": f"What is {i} + {i}? POISON{i}", "answer": str(2 * i)})
        for i in range(3)])
    out = str(tmp_path / "out")
    result = cli_rollout(monkeypatch, CorruptingPolicy(tiny, replace_id(-1), only="POISON1"), [
        "--env", "math", "--tasks", tasks, "--out", out, "-G", "2", "--max-turns", "2",
        "--max-new-tokens", "8", "--seed", "0", "--max-error-frac", "0.2"])
    assert result.exit_code == 1, result.output
    assert "2 of 6 trajectories failed (33% > --max-error-frac 0.2)" in result.stderr
    assert "most common cause policy_error (2)" in result.stderr and "token id -1" in result.stderr
    summary = summary_of(result)
    assert summary["rows_written"] == 6 and summary["error_causes"] == {"policy_error": 2}
    assert len(read_rows(out)) == 6


def test_every_group_failing_exits_nonzero(tmp_path, tiny, monkeypatch):
    """The environment cannot even be built: every row is env_error, and the command fails with the
    cause instead of reporting success (exit 0) over a directory of failures."""
    import arlctl.envs.registry as registry

    def broken_factory(name, **options):
        raise RuntimeError("no environment today")

    monkeypatch.setattr(registry, "make_env", broken_factory)
    result = cli_rollout(monkeypatch, tiny, ["--env", "math", "--tasks", "builtin:math?n=2", "--out",
                                             str(tmp_path / "out"), "-G", "2", "--max-new-tokens", "4"])
    assert result.exit_code == 1, result.output
    assert "every trajectory failed (env_error 4)" in result.stderr and "no environment today" in result.stderr
    assert summary_of(result)["errors"] == 4


# --------------------------------------------------------------------------------- the cut swe diff


@pytest.fixture
def swe_home(tmp_path, monkeypatch, tiny):
    from arlctl.sandbox.bwrap import bwrap_available

    if not bwrap_available():
        pytest.skip("bubblewrap is not installed")
    monkeypatch.setenv("ARLCTL_HOME", str(tmp_path / "home"))  # private snapshots (the model is loaded)


def make_file_call(path: str, size: int) -> str:
    command = f"python3 -c \"open('{path}', 'w').write(('x' * 99 + chr(10)) * {size // 100})\""
    return f'<tool_call>\n{json.dumps({"name": "bash", "arguments": {"command": command}})}\n</tool_call>'


SUBMIT = '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>'


@pytest.mark.parametrize(("size", "limit", "cut"), [
    (1_500_000, None, True),  # over the 1 MiB default
    (3_000, 2_000, True),
    (1_000, 2_000, False),
])
def test_swe_diff_over_the_limit_is_flagged_truncated(tmp_path, tiny, swe_home, size, limit, cut):
    from arlctl.envs.swe.env import DIFF_TRUNCATED, SweEnv, diff_truncation
    from arlctl.envs.swe.tasks import load_suite_task

    options = {} if limit is None else {"max_diff_bytes": limit}
    policy = ScriptedPolicy(tiny.tokenizer, [make_file_call("big.txt", size), SUBMIT])
    cfg = RolloutConfig(env="swe", group_size=1, concurrency=1, max_turns=3, max_new_tokens=200,
                        step_timeout=60)
    stats, rows = run_to_shards(policy, [load_suite_task("stockroom-001")], cfg,
                                lambda: SweEnv(sandboxes=1, **options), str(tmp_path / "out"))
    row = rows[0]
    assert row["finish_reason"] == "submit"
    if not cut:
        assert row["status"] == "ok" and diff_truncation(row["final_state"]) is None
        assert "+++ b/big.txt" in row["final_state"]
        return
    assert row["status"] == "truncated"
    kept, full = diff_truncation(row["final_state"])
    assert full > (limit or 1 << 20) and kept <= (limit or 1 << 20)
    assert row["final_state"].startswith(DIFF_TRUNCATED.format(kept=kept, size=full))
    assert row["final_state"].endswith("\n")  # cut at a line
    assert "diff truncated" in row["turns"][-1]["error"]


def test_swe_diff_cut_when_the_episode_ends_on_a_bound(tmp_path, tiny, swe_home):
    """No submit: the loop asks the env for its diff after max_turns; the cut is flagged there too."""
    from arlctl.envs.swe.env import SweEnv, diff_truncation
    from arlctl.envs.swe.tasks import load_suite_task

    policy = ScriptedPolicy(tiny.tokenizer, [make_file_call("big.txt", 5_000)])
    cfg = RolloutConfig(env="swe", group_size=1, concurrency=1, max_turns=1, max_new_tokens=200)
    _, rows = run_to_shards(policy, [load_suite_task("stockroom-001")], cfg,
                            lambda: SweEnv(sandboxes=1, max_diff_bytes=1_000), str(tmp_path / "out"))
    row = rows[0]
    assert row["finish_reason"] == "max_turns" and row["status"] == "truncated"
    assert diff_truncation(row["final_state"])[1] > 1_000
    assert "diff truncated" in row["turns"][-1]["error"]


def test_dry_run_prints_a_hostile_task_safely(tmp_path):
    """--dry-run renders the first prompt: a surrogate, an OSC 52 sequence and Rich markup in the task
    are shown as text (escaped), not obeyed, and do not crash the render."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", [
        '{"task_id": "[/]d1", "question": "What is [bold red]2+2[/]? \\ud800 \\u001b]52;c;eA==\\u0007", "answer": "4"}'])
    result = runner.invoke(app, ["rollout", "--env", "math", "--tasks", tasks, "--policy", "tiny", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output
    assert "What is [bold red]2+2[/]?" in result.output and "\\x1b]52;c;eA==\\x07" in result.output
    assert "task [/]d1" in result.output
