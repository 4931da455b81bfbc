"""Builds the built-in swe suite from its spec files (a maintainer tool, not used at run time).

Each spec in `suite_src/*.spec` describes several tasks: the buggy repository's files, the gold fix as
exact old/new replacements, the hidden test files and an issue-like problem statement. This tool writes
`suite/<instance_id>/repo/` (the buggy snapshot the policy sees) and `suite/<instance_id>/task.json`
(SWE-bench fields: patch and test_patch made with real `git diff`), then proves each task genuine by
running pytest on the host: FAIL_TO_PASS = hidden tests that fail on the buggy code and pass with the
gold patch (must be non-empty); PASS_TO_PASS = every other test, which must pass both times.

It also writes the probe form of every test file (`probe_patch`, see probes.py) and the records the gold
fix produces under it (`probe_expected`): the grader's trusted side compares against those, so the
sandbox never holds an expected value. The build checks that probe grading agrees with pytest's verdict
on the buggy and on the gold code, test by test.

    python -m arlctl.envs.swe.build_suite            # rebuild all
    python -m arlctl.envs.swe.build_suite --check    # verify, and that suite/ is what the specs build
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).parent
SPEC_DIR = HERE / "suite_src"
SUITE_DIR = HERE / "suite"

# Prepended to every hidden test file: equality that also demands the exact type, element by element,
# so an object whose __eq__ always answers True cannot pass a hidden test.
STRICT_HELPER = '''

def _same(actual, expected):
    """Equal in value and in exact type, recursively (no always-equal objects)."""
    assert type(actual) is type(expected), f"type {type(actual).__name__} != {type(expected).__name__}"
    if isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{actual!r} != {expected!r}"
        for a, e in zip(actual, expected):
            _same(a, e)
    elif isinstance(expected, dict):
        assert len(actual) == len(expected), f"{actual!r} != {expected!r}"
        for key, value in expected.items():
            assert key in actual, f"missing key {key!r}"
            _same(actual[key], value)
    elif isinstance(expected, float):
        assert abs(actual - expected) <= 1e-9 * max(1.0, abs(expected)), f"{actual!r} != {expected!r}"
    else:
        assert expected == actual and actual == expected, f"{actual!r} != {expected!r}"
'''


def parse_specs(text: str) -> list[dict]:
    """Parse `@@@ directive` sections into task dicts (files, fixes, hidden, problem)."""
    tasks: list[dict] = []
    current: dict | None = None
    section: tuple[str, str] | None = None
    body: list[str] = []

    def flush() -> None:
        if current is None or section is None:
            return
        kind, arg = section
        content = "\n".join(body).strip("\n") + "\n"
        if kind == "problem":
            current["problem"] = content.strip() + "\n"
        elif kind == "file":
            current["files"][arg] = content
        elif kind == "hidden":
            current["hidden"][arg] = content
        elif kind == "fix":
            current["fixes"].append((arg, content))
        elif kind == "meta":
            for line in content.splitlines():
                key, _, value = line.partition(":")
                if key.strip():
                    current[key.strip()] = value.strip()

    for line in text.splitlines():
        if line.startswith("@@@ "):
            flush()
            body = []
            kind, _, arg = line[4:].strip().partition(" ")
            if kind == "task":
                current = {"instance_id": arg, "files": {}, "hidden": {}, "fixes": []}
                tasks.append(current)
                section = ("meta", "")
            else:
                section = (kind, arg.strip())
        else:
            body.append(line)
    flush()
    return tasks


def apply_fix(files: dict[str, str], path: str, fix: str) -> None:
    """Apply `<<<<\\nold\\n====\\nnew\\n>>>>` blocks to files[path]; each old text must occur once."""
    for block in fix.split("<<<<\n")[1:]:
        old, _, rest = block.partition("\n====\n")
        new = rest.rsplit("\n>>>>", 1)[0]
        if files[path].count(old) != 1:
            raise ValueError(f"fix for {path}: old text occurs {files[path].count(old)} times: {old!r}")
        files[path] = files[path].replace(old, new)


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "arlctl", "GIT_AUTHOR_EMAIL": "suite@arlctl", "GIT_COMMITTER_NAME": "arlctl",
           "GIT_COMMITTER_EMAIL": "suite@arlctl", "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z", "PATH": "/usr/bin:/bin", "HOME": str(repo)}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout


def write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, content in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")


def run_pytest(repo: Path) -> dict[str, str]:
    """Run every test in repo on the host; returns node id -> outcome (passed/failed/...)."""
    report = repo.parent / "report.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
                    "-c", "/dev/null", "--rootdir", str(repo), f"--junitxml={report}", "tests"],
                   cwd=repo, capture_output=True, text=True, timeout=120,
                   env={"PATH": "/usr/bin:/bin", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
                        "PYTHONDONTWRITEBYTECODE": "1"})
    return parse_junit(report.read_text())


def parse_junit(xml_text: str) -> dict[str, str]:
    outcomes: dict[str, str] = {}
    for case in ET.fromstring(xml_text).iter("testcase"):
        path = case.get("classname", "").replace(".", "/")
        node = f"{path}.py::{case.get('name')}"
        status = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = child.tag
        outcomes[node] = status
    return outcomes


def run_probes(repo: Path) -> str:
    """Run the probe forms of the tests in repo on the host; returns the recorder's raw lines."""
    from arlctl.envs.swe.probes import PROBE_MODULE

    out = repo.parent / "probes.jsonl"
    out.unlink(missing_ok=True)
    harness = repo.parent / "harness"
    harness.mkdir(exist_ok=True)
    shutil.copy(HERE / "harness" / "probe.py", harness / f"{PROBE_MODULE}.py")
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest", "-c",
                    "/dev/null", "--rootdir", str(repo), "-p", PROBE_MODULE, "--arlctl-probe-out", str(out),
                    "tests"], cwd=repo, capture_output=True, text=True, timeout=120,
                   env={"PATH": "/usr/bin:/bin", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
                        "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(harness)})
    return out.read_text(encoding="utf-8") if out.exists() else ""


def probe_forms(spec: dict) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Probe form of every test file (visible and hidden), and node id prefix -> expected raise names."""
    from arlctl.envs.swe.probes import to_probe_source

    forms: dict[str, str] = {}
    raises: dict[str, list[str]] = {}
    tests = {p: c for p, c in spec["files"].items() if p.startswith("tests/")} | spec["hidden"]
    for path, content in tests.items():
        forms[path], names = to_probe_source(content)
        raises.update({f"{path}::{function}": found for function, found in names.items()})
    return forms, raises


def expected_records(gold_lines: str, raises: dict[str, list[str]], iid: str) -> dict[str, list[dict]]:
    """The gold run's records, with each raise check replaced by the exception name the test demands."""
    from arlctl.envs.swe.probes import records_by_test

    by_test, junk = records_by_test(gold_lines)
    if junk:
        raise ValueError(f"{iid}: {junk} unreadable probe lines on the gold code")
    expected: dict[str, list[dict]] = {}
    for node, records in by_test.items():
        names = list(raises.get(node, []))
        kept = []
        for record in records:
            if record["mode"] == "raises":
                if not names or record["v"][0] != "raised":
                    raise ValueError(f"{iid}: {node}: the gold code did not raise where the test expects it")
                record = {"mode": "raises", "v": ["raises", names.pop(0)]}
            kept.append({"mode": record["mode"], "v": record["v"]})
        if names:
            raise ValueError(f"{iid}: {node}: raise checks {names} were not reached on the gold code")
        expected[node] = kept
    return expected


def check_probes(iid: str, expected: dict, buggy_lines: str, gold_lines: str, f2p: list[str],
                 p2p: list[str]) -> None:
    """Probe verdicts must agree with pytest's: F2P fail on the buggy code, everything passes on the gold."""
    from arlctl.envs.swe.probes import verdicts

    ids = f2p + p2p
    gold, _ = verdicts(gold_lines, expected, ids)
    buggy, _ = verdicts(buggy_lines, expected, ids)
    wrong = [i for i in ids if gold[i] != "passed"] + [i for i in p2p if buggy[i] != "passed"]
    wrong += [i for i in f2p if buggy[i] == "passed"]
    if wrong:
        raise ValueError(f"{iid}: probe grading disagrees with pytest on {sorted(set(wrong))}")


def build_task(spec: dict, out_dir: Path | None) -> dict:
    """Make patch/test_patch with git, verify F2P/P2P on the host; write the task if out_dir is set."""
    iid = spec["instance_id"]
    package = spec["package"]
    if importlib.util.find_spec(package) is not None:
        raise ValueError(f"{iid}: package name {package!r} shadows an installed module")
    hidden = {p: STRICT_HELPER.lstrip("\n") + "\n\n" + c for p, c in spec["hidden"].items()}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        write_tree(repo, spec["files"])
        _git(repo, "init", "-q")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", "buggy")
        gold = dict(spec["files"])
        for path, fix in spec["fixes"]:
            apply_fix(gold, path, fix)
        write_tree(repo, gold)
        patch = _git(repo, "diff")
        _git(repo, "checkout", "-q", ".")
        forms, raises = probe_forms(spec)
        write_tree(repo, forms)
        _git(repo, "add", "-A")
        probe_patch = _git(repo, "diff", "--cached")
        buggy_probes = run_probes(repo)
        write_tree(repo, gold)
        write_tree(repo, forms)  # gold holds the original visible tests
        gold_probes = run_probes(repo)
        _git(repo, "reset", "-q", "--hard")
        _git(repo, "clean", "-q", "-fdx")
        write_tree(repo, hidden)
        _git(repo, "add", "-A")
        test_patch = _git(repo, "diff", "--cached")
        before = run_pytest(repo)
        write_tree(repo, gold)
        after = run_pytest(repo)
    hidden_ids = {n for n in after if n.split("::")[0] in hidden}
    f2p = sorted(n for n in hidden_ids if before.get(n) != "passed" and after[n] == "passed")
    p2p = sorted(n for n in after if before.get(n) == "passed" and after[n] == "passed")
    broken = sorted(n for n in after if after[n] != "passed")
    flaky = sorted(n for n in after if n not in hidden_ids and before.get(n) != "passed")
    if not f2p or broken or flaky:
        raise ValueError(f"{iid}: f2p={f2p} failing-after-gold={broken} visible-failing-before={flaky}")
    probe_expected = expected_records(gold_probes, raises, iid)
    check_probes(iid, probe_expected, buggy_probes, gold_probes, f2p, p2p)
    task = {"instance_id": iid, "repo": f"arlctl-suite/{package}", "base_commit": "buggy",
            "problem_statement": spec["problem"], "hints_text": "", "version": "1.0",
            "bug_kind": spec.get("kind", ""), "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p,
            "test_patch": test_patch, "patch": patch, "probe_patch": probe_patch,
            "probe_expected": probe_expected}
    if out_dir is not None:
        target = out_dir / iid
        if target.exists():
            shutil.rmtree(target)
        write_tree(target / "repo", spec["files"])
        (target / "task.json").write_text(json.dumps(task, indent=1) + "\n", encoding="utf-8")
    return task


def stale(task: dict, spec: dict, suite_dir: Path = SUITE_DIR) -> str:
    """Why suite/<id>/ differs from what the spec builds ('' when it is up to date)."""
    target = suite_dir / task["instance_id"]
    try:
        written = json.loads((target / "task.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        return f"task.json unreadable: {err}"
    changed = sorted(k for k in set(task) | set(written) if task.get(k) != written.get(k))
    if changed:
        return f"task.json fields differ: {changed}"
    repo = target / "repo"
    on_disk = {str(p.relative_to(repo)) for p in repo.rglob("*") if p.is_file()}
    if on_disk != set(spec["files"]):
        return f"repo files differ: {sorted(on_disk ^ set(spec['files']))}"
    edited = sorted(p for p, c in spec["files"].items() if (repo / p).read_text(encoding="utf-8") != c)
    return f"repo files differ: {edited}" if edited else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="verify only, write nothing")
    parser.add_argument("--only", default=None, help="build one instance id")
    args = parser.parse_args(argv)
    specs = [t for f in sorted(SPEC_DIR.glob("*.spec")) for t in parse_specs(f.read_text(encoding="utf-8"))]
    ids = [t["instance_id"] for t in specs]
    if len(ids) != len(set(ids)):
        raise SystemExit(f"duplicate instance ids: {sorted(i for i in ids if ids.count(i) > 1)}")
    failures = 0
    for spec in specs:
        if args.only and spec["instance_id"] != args.only:
            continue
        try:
            task = build_task(spec, None if args.check else SUITE_DIR)
            why = stale(task, spec) if args.check else ""
            if why:  # the spec builds, but the committed suite is not what it builds
                raise ValueError(f"suite/{task['instance_id']} is out of date ({why}); rebuild it")
            print(f"ok   {task['instance_id']}: {len(task['FAIL_TO_PASS'])} f2p, {len(task['PASS_TO_PASS'])} p2p")
        except Exception as exc:  # report every broken task, not just the first
            failures += 1
            print(f"FAIL {spec['instance_id']}: {exc}")
    print(f"{len(specs) - failures}/{len(specs)} tasks ok")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
