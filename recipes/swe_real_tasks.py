#!/usr/bin/env python3
"""Build SWE-bench-format tasks offline from real projects' own sources and test suites.

    python recipes/swe_real_tasks.py --out runs/swe-real                 # django and sympy, rows + images
    python recipes/swe_real_tasks.py --out runs/swe-real --projects sympy --no-images --json

For each project (django's sdist ships tests/ and runtests.py; sympy's ships its tests and its own runner,
sympy.testing.runtests): the pinned source release is fetched as a package (`pip download --no-binary`),
unpacked into a git repository, and for each of its bugs a known bug is injected into a function the
suite covers. The project's own runner is run on the buggy and on the gold tree, and its log read with the
swebench package's parser for that repo: FAIL_TO_PASS is every test that passes on gold and not on the
bug, PASS_TO_PASS every test that passes on both. A wrong fix of each bug is checked to leave a
FAIL_TO_PASS test failing. Then (unless --no-images) a Docker image per task is built on the local engine
with no network: an environment image FROM arlctl/sandbox-base:1 with the project's dependencies installed
from the wheel cache (`pip install --target`, offline) in a `testbed` env laid out as SWE-bench images
lay theirs (/opt/miniconda3, entered by `conda activate testbed`), then the instance image
with the buggy repository, one commit at base_commit, at /testbed.

Written under --out: tasks.jsonl (the rows: SWE-bench fields plus image, repo_dir, log_parser, and how the
tests run: a SWE-bench 5 `eval_script` for django, `test_cmd` for sympy, which then runs in the image's
testbed env as image rows do by default), wrong_fixes.jsonl
({instance_id, patch}) and summary.json. Grade them: `arlctl reward --reward swe --reward-opt sandbox=docker`
on rollouts over `--tasks tasks.jsonl`, or see tests/swe/test_real_projects.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

BASE_IMAGE = os.environ.get("ARLCTL_SANDBOX_IMAGE", "arlctl/sandbox-base:1")
# The images lay the test environment out as SWE-bench's do: a `testbed` env under /opt/miniconda3, entered
# with the lines their eval scripts use. conda itself cannot be fetched here (no conda channel is reachable),
# so /opt/miniconda3/bin/activate is a stand-in that gives the shell a `conda` function knowing one command,
# `conda activate testbed`, and refusing any other; the env holds the dependencies from the wheel cache.
ACTIVATE = "source /opt/miniconda3/bin/activate\nconda activate testbed"
ENV_DIR = "/opt/miniconda3/envs/testbed"
ACTIVATE_SCRIPT = f"""# arlctl recipe: a stand-in for conda's activate (see recipes/swe_real_tasks.py)
conda() {{
    if [ "$#" -eq 2 ] && [ "$1" = activate ] && [ "$2" = testbed ]; then
        export CONDA_DEFAULT_ENV=testbed CONDA_PREFIX={ENV_DIR}
        export PATH={ENV_DIR}/bin:$PATH PYTHONPATH=/testbed:{ENV_DIR}/site
    else
        echo "conda stand-in: only 'conda activate testbed' is known (got: $*)" >&2
        return 1
    fi
}}
"""
# Fixed identity and dates: the same sources give the same commits, so base_commit is stable across runs.
GIT = ["git", "-c", "user.name=arlctl recipe", "-c", "user.email=recipe@arlctl.invalid", "-c", "commit.gpgsign=false",
       "-c", "init.defaultBranch=main", "-c", "core.autocrlf=false", "-c", "gc.auto=0", "-c", "maintenance.auto=false"]
GIT_ENV = {"GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
           "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}


@dataclass
class Bug:
    name: str
    path: str
    gold: str  # text in the pristine file
    buggy: str  # what it becomes
    wrong: str  # a plausible fix that is not right (replaces `buggy`)
    statement: str


@dataclass
class Project:
    name: str
    pin: str
    repo: str
    version: str
    deps: list[str]
    tests: str  # the test target given to the runner
    bugs: list[Bug] = field(default_factory=list)

    def command(self) -> str:
        raise NotImplementedError


class Django(Project):
    def command(self) -> str:  # the command of SWE-bench's django specs
        return f"./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 {self.tests}"


class Sympy(Project):
    def command(self) -> str:  # sympy's own runner (what its bin/test wraps), verbose, in this process
        return ("PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' python -c 'import sys; "
                "from sympy.testing.runtests import test; "
                "sys.exit(0 if test(*sys.argv[1:], verbose=True, colors=False, subprocess=False) else 1)' "
                f"{self.tests}")


PROJECTS: dict[str, Project] = {
    "django": Django("django", "5.2.20", "django/django", "5.2", ["asgiref==3.13.0", "sqlparse==0.6.1"],
                     "utils_tests.test_text", [
        Bug("phone2numeric", "django/utils/text.py", '        "s": "7",\n', '        "s": "8",\n',
            '        "t": "7",\n',
            "phone2numeric() maps the letter s to the wrong digit: '0800 flowers' becomes '0800 3569387', "
            "where a phone keypad gives '0800 3569377'."),
        Bug("slugify", "django/utils/text.py", '    return re.sub(r"[-\\s]+", "-", value).strip("-_")\n',
            '    return re.sub(r"[-\\s]+", "-", value).strip("-")\n',
            '    return re.sub(r"[-\\s]+", "-", value).strip("_")\n',
            "slugify() no longer strips leading and trailing underscores: slugify('__strip__underscore-value___') "
            "returns '__strip__underscore-value___' instead of 'strip__underscore-value'."),
        Bug("get_text_list", "django/utils/text.py", '        _(", ").join(str(i) for i in list_[:-1]),\n',
            '        _(",").join(str(i) for i in list_[:-1]),\n',
            '        ", ".join(str(i) for i in list_[:-1]),\n',
            "get_text_list(['a', 'b', 'c', 'd']) returns 'a,b,c or d': the items are joined without the "
            "(translated) ', ' separator, so it reads 'a,b,c or d' instead of 'a, b, c or d'."),
    ]),
    "sympy": Sympy("sympy", "1.14.0", "sympy/sympy", "1.14", ["mpmath==1.3.0"],
                   "sympy/utilities/tests/test_iterables.py", [
        Bug("rotate_left", "sympy/utilities/iterables.py",
            "    y = y % len(x)\n    return x[y:] + x[:y]\n\n\ndef rotate_right",
            "    y = y % len(x)\n    return x[:y] + x[y:]\n\n\ndef rotate_right",
            "    y = y % len(x)\n    return x[y + 1:] + x[:y + 1]\n\n\ndef rotate_right",
            "rotate_left([0, 1, 2, 3, 4], 2) returns the list unchanged; it should give [2, 3, 4, 0, 1]."),
        Bug("common_prefix", "sympy/utilities/iterables.py",
            "            break\n    else:\n        i += 1\n    return seqs[0][:i]\n",
            "            break\n    return seqs[0][:i]\n",
            "            break\n    return seqs[0][:i + 1]\n",
            "common_prefix(list(range(3)), list(range(4))) returns [0, 1]; the whole shorter sequence, "
            "[0, 1, 2], is their common prefix."),
        Bug("runs", "sympy/utilities/iterables.py", "        if op(ei, run[-1]):\n",
            "        if op(run[-1], ei):\n", "        if not op(run[-1], ei):\n",
            "runs([1, 1, 2]) should be [[1], [1, 2]] (an increasing run continues while each element is "
            "greater than the one before), but runs() groups decreasing runs instead."),
    ]),
}


def say(*parts: object) -> None:
    print("[swe_real_tasks]", *parts, file=sys.stderr, flush=True)


def git(repo: Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run([*GIT, "-C", str(repo), *args], input=stdin, capture_output=True, text=True, check=True,
                          env={**os.environ, **GIT_ENV}).stdout


def fetch(project: Project, cache: Path) -> tuple[Path, list[Path]]:
    """The pinned source release and its dependencies' wheels, downloaded once into the cache."""
    sdists, wheels = cache / "sdists", cache / "wheels"
    sdist = next(sdists.glob(f"{project.name}-{project.pin}.tar.gz"), None) if sdists.is_dir() else None
    if sdist is None:
        say(f"downloading {project.name}=={project.pin} (source release)")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                        f"{project.name}=={project.pin}", "-d", str(sdists)], check=True)
        sdist = next(sdists.glob(f"{project.name}-{project.pin}.tar.gz"))
    found = []
    for dep in project.deps:
        name, _, version = dep.partition("==")
        have = sorted(wheels.glob(f"{name}-{version}-*.whl")) if wheels.is_dir() else []
        if not have:
            say(f"downloading the wheel of {dep}")
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:", "--no-deps",
                            dep, "-d", str(wheels)], check=True)
            have = sorted(wheels.glob(f"{name}-{version}-*.whl"))
        found.append(have[0])
    return sdist, found


