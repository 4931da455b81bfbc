"""Held-out evaluation: pass@k, correct rates and McNemar on hand-built rows; whole evals of the tiny model,
per version, restartable, following published versions; and no eval row ever reaching filter or train."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest

from arlctl.io import ledger
from arlctl.io.run import RunLayout
from arlctl.io.shards import read_lineage, read_shard, scan
from arlctl.stages.eval import (
    EvalConfig,
    Outcome,
    by_task,
    compare,
    correct_rate,
    ks_up_to,
    mcnemar,
    mcnemar_p,
    pass_at_ks,
    summarize,
)


def rows(task: str, *rewards: float | None, status: str = "ok") -> list[Outcome]:
    return [Outcome(task, r, status, None if r is not None else "grader down") for r in rewards]


# ---------------------------------------------------------------------------------------------- the numbers


def test_pass_at_k_is_the_unbiased_estimator_by_hand():
    # task a: n=4, c=1.  pass@1 = 1 - C(3,1)/C(4,1) = 1 - 3/4 = 0.25;  pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    #                    pass@4 = 1 - C(3,4)/C(4,4) = 1 - 0 = 1
    # task b: n=4, c=0.  every pass@k = 1 - C(4,k)/C(4,k) = 0
    # task c: n=4, c=4.  every pass@k = 1 - C(0,k)/C(4,k) = 1
    tasks = by_task(rows("a", 1, 0, 0, 0) + rows("b", 0, 0, 0, 0) + rows("c", 1, 1, 1, 1), correct_at=1.0)
    got = pass_at_ks(tasks, 4)
    assert got == pytest.approx({"1": (0.25 + 0 + 1) / 3, "2": (0.5 + 0 + 1) / 3, "4": (1 + 0 + 1) / 3})
    # n=8, c=3, k=4: 1 - C(5,4)/C(8,4) = 1 - 5/70
    one = by_task(rows("d", 1, 1, 1, 0, 0, 0, 0, 0), 1.0)
    assert pass_at_ks(one, 8)["4"] == pytest.approx(1 - math.comb(5, 4) / math.comb(8, 4))
    assert ks_up_to(8) == [1, 2, 4, 8] and ks_up_to(6) == [1, 2, 4, 6] and ks_up_to(1) == [1]


def test_rows_without_an_answer_are_left_out_and_counted():
    # task a: two graded rows (1 correct), one null reward; task b: one env_error row (not the model's answer)
    outcome = rows("a", 1.0, 0.0, None) + rows("b", 1.0, status="env_error") + rows("c", 0.5)
    cfg = EvalConfig(samples=3)
    summary = summarize({"sampled": outcome}, cfg)
    assert summary["n_rows"] == 5 and summary["n_graded"] == 3  # a's two graded rows and c's
    assert summary["null_reward"] == 1 and summary["null_reward_causes"] == {"grader down": 1}
    assert summary["not_answers"] == 1 and summary["status"] == {"env_error": 1, "ok": 4}
    assert summary["correct_rate"] == pytest.approx(1 / 3)  # 0.5 < correct_at 1.0
    assert summary["mean_reward"] == pytest.approx(1.5 / 3)
    # clustered by task: a has c=1 of n=2, c has 0 of 1; p = 1/3
    # se = sqrt((1 - 2/3)^2 + (0 - 1/3)^2) / 3 = sqrt(2/9) / 3
    assert summary["correct_se"] == pytest.approx(math.sqrt(2 / 9) / 3)
    # pass@2 only over tasks with at least 2 graded samples (a): 1 - C(1,2)/C(2,2) = 1
    assert summary["pass_at_k"] == pytest.approx({"1": (0.5 + 0.0) / 2, "2": 1.0})
    assert summarize({"sampled": outcome}, EvalConfig(samples=3, correct_at=0.5))["correct_rate"] == pytest.approx(2 / 3)


def test_one_row_per_task_gives_the_binomial_standard_error():
    tasks = by_task([Outcome(str(i), 1.0 if i < 3 else 0.0) for i in range(10)], 1.0)
    p, se = correct_rate(tasks)
    assert p == pytest.approx(0.3) and se == pytest.approx(math.sqrt(0.3 * 0.7 / 10))
    assert correct_rate({}) == (None, None)


def mcnemar_rows(pattern: dict[str, int]) -> tuple[list[Outcome], list[Outcome]]:
    """Greedy rows of two versions from counts: both, only_a, only_b, neither."""
    a, b, i = [], [], 0
    for kind, count in pattern.items():
        for _ in range(count):
            a.append(Outcome(f"t{i}", 1.0 if kind in ("both", "only_a") else 0.0))
            b.append(Outcome(f"t{i}", 1.0 if kind in ("both", "only_b") else 0.0))
            i += 1
    return a, b


def test_exact_mcnemar_by_hand():
    # b=5, c=1: n=6, p = 2 * (C(6,0) + C(6,1)) / 2^6 = 2 * 7 / 64 = 0.21875
    assert mcnemar_p(5, 1) == pytest.approx(0.21875)
    assert mcnemar_p(1, 5) == pytest.approx(0.21875)
    assert mcnemar_p(0, 0) == 1.0 and mcnemar_p(3, 3) == 1.0  # min(1, ...) caps the symmetric case
    # b=10, c=0: 2 * 1 / 1024
    assert mcnemar_p(10, 0) == pytest.approx(2 / 1024)
    a, b = mcnemar_rows({"both": 4, "only_a": 5, "only_b": 1, "neither": 10})
    b.append(Outcome("extra", 1.0))  # graded only in B: unpaired, outside the test
    test = mcnemar(a, b, 1.0)
    assert test == {"tasks": 20, "both": 4, "neither": 10, "only_a": 5, "only_b": 1, "unpaired": 1,
                    "p_value": pytest.approx(0.21875)}


def test_compare_needs_a_shared_mode_and_the_same_threshold():
    a, b = mcnemar_rows({"both": 1, "only_b": 2})
    cfg = EvalConfig()
    sa = {"version": 1, "correct_at": 1.0, **summarize({"greedy": a}, cfg)}
    sb = {"version": 2, "correct_at": 1.0, **summarize({"greedy": b}, cfg)}
    out = compare(sa, {"greedy": a}, sb, {"greedy": b})
    assert out["modes"]["greedy"]["difference"] == pytest.approx(1.0 - 1 / 3)
    assert out["modes"]["greedy"]["mcnemar"]["only_b"] == 2
    from arlctl.errors import UsageError

    with pytest.raises(UsageError, match="share no eval mode"):
        compare(sa, {"greedy": a}, {**sb, "by_mode": {}}, {"sampled": b})
    with pytest.raises(UsageError, match="different --correct-at"):
        compare(sa, {"greedy": a}, {**sb, "correct_at": 0.5}, {"greedy": b})


def test_modes_default_to_greedy():
    assert EvalConfig().modes() == ["greedy"]
    assert EvalConfig(samples=4).modes() == ["sampled"]
    assert EvalConfig(samples=4, greedy=True).modes() == ["greedy", "sampled"]
    loop = EvalConfig(samples=4, greedy=True, temperature=0.7, max_new_tokens=9).loop("greedy", "math")
    assert (loop.group_size, loop.temperature, loop.max_new_tokens) == (1, 0.0, 9)
    assert EvalConfig(samples=4, temperature=0.7).loop("sampled", "math").group_size == 4


# ---------------------------------------------------------------------------------------------- real evals


TASKS = "builtin:math?n=3&seed=5"


def job(root: str, **cfg):
    from arlctl.envs.tasks import load_tasks
    from arlctl.stages.eval_job import EvalJob
    from arlctl.stages.reward import AutoReward

    config = EvalConfig(max_turns=1, max_new_tokens=4, concurrency=8, **cfg)
    return EvalJob(cfg=config, name="t", root=root, tasks=load_tasks(TASKS, env="math"), env="math", env_options={},
                   reward=AutoReward(), sources=[TASKS], policy_spec="tiny")


def load(spec: str):
    from arlctl.inference.loader import load_policy

    return load_policy(spec, max_batch=16, progress=False)


def publish(policy_dir: Path, version: int) -> None:
    """The tiny model published as `version` by sync's own publish and the ledger's LATEST."""
    from arlctl.models import tiny_model_dir
    from arlctl.stages.sync import publish as sync_publish

    sync_publish(tiny_model_dir(), version, policy_dir)
    ledger.write_latest(policy_dir, ledger.version_dir_name(version))


@pytest.mark.slow
def test_one_version_writes_rewarded_shards_and_a_summary_once(tmp_path):
    from arlctl.stages.eval_job import evaluate_version, read_eval

    root = str(tmp_path / "evals")
    the_job = job(root, greedy=True, samples=2)

    async def go(j):
        pol = load("tiny")
        try:
            return await evaluate_version(j, pol, asyncio.Event(), log=lambda line: None)
        finally:
            await pol.close()

    first = asyncio.run(go(the_job))
    directory = Path(root) / "t" / "v000000"
    assert first.directory == str(directory) and not first.skipped and not (directory / "_work").exists()
    shards = scan(str(directory)).shards
    assert sorted(Path(s).name.split("-")[0] for s in shards) == ["greedy", "sampled"]
    for shard in shards:
        table = read_shard(shard)
        mode = Path(shard).name.split("-")[0]
        assert table.num_rows == 3 * (1 if mode == "greedy" else 2)
        assert table.column("reward").null_count == 0 and set(table.column("policy_version").to_pylist()) == {0}
        lineage = read_lineage(shard)
        assert lineage.stage == "eval" and lineage.inputs == []
        assert lineage.extra["eval"] == "t" and lineage.extra["mode"] == mode and lineage.extra["policy_version"] == 0
    summary = json.loads((directory / "summary.json").read_text())
    assert summary["name"] == "t" and summary["version"] == 0 and summary["n_tasks"] == 3 and summary["n_rows"] == 9
    assert set(summary["pass_at_k"]) == {"1", "2"} and summary["by_mode"]["greedy"]["n_rows"] == 3
    assert summary["tasks"] == [TASKS] and summary["samples"] == 2 and summary["policy"] == "tiny"
    again = asyncio.run(go(the_job))  # a second run of the same version is a no-op
    assert again.skipped and scan(str(directory)).shards == shards
    read_back, by_mode = read_eval(root, "t", 0)
    assert read_back == summary and len(by_mode["sampled"]) == 6
    the_job.force = True  # --force evaluates it again, replacing the shards
    forced = asyncio.run(go(the_job))
    assert not forced.skipped and len(scan(str(directory)).shards) == 2 and set(scan(str(directory)).shards) != set(shards)


@pytest.mark.slow
def test_watch_evaluates_every_nth_published_version_once(tmp_path):
    from arlctl.stages.eval_job import watch

    policy_dir = tmp_path / "policy"
    root = str(tmp_path / "evals")
    publish(policy_dir, 1)
    publish(policy_dir, 2)
    the_job = job(root, every=2)

    async def follow(on_version):
        stop = asyncio.Event()
        return await watch(the_job, str(policy_dir), load, stop, poll=0.2, log=lambda line: None,
                           on_result=lambda r: on_version(r, stop))

    def on_version(result, stop):
        if result.version == 2:  # sync publishes more while the watcher runs
            publish(policy_dir, 3)
            publish(policy_dir, 4)
        if result.version == 4:
            stop.set()

    first = asyncio.run(follow(on_version))
    assert [r.version for r in first.evaluated] == [2, 4] and first.failed == {}
    assert sorted(p.name for p in (Path(root) / "t").iterdir() if not p.name.startswith("_")) == ["v000002",
                                                                                                  "v000004"]
    assert json.loads((Path(root) / "t" / "v000004" / "summary.json").read_text())["version"] == 4

    async def restart():  # a restarted watcher skips what is evaluated, and evaluates v6 when it appears
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.call_later(0.5, publish, policy_dir, 5)
        loop.call_later(0.7, publish, policy_dir, 6)
        return await watch(the_job, str(policy_dir), load, stop, poll=0.2, log=lambda line: None,
                           on_result=lambda r: stop.set())

    second = asyncio.run(restart())
    assert [r.version for r in second.evaluated] == [6] and not second.evaluated[0].skipped


def test_filter_and_train_never_read_eval_shards(tmp_path):
    """A run with an eval next to ordinary rewarded rows: filter (with the run's default I/O, as `arlctl
    filter --run` resolves it) batches only RUN/rewarded rows, so train (which reads RUN/batches) cannot
    see an eval row."""
    from arlctl.io.run import STAGE_IO
    from arlctl.io.shards import Lineage, write_shard
    from arlctl.stages.configs import FilterConfig
    from arlctl.stages.eval_job import evaluate_version
    from arlctl.stages.filter import run_filter
    from arlctl.synthetic import synthetic_table

    run = RunLayout(str(tmp_path / "run"))
    the_job = job(run.evals, samples=2)

    async def go():
        pol = load("tiny")
        try:
            return await evaluate_version(the_job, pol, asyncio.Event(), log=lambda line: None)
        finally:
            await pol.close()

    asyncio.run(go())
    eval_ids = {i for s in scan(the_job.version_dir(0)).shards for i in read_shard(s).column("trajectory_id").to_pylist()}
    assert len(eval_ids) == 6
    write_shard(synthetic_table(4, group_size=2, seed=3), f"{run.rewarded}/part-a.parquet", Lineage("reward"))
    in_url, out_url = run.stage_io("filter")
    summary = run_filter(in_url, out_url, FilterConfig(batch_groups=2, keep_status=["ok", "truncated", "timeout",
                                                                                    "env_error", "policy_error"]), 0)
    batched = {i for s in scan(out_url).shards for i in read_shard(s).column("trajectory_id").to_pylist()}
    assert batched and not batched & eval_ids
    for shard in scan(out_url).shards:
        assert all("/evals/" not in i for i in read_lineage(shard).inputs)
    assert summary["inputs"] == ["part-a.parquet"] and summary["rows_in"] == 8  # the rewarded rows, no eval row
    # no pipeline stage has RUN/evals as its input
    assert all(inp != "evals" for inp, _ in STAGE_IO.values()) and run.stage_io("train")[0] == run.batches
