"""Out-of-tree environments and rewards: a real package (tests/envs/plugin_pkg) pip-installed into this
venv, used through `module:attribute` specs and through its entry points, with no edit to arlctl.

The package is uninstalled when the module's tests end, so the venv is left as it was. The commands run in
this process (a fresh interpreter per command cost seconds each); the listing is also read by a fresh
`arlctl` process (e2e), as a user's shell would after `pip install`.
"""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from inprocess import arlctl as arlctl_in_process

from arlctl.envs import registry
from arlctl.io.shards import list_shards, read_shard

ARLCTL = [sys.executable, "-m", "arlctl.cli.main"]
PACKAGE = Path(__file__).parent / "plugin_pkg"
DIST = "arlctl-mypkg-fixture"

# The package is installed into the one venv every xdist worker shares, and uninstalled when the module's
# tests end: split over two workers, one worker's uninstall would pull it from under the other's tests.
pytestmark = pytest.mark.xdist_group("plugin-venv")
WORDS = ["stone", "lamp"]


def arlctl(*args: str) -> subprocess.CompletedProcess:
    """The real CLI in this process. The plugins it loads are forgotten after it (they are uninstalled when
    the module ends); built-ins it imported stay registered, as their modules stay imported."""
    before = set(registry.SOURCES)
    try:
        return arlctl_in_process(*args)
    finally:
        for what, name in set(registry.SOURCES) - before:
            (registry.ENVS if what == "env" else registry.REWARDS).pop(name, None)
            del registry.SOURCES[(what, name)]


def arlctl_process(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*ARLCTL, *args], capture_output=True, text=True, timeout=600)


