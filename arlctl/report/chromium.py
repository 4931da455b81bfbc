"""A screenshot of the report page with headless Chromium (`arlctl report --screenshot`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from arlctl.errors import TerminalError, UsageError

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def find_chromium() -> str:
    """$ARLCTL_CHROMIUM, else the first Chromium-family browser on PATH."""
    explicit = os.environ.get("ARLCTL_CHROMIUM")
    if explicit:
        if shutil.which(explicit) is None:
            raise UsageError(f"ARLCTL_CHROMIUM={explicit} is not an executable")
        return explicit
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    raise UsageError("no Chromium found for --screenshot (looked for " + ", ".join(BROWSERS) + ")",
                     hint="apt-get install -y chromium, or set ARLCTL_CHROMIUM to a Chrome/Chromium binary")


def browser_command(browser: str, profile: str, *actions: str, width: int = 1280, height: int = 4000) -> list[str]:
    """Headless Chromium flags: a throwaway profile (parallel runs never share one), no GPU, no network
    needed (the page is self-contained); --no-sandbox only as root, where Chromium refuses to start without."""
    cmd = [browser, "--headless", "--disable-gpu", "--hide-scrollbars", "--no-first-run", "--mute-audio",
           f"--user-data-dir={profile}", f"--window-size={width},{height}", *actions]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.insert(1, "--no-sandbox")
    return cmd


def screenshot(html: Path, png: Path, width: int = 1280, height: int = 4000, timeout_s: float = 120) -> Path:
    """Render the local `html` file in headless Chromium and write `png` (width x height pixels)."""
    browser = find_chromium()
    png = png.resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="arlctl-chromium-") as profile:
        cmd = browser_command(browser, profile, f"--screenshot={png}", html.resolve().as_uri(),
                              width=width, height=height)
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise TerminalError(f"Chromium did not finish the screenshot within {timeout_s:g}s") from None
    if done.returncode != 0 or not png.is_file() or png.stat().st_size == 0:
        tail = " ".join((done.stderr or "").strip().splitlines()[-3:])
        raise TerminalError(f"Chromium could not screenshot {html} (exit {done.returncode}): {tail}")
    return png
