"""A second (third, ...) real docker engine for the multi-engine tests, beside the one .ci/docker_setup.sh
starts: its own dockerd with its own socket, --data-root, --exec-root and --pidfile (as the setup script
does, with other paths), no bridge and no iptables. The sandbox image is copied from the main engine
(`docker save | docker load`, so it has the same id) the first time; the data root is kept between runs
so later runs start in about a second. `stop()` is what an engine dying looks like to the sandboxes on it:
dockerd exits, its containers are killed and every attach stream closes.

    engine = ExtraEngine("b").start()      # unix:///run/arlctl-docker-b.sock
    ...; engine.stop(); engine.start()     # down, then back
    engine.stop()
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

MAIN_URL = "unix:///run/arlctl-docker.sock"
IMAGE = "arlctl/sandbox-base:1"


def engine_answers(url: str) -> bool:
    r = subprocess.run(
        ["docker", "-H", url, "version", "--format", "{{.Server.Version}}"], capture_output=True, timeout=20
    )
    return r.returncode == 0


def has_image(url: str, image: str = IMAGE) -> bool:
    r = subprocess.run(["docker", "-H", url, "image", "inspect", image], capture_output=True, timeout=30)
    return r.returncode == 0


class ExtraEngine:
    def __init__(self, name: str):
        self.name = name
        self.sock = f"/run/arlctl-docker-{name}.sock"
        self.data_root = f"/var/lib/arlctl-docker-{name}"
        self.exec_root = f"/run/arlctl-docker-exec-{name}"
        self.pidfile = f"/run/arlctl-docker-{name}.pid"
        self.log = f"/tmp/arlctl-dockerd-{name}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.sock}"

    def start(self, image_from: str | None = MAIN_URL, timeout_s: float = 60.0) -> ExtraEngine:
        """Start dockerd (unless ours already runs) and make sure it has the sandbox image."""
        if self.proc is None or self.proc.poll() is not None:
            for path in (self.data_root, self.exec_root):
                os.makedirs(path, exist_ok=True)
            argv = [
                "dockerd",
                "--bridge=none",
                "--iptables=false",
                "--ip6tables=false",
                "--shutdown-timeout=1",
                "-H",
                self.url,
                "--data-root",
                self.data_root,
                "--exec-root",
                self.exec_root,
                "--pidfile",
                self.pidfile,
            ]
            if os.environ.get("ARLCTL_DOCKER_STORAGE_DRIVER"):
                argv += ["--storage-driver", os.environ["ARLCTL_DOCKER_STORAGE_DRIVER"]]
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen(
                    argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
                )
            deadline = time.monotonic() + timeout_s
            while not engine_answers(self.url):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    tail = Path(self.log).read_text(errors="replace").splitlines()[-15:]
                    raise RuntimeError(f"dockerd {self.name} did not come up:\n" + "\n".join(tail))
                time.sleep(0.3)
            self._remove_leftovers()
        if image_from and not has_image(self.url):
            self.copy_image(image_from)
        return self

    def _remove_leftovers(self) -> None:
        """Containers left by an earlier run that was killed (the data root is kept)."""
        ids = subprocess.run(
            ["docker", "-H", self.url, "ps", "-aq", "--filter", "label=arlctl.sandbox=1"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.split()
        if ids:
            subprocess.run(["docker", "-H", self.url, "rm", "-f", *ids], capture_output=True, timeout=120)

    def copy_image(self, source_url: str, image: str = IMAGE) -> None:
        save = subprocess.Popen(["docker", "-H", source_url, "save", image], stdout=subprocess.PIPE)
        load = subprocess.run(
            ["docker", "-H", self.url, "load"], stdin=save.stdout, capture_output=True, timeout=600
        )
        save.stdout.close()
        if save.wait(timeout=600) != 0 or load.returncode != 0:
            raise RuntimeError(f"could not copy {image} to engine {self.name}: {load.stderr.decode()[-500:]}")

    def remove_image(self, image: str) -> None:
        subprocess.run(["docker", "-H", self.url, "rmi", "-f", image], capture_output=True, timeout=60)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop dockerd (SIGTERM; it kills its containers within --shutdown-timeout), SIGKILL if it hangs."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None
