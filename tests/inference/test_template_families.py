"""Every chat-template family, token-exact, in both history modes (DESIGN.md §6; issue 13 item 1).

Each family is the SmolLM2 tokenizer with the family's special tokens and a template written in
tests/inference/families.py, under a tiny random Llama sized to that vocabulary, run by the real HF
backend. Two kinds of rollout:
- the random model in an env that answers every turn with a tool message (three turns, free text);
- the same model made to write the family's own tool call (its log-probs are the model's own scores
  of the forced tokens), through the real math env, so the family's parser, the calculator and the math
  reward all run: the trajectory must earn reward 1.

Checks: full history decodes to exactly what the template renders for the recorded messages (the think
gate excepted, where it must stay prefix-consistent and keep the reasoning the template would drop);
per-turn history writes one row per turn whose prompt is exactly the template's own rendering; mask-1
log-probs are the model's scores of the recorded ids in their recorded context.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from families import FAMILIES, family_model_dir, family_tokenizer

from arlctl.envs.base import EnvReset, StepResult
from arlctl.envs.math import MathEnv
from arlctl.envs.registry import get_reward
from arlctl.inference.base import Generation
from arlctl.inference.chat import ChatCodec
from arlctl.inference.loader import load_policy
from arlctl.stages.agent_loop import RolloutConfig
from arlctl.stages.rollout import rollout
from arlctl.tools import parser_for_template

ECHO_TOOL = {"type": "function", "function": {
    "name": "echo", "description": "Echo a text back.",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": []}}}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {name: family_model_dir(root, family) for name, family in FAMILIES.items()}


@pytest.fixture(scope="module")
def reference(models):
    from transformers import AutoModelForCausalLM

    cache: dict[str, Any] = {}

    def get(name: str):
        if name not in cache:
            cache[name] = AutoModelForCausalLM.from_pretrained(str(models[name]), local_files_only=True).eval()
        return cache[name]

    return get


def score(model, context: list[int], ids: list[int]) -> list[float]:
    """The model's log-prob of each of `ids` after `context` (teacher forcing)."""
    full = torch.tensor([context + ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(full).logits[0, :-1].float(), dim=-1)
    picked = logp.gather(-1, full[0, 1:, None])[:, 0]
    return picked[len(context) - 1:].tolist()


class EchoEnv:
    """Three turns whatever the model writes; each step answers with a tool message. Records messages."""

    name, version, tool_format = "echo", "echo-1", "hermes"
    log: dict[str, dict[str, Any]] = {}

    async def reset(self, task):
        self.steps = 0
        self.record = {"messages": [{"role": "system", "content": "You echo."},
                                    {"role": "user", "content": task["prompt"]}],
                       "tools": [ECHO_TOOL], "observations": []}
        EchoEnv.log[task["task_id"]] = self.record
        return EnvReset(messages=self.record["messages"], tools=[ECHO_TOOL])

    async def step(self, action):
        self.steps += 1
        if self.steps == 3:
            return StepResult(observations=[], done=True, final_state=action.text, finish_reason="submit")
        obs = [{"role": "tool", "name": "echo", "tool_call_id": f"call{self.steps:05d}", "content": f"heard {self.steps}"}]
        self.record["observations"].append(obs)
        return StepResult(observations=obs, done=False)

    async def close(self):
        pass


class RecordingMath(MathEnv):
    log: dict[str, dict[str, Any]] = {}

    async def reset(self, task):
        reset = await super().reset(task)
        self.record = {"messages": reset.messages, "tools": reset.tools, "observations": []}
        RecordingMath.log[task["task_id"]] = self.record
        return reset

    async def step(self, action):
        result = await super().step(action)
        if result.observations:
            self.record["observations"].append(result.observations)
        return result


class ForcedCalls:
    """The family's tiny model made to write a tool call, then the answer once the result is in its context.

    The question "What is A + B?" is read from the context; the call is `calculator("A + B")`, the answer
    \\boxed{A+B} (or one more, for questions listed in `wrong`). Token ids come from the family's tokenizer;
    each log-prob is the model's own score of that token in the exact context it was given, so the recorded
    log-probs can be checked like sampled ones.
    """

    def __init__(self, inner, model, family, wrong: tuple[str, ...] = ()):
        self.inner, self.model, self.family, self.wrong = inner, model, family, wrong
        self.tokenizer, self.name, self.version = inner.tokenizer, inner.name, inner.version
        self.vocab_size = len(inner.tokenizer)
        self.contexts: list[list[int]] = []

    async def generate(self, ids, sampling):
        import re

        self.contexts.append(list(ids))
        seen = self.tokenizer.decode(ids)
        a, b = re.findall(r"What is (\d+) \+ (\d+)\?", seen)[-1]
        expression, result = f"{a} + {b}", str(int(a) + int(b))
        thinking = "<think>\nI should add.\n</think>\n\n" if self.family.name == "think" else ""
        if result in seen.split("What is")[-1]:  # the calculator's answer is in the context
            answer = str(int(result) + 1) if expression in self.wrong else result
            text = f"{thinking}The sum is \\boxed{{{answer}}}."
        else:
            text = thinking + self.family.call_text("calculator", {"expression": expression})
        out = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.convert_tokens_to_ids(
            self.family.eos)]
        return Generation(ids=out, logprobs=score(self.model, list(ids), out), finish_reason="stop",
                          version=self.version)

    async def reload(self, path, version):
        pass

    async def close(self):
        await self.inner.close()


