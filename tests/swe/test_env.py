"""SweEnv over real bwrap sandboxes: prompt, tools, error observations, text mode and the final diff."""

from __future__ import annotations

import pytest
from swe_helpers import run

from arlctl.envs.base import Action
from arlctl.envs.registry import make_env
from arlctl.envs.swe.env import SweEnv
from arlctl.envs.swe.tasks import load_suite_task
from arlctl.errors import UsageError
from arlctl.tools.calls import ToolCall

TASK = "stockroom-001"


def episode(script, **env_options):
    """Run `script(env)` against a reset env on TASK; always release the sandbox and pools."""

    async def go():
        env = SweEnv(sandboxes=1, **env_options)
        try:
            reset = await env.reset(load_suite_task(TASK))
            return await script(env, reset)
        finally:
            await env.close()  # also closes the env's own sandbox pool

    return run(go())


async def call(env, name, **arguments):
    result = await env.step(Action(text="", tool_calls=[ToolCall(name, arguments)]))
    assert len(result.observations) == 1
    return result, result.observations[0]["content"]


def test_reset_prompt_and_tools(bwrap):
    task = load_suite_task(TASK)

    async def script(env, reset):
        return reset

    reset = episode(script)
    assert [m["role"] for m in reset.messages] == ["system", "user"]
    user = reset.messages[1]["content"]
    assert f"(task {TASK})" in user and task["problem_statement"].strip() in user
    everything = str(reset.messages) + str(reset.tools)
    assert "<=" not in everything and "test_reorder_at_threshold" not in everything  # no fix, no hidden test
    names = [t["function"]["name"] for t in reset.tools]
    assert names == ["bash", "view_file", "edit_file", "create_file", "run_tests", "submit"]
    assert isinstance(make_env("swe"), SweEnv)
    with pytest.raises(UsageError):
        SweEnv(mode="chat")


def test_tools_and_error_observations(bwrap):
    async def script(env, reset):
        out = {}
        _, out["view"] = await call(env, "view_file", path="stockroom/reorder.py", start_line=4, end_line=5)
        _, out["missing"] = await call(env, "view_file", path="nope.py")
        _, out["range"] = await call(env, "view_file", path="stockroom/reorder.py", start_line=5, end_line=2)
        _, out["zero"] = await call(env, "edit_file", path="stockroom/reorder.py", old="no such text", new="x")
        _, out["many"] = await call(env, "edit_file", path="stockroom/reorder.py", old="item", new="x")
        _, out["edit"] = await call(env, "edit_file", path="stockroom/reorder.py",
                                    old="item.quantity < item.reorder_at", new="item.quantity <= item.reorder_at")
        _, out["after"] = await call(env, "bash", command="grep -n '<=' stockroom/reorder.py")
        _, out["create"] = await call(env, "create_file", path="stockroom/notes/todo.txt", content="a\nb\n")
        _, out["tests"] = await call(env, "run_tests")
        _, out["unknown"] = await call(env, "teleport")
        result, out["exit"] = await call(env, "bash", command="exit 3")
        parse = await env.step(env.parse_action("<tool_call>{not json}</tool_call>"))
        out["parse"] = parse.observations[0]["content"]
        out["parse_error"] = parse.error
        return out

    out = episode(script)
    assert out["view"] == ("stockroom/reorder.py (lines 4-5 of 10)\n"
                           "    4  def below_threshold(item):\n"
                           "    5      return item.quantity < item.reorder_at")
    assert out["missing"].startswith("error:") and "nope.py" in out["missing"]
    assert out["range"].startswith("error: bad line range 5..2")
    assert out["zero"].startswith("error:") and "not found" in out["zero"]
    assert out["many"].startswith("error:") and "occurs 8 times" in out["many"]
    assert out["edit"] == "edited stockroom/reorder.py: replaced 1 occurrence at line 5"
    assert out["after"] == "exit code: 0\n5:    return item.quantity <= item.reorder_at\n"
    assert out["create"] == "wrote stockroom/notes/todo.txt (2 lines)"
    assert out["tests"].startswith("exit code: 0") and "3 passed" in out["tests"]
    assert out["unknown"].startswith("error: unknown tool 'teleport'")
    assert out["exit"] == "exit code: 3\n"
    assert out["parse"].startswith("error:") and out["parse_error"]


