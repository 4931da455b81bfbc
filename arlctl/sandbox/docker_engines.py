"""Several docker engines behind one run: which hosts, whether each still answers, and their images.

A run names its engines as a list of entries `URL [max=N]` (N: the most sandboxes that engine may hold):
the docker backend's `docker_hosts` option (a list, or one comma-separated string, so
`--env-opt docker_hosts=unix:///a.sock,unix:///b.sock` works), else $ARLCTL_DOCKER_HOSTS. An entry that
is a file path (no `://`) is a hosts file: one entry per line, `#` comments. `engine_limit` is the limit
of entries that give none.

`DockerEngines` pairs the placement (`pool.EngineSet`: most free capacity first, eject and back off) with
a liveness probe: a sandbox whose exec channel broke asks `check(host)`, which pings the engine (one ping
per engine per second at most, however many sandboxes ask) and ejects it when it does not answer. Every
pool of a process that names the same engines shares one `DockerEngines` (`shared_engines`), so counts
and ejections are the engines', not one pool's.

`prefetch` checks (and pulls, where a registry is reachable) every image on every engine before a run.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from arlctl.errors import UsageError
from arlctl.sandbox.pool import EngineSet

HOSTS_ENV = "ARLCTL_DOCKER_HOSTS"
_PROBE_CACHE_S = 1.0


def parse_hosts(
    spec: str | Iterable[str] | None, default_limit: int | None = None
) -> list[tuple[str, int | None]]:
    """[(url, limit)] from entries `URL [max=N]`, comma-separated strings and hosts files; duplicates dropped."""
    if spec is None:
        return []
    items = (
        spec.split(",") if isinstance(spec, str) else [part for item in spec for part in str(item).split(",")]
    )
    hosts: dict[str, int | None] = {}
    for item in (i.strip() for i in items):
        if not item:
            continue
        if "://" not in item.split()[0]:
            hosts.update(parse_hosts(_read_hosts_file(item), default_limit))
            continue
        url, *options = item.split()
        limit = default_limit
        for option in options:
            key, _, value = option.partition("=")
            if key != "max" or not value.isdigit() or int(value) < 1:
                raise UsageError(f"bad docker host entry {item!r}", hint="write URL or 'URL max=N' (N >= 1)")
            limit = int(value)
        hosts[url] = limit
    return list(hosts.items())


def _read_hosts_file(path: str) -> list[str]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise UsageError(
            f"cannot read docker hosts file {path}: {e}",
            hint="entries are URLs such as unix:///run/arlctl-docker.sock, or a file of them",
        ) from e
    return [line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()]


def hosts_from(
    docker_hosts: str | Iterable[str] | None = None, engine_limit: int | None = None
) -> list[tuple[str, int | None]]:
    """The configured engines: `docker_hosts`, else $ARLCTL_DOCKER_HOSTS; [] when neither names any."""
    if docker_hosts:
        return parse_hosts(docker_hosts, engine_limit)
    return parse_hosts(os.environ.get(HOSTS_ENV) or None, engine_limit)


def ping(url: str, timeout: float) -> str | None:
    """None when the engine at `url` answers within `timeout`, else why not."""
    try:
        import docker
    except ImportError:
        return "the docker SDK is not installed"
    try:
        client = docker.DockerClient(base_url=url, timeout=timeout)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    try:
        client.ping()
        return None
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    finally:
        client.close()


class DockerEngines:
    """The engines one process spreads docker sandboxes over (see the module docstring)."""

    def __init__(
        self,
        hosts: list[tuple[str, int | None]],
        backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        probe_timeout_s: float = 3.0,
    ):
        self.placement = EngineSet(hosts, backoff_s=backoff_s, max_backoff_s=max_backoff_s)
        self.probe_timeout_s = probe_timeout_s
        self._probed: dict[str, tuple[float, str | None]] = {}
        self._probe_locks = {host: threading.Lock() for host, _ in hosts}

    @property
    def hosts(self) -> list[str]:
        return list(self.placement.engines)

    def probe(self, host: str) -> str | None:
        """Ping `host` (or reuse a ping from the last second); eject it when it does not answer. None: it
        answers; else the reason it does not."""
        with self._probe_locks[host]:
            when, error = self._probed.get(host, (-1e9, None))
            if time.monotonic() - when > _PROBE_CACHE_S:
                error = ping(host, self.probe_timeout_s)
                self._probed[host] = (time.monotonic(), error)
        if error is not None:
            self.placement.eject(host, error)
        return error

    async def check(self, host: str) -> str | None:
        return await asyncio.to_thread(self.probe, host)

    def stats(self) -> list[dict]:
        return self.placement.stats()


_SHARED: dict[tuple, DockerEngines] = {}
_SHARED_LOCK = threading.Lock()


def shared_engines(hosts: list[tuple[str, int | None]]) -> DockerEngines:
    """The process's DockerEngines for exactly these hosts and limits (one placement for all its pools)."""
    key = tuple(hosts)
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = DockerEngines(hosts)
        return _SHARED[key]


# ---- images on every engine ------------------------------------------------------------------------------


@dataclass
class ImageCheck:
    engine: str
    image: str
    status: str  # present, pulled, missing, unreachable
    detail: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status in ("present", "pulled")

    def to_json(self) -> dict:
        return {
            "engine": self.engine,
            "image": self.image,
            "status": self.status,
            "ok": self.ok,
            "detail": self.detail,
            "seconds": round(self.seconds, 3),
        }


def check_image(engine: str, image: str, pull: bool, timeout: float = 600.0) -> ImageCheck:
    """Whether `image` is on `engine`; with `pull`, pull it when it is not. Never raises."""
    started = time.monotonic()
    try:
        import docker
        from docker.errors import ImageNotFound
    except ImportError:
        return ImageCheck(engine, image, "unreachable", "the docker SDK is not installed")
    try:
        client = docker.DockerClient(base_url=engine, timeout=timeout)
        client.ping()
    except Exception as e:
        return ImageCheck(
            engine, image, "unreachable", f"{type(e).__name__}: {e}", time.monotonic() - started
        )
    try:
        try:
            found = client.images.get(image)
            return ImageCheck(engine, image, "present", found.short_id, time.monotonic() - started)
        except ImageNotFound:
            if not pull:
                return ImageCheck(
                    engine, image, "missing", "not on the engine (--no-pull)", time.monotonic() - started
                )
        try:
            pulled = client.images.pull(image)
            return ImageCheck(engine, image, "pulled", pulled.short_id, time.monotonic() - started)
        except Exception as e:
            return ImageCheck(
                engine,
                image,
                "missing",
                f"not on the engine; pull failed: {_short(e)}",
                time.monotonic() - started,
            )
    except Exception as e:
        return ImageCheck(
            engine, image, "unreachable", f"{type(e).__name__}: {_short(e)}", time.monotonic() - started
        )
    finally:
        client.close()


def _short(e: Exception) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 200 else text[:197] + "..."


async def prefetch(
    engines: list[str], images: list[str], parallel: int = 4, pull: bool = True, on_done=None
) -> list[ImageCheck]:
    """Check (and pull) every image on every engine, at most `parallel` at once; one ImageCheck per pair,
    in engine-then-image order. `on_done(check)` is called as each finishes (progress)."""
    gate = asyncio.Semaphore(max(1, parallel))

    async def one(engine: str, image: str) -> ImageCheck:
        async with gate:
            result = await asyncio.to_thread(check_image, engine, image, pull)
        if on_done is not None:
            on_done(result)
        return result

    return list(await asyncio.gather(*(one(e, i) for e in engines for i in images)))