def run(policy, tasks, cfg, env_factory):
    groups = []

    async def sink(group):
        groups.append(group)

    stats = asyncio.run(rollout(tasks, policy, env_factory, cfg, sink))
    return [row for group in groups for row in group], stats


def template_prompt(tokenizer, family, record, turns: list[tuple[str, list]]) -> str:
    """What the family's template renders, with the generation prompt, for the messages before a turn."""
    codec = ChatCodec(tokenizer, dict(family.kwargs))
    messages = list(codec.prompt_messages(record["messages"], record["tools"]))
    for content, observations in turns:
        messages.append({"role": "assistant", "content": content})
        messages.extend(observations)
    return tokenizer.apply_chat_template(messages, tools=record["tools"], tokenize=False,
                                         add_generation_prompt=True, **dict(family.kwargs))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_codec_and_parser_are_picked_from_the_template(name):
    family = FAMILIES[name]
    tokenizer = family_tokenizer(family)
    codec = ChatCodec(tokenizer, dict(family.kwargs))
    assert parser_for_template(tokenizer.chat_template) == family.parser
    assert codec.tools_in_template
    assert codec.closing.startswith(family.eos)
    # the probe at construction already appended a tool turn; only the think gate rewrites history
    assert codec.rewrites_history == name.startswith("think")


