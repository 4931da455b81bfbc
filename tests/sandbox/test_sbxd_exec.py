"""The exec server inside a sandbox (`arlctl/sandbox/_sbxd.py`): one posix_spawn and one poll loop per
command, with no threads (issue 19). What a command sees and what comes back must be what subprocess gave:
its own three descriptors and nothing else, stdin fed while its output is read, output capped per stream,
the wall timeout, signals as negative exit codes; and no request can take the server down.
"""

from __future__ import annotations

import json

from sandbox_helpers import LIMITS, run

from arlctl.sandbox import make_sandbox

PY = "python3"


def _exec_all(backend, snapshot, calls):
    """Run (argv, kwargs) calls in one sandbox; (results, whether the server still answers after each)."""

    async def go():
        sb = await make_sandbox(backend, str(snapshot), **LIMITS)
        try:
            results, alive = [], []
            for argv, kwargs in calls:
                results.append(await sb.exec(argv, **{"timeout": 30, **kwargs}))
                alive.append(await sb.health())
            return results, alive
        finally:
            await sb.close()

    return run(go())


def test_a_command_that_leaves_its_stdin_unread_does_not_end_the_server(backend, snapshot):
    # The server used to die of SIGPIPE here (writing the rest of stdin to a command that had exited).
    (unread, after), alive = _exec_all(backend, snapshot, [
        (["true"], {"stdin": b"y" * (1 << 20)}),
        (["echo", "still here"], {}),
    ])
    assert unread.exit_code == 0 and not unread.timed_out
    assert after.stdout == "still here\n"
    assert alive == [True, True]


def test_stdin_is_fed_while_output_is_read(backend, snapshot):
    # 3 MiB through `cat` both ways: more than either pipe holds, so feeding and reading must interleave.
    data = bytes(range(256)) * (3 * 4096)
    script = "import sys; d = sys.stdin.buffer.read(); sys.stdout.write(d.hex()[:64] + ' ' + str(len(d)))"
    (echoed, counted), _ = _exec_all(backend, snapshot, [
        (["/bin/sh", "-c", "cat | wc -c"], {"stdin": data}),
        ([PY, "-c", script], {"stdin": data}),
    ])
    assert echoed.stdout.strip() == str(len(data))
    assert counted.stdout == data.hex()[:64] + f" {len(data)}"


def test_a_command_gets_only_its_three_descriptors(backend, snapshot):
    script = "import os, json; print(json.dumps(sorted(int(f) for f in os.listdir('/proc/self/fd'))))"
    (listed, with_stdin), _ = _exec_all(backend, snapshot, [([PY, "-c", script], {}),
                                                            ([PY, "-c", script], {"stdin": b"x"})])
    # 0-2 and the descriptor listdir itself opened; never the server's protocol pipes, pidfd or /dev/null
    for result in (listed, with_stdin):
        fds = json.loads(result.stdout)
        assert fds[:3] == [0, 1, 2] and len(fds) == 4, fds


def test_exit_statuses_signals_timeouts_and_spawn_errors(backend, snapshot):
    results, _ = _exec_all(backend, snapshot, [
        (["/bin/sh", "-c", "echo out; echo err >&2; exit 3"], {}),
        (["/bin/sh", "-c", "kill -TERM $$"], {}),
        (["/bin/sh", "-c", "exec >&- 2>&-; sleep 30"], {"timeout": 0.5}),  # closed its pipes, still running
        (["no-such-command-here"], {}),
        ([], {}),  # used to crash the server (IndexError outside the OSError handler)
        (["pwd"], {}),
    ])
    exited, signalled, timed_out, missing, empty, cwd = results
    assert (exited.exit_code, exited.stdout, exited.stderr) == (3, "out\n", "err\n")
    assert signalled.exit_code == -15
    assert timed_out.timed_out and timed_out.exit_code == 124
    assert missing.exit_code == 127 and "no-such-command-here" in missing.stderr
    assert empty.exit_code in (127, 125)  # 125: docker runs argv under timeout(1), which refuses it first
    # the server answered after all of them, in the sandbox's workdir, unchanged by the requests before
    assert cwd.exit_code == 0 and cwd.stdout.strip().startswith("/")


def test_output_is_capped_per_stream_and_the_rest_drained(backend, snapshot):
    async def go():
        sb = await make_sandbox(backend, str(snapshot), max_output_bytes=1000, **LIMITS)
        try:
            return await sb.exec(["/bin/sh", "-c", "head -c 5000000 /dev/zero | tr '\\0' a; echo done >&2"],
                                 timeout=60)
        finally:
            await sb.close()

    result = run(go())
    assert result.exit_code == 0
    assert result.stdout == "a" * 1000
    assert result.stderr.startswith("done\n") and "truncated" in result.stderr
