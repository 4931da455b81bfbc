"""Where a sandbox runs (`placement()`, recorded as a row's env_info, schema v3), and what a pool's acquire
reports when it gave sandboxes up before handing one out (`acquire(moves=[])`).

Real backends: bwrap on this host, docker on the engine of .ci/docker_setup.sh (marker docker).
"""

from __future__ import annotations

import socket

from sandbox_helpers import run

from arlctl.sandbox import Sandbox, make_sandbox
from arlctl.sandbox.base import placement_of
from arlctl.sandbox.docker import default_url


def test_placement_says_where_each_backend_runs(backend, snapshot):
    async def scenario():
        sb = await make_sandbox(backend, str(snapshot), memory_mb=256, pids=64, disk_mb=64)
        try:
            return sb.placement(), (await sb.exec("cat /etc/hostname || hostname")).stdout.strip(), sb
        finally:
            await sb.close()

    where, inside, sb = run(scenario())
    assert isinstance(sb, Sandbox)  # placement() is part of the protocol every backend implements
    assert where["sandbox"] == backend
    if backend == "bwrap":
        assert where == {"sandbox": "bwrap", "host": socket.gethostname(), "id": sb.id}
    else:
        # The container's own hostname is its short id: the placement names the container it really is.
        assert where["container"] == inside and len(inside) == 12
        assert where["engine"] == default_url() and where["name"].startswith("arlctl-sbx-")
        assert where["image"] == "arlctl/sandbox-base:1"


def test_subprocess_placement_is_this_host(tmp_path):
    async def scenario():
        sb = await make_sandbox("subprocess", None, insecure=True, root_dir=str(tmp_path))
        try:
            return sb.placement()
        finally:
            await sb.close()

    assert run(scenario()) == {"sandbox": "subprocess", "host": socket.gethostname()}


def test_placement_of_an_object_without_one_names_its_kind():
    class Bare:
        kind = "custom"

    assert placement_of(Bare()) == {"sandbox": "custom"}
    assert placement_of(object()) == {"sandbox": "object"}


def test_an_acquire_reports_the_sandbox_it_gave_up_for_a_failed_health_check(backend, pool_factory):
    """The pool's one idle sandbox dies before anyone leases it (closed under the pool, as a crashed exec
    server or a dead engine looks to a health check). The next acquire skips it, waits for its
    replacement, and reports the dead one's placement with the cause."""

    async def scenario():
        async with pool_factory(backend, size=1) as pool:
            [dead] = list(pool._all)
            gone = dead.placement()
            await dead.close()
            moves: list[dict] = []
            async with pool.acquire(moves=moves) as sb:
                assert (await sb.exec("cat README")).stdout == "pristine\n"
                now = sb.placement()
            quiet: list[dict] = []
            async with pool.acquire(moves=quiet) as sb:  # healthy: nothing given up, nothing reported
                pass
            return gone, now, moves, quiet, pool.stats()

    gone, now, moves, quiet, stats = run(scenario())
    assert moves == [{**gone, "cause": "health_check"}]
    assert now != gone and now["sandbox"] == gone["sandbox"] == backend
    assert quiet == []
    assert stats.health_failures == 1 and stats.replacement_causes == {"health_check": 1}