@pytest.mark.slow
@pytest.mark.parametrize("history", ["full", "per-turn"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_random_model_multi_turn_is_token_exact(name, history, models, reference):
    family = FAMILIES[name]
    policy = load_policy(str(models[name]), max_batch=8, progress=False)
    tokenizer = policy.tokenizer
    model = reference(name)
    tasks = [{"task_id": f"{name}-{i}", "prompt": f"Echo number {i}."} for i in range(3)]
    cfg = RolloutConfig(env="echo", group_size=2, concurrency=6, max_turns=3, max_new_tokens=10, max_tokens=600,
                        seed=11, history=history, template_kwargs=dict(family.kwargs))
    try:
        rows, stats = run(policy, tasks, cfg, EchoEnv)
    finally:
        asyncio.run(policy.close())
    assert stats.errors == 0, stats.last_error
    codec = ChatCodec(tokenizer, dict(family.kwargs))
    if history == "full":
        assert len(rows) == 6 and all(len(r.turns) == 3 for r in rows)
        for row in rows:
            check_logprobs(model, row)
            record = EchoEnv.log[row.task_id]
            turns = [(t.text, record["observations"][i] if i < 2 else None) for i, t in enumerate(row.turns)]
            decoded = codec.decode(row.prompt_ids + row.response_ids)
            if name.startswith("think"):
                check_prefix_consistent(codec, row, record)
            else:
                _, owed = codec.split_generation(row.response_ids[row.turns[-1].gen_start:])
                assert decoded + owed == codec.render_conversation(record["messages"], record["tools"], turns)
    else:
        assert len(rows) == 18  # 3 tasks x G=2 x 3 turns
        by_traj: dict[str, list] = {}
        for row in rows:
            by_traj.setdefault(row.trajectory_id, []).append(row)
        assert len(by_traj) == 6
        for sibling_rows in by_traj.values():
            sibling_rows.sort(key=lambda r: r.turns[0].index)
            assert [r.turns[0].index for r in sibling_rows] == [0, 1, 2]
            # the last reply ends the episode; "length" when the 10-token budget cut it (issue 27 item 4)
            assert [r.finish_reason for r in sibling_rows][:2] == ["continued", "continued"]
            assert sibling_rows[-1].finish_reason in ("submit", "length")
            assert len({(r.group_id, r.sample_index, r.status) for r in sibling_rows}) == 1
            record = EchoEnv.log[sibling_rows[0].task_id]
            history_so_far: list[tuple[str, list]] = []
            for k, row in enumerate(sibling_rows):
                expected = template_prompt(tokenizer, family, record, history_so_far)
                assert row.prompt_text == expected
                assert row.prompt_ids == tokenizer(expected, add_special_tokens=False)["input_ids"]
                assert row.response_mask == [1] * len(row.response_ids) and row.turns[0].gen_start == 0
                check_logprobs(model, row)
                if k < 2:
                    history_so_far.append((codec.split_generation(row.response_ids)[0], record["observations"][k]))


def check_logprobs(model, row) -> None:
    scored = score(model, row.prompt_ids, row.response_ids)
    for pos, (mask, recorded) in enumerate(zip(row.response_mask, row.response_logprobs)):
        if mask:
            assert recorded == pytest.approx(scored[pos], abs=2e-3), pos
        else:
            assert recorded == 0.0


def check_prefix_consistent(codec: ChatCodec, row, record) -> None:
    """Think gate, full history: the recorded ids are the prompt, then per turn the sampled ids as sampled
    and exactly the template's text after an assistant message (closing, tool turn, next header)."""
    assert row.prompt_text == codec.prompt(record["messages"], record["tools"]).text
    for i, turn in enumerate(row.turns[:-1]):
        obs_ids = row.response_ids[turn.gen_start + turn.gen_len: turn.gen_start + turn.gen_len + turn.obs_len]
        _, glue = codec.split_generation(row.response_ids[turn.gen_start: turn.gen_start + turn.gen_len])
        assert obs_ids == codec.continuation(glue, record["observations"][i]).ids


@pytest.mark.slow
@pytest.mark.parametrize("history", ["full", "per-turn"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_tool_calls_reach_the_env_and_earn_the_reward(name, history, models, reference):
    family = FAMILIES[name]
    inner = load_policy(str(models[name]), max_batch=4, progress=False)
    policy = ForcedCalls(inner, reference(name), family)
    task = {"task_id": f"sum-{name}", "question": "What is 1234 + 4321?", "answer": "5555"}
    cfg = RolloutConfig(env="math", group_size=1, concurrency=1, max_turns=4, max_new_tokens=200, max_tokens=1500,
                        history=history, template_kwargs=dict(family.kwargs))
    try:
        rows, stats = run(policy, [task], cfg, RecordingMath)
    finally:
        asyncio.run(policy.close())
    assert stats.errors == 0, stats.last_error
    final = rows[-1]
    assert final.status == "ok" and final.finish_reason == "submit" and final.final_state == "5555"
    calls = [c for r in rows for t in r.turns for c in t.tool_calls]
    assert [(c["name"], c["arguments"]) for c in calls] == [("calculator", {"expression": "1234 + 4321"})]
    reward = get_reward("math").score(final.final_state, task, final.turns[-1].text)
    assert reward[0] == 1.0
    record = RecordingMath.log[task["task_id"]]
    assert "5555" in record["observations"][0][0]["content"]
    tokenizer = inner.tokenizer
    if history == "full":
        (row,) = rows
        assert len(row.turns) == 2
        # what the model was given at turn 2 is exactly the recorded prefix
        assert policy.contexts[1] == row.prompt_ids + row.response_ids[:row.turns[1].gen_start]
        check_logprobs(reference(name), row)
        if name == "think":  # the reasoning the template would drop from history stays in what was recorded
            assert "I should add." in tokenizer.decode(row.response_ids[row.turns[1].gen_start - 100:])
    else:
        assert [r.finish_reason for r in rows] == ["continued", "submit"]
        assert [c for c in policy.contexts] == [r.prompt_ids for r in rows]
        first_text = ChatCodec(tokenizer, dict(family.kwargs)).split_generation(rows[0].response_ids)[0]
        assert rows[1].prompt_text == template_prompt(tokenizer, family, record,
                                                      [(first_text, record["observations"][0])])
        if name == "think":  # the template's own rendering of history drops the earlier reasoning
            assert "I should add." not in rows[1].prompt_text
        for row in rows:
            check_logprobs(reference(name), row)


@pytest.mark.slow
def test_think_gate_per_turn_rows_go_through_reward_filter_and_train(models, reference, tmp_path, monkeypatch):
    """The think-gate family with --history per-turn, through the real CLI stages: each trajectory is two
    rows (call, answer) whose reward, advantage and batch are the trajectory's, and train takes a step."""
    import json

    import duckdb
    from typer.testing import CliRunner

    import arlctl.stages.policy_job as policy_job
    from arlctl.cli.main import app

    family = FAMILIES["think"]
    inner = load_policy(str(models["think"]), max_batch=8, progress=False)
    policy = ForcedCalls(inner, reference("think"), family, wrong=("20 + 22",))
    monkeypatch.setattr(policy_job, "load_resolved", lambda *a, **k: policy)  # the resolver's one load
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": f"q{a}", "question": f"What is {a} + {b}?", "answer": str(a + b)})
                             + "\n" for a, b in [(10, 11), (20, 22), (30, 33)]))
    run = tmp_path / "run"
    cli = CliRunner()
    result = cli.invoke(app, ["rollout", "--env", "math", "--tasks", str(tasks), "--policy", str(models["think"]),
                              "--run", str(run), "-G", "2", "--max-turns", "4", "--history", "per-turn",
                              "--chat-template-kwargs", "enable_thinking=true", "--json", "-q"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[0])
    assert summary["rows_written"] == 12 and summary["trajectories"] == 6 and summary["template_rewrites_history"]
    result = cli.invoke(app, ["reward", "--run", str(run), "--reward", "auto", "--json"])
    assert result.exit_code == 0, result.output
    rewards = duckdb.sql(f"select task_id, trajectory_id, list(distinct reward), count(*) "
                         f"from '{run}/rewarded/*.parquet' group by all").fetchall()
    assert len(rewards) == 6
    for task_id, _, distinct, n in rewards:
        assert n == 2 and distinct == [0.0 if task_id == "q20" else 1.0]
    result = cli.invoke(app, ["filter", "--run", str(run), "--adv", "batch", "--keep-uniform", "1",
                              "--batch-groups", "3", "--json"])
    assert result.exit_code == 0, result.output
    batch = duckdb.sql(f"select trajectory_id, list(distinct advantage), count(*), list(distinct finish_reason) "
                       f"from '{run}/batches/*.parquet' group by all").fetchall()
    assert len(batch) == 6
    for _, advantages, n, reasons in batch:
        assert n == 2 and len(advantages) == 1 and advantages[0] != 0.0 and sorted(reasons) == ["continued", "submit"]
    result = cli.invoke(app, ["train", "--run", str(run), "--policy", str(models["think"]), "--lr", "1e-3",
                              "--max-steps", "1", "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    trained = json.loads(result.stdout.strip().splitlines()[0])
    assert trained["steps"] == 1 and trained.get("skipped_nonfinite", 0) == 0