def unpack(sdist: Path, where: Path) -> Path:
    with tarfile.open(sdist) as archive:
        archive.extractall(where, filter="data")
    (root,) = [p for p in where.iterdir() if p.is_dir()]
    return root


def one_commit(tree: Path, message: str) -> str:
    """Make `tree` a git repository with exactly one commit; its id."""
    shutil.rmtree(tree / ".git", ignore_errors=True)
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", message)
    return git(tree, "rev-parse", "HEAD").strip()


def replace_once(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    if text.count(old) != 1:
        raise SystemExit(f"{path}: the text to replace occurs {text.count(old)} times, not once: {old!r}")
    path.write_text(text.replace(old, new), encoding="utf-8")


def run_suite(project: Project, tree: Path, site: Path) -> tuple[dict[str, str], str]:
    """The project's runner on `tree` here (the image's command and environment, on this host's python),
    and its log read with the package's parser: (statuses, log)."""
    from arlctl.envs.swe import official

    with tempfile.TemporaryDirectory() as bindir:
        os.symlink(sys.executable, Path(bindir) / "python")
        env = {**os.environ, "PATH": f"{bindir}:{os.environ.get('PATH', '')}", "PYTHONPATH": f"{tree}:{site}",
               "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8"}
        run = subprocess.run(["bash", "-c", project.command()], cwd=tree, env=env, capture_output=True, text=True,
                             timeout=900)
    log = run.stdout + run.stderr
    report = official.official_report({"repo": project.repo}, log, [], [], exit_code=run.returncode)
    if not report.get("log_found"):
        raise SystemExit(f"{project.name}: the runner's log was not read ({report}); log tail:\n{log[-2000:]}")
    return report["statuses"], log


def eval_script_for(project: Project, base: str) -> str:
    """A SWE-bench 5 eval script for a django row (the shape the dataset's rows carry)."""
    return "\n".join([
        "#!/bin/bash", "set -uxo pipefail", ACTIVATE, "cd /testbed", "git status",
        f"git -c core.fileMode=false diff {base}", ACTIVATE, ": '>>>>> Start Test Output'", project.command(),
        ": '>>>>> End Test Output'"]) + "\n"


def build_images(project: Project, site: Path, tasks: list[tuple[dict, Path]], docker_host: str | None) -> None:
    import docker

    client = docker.DockerClient(base_url=docker_host) if docker_host else docker.from_env()
    env_tag = f"arlctl/swe-env-{project.name}:{project.pin}"
    with tempfile.TemporaryDirectory() as ctx:
        shutil.copytree(site, Path(ctx) / "site", symlinks=True)
        (Path(ctx) / "activate").write_text(ACTIVATE_SCRIPT)
        (Path(ctx) / "Dockerfile").write_text(
            f"FROM {BASE_IMAGE}\nUSER root\nCOPY site {ENV_DIR}/site\nCOPY activate /opt/miniconda3/bin/activate\n"
            f"RUN mkdir -p {ENV_DIR}/bin && ln -s /usr/bin/python3 {ENV_DIR}/bin/python\nUSER sandbox\n")
        say(f"building {env_tag}")
        client.images.build(path=ctx, tag=env_tag, network_mode="none", rm=True, forcerm=True)
    for row, tree in tasks:
        with tempfile.TemporaryDirectory() as ctx:
            shutil.copytree(tree, Path(ctx) / "repo", symlinks=True)
            (Path(ctx) / "Dockerfile").write_text(
                f"FROM {env_tag}\nCOPY --chown=1000:1000 repo /testbed\nWORKDIR /testbed\n")
            say(f"building {row['image']}")
            client.images.build(path=ctx, tag=row["image"], network_mode="none", rm=True, forcerm=True)
    client.close()


def build_project(project: Project, out: Path, cache: Path, images: bool, docker_host: str | None) -> list[dict]:
    sdist, wheels = fetch(project, cache)
    work = out / "build" / project.name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    site = work / "site"  # the dependencies, installed from the wheel cache without an index
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site),
                    *map(str, wheels)], check=True)
    gold_tree = unpack(sdist, work / "gold")
    gold_statuses, _ = run_suite(project, gold_tree, site)
    say(f"{project.name} {project.pin}: {len(gold_statuses)} tests read on the gold tree")
    rows, built = [], []
    for index, bug in enumerate(project.bugs, start=1):
        iid = f"{project.repo.replace('/', '__')}-arlctl-{index}"
        tree = work / f"task-{index}"
        shutil.copytree(gold_tree, tree, symlinks=True)
        replace_once(tree / bug.path, bug.gold, bug.buggy)
        base = one_commit(tree, f"{project.name} {project.pin} with bug {bug.name}")
        gold_patch = _patch(tree, bug.path, bug.buggy, bug.gold)
        wrong_patch = _patch(tree, bug.path, bug.buggy, bug.wrong)
        buggy = run_suite(project, tree, site)[0]
        f2p = sorted(t for t, s in gold_statuses.items() if s == "PASSED" and buggy.get(t) != "PASSED")
        p2p = sorted(t for t, s in gold_statuses.items() if s == "PASSED" and buggy.get(t) == "PASSED")
        if not f2p:
            raise SystemExit(f"{iid}: the injected bug fails no test the runner reports")
        replace_once(tree / bug.path, bug.buggy, bug.wrong)
        wrong = run_suite(project, tree, site)[0]
        git(tree, "checkout", "-q", "--", bug.path)
        if all(wrong.get(t) == "PASSED" for t in f2p):
            raise SystemExit(f"{iid}: the wrong fix passes every FAIL_TO_PASS test")
        row = {
            "instance_id": iid, "repo": project.repo, "version": project.version, "base_commit": base,
            "environment_setup_commit": base, "created_at": "2026-01-01T00:00:00Z", "hints_text": "",
            "problem_statement": bug.statement, "patch": gold_patch, "test_patch": "",
            "FAIL_TO_PASS": json.dumps(f2p), "PASS_TO_PASS": json.dumps(p2p),
            "image": f"arlctl/sweb.eval.{iid.lower()}:1", "repo_dir": "/testbed",
            "log_parser": f"parse_log_{project.name}", "eval_type": "pass_and_fail",
        }
        if isinstance(project, Django):
            row["eval_script"] = eval_script_for(project, base)
        else:
            row["test_cmd"] = project.command()  # no `activate`: an image row enters the image's testbed env
        rows.append((row, wrong_patch))
        built.append((row, tree))
        say(f"{iid}: {len(f2p)} FAIL_TO_PASS, {len(p2p)} PASS_TO_PASS")
    if images:
        build_images(project, site, built, docker_host)
    return rows


