"""`--reward judge`: an LLM grades trajectories against a rubric (arlctl/rewards/judge.py).

Three judges: a scripted OpenAI-compatible endpoint (a real aiohttp server whose replies each test
decides, for exact verdict, retry, timeout and concurrency checks), a real `arlctl serve --policy tiny`
process, and the tiny model loaded in process (`judge=tiny`). The tiny model's replies are noise, so with
it we assert what must hold anyway: greedy decoding gives the same verdict twice, a reply without a
verdict is a null reward with its cause, and a rubric that can read the noise scores it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from scripted_judge import Fail, Raw, ScriptedJudge, Slow, free_port
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.envs.registry import get_reward
from arlctl.errors import UsageError
from arlctl.io.shards import Lineage, read_shard, write_shard
from arlctl.rewards import rubrics
from arlctl.schemas.rows import TrajectoryRow, Turn, rows_to_table

TASK = {"task_id": "t1", "question": "What is 6 * 7?", "answer": "42"}


def judge(server: ScriptedJudge, **options):
    return get_reward("judge", server=server.url, model="scripted-judge", **{"backoff": 0.0, **options})


def grade(reward, final_state="42", task=TASK, response="6 * 7 = 42, so <answer>42</answer>", **kw):
    return asyncio.run(reward.score(final_state, task, response, **kw))


def write_rubric(path: Path, **doc) -> str:
    path.write_text(yaml.safe_dump(doc))
    return str(path)


# ---- verdicts -----------------------------------------------------------------------------------------

def test_verdicts_map_to_scores_and_the_last_verdict_counts(scripted):
    replies = iter(["The product is right.\nVERDICT: PASS", "Wrong number.\nVERDICT: FAIL",
                    "First thought VERDICT: FAIL, but on checking again\nVERDICT: PASS"])
    server = scripted(lambda messages: next(replies))
    reward = judge(server)
    assert grade(reward)[:2] == (1.0, {"judge": 1.0})
    value, parts, info = grade(reward, final_state="41")
    assert (value, parts) == (0.0, {"judge": 0.0})
    assert info["verdict"] == "FAIL" and info["rationale"] == "Wrong number.\nVERDICT: FAIL"
    assert info["judge_model"] == "scripted-judge" and info["rubric"].startswith("default@")
    assert grade(reward)[0] == 1.0  # the last of two verdicts in one reply
    assert server.calls == 3
    # What the judge was shown: the question, the final answer, the transcript; greedy; the model named.
    request = server.requests[1]
    assert request["temperature"] == 0 and request["model"] == "scripted-judge"
    shown = server.contents(1)
    assert "What is 6 * 7?" in shown and "\n41\n" in shown and "6 * 7 = 42, so <answer>42</answer>" in shown


def test_a_scale_rubric_maps_numbers_linearly_and_refuses_out_of_range(scripted, tmp_path):
    path = write_rubric(tmp_path / "ten.yaml", template="Grade {answer} for {prompt}.", verdict=r"Score:\s*(\d+)",
                        scale=[0, 10])
    replies = iter(["Score: 7", "Score: 12", "Score: 0"])
    reward = judge(scripted(lambda m: next(replies)), rubric=path)
    assert grade(reward)[0] == pytest.approx(0.7)  # (7 - 0) / (10 - 0)
    value, _, info = grade(reward)
    assert value is None and "12 is outside the scale [0, 10]" in info["error"]
    assert grade(reward)[0] == 0.0


@pytest.mark.parametrize("reply, cause", [
    ("I am not sure about this one.", "no match of"),
    ("VERDICT: MAYBE", "no match of"),  # MAYBE is not in the verdict regex
    ("", "no match of"),
])
def test_an_unreadable_verdict_is_a_null_reward_with_its_cause(scripted, reply, cause):
    value, parts, info = grade(judge(scripted(lambda m: reply)))
    assert value is None and parts is None
    assert info["error"].startswith("judge: unparseable verdict") and cause in info["error"]
    assert info["rationale"] == reply and "infra" not in info  # the judge's reply is kept to look at


def test_a_verdict_not_in_the_scores_is_unparseable(scripted, tmp_path):
    path = write_rubric(tmp_path / "r.yaml", template="{answer}", verdict=r"VERDICT: (\w+)",
                        scores={"PASS": 1, "FAIL": 0})
    value, _, info = grade(judge(scripted(lambda m: "VERDICT: MAYBE"), rubric=path))
    assert value is None and "'MAYBE' is not one of FAIL, PASS" in info["error"]


# ---- failures of the request --------------------------------------------------------------------------

def test_transient_failures_are_retried_then_the_verdict_counts(scripted):
    answers = iter([Fail(503, "warming up"), Fail(502), "VERDICT: PASS"])
    server = scripted(lambda m: next(answers))
    value, _, info = grade(judge(server, retries=2))
    assert value == 1.0 and info["attempts"] == 3 and server.calls == 3


def test_a_4xx_answer_is_not_retried(scripted):
    server = scripted(lambda m: Fail(400, "prompt of 9000 tokens does not fit the 8192-token context"))
    value, _, info = grade(judge(server, retries=3))
    assert value is None and server.calls == 1 and info["infra"] is True
    assert info["error"] == "judge: judge server answered HTTP 400: prompt of 9000 tokens does not fit the " \
                            "8192-token context"


def test_retries_run_out_on_a_server_that_keeps_failing(scripted):
    server = scripted(lambda m: Fail(500, "boom"))
    value, _, info = grade(judge(server, retries=2))
    assert value is None and server.calls == 3
    assert info["error"] == "judge: judge server answered HTTP 500: boom (after 3 attempts)"


class Held(Slow):
    """A reply the scripted server holds, in 0.05 s naps, until the test releases it: a judge that answers
    at all before then did not wait for the server."""

    def __init__(self) -> None:
        self.seconds = 0.05
        self.released = threading.Event()

    @property
    def then(self):
        return "VERDICT: PASS" if self.released.is_set() else self


def test_a_timeout_is_retried_then_a_null_reward(scripted):
    held = Held()
    server = scripted(lambda m: held)
    # A failsafe, not a bound: a judge that ignored its 0.3 s timeout gets an answer after 120 s and the
    # assertions below fail, instead of the test hanging.
    failsafe = threading.Timer(120.0, held.released.set)
    failsafe.start()
    try:
        value, _, info = grade(judge(server, timeout=0.3, retries=1))
        # Both attempts were given up on while the server still held them: the null came from the timeout.
        assert server.in_flight == 2 and server.calls == 2
    finally:
        failsafe.cancel()
        held.released.set()
    assert value is None and info["infra"] is True
    assert info["error"] == "judge: judge request timed out after 0.3 s " \
                            f"({server.url}/v1/chat/completions) (after 2 attempts)"


def test_a_dead_server_is_a_null_reward_naming_the_connection(tmp_path):
    reward = get_reward("judge", server=f"http://127.0.0.1:{free_port()}/v1", model="m", retries=1, backoff=0.0)
    value, _, info = grade(reward)
    assert value is None and info["infra"] is True
    assert "judge request failed: ClientConnectorError" in info["error"] and info["error"].endswith("(after 2 attempts)")


def test_a_reply_that_is_not_a_chat_completion(scripted):
    value, _, info = grade(judge(scripted(lambda m: Raw({"text": "VERDICT: PASS"}))))
    assert value is None and "reply is not a chat completion" in info["error"]


def test_concurrency_bounds_the_requests_in_flight(scripted):
    server = scripted(lambda m: Slow(0.2, "VERDICT: PASS"))
    reward = judge(server, concurrency=2)

    async def many():
        return await asyncio.gather(*(reward.score("42", TASK, "x") for _ in range(6)))

    assert [r[0] for r in asyncio.run(many())] == [1.0] * 6
    assert server.max_in_flight == 2 and server.calls == 6


# ---- rubrics and versions -----------------------------------------------------------------------------

def test_the_math_rubric_shows_the_reference_answer_and_needs_one(scripted):
    server = scripted(lambda m: "Score: 1")
    reward = judge(server, rubric="math")
    gsm8k = {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"}
    assert grade(reward, final_state="7", task=gsm8k)[0] == 1.0
    assert "Reference answer: 7\n" in server.contents()  # the part after ####
    value, _, info = grade(reward, task={"question": "2 + 2?"})
    assert value is None and info["error"] == "judge: the rubric uses {gold} but the task has no 'answer' field"
    assert server.calls == 1  # no request for a row that cannot be graded


def test_the_version_names_the_rubric_content_and_the_judge_model(tmp_path):
    text = yaml.safe_dump({"name": "mine", "template": "{answer}", "verdict": "(PASS|FAIL)",
                           "scores": {"PASS": 1, "FAIL": 0}})
    (tmp_path / "a.yaml").write_text(text)
    (tmp_path / "b.yaml").write_text(text + "# edited\n")
    digest_a = hashlib.sha256(text.encode()).hexdigest()[:12]
    digest_b = hashlib.sha256((text + "# edited\n").encode()).hexdigest()[:12]
    a = get_reward("judge", server="http://127.0.0.1:9", model="judge-7b", rubric=str(tmp_path / "a.yaml"))
    b = get_reward("judge", server="http://127.0.0.1:9", model="judge-7b", rubric=str(tmp_path / "b.yaml"))
    assert a.version.endswith(f"+rubric:mine@{digest_a}+judge:judge-7b")
    assert b.version.endswith(f"+rubric:mine@{digest_b}+judge:judge-7b") and digest_a != digest_b
    assert get_reward("judge", judge="tiny").version.endswith("+judge:hf:tiny")


@pytest.mark.parametrize("options, message", [
    ({"server": "http://127.0.0.1:9"}, "needs model=NAME"),
    ({"server": "http://127.0.0.1:9", "model": "m", "judge": "tiny"}, "not both"),
    ({"server": "ftp://x", "model": "m"}, "http(s) URL"),
    ({"judge": "tiny", "rubric": "no-such-rubric"}, "neither a file nor a shipped rubric"),
    ({"judge": "tiny", "rubric": "pairwise"}, "this reward takes judge"),
    ({"judge": "tiny", "timeout": 0}, "timeout must be a positive number"),
    ({"judge": "tiny", "retries": -1}, "retries must be an integer >= 0"),
    ({"judge": "tiny", "steps": 2}, "steps must be 0 or 1"),
])
def test_bad_options_are_usage_errors_before_any_row(options, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        get_reward("judge", **options)


@pytest.mark.parametrize("doc, message", [
    ({"template": "{answer} {solution}", "verdict": "(A)", "scores": {"A": 1}}, "unknown fields {solution}"),
    ({"template": "{answer}", "verdict": "no group", "scores": {"A": 1}}, "one capture group"),
    ({"template": "{answer}", "verdict": "([", "scores": {"A": 1}}, "not a valid regex"),
    ({"template": "{answer}", "verdict": "(A)", "scores": {"A": 2}}, r"lie in \[0, 1\]"),
    ({"template": "{answer}", "verdict": "(A)"}, "exactly one of `scores`"),
    ({"template": "{answer}", "verdict": "(A)", "scale": [5, 1]}, "low < high"),
    ({"verdict": "(A)", "scores": {"A": 1}}, "non-empty `template`"),
    ({"template": "{answer}", "verdict": "(A)", "scores": {"A": 1}, "colour": "red"}, "unknown keys colour"),
])
def test_malformed_rubrics_are_usage_errors_naming_the_file(tmp_path, doc, message):
    path = write_rubric(tmp_path / "bad.yaml", **doc)
    with pytest.raises(UsageError, match=message) as err:
        get_reward("judge", judge="tiny", rubric=path)
    assert path in str(err.value)


def test_literal_braces_in_a_template_and_long_fields_are_cut_and_reported(scripted, tmp_path):
    path = write_rubric(tmp_path / "r.yaml", template='Reply as JSON {"ok": true}. Work: {response}',
                        verdict="(PASS)", scores={"PASS": 1}, max_field_chars=100)
    server = scripted(lambda m: "PASS")
    value, _, info = grade(judge(server, rubric=path), response="x" * 1000)
    assert value == 1.0 and info["truncated"] == ["response"]
    shown = server.contents()
    assert shown.startswith('Reply as JSON {"ok": true}. Work: ' + "x" * 50 + "\n[... 900 characters cut ...]\n")


# ---- per-turn (process) rewards -----------------------------------------------------------------------

def test_steps_grade_every_turn_in_order(scripted):
    def reply(messages):
        text = messages[-1]["content"]
        if "Earlier steps of the assistant" not in text:
            return "VERDICT: PASS"  # the final-answer grade
        step = text.split("of the assistant:\n")[-1]
        if "broken" in step:
            return Fail(500, "judge crashed on this step")
        return "VERDICT: PASS" if "good" in step else "VERDICT: FAIL"

    server = scripted(reply)
    reward = judge(server, steps=1, retries=0)
    turns = ["a good first move", "a bad second move", "a broken third", "good again"]
    value, _, info = grade(reward, turns=turns)
    assert value == 1.0 and server.calls == 1 + 4
    assert info["step_rewards"] == [1.0, 0.0, None, 1.0]
    assert info["step_errors"] == {"2": "judge: judge server answered HTTP 500: judge crashed on this step"}
    fourth = next(r for r in server.requests if "good again" in r["messages"][-1]["content"])
    shown = fourth["messages"][-1]["content"]
    # Step 4 sees the three before it, numbered, and its own number.
    assert "Step 1:\na good first move\n\nStep 2:\na bad second move\n\nStep 3:\na broken third" in shown
    assert "Step 4 of the assistant:\ngood again" in shown


def test_steps_without_turns_say_so_and_without_a_step_template_are_refused(scripted, tmp_path):
    value, _, info = grade(judge(scripted(lambda m: "VERDICT: PASS"), steps=1))
    assert value == 1.0 and info["step_rewards"] == [] and "passed no turns" in info["step_error"]
    path = write_rubric(tmp_path / "r.yaml", template="{answer}", verdict="(PASS)", scores={"PASS": 1})
    with pytest.raises(UsageError, match="has no step_template"):
        get_reward("judge", judge="tiny", rubric=path, steps=1)


# ---- through the CLI ----------------------------------------------------------------------------------

def write_rollouts(directory: Path) -> None:
    rows = [TrajectoryRow(group_id="g1", sample_index=i, task_id="t1", env="math", env_version="math-1", task=TASK,
                          policy="p", prompt_text="p", prompt_ids=[1, 2], response_ids=[3], response_mask=[1],
                          response_logprobs=[-0.1], turns=[Turn(0, 0, 1, 0, f"<answer>{answer}</answer>")],
                          final_state=answer) for i, answer in enumerate(["42", "41"])]
    write_shard(rows_to_table(rows), str(directory / "part-1.parquet"), Lineage(stage="rollout"))


def test_cli_rewards_rows_with_a_scripted_judge(scripted, tmp_path):
    write_rollouts(tmp_path / "rollouts")
    server = scripted(lambda m: "VERDICT: PASS" if "answer:\n42\n" in m[-1]["content"] else "VERDICT: FAIL")
    result = CliRunner().invoke(app, ["reward", "--in", str(tmp_path / "rollouts"), "--out", str(tmp_path / "out"),
                                      "--reward", "judge", "--reward-opt", f"server={server.url}",
                                      "--reward-opt", "model=scripted", "--json"])
    assert result.exit_code == 0, result.output
    rows = read_shard(str(tmp_path / "out" / "part-1.parquet")).to_pylist()
    assert [r["reward"] for r in rows] == [1.0, 0.0]
    assert all("+rubric:default@" in r["reward_version"] and r["reward_version"].endswith("+judge:scripted")
               for r in rows)
    assert json.loads(rows[1]["reward_info"])["verdict"] == "FAIL"


def test_cli_exits_nonzero_when_the_judge_is_dead(tmp_path):
    write_rollouts(tmp_path / "rollouts")
    result = CliRunner().invoke(app, ["reward", "--in", str(tmp_path / "rollouts"), "--out", str(tmp_path / "out"),
                                      "--reward", "judge", "--reward-opt", f"server=http://127.0.0.1:{free_port()}",
                                      "--reward-opt", "model=m", "--reward-opt", "retries=0"])
    assert result.exit_code == 1
    assert "no row got a reward" in result.output and "judge request failed" in result.output
    rows = read_shard(str(tmp_path / "out" / "part-1.parquet")).to_pylist()  # written, every reward null
    assert [r["reward"] for r in rows] == [None, None]
    assert all(json.loads(r["reward_info"])["infra"] is True for r in rows)


# ---- real judges: `arlctl serve --policy tiny` and the tiny model in process ---------------------------

@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    """A real `arlctl serve --policy tiny` process on 127.0.0.1 (greedy requests: deterministic)."""
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "arlctl.cli.main", "serve", "--policy", "tiny", "--port",
                                 str(port), "--max-batch", "4"], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"arlctl serve exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            break
        except OSError:
            time.sleep(0.3)
    else:
        proc.kill()
        pytest.fail("arlctl serve did not come up")
    yield url
    proc.terminate()
    proc.wait(60)


def first_char_rubric(path: Path, reply: str) -> str:
    """The default rubric (so the same prompt, so the same reply) reading the first non-space character of
    `reply` as a passing verdict."""
    doc = yaml.safe_load((Path(rubrics.HERE) / "default.yaml").read_text())
    doc.update(verdict=r"\A\s*(\S)", scores={reply.strip()[0]: 1.0}, max_tokens=6)
    return write_rubric(path, **doc)


@pytest.mark.slow
def test_a_real_tiny_judge_server_is_deterministic(tiny_server, tmp_path):
    reward = get_reward("judge", server=tiny_server, model="tiny", max_tokens=6, retries=0)
    first, second = grade(reward), grade(reward)
    # The tiny model writes noise: no VERDICT line, so a null reward with the cause — the same twice.
    assert first[0] is None and first[2]["error"].startswith("judge: unparseable verdict: no match of")
    assert first[2]["rationale"] and first[2]["rationale"] == second[2]["rationale"]
    # A rubric that can read its noise turns it into a verdict, again the same twice.
    rubric = first_char_rubric(tmp_path / "first.yaml", first[2]["rationale"])
    reward = get_reward("judge", server=tiny_server, model="tiny", rubric=rubric, retries=0)
    scored = [grade(reward) for _ in range(2)]
    assert [s[0] for s in scored] == [1.0, 1.0]
    assert scored[0][2]["verdict"] == scored[1][2]["verdict"] == scored[0][2]["rationale"].strip()[0]


@pytest.mark.slow
def test_the_in_process_tiny_judge_agrees_with_the_served_one(tiny_server, tmp_path):
    served = grade(get_reward("judge", server=tiny_server, model="tiny", max_tokens=6, retries=0))
    local = get_reward("judge", judge="tiny", max_tokens=6)
    first, second = grade(local), grade(local)
    assert first[0] is None and "unparseable verdict" in first[2]["error"]
    assert first[2]["judge_model"] == "hf:tiny"
    # Same model, same chat template, greedy: the same reply in process as over HTTP.
    assert first[2]["rationale"] == second[2]["rationale"] == served[2]["rationale"]


def test_an_in_process_judge_that_cannot_load_is_a_null_reward(tmp_path):
    (tmp_path / "not-a-model").mkdir()
    value, _, info = grade(get_reward("judge", judge=str(tmp_path / "not-a-model")))
    assert value is None and info["infra"] is True
    assert "could not be loaded" in info["error"] and "not-a-model" in info["error"]


@pytest.mark.slow
def test_shipped_rubrics_load():
    assert rubrics.shipped() == ["default", "listwise", "math", "pairwise"]
    kinds = {name: rubrics.load(name).kind for name in rubrics.shipped()}
    assert kinds == {"default": "judge", "math": "judge", "pairwise": "pairwise", "listwise": "listwise"}
    assert rubrics.load("math").step_template and rubrics.load("default").step_template


@pytest.mark.slow
def test_cli_steps_get_each_turn_from_the_reward_stage(scripted, tmp_path):
    row = TrajectoryRow(group_id="g1", sample_index=0, task_id="t1", env="math", env_version="math-1", task=TASK,
                        policy="p", prompt_text="p", prompt_ids=[1], response_ids=[2, 3], response_mask=[1, 1],
                        response_logprobs=[-0.1, -0.1], turns=[Turn(0, 0, 1, 0, "good: 6 * 7"),
                                                               Turn(1, 1, 1, 0, "bad: <answer>41</answer>")],
                        final_state="41")
    write_shard(rows_to_table([row]), str(tmp_path / "rollouts" / "part-1.parquet"), Lineage(stage="rollout"))
    server = scripted(lambda m: "VERDICT: PASS" if "assistant:\ngood" in m[-1]["content"] else "VERDICT: FAIL")
    result = CliRunner().invoke(app, ["reward", "--in", str(tmp_path / "rollouts"), "--out", str(tmp_path / "out"),
                                      "--reward", "judge", "--reward-opt", f"server={server.url}",
                                      "--reward-opt", "model=m", "--reward-opt", "steps=1"])
    assert result.exit_code == 0, result.output
    [out] = read_shard(str(tmp_path / "out" / "part-1.parquet")).to_pylist()
    info = json.loads(out["reward_info"])
    # The final answer 41 fails; turn 1 ("good: ...") passes and turn 2 fails.
    assert out["reward"] == 0.0 and info["step_rewards"] == [1.0, 0.0] and server.calls == 3
