"""What a concurrent eval watcher costs the rollout: rollout throughput alone and beside `arlctl eval --watch`.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/eval_share.py
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/eval_share.py --tasks 64 --eval-tasks 16 --publish-s 2

Both sides are real processes of the tiny model (the CLI as a user runs it). The rollout runs three times:
alone, beside an eval watcher while a new version is published every --publish-s seconds (the tiny model,
by sync's own `publish`), and alone again; the ratio is its generated tokens/s beside the watcher over the
mean of the two runs alone (same machine, same minute). The watcher starts first and the timed rollout
begins once it is evaluating (its version's _work/ exists), so the two overlap. CPU is read from
/proc/PID/stat (all threads) every 0.2 s over the rollout process's life, and the window is its generation (the last
`seconds` of its JSON summary, after imports and model load): the eval's share is its CPU seconds over both
processes' CPU seconds in that window, and also over the window's wall time x cores.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ARLCTL = [sys.executable, "-m", "arlctl.cli.main"]
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a live process (all its threads), 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS  # fields 14 and 15 of stat(5), after "pid (comm)"


def rollout(run: Path, args: argparse.Namespace, watcher: subprocess.Popen | None) -> dict:
    """One timed `arlctl rollout`; with a watcher, also the CPU both used while the rollout generated."""
    cmd = [*ARLCTL, "rollout", "--env", "math", "--tasks", f"builtin:math?n={args.tasks}&seed=1", "--policy", "tiny",
           "--out", str(run / "rollouts"), "-G", str(args.group), "--max-turns", "1", "--max-new-tokens",
           str(args.max_new_tokens), "--seed", "0", "--json", "-q"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    samples = []  # (time, rollout CPU s, watcher CPU s)
    while proc.poll() is None:
        samples.append((time.monotonic(), cpu_seconds(proc.pid), cpu_seconds(watcher.pid) if watcher else 0.0))
        time.sleep(0.2)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"rollout failed ({proc.returncode}): {err[-2000:]}")
    summary = json.loads(out)
    # The generation window: the last `seconds` of the process (model load and imports come before it).
    start = samples[-1][0] - summary["seconds"]
    first = next((s for s in samples if s[0] >= start), samples[-1])
    last = samples[-1]
    return {"tok_per_s": summary["generated_tokens_per_s"], "tokens": summary["generated_tokens"],
            "window_s": last[0] - first[0], "window_start_wall": time.time() - (time.monotonic() - first[0]), "rollout_cpu_s": last[1] - first[1],
            "eval_cpu_s": last[2] - first[2]}


def publish_version(run: Path, version: int) -> None:
    """The tiny model published as `version` by sync's own publish, and LATEST moved to it."""
    from arlctl.io import ledger
    from arlctl.models import tiny_model_dir
    from arlctl.stages.sync import publish

    publish(tiny_model_dir(), version, run / "policy")
    ledger.write_latest(run / "policy", ledger.version_dir_name(version))


def start_watcher(run: Path, args: argparse.Namespace) -> subprocess.Popen:
    """`arlctl eval --watch` on a run with v1 published, once it is evaluating v1."""
    publish_version(run, 1)
    cmd = [*ARLCTL, "eval", "--run", str(run), "--watch", "--every", "1", "--policy", str(run / "policy"), "--tasks",
           f"builtin:math?n={args.eval_tasks}&seed=999", "--samples", str(args.group), "--max-turns", "1",
           "--max-new-tokens", str(args.max_new_tokens), "--poll", "0.5", "-q"]
    with open(run / "eval.log", "w") as log:  # the child keeps its own copy of the descriptor
        watcher = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    deadline = time.time() + 300
    work = run / "evals" / "heldout" / "v000001" / "_work"
    while not work.exists() and not (work.parent / "summary.json").exists():
        if watcher.poll() is not None or time.time() > deadline:
            raise SystemExit(f"the eval watcher did not start: {(run / 'eval.log').read_text()[-2000:]}")
        time.sleep(0.2)
    return watcher


def keep_publishing(run: Path, every_s: float, stop: threading.Event) -> list[int]:
    """Publish v2, v3, ... every `every_s` seconds until `stop` (sync's pace in a real run): the watcher
    always has a fresh version to evaluate while the rollout runs. Returns the versions published."""
    published = []
    version = 2
    while not stop.wait(every_s):
        publish_version(run, version)
        published.append(version)
        version += 1
    return published


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=32, help="rollout tasks (groups)")
    ap.add_argument("--group", type=int, default=4, help="samples per task (rollout -G and eval --samples)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--eval-tasks", type=int, default=16, help="held-out tasks per evaluated version")
    ap.add_argument("--publish-s", type=float, default=3.0, help="seconds between published versions")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        alone_1 = rollout(root / "alone1", args, None)
        watched = root / "watched"
        watcher = start_watcher(watched, args)
        stop, published = threading.Event(), []
        publisher = threading.Thread(target=lambda: published.extend(keep_publishing(watched, args.publish_s, stop)))
        publisher.start()
        try:
            beside = rollout(root / "beside", args, watcher)
        finally:
            stop.set()
            publisher.join()
            os.killpg(watcher.pid, signal.SIGTERM)
            watcher.wait(timeout=120)
        summaries = sorted((watched / "evals" / "heldout").glob("v*/summary.json"))
        in_window = [p.parent.name for p in summaries if p.stat().st_mtime >= beside["window_start_wall"]]
        alone_2 = rollout(root / "alone2", args, None)
    baseline = (alone_1["tok_per_s"] + alone_2["tok_per_s"]) / 2
    cores = len(os.sched_getaffinity(0))
    share = beside["eval_cpu_s"] / max(beside["eval_cpu_s"] + beside["rollout_cpu_s"], 1e-9)
    print(f"rollout alone:         {alone_1['tok_per_s']:8.1f} and {alone_2['tok_per_s']:8.1f} gen tok/s "
          f"({alone_1['tokens']} tokens each)")
    print(f"rollout beside eval:   {beside['tok_per_s']:8.1f} gen tok/s")
    print(f"throughput ratio (beside / alone): {beside['tok_per_s'] / baseline:.2f}")
    print(f"eval's share of CPU while the rollout generated ({beside['window_s']:.1f} s): {share:.0%} of both "
          f"processes' CPU ({beside['eval_cpu_s']:.1f} s eval, {beside['rollout_cpu_s']:.1f} s rollout), "
          f"{beside['eval_cpu_s'] / max(beside['window_s'] * cores, 1e-9):.0%} of {cores} cores")
    print(f"versions published: v1 before the rollout, {len(published)} more while it ran; the watcher finished "
          f"{len(summaries)} ({len(in_window)} within the generation window: {', '.join(in_window) or 'none'})")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (other work on the machine skews both sides)")


if __name__ == "__main__":
    main()
