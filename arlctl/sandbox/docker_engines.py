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

It also knows which engine holds which image (`holders(image)`), so that a sandbox is placed where its
image already is: a task file of thousands of SWE-bench rows names hundreds of images, each gigabytes, and
rarely is every one on every engine. Each (engine, image) pair is asked of its engine once and then
remembered (thousands of sandboxes of one image cost one lookup per engine); what a start finds out
afterwards corrects it (`note_image`: a start that ran proves the image there, one that failed with
image-not-found proves it gone, say removed since the lookup).

`prefetch` checks (and pulls, where a registry is reachable) every distinct image on every engine before a
run; `summarize` says which images each engine lacks and which are on no engine at all.
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


def image_present(url: str, image: str, timeout: float) -> tuple[bool | None, str]:
    """(whether the engine at `url` holds `image`, why not known): (True, "") or (False, "") as the
    engine says, (None, cause) when it could not be asked (unreachable, the SDK missing)."""
    try:
        import docker
        from docker.errors import ImageNotFound
    except ImportError:
        return None, "the docker SDK is not installed"
    try:
        client = docker.DockerClient(base_url=url, timeout=timeout)
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"
    try:
        client.images.get(image)
        return True, ""
    except ImageNotFound:
        return False, ""
    except Exception as e:
        return None, f"{type(e).__name__}: {_short(e)}"
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
        self._images: dict[tuple[str, str], bool] = {}  # (engine, image) -> held, as last found out
        self._image_locks: dict[tuple[str, str], threading.Lock] = {}
        self._images_lock = threading.Lock()
        self.image_lookups = 0  # questions asked of an engine (not answered from what is remembered)

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

    def holds(self, host: str, image: str) -> bool | None:
        """Whether `host` holds `image`: asked of the engine the first time, remembered after. Sandboxes
        starting at once for the same pair wait for that one lookup rather than each asking. None: the
        engine could not be asked (nothing is remembered; it is probed, so a dead one is ejected)."""
        key = (host, image)
        with self._images_lock:
            if key in self._images:
                return self._images[key]
            lock = self._image_locks.setdefault(key, threading.Lock())
        with lock:
            with self._images_lock:
                if key in self._images:  # answered while this caller waited
                    return self._images[key]
                self.image_lookups += 1
            held, _why = image_present(host, image, self.probe_timeout_s)
            if held is None:  # the engine did not answer the lookup: a ping says whether it is down
                self.probe(host)
                return None
            with self._images_lock:
                self._images[key] = held
            return held

    async def holders(self, image: str) -> list[str]:
        """The engines placement could pick now that hold `image` (see holds()), in host order. An ejected
        engine whose backoff is over counts too: it is due a trial placement (when it was never asked,
        the lookup is its first test, and one that fails ejects it again before a sandbox is staked on
        it). Remembered answers cost no thread; only pairs not yet known are asked, concurrently."""
        hosts = self.placement.placeable()
        with self._images_lock:
            known = {h: self._images[(h, image)] for h in hosts if (h, image) in self._images}
        unknown = [h for h in hosts if h not in known]
        if unknown:
            found = await asyncio.gather(*(asyncio.to_thread(self.holds, h, image) for h in unknown))
            known.update(zip(unknown, found, strict=True))
        return [h for h in hosts if known[h]]

    def note_image(self, host: str, image: str, held: bool) -> None:
        """What a start on `host` found out about `image`: it started there (held) or the engine said it
        has no such image (not held). Placement goes by this from then on."""
        with self._images_lock:
            self._images[(host, image)] = held

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
    engines: list[str],
    images: list[str],
    parallel: int = 4,
    pull: bool = True,
    on_done=None,
    ping_timeout_s: float = 10.0,
) -> list[ImageCheck]:
    """Check (and pull) every distinct image on every engine, at most `parallel` at once; one ImageCheck
    per pair, in engine-then-image order. `on_done(check)` is called as each finishes (progress).

    Each engine is pinged once first: one that does not answer gets an "unreachable" check for each image
    at once, rather than a connection attempt (and its timeout) per image."""
    images = list(dict.fromkeys(images))  # a task file names each image on many rows: ask once per engine
    engines = list(dict.fromkeys(engines))
    gate = asyncio.Semaphore(max(1, parallel))
    down = dict(
        zip(
            engines,
            await asyncio.gather(*(asyncio.to_thread(ping, e, ping_timeout_s) for e in engines)),
            strict=True,
        )
    )

    async def one(engine: str, image: str) -> ImageCheck:
        if down[engine] is not None:
            result = ImageCheck(engine, image, "unreachable", down[engine])
        else:
            async with gate:
                result = await asyncio.to_thread(check_image, engine, image, pull)
        if on_done is not None:
            on_done(result)
        return result

    return list(await asyncio.gather(*(one(e, i) for e in engines for i in images)))


def summarize(checks: list[ImageCheck]) -> dict:
    """What a prefetch found, by engine and by image: for each engine whether it answered, how many images
    it has and which it lacks (missing there, or every one when it is unreachable); `nowhere`: the images
    on no engine at all (the tasks that name them cannot run: they end env_error); `partial`: whether some
    image is on some engines only (the run can go: placement sends its tasks to the engines that hold it)."""
    per_engine: dict[str, dict] = {}
    held: dict[str, int] = {}  # image -> engines that have it
    for c in checks:
        entry = per_engine.setdefault(
            c.engine, {"reachable": False, "images": 0, "available": 0, "missing": 0, "missing_images": []}
        )
        held.setdefault(c.image, 0)
        entry["images"] += 1
        entry["reachable"] = entry["reachable"] or c.status != "unreachable"
        if c.ok:
            entry["available"] += 1
            held[c.image] += 1
        else:
            entry["missing"] += 1
            entry["missing_images"].append(c.image)
    return {
        "engines": per_engine,
        "nowhere": [image for image, n in held.items() if n == 0],
        "partial": any(0 < n < len(per_engine) for n in held.values()),
    }
