"""`--env-mix` parsing, per-env task sources and the mixed group sampler (arlctl.envs.mix)."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import pytest

from arlctl.envs.mix import mix_sources, mixed_tasks, parse_env_mix
from arlctl.errors import UsageError


def _sources(**sizes: int) -> dict[str, list[dict]]:
    return {env: [{"task_id": f"{env}-{i}", "prompt": f"p{i}", "meta": {"k": [i]}} for i in range(n)]
            for env, n in sizes.items()}


# ------------------------------------------------------------------------------------------------ parse
def test_parse_normalises_and_keeps_order():
    assert parse_env_mix("swe:0.7,math:0.3") == [("swe", pytest.approx(0.7)), ("math", pytest.approx(0.3))]
    # 1 + 3 = 4 -> 0.25, 0.75; spaces around items are fine
    assert parse_env_mix(" a:1 , b:3 ") == [("a", 0.25), ("b", 0.75)]
    assert parse_env_mix("math:2") == [("math", 1.0)]


def test_parse_plugin_specs_keep_their_colon():
    mix = parse_env_mix("mypkg.env:make:1,math:1,other.mod:Factory:2")
    assert mix == [("mypkg.env:make", 0.25), ("math", 0.25), ("other.mod:Factory", 0.5)]


@pytest.mark.parametrize("spec, words", [
    ("", "item 1 is empty"),
    ("swe:0.5,,math:0.5", "item 2 is empty"),
    ("swe:0.5,", "item 2 is empty"),
    ("swe", "has no weight"),
    (":0.5", "has no weight"),
    ("swe:0.5,math:x", "'x' of 'math' is not a number"),
    ("mypkg.env:make", "'make' of 'mypkg.env' is not a number"),  # plugin spec without its weight
    ("swe:0", "positive finite"),
    ("swe:-1,math:2", "positive finite"),
    ("swe:nan", "positive finite"),
    ("swe:inf,math:1", "positive finite"),
    ("swe:1,math:1,swe:2", "'swe' is given twice"),
])
def test_parse_rejects_bad_specs_with_one_line_and_a_hint(spec, words):
    with pytest.raises(UsageError) as info:
        parse_env_mix(spec)
    assert words in str(info.value) and "\n" not in str(info.value)
    assert info.value.hint


# --------------------------------------------------------------------------------------------- sampling
@pytest.mark.parametrize("spec", ["a:0.7,b:0.3", "a:0.5,b:0.5", "a:0.9,b:0.1", "a:1,b:2,c:7", "a:0.33,b:0.67"])
@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_realised_shares_over_1000_groups_are_within_5_percent(spec, seed):
    mix = parse_env_mix(spec)
    sources = _sources(a=5, b=3, c=11)
    tasks = list(mixed_tasks({e: sources[e] for e, _ in mix}, mix, seed, 1000))
    assert len(tasks) == 1000
    counts = Counter(t["env"] for t in tasks)
    for env, weight in mix:
        assert abs(counts[env] / 1000 - weight) <= 0.05, (env, counts)
        # the round robin is much tighter than the ±5% bar: within one group of weight * n
        assert abs(counts[env] - weight * 1000) <= 1, (env, counts)


def test_any_window_of_1000_groups_of_an_endless_stream_is_within_5_percent():
    mix = parse_env_mix("swe:0.7,math:0.3")
    stream = mixed_tasks(_sources(swe=4, math=9), mix, 3, None)
    envs = [t["env"] for t in itertools.islice(stream, 5000)]
    for start in (0, 1, 333, 2500, 3999):
        share = envs[start:start + 1000].count("swe") / 1000
        assert abs(share - 0.7) <= 0.05, (start, share)


def test_same_seed_same_sequence_other_seed_other_order():
    mix = parse_env_mix("a:0.6,b:0.4")
    sources = _sources(a=7, b=5)

    def ids(seed):
        return [(t["env"], t["task_id"]) for t in mixed_tasks(sources, mix, seed, 300)]

    assert ids(7) == ids(7)
    assert ids(7) != ids(8)  # later passes are reshuffled with the seed


def test_tasks_cycle_in_order_then_reshuffled_whole_passes():
    mix = parse_env_mix("a:0.5,b:0.5")
    sources = _sources(a=4, b=4)
    a_ids = [t["task_id"] for t in mixed_tasks(sources, mix, 0, 40) if t["env"] == "a"]
    assert len(a_ids) == 20
    assert a_ids[:4] == ["a-0", "a-1", "a-2", "a-3"]  # first pass in source order
    for start in range(0, 20, 4):  # every pass uses every task exactly once
        assert sorted(a_ids[start:start + 4]) == ["a-0", "a-1", "a-2", "a-3"]
    assert any(a_ids[s:s + 4] != a_ids[:4] for s in range(4, 20, 4))  # and some pass is reshuffled


def test_yields_copies_with_env_set_and_exactly_n_groups():
    sources = _sources(a=2, b=2)
    mix = parse_env_mix("a:1,b:1")
    tasks = list(mixed_tasks(sources, mix, 0, 5))
    assert len(tasks) == 5 and all("env" in t for t in tasks)
    tasks[0]["meta"]["k"].append(99)
    assert sources["a"][0]["meta"]["k"] == [0] and "env" not in sources["a"][0]  # the sources are untouched
    assert list(mixed_tasks(sources, mix, 0, 0)) == []


def test_an_env_without_tasks_is_a_usage_error():
    with pytest.raises(UsageError, match="'b' of the mix has no tasks"):
        next(mixed_tasks({"a": _sources(a=1)["a"], "b": []}, parse_env_mix("a:1,b:1"), 0, 3))


# ---------------------------------------------------------------------------------------------- sources
def _jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_env_equals_source_and_builtin_fallback():
    mix = parse_env_mix("math:0.5,first-token:0.5")
    sources = mix_sources(mix, ["math=builtin:math?n=3&seed=1"])
    assert list(sources) == ["math", "first-token"]
    assert len(sources["math"]) == 3 and all(t["env"] == "math" for t in sources["math"])
    assert len(sources["first-token"]) == 64  # builtin:first-token's default n
    assert all(t["env"] == "first-token" for t in sources["first-token"])


def test_a_plain_source_is_split_by_its_rows_env(tmp_path):
    path = _jsonl(tmp_path / "mixed.jsonl", [
        {"task_id": "m1", "env": "math", "question": "1+1", "answer": "2"},
        {"task_id": "f1", "env": "first-token", "prompt": "x"},
        {"task_id": "m2", "env": "math", "question": "2+2", "answer": "4"},
    ])
    sources = mix_sources(parse_env_mix("math:3,first-token:1"), [path])
    assert [t["task_id"] for t in sources["math"]] == ["m1", "m2"]
    assert [t["task_id"] for t in sources["first-token"]] == ["f1"]
    got = Counter(t["env"] for t in mixed_tasks(sources, parse_env_mix("math:3,first-token:1"), 0, 400))
    assert got == {"math": 300, "first-token": 100}


def test_env_equals_jsonl_fills_env_and_rejects_rows_of_another_env(tmp_path):
    path = _jsonl(tmp_path / "t.jsonl", [{"task_id": "q1", "question": "1+1", "answer": "2"}])
    sources = mix_sources(parse_env_mix("math:1,first-token:1"), [f"math={path}"])
    assert sources["math"] == [{"task_id": "q1", "question": "1+1", "answer": "2", "env": "math"}]
    other = _jsonl(tmp_path / "o.jsonl", [{"task_id": "q1", "env": "first-token", "prompt": "x"}])
    with pytest.raises(UsageError, match="is for env 'first-token', not 'math'"):
        mix_sources(parse_env_mix("math:1,first-token:1"), [f"math={other}"])


def test_rows_without_env_in_a_plain_source_name_the_first_such_row(tmp_path):
    path = _jsonl(tmp_path / "t.jsonl", [{"task_id": "ok", "env": "math"}, {"task_id": "bare-7"},
                                         {"task_id": "bare-8"}])
    with pytest.raises(UsageError, match="task 'bare-7' has no 'env' field"):
        mix_sources(parse_env_mix("math:1"), [path])


def test_sources_for_envs_outside_the_mix_are_usage_errors(tmp_path):
    mix = parse_env_mix("math:1")
    with pytest.raises(UsageError, match="env 'first-token', which is not in the mix"):
        mix_sources(mix, ["first-token=builtin:first-token?n=2"])
    path = _jsonl(tmp_path / "t.jsonl", [{"task_id": "f", "env": "first-token", "prompt": "x"}])
    with pytest.raises(UsageError, match="env 'first-token', which is not in the mix"):
        mix_sources(mix, [path])


def test_two_sources_for_one_env_are_a_usage_error():
    with pytest.raises(UsageError, match="'math' has tasks from both"):
        mix_sources(parse_env_mix("math:1"), ["math=builtin:math?n=2", "math=builtin:math?n=3"])


def test_an_env_with_no_source_and_no_builtin_says_how_to_pass_one():
    with pytest.raises(UsageError) as info:
        mix_sources(parse_env_mix("math:1,mypkg.env:make:1"), [])
    assert "'mypkg.env:make' of the mix has no tasks" in str(info.value)
    assert "--tasks mypkg.env:make=SOURCE" in info.value.hint


def test_a_builtin_spec_with_options_is_not_mistaken_for_env_equals_source():
    # "builtin:math?n=2" has '=' but is a plain source; its rows carry env "math"
    sources = mix_sources(parse_env_mix("math:1"), ["builtin:math?n=2"])
    assert len(sources["math"]) == 2