def pip(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """Install the fixture package from a copy (pip builds in it, never in the repo); uninstall after."""
    copy = tmp_path_factory.mktemp("plugin") / "plugin_pkg"
    shutil.copytree(PACKAGE, copy)
    pip("install", "--no-deps", "--no-build-isolation", "--no-index", "-q", str(copy))  # offline: setuptools is here
    importlib.invalidate_caches()  # this process finds the new package's modules and metadata too
    try:
        yield
    finally:
        pip("uninstall", "-y", "-q", DIST)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    path = tmp_path_factory.mktemp("tasks") / "words.jsonl"
    path.write_text("".join(json.dumps({"task_id": f"w{i}", "word": w}) + "\n" for i, w in enumerate(WORDS)))
    return str(path)


def rollout(env: str, tasks: str, out: Path, *extra: str) -> list[dict]:
    result = arlctl("rollout", "--env", env, "--tasks", tasks, "--policy", "tiny", "--out", str(out), "-G", "2",
                    "--max-turns", "1", "--max-new-tokens", "8", "--seed", "0", "--json", "-q", *extra)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["trajectories"] == 4
    return [row for shard in list_shards(str(out)) for row in read_shard(shard).to_pylist()]


def reward(reward_name: str, rollouts: Path, out: Path) -> tuple[dict, list[dict]]:
    result = arlctl("reward", "--in", str(rollouts), "--out", str(out), "--reward", reward_name, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), [row for s in list_shards(str(out)) for row in read_shard(s).to_pylist()]


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in result.stderr
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


@pytest.mark.slow
def test_spec_env_rolls_out_and_spec_reward_scores(plugin, tasks, tmp_path):
    rows = rollout("mypkg.env:make", tasks, tmp_path / "rollouts")
    assert len(rows) == 4
    assert {row["env"] for row in rows} == {"mypkg.env:make"}  # the env column holds the --env given
    assert {row["env_version"] for row in rows} == {"reverse-1"}  # ReverseEnv.version: the plugin's object ran
    assert {row["status"] for row in rows} <= {"ok", "truncated"}
    assert all("backwards" in row["prompt_text"] for row in rows)

    summary, scored = reward("mypkg.reward:score", tmp_path / "rollouts", tmp_path / "rewarded")
    assert summary["rows"] == 4 and summary["reward_version"] == "reverse-reward-2"  # mypkg.reward.VERSION
    for row in scored:
        task = json.loads(row["task"]) if isinstance(row["task"], str) else row["task"]
        answer = (row["final_state"] if row["final_state"] is not None else "").strip()
        assert row["reward"] == float(answer == task["word"][::-1])  # the plugin's rule, applied per row
        assert row["reward_version"] == "reverse-reward-2"


@pytest.mark.slow
def test_entry_point_names_work_like_builtins(plugin, tasks, tmp_path):
    rows = rollout("reverse", tasks, tmp_path / "rollouts", "--env-opt", "hint=true")
    assert {row["env"] for row in rows} == {"reverse"}
    assert all("It has" in row["prompt_text"] for row in rows)  # --env-opt reached the plugin's factory

    summary, scored = reward("reverse", tmp_path / "rollouts", tmp_path / "rewarded")
    assert summary["rows"] == 4 and {row["reward_version"] for row in scored} == {"reverse-reward-2"}
    assert all(row["reward"] in (0.0, 1.0) for row in scored)


def test_a_reward_without_version_is_versioned_by_its_spec(plugin, tasks, tmp_path):
    rollout("reverse", tasks, tmp_path / "rollouts")
    summary, scored = reward("mypkg.plain:half", tmp_path / "rollouts", tmp_path / "rewarded")
    assert summary["reward_version"] == "mypkg.plain:half"
    assert {row["reward"] for row in scored} == {0.5}


@pytest.mark.parametrize("where", [
    "in-process", pytest.param("process", marks=pytest.mark.e2e)])
def test_envs_lists_plugins_with_their_source(plugin, where):
    run = arlctl if where == "in-process" else arlctl_process
    result = run("envs", "--json")
    assert result.returncode == 0, result.stderr  # a broken plugin (mypkg-broken) is listed, not loaded
    listing = json.loads(result.stdout)
    envs = {(e["name"], e["source"]): e for e in listing["envs"]}
    assert envs[("math", "builtin")]["module"] == "arlctl.envs.math"
    assert envs[("swe", "builtin")]["module"].startswith("arlctl.envs.swe")
    reverse = envs[("reverse", "entry-point")]
    assert (reverse["distribution"], reverse["distribution_version"], reverse["module"]) == (
        DIST, "0.3.1", "mypkg.env:make")
    assert "shadowed" in envs[("math", "entry-point")]["note"]  # the built-in of the same name wins
    assert ("mypkg-broken", "entry-point") in envs
    rewards = {(e["name"], e["source"]): e for e in listing["rewards"]}
    assert rewards[("reverse", "entry-point")]["module"] == "mypkg.reward:score"
    assert rewards[("math", "builtin")]["version"] == "math-1"

    human = run("envs")
    assert human.returncode == 0, human.stderr
    assert re.search(rf"\n  reverse +entry point of {DIST} 0.3.1: mypkg.env:make\n", human.stderr)
    assert re.search(rf"\n  math +entry point of {DIST} 0.3.1: mypkg.env:make  -- shadowed", human.stderr)


def test_builtin_wins_over_a_plugin_of_the_same_name(plugin):
    result = arlctl("rollout", "--env", "math", "--tasks", "builtin:math?n=1", "--policy", "tiny", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "calculator" in result.stderr and "backwards" not in result.stderr


@pytest.mark.parametrize(("spec", "message"), [
    ("nosuch.module:make", "no module named 'nosuch'"),
    ("mypkg.env:nothing", "has no attribute 'nothing'"),
    ("mypkg.env:NOT_CALLABLE", "is a int, not callable"),
    ("mypkg.env:not_an_env", "without reset, step, close"),
    ("mypkg-broken", f"from plugin {DIST} 0.3.1 (mypkg.nosuch:make) failed to load"),
    ("no-such-env", "unknown env 'no-such-env'"),
])
def test_a_broken_env_is_a_usage_error_with_one_line(plugin, tasks, tmp_path, spec, message):
    result = arlctl("rollout", "--env", spec, "--tasks", tasks, "--policy", "tiny", "--out", str(tmp_path / "o"),
                    "--dry-run")
    assert result.returncode == 2, result.stderr
    lines = error_lines(result)
    assert len(lines) == 1 and message in lines[0], result.stderr


@pytest.mark.parametrize(("spec", "message"), [
    ("nosuch.module:score", "no module named 'nosuch'"),
    ("mypkg.reward:nothing", "has no attribute 'nothing'"),
    ("mypkg.env:NOT_CALLABLE", "not callable"),
    ("mypkg.env:make", "cannot be called as score(final_state, task, response_text)"),  # an env, not a reward
    ("mypkg.reward", "unknown reward 'mypkg.reward'"),
])
def test_a_broken_reward_is_a_usage_error_with_one_line(plugin, tmp_path, spec, message):
    (tmp_path / "in").mkdir()
    result = arlctl("reward", "--in", str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--reward", spec)
    assert result.returncode == 2, result.stderr
    lines = error_lines(result)
    assert len(lines) == 1 and message in lines[0], result.stderr


# In-process checks of the registry's rules (no pip needed).

from importlib.metadata import version  # noqa: E402  (a module-level `version` function: must not be a version)

from arlctl.errors import UsageError  # noqa: E402


def _score(final_state, task, response_text):
    return 1.0, {}, {}


def _versioned(final_state, task, response_text):
    return 1.0, {}, {}


_versioned.version = "versioned-7"


def test_reward_version_comes_from_the_function_else_the_spec():
    assert callable(version)  # this module holds a function named `version`: it is skipped, not str()-ed
    assert registry.plugin_reward_version(_versioned, "tests.x:_versioned") == "versioned-7"
    assert registry.plugin_reward_version(_score, "tests.x:_score") == "tests.x:_score"


@pytest.fixture
def clean_registry():
    """Plugins loaded by a test leave the process-wide tables as they were."""
    saved = dict(registry.ENVS), dict(registry.REWARDS), dict(registry.SOURCES)
    yield
    for table, before in zip((registry.ENVS, registry.REWARDS, registry.SOURCES), saved, strict=True):
        table.clear()
        table.update(before)


def _fake_dist(root: Path, name: str, entry: str) -> None:
    """A real installed-distribution record (what pip writes), on a directory put on sys.path."""
    info = root / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[arlctl.rewards]\n{entry}\n")


def test_two_plugins_claiming_one_name_are_refused(tmp_path, monkeypatch, clean_registry):
    _fake_dist(tmp_path, "plugin-a", f"twice = {__name__}:_score")
    _fake_dist(tmp_path, "plugin-b", f"twice = {__name__}:_versioned")
    _fake_dist(tmp_path, "plugin-c", f"once = {__name__}:_versioned")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UsageError, match=r"'twice' is registered by several plugins: plugin-a 1.0 .*plugin-b 1.0"):
        registry.get_reward("twice")
    notes = {e["distribution"]: e.get("note") for e in registry.catalog("reward") if e["name"] == "twice"}
    assert set(notes) == {"plugin-a", "plugin-b"} and all("ambiguous" in note for note in notes.values())
    loaded = registry.get_reward("once")
    assert loaded.version == "versioned-7" and loaded.score is _versioned
    assert registry.SOURCES[("reward", "once")] == registry.Source("entry-point", f"{__name__}:_versioned",
                                                                   "plugin-c", "1.0")


def test_reward_options_bind_to_a_spec_reward(clean_registry):
    with pytest.raises(UsageError, match="bad option for reward"):
        registry.get_reward(f"{__name__}:_score", weight=2)