def _patch(tree: Path, rel: str, old: str, new: str) -> str:
    """The diff that takes the committed `rel` from `old` to `new`, leaving the tree as it was."""
    replace_once(tree / rel, old, new)
    diff = git(tree, "diff", "--no-color", "--", rel)
    git(tree, "checkout", "-q", "--", rel)
    return diff


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="examples:\n  python recipes/swe_real_tasks.py --out runs/swe-real\n"
                                            "  python recipes/swe_real_tasks.py --out /tmp/r --projects sympy --no-images")
    parser.add_argument("--out", type=Path, required=True, help="where tasks.jsonl, wrong_fixes.jsonl and the builds go")
    parser.add_argument("--projects", default="django,sympy", help=f"comma-separated, of: {', '.join(PROJECTS)}")
    parser.add_argument("--cache", type=Path, default=Path(os.environ.get("ARLCTL_HOME", "~/.cache/arlctl")).expanduser()
                        / "swe-real", help="downloaded source releases and wheels (default $ARLCTL_HOME/swe-real)")
    parser.add_argument("--no-images", action="store_true", help="write the rows only")
    parser.add_argument("--docker-host", default=os.environ.get("DOCKER_HOST"), help="the engine (default $DOCKER_HOST)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.projects.split(",") if n.strip()]
    unknown = [n for n in names if n not in PROJECTS]
    if unknown:
        parser.error(f"unknown project {unknown[0]!r}; known: {', '.join(PROJECTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    made = [pair for name in names for pair in build_project(PROJECTS[name], args.out, args.cache, not args.no_images,
                                                              args.docker_host)]
    (args.out / "tasks.jsonl").write_text("".join(json.dumps(row) + "\n" for row, _ in made))
    (args.out / "wrong_fixes.jsonl").write_text(
        "".join(json.dumps({"instance_id": row["instance_id"], "patch": wrong}) + "\n" for row, wrong in made))
    summary = {"tasks": len(made), "projects": names, "images": not args.no_images,
               "rows": [{"instance_id": r["instance_id"], "image": r["image"], "fail_to_pass": len(json.loads(r["FAIL_TO_PASS"])),
                         "pass_to_pass": len(json.loads(r["PASS_TO_PASS"]))} for r, _ in made]}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if args.json:
        print(json.dumps(summary))
    else:
        for r in summary["rows"]:
            print(f"{r['instance_id']}: {r['fail_to_pass']} FAIL_TO_PASS, {r['pass_to_pass']} PASS_TO_PASS, image {r['image']}")
        print(f"{len(made)} tasks written to {args.out / 'tasks.jsonl'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