def test_output_truncated_with_marker(bwrap):
    async def script(env, reset):
        return (await call(env, "bash", command="seq 1 5000"))[1]

    text = episode(script, max_output_chars=300)
    assert "[... output truncated:" in text and len(text) < 400
    assert text.startswith("exit code: 0\n1\n2\n") and text.endswith("4999\n5000\n")


def test_submit_returns_diff_with_new_files(bwrap):
    async def script(env, reset):
        await call(env, "edit_file", path="stockroom/reorder.py",
                   old="item.quantity < item.reorder_at", new="item.quantity <= item.reorder_at")
        await call(env, "create_file", path="stockroom/extra.py", content="X = 1\n")
        # noise the diff must not carry, and git tricks that must not hide the change
        await call(env, "bash", command="python -c 'import stockroom' && mkdir -p stockroom/__pycache__ && "
                                        "touch stockroom/__pycache__/x.pyc && git add -A && "
                                        "git -c user.name=a -c user.email=b commit -qm hide && rm -f .git/index")
        return await env.step(Action(text="", tool_calls=[ToolCall("submit", {})]))

    result = episode(script)
    assert result.done and result.finish_reason == "submit"
    diff = result.final_state
    assert "diff --git a/stockroom/reorder.py b/stockroom/reorder.py" in diff
    assert "+    return item.quantity <= item.reorder_at" in diff
    assert "diff --git a/stockroom/extra.py b/stockroom/extra.py\nnew file mode 100644" in diff
    assert "__pycache__" not in diff and ".pyc" not in diff


def test_text_mode_bash_blocks(bwrap):
    async def script(env, reset):
        first = await env.step(env.parse_action("Let me look.\n```bash\nls stockroom\n```"))
        two = await env.step(env.parse_action("```bash\nls\n```\n```bash\npwd\n```"))
        edit = "```bash\nsed -i 's/quantity < item/quantity <= item/' stockroom/reorder.py\n```"
        await env.step(env.parse_action(edit))
        done = await env.step(env.parse_action("Done.\n```bash\necho SUBMIT\n```"))
        return reset, first, two, done

    reset, first, two, done = episode(script, mode="text")
    assert reset.tools == [] and "```bash" in reset.messages[0]["content"]
    assert first.observations == [{"role": "user", "content": "exit code: 0\n__init__.py\ninventory.py\nreorder.py\n"}]
    assert two.error and "expected exactly one" in two.observations[0]["content"]
    assert done.done and done.finish_reason == "submit"
    assert "+    return item.quantity <= item.reorder_at" in done.final_state


def test_provider_bounds_held_sandboxes_and_evicts_idle_pools(bwrap):
    from arlctl.envs.swe.sandboxes import PoolProvider
    from arlctl.envs.swe.tasks import prepare_snapshot

    snap_a = prepare_snapshot(load_suite_task("stockroom-001"))
    snap_b = prepare_snapshot(load_suite_task("leapcal-031"))

    async def go():
        import asyncio

        provider = PoolProvider("bwrap", sandboxes=1, pool_size=1, max_pools=1)
        try:
            first = await provider.acquire(snap_a)
            second = asyncio.ensure_future(provider.acquire(snap_b))
            await asyncio.sleep(0.3)
            blocked = not second.done()  # only one sandbox may be held at a time
            await first.release()
            lease_b = await asyncio.wait_for(second, 30)
            listing = (await lease_b.sandbox.exec("ls", timeout=10)).stdout.split()
            pools = list(provider._pools)
            await lease_b.release()
            return blocked, listing, pools
        finally:
            await provider.close()

    blocked, listing, pools = run(go())
    assert blocked
    assert listing == ["leapcal", "tests"]
    assert pools == [snap_b]  # the idle pool for the first snapshot was closed to make room
