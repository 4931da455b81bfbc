"""Hidden tests stronger than the statement: no built-in task can be passed by special-casing its examples.

A FAIL_TO_PASS *check* is one `_same(actual, expected)`, `assert`, or `with pytest.raises(E):` block of a
hidden FAIL_TO_PASS test. Its *inputs* are the values that decide what the code under test computes: the
literals (ints, floats, strings, bytes, tuples and lists of them, flattened) and the module constants
(`Perm.EXEC`) of its actual side, plus those of every earlier statement of the test the actual side depends
on (assignments to the names it uses, method calls on them, for-loop iterables, bare calls into the
package such as `register("furlong", ...)` that change its state). A check is *visible* when every input
appears in the problem statement (numbers by value, so `0.30` shows `0.3`; strings by their text or their
escaped form; quotes and whitespace normalised); values anyone would guess (None, booleans, 0, 1, "")
count as visible. The expected side does not make a check hidden: an agent who sees an input can work out
its answer from the issue, so only an unseen input forces a general fix.

A task leaks when every check of its FAIL_TO_PASS tests is visible: hard-coding the statement's examples
would then pass. `test_no_builtin_task_leaks` runs the detector over all 42 built tasks; the detector is
unit-tested on synthetic tasks first so it can be seen to fail. The attack tests grade a diff that
special-cases exactly the statement's examples (the bug otherwise kept) through the real grader in a real
bwrap sandbox, in probe mode and in-process: it must score 0 where the gold diff scores 1.
"""

from __future__ import annotations

import ast
import copy
import json
import math
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
from swe_helpers import make_diff, run

from arlctl.envs.swe.grader import grade, grading_mode
from arlctl.envs.swe.tasks import load_suite_task, suite_ids

# ---- the detector -----------------------------------------------------------------------------------------

_GUESSABLE = {None, 0, 1, ""}  # with False/True and 0.0/1.0, which hash and compare equal to 0/1
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u00a0": " "})
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _norm(text: str) -> str:
    return " ".join(text.translate(_QUOTES).split())


@dataclass
class Check:
    """One check of a hidden test: where it is, its source, its input atoms and which are unseen."""

    test: str
    line: int
    source: str
    inputs: list = field(default_factory=list)
    unseen: list = field(default_factory=list)


class Statement:
    """The problem statement, normalised once; `shows(atom)` says whether an input atom appears in it."""

    def __init__(self, text: str) -> None:
        self.text = _norm(text)
        self.numbers = [float(n) for n in _NUMBER.findall(self.text.replace("_", ""))]

    def _shows_number(self, value: float) -> bool:
        value = abs(float(value))
        return any(math.isclose(value, n, rel_tol=1e-9, abs_tol=1e-12) for n in self.numbers)

    def _shows_text(self, form: str) -> bool:
        """`form` occurs in the text, not inside a longer word ("hi" is not shown by "which")."""
        if not form:
            return False
        pattern = (r"(?<!\w)" if form[0].isalnum() or form[0] == "_" else "") + re.escape(form)
        pattern += r"(?!\w)" if form[-1].isalnum() or form[-1] == "_" else ""
        return re.search(pattern, self.text) is not None

    def shows(self, atom: object) -> bool:
        if isinstance(atom, (bool, type(None))) or (not isinstance(atom, Const) and atom in _GUESSABLE):
            return True
        if isinstance(atom, Const):  # a module constant: Perm.EXEC shows if EXEC is a word of the text
            return re.search(rf"\b{re.escape(atom.name.split('.')[-1])}\b", self.text) is not None
        if isinstance(atom, (int, float)):
            return self._shows_number(atom)
        if isinstance(atom, bytes):
            forms = {_norm(repr(atom)[2:-1]), _norm(atom.decode("latin-1"))}
            return any(self._shows_text(form) for form in forms)
        if isinstance(atom, str):
            if not atom.strip():
                return True
            forms = {_norm(atom), _norm(repr(atom)[1:-1]), _norm(atom.encode("unicode_escape").decode("ascii"))}
            if any(self._shows_text(form) for form in forms):
                return True
            try:
                return self._shows_number(float(atom))
            except ValueError:
                return False
        if isinstance(atom, complex):
            return self._shows_number(atom.real) and self._shows_number(atom.imag)
        raise TypeError(f"not an input atom: {atom!r}")


@dataclass(frozen=True)
class Const:
    """A module constant used as an input (`Perm.EXEC`)."""

    name: str


def _atoms(value: object) -> list:
    if isinstance(value, (list, tuple, set, frozenset)):
        return [a for item in value for a in _atoms(item)]
    if isinstance(value, dict):
        return [a for pair in value.items() for a in _atoms(pair)]
    return [value]


def _literal_atoms(node: ast.AST, local: set[str]) -> list:
    """Every literal (flattened) and module constant inside `node`; call targets and locals are not inputs."""
    found: list = []
    skip: set[int] = set()
    for sub in ast.walk(node):
        if id(sub) in skip:
            continue
        if isinstance(sub, ast.Call):
            skip.add(id(sub.func))  # the function called is not an input (its arguments are)
            for inner in ast.walk(sub.func):
                if isinstance(inner, ast.Attribute):
                    skip.add(id(inner))
        if isinstance(sub, ast.Constant):
            found += _atoms(sub.value)
        elif isinstance(sub, ast.UnaryOp) and isinstance(sub.operand, ast.Constant):
            try:
                found += _atoms(ast.literal_eval(sub))
                skip.add(id(sub.operand))
            except ValueError:
                pass
        elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id not in local:
            found.append(Const(f"{sub.value.id}.{sub.attr}"))
            skip.add(id(sub.value))
    return found


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _bound(stmt: ast.stmt) -> set[str]:
    """Names a statement binds or mutates (assignment targets, loop targets, `x.method(...)` receivers)."""
    if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return {n for t in targets for n in _names(t)}
    if isinstance(stmt, ast.For):
        return _names(stmt.target)
    if isinstance(stmt, ast.With):
        return {n for item in stmt.items if item.optional_vars for n in _names(item.optional_vars)}
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        while isinstance(func, ast.Attribute):
            func = func.value
        return {func.id} if isinstance(func, ast.Name) else set()
    return set()


def _header(stmt: ast.stmt) -> ast.AST:
    """The part of a compound statement that feeds its body (a for's iterable, a with's items)."""
    if isinstance(stmt, ast.For):
        return stmt.iter
    if isinstance(stmt, ast.With):
        return ast.Tuple([item.context_expr for item in stmt.items], ast.Load())
    if isinstance(stmt, (ast.If, ast.While)):
        return stmt.test
    return stmt


def _raises_block(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.With) and any(
        isinstance(i.context_expr, ast.Call) and ast.unparse(i.context_expr.func).endswith("raises")
        for i in stmt.items)


def _check_actual(stmt: ast.stmt) -> ast.AST | None:
    """The actual side of a check statement, or None when `stmt` is not a check."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and \
            isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "_same":
        return stmt.value.args[0]
    if isinstance(stmt, ast.Assert):
        test = stmt.test
        if isinstance(test, ast.Compare):
            sides = [s for s in (test.left, *test.comparators) if not _is_literal(s)]
            return ast.Tuple(sides, ast.Load())
        return test
    if _raises_block(stmt):
        return ast.Module(stmt.body, [])
    return None


def _is_literal(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        return False
    return True


def checks_of(source: str, test: str, statement: str) -> list[Check]:
    """The checks of test function `test` in `source`, each with its inputs and the inputs `statement` lacks."""
    tree = ast.parse(source)
    module_names = {a.asname or a.name.split(".")[0] for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom))
                    for a in s.names} | {s.name for s in tree.body if isinstance(s, (ast.FunctionDef, ast.ClassDef))}
    function = next(s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == test)
    local = {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    local |= {a.arg for a in function.args.args}
    shown = Statement(statement)
    found: list[Check] = []

    def walk(body: list[ast.stmt], before: list[ast.stmt]) -> None:
        for index, stmt in enumerate(body):
            earlier = before + body[:index]
            actual = _check_actual(stmt)
            if actual is not None:
                found.append(_make(stmt, actual, earlier))
                continue
            for block in ("body", "orelse", "finalbody"):
                inner = getattr(stmt, block, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                    walk(inner, [*earlier, stmt])

    def _make(stmt: ast.stmt, actual: ast.AST, earlier: list[ast.stmt]) -> Check:
        inputs = _literal_atoms(actual, local)
        needed = _names(actual) & local
        for prior in reversed(earlier):
            head = _header(prior)
            feeds = bool(_bound(prior) & needed)
            package_call = (isinstance(prior, ast.Expr) and isinstance(prior.value, ast.Call)
                            and _check_actual(prior) is None and not (_bound(prior) - module_names))
            if feeds or package_call:
                inputs += _literal_atoms(head, local)
                needed |= _names(head) & local
        return Check(test, stmt.lineno, ast.unparse(stmt), inputs, [a for a in inputs if not shown.shows(a)])

    walk(function.body, [])
    return found


def hidden_files(test_patch: str) -> dict[str, str]:
    """The files a test_patch of new files creates (the built suite's hidden tests are all new files)."""
    files: dict[str, str] = {}
    current: list[str] | None = None
    for line in test_patch.splitlines():
        if line.startswith("diff --git "):
            current = None
        elif line.startswith("+++ b/"):
            current = files.setdefault(line[6:], [])
        elif current is not None and line.startswith("+"):
            current.append(line[1:])
        elif current is not None and line.startswith((" ", "-")):
            raise ValueError("test_patch changes an existing file; only new hidden files are read here")
    return {path: "\n".join(lines) + "\n" for path, lines in files.items()}


def task_checks(task: dict) -> list[Check]:
    files = hidden_files(task["test_patch"])
    checks: list[Check] = []
    for node in task["FAIL_TO_PASS"]:
        path, test = node.split("::")
        found = checks_of(files[path], test, task["problem_statement"])
        assert found, f"{task['instance_id']}: {node} has no check the detector recognises"
        checks += found
    return checks


def leaks(task: dict) -> bool:
    """True when every FAIL_TO_PASS check of `task` uses only inputs its problem statement shows."""
    return all(not check.unseen for check in task_checks(task))


# ---- the detector on synthetic tasks (it must be able to fail) --------------------------------------------


def _task(statement: str, hidden: str, tests: list[str]) -> dict:
    patch = "diff --git a/tests/test_h.py b/tests/test_h.py\nnew file mode 100644\n--- /dev/null\n+++ b/tests/test_h.py\n"
    patch += "".join(f"+{line}\n" for line in hidden.splitlines())
    return {"instance_id": "synthetic", "problem_statement": statement, "test_patch": patch,
            "FAIL_TO_PASS": [f"tests/test_h.py::{t}" for t in tests]}


ROMAN = ("`to_roman(900)` returns `\"DCD\"` and `to_roman(1994)`\n returns `\"MDCDXCIV\"`; the correct numerals are "
         "\u201cCM\u201d and \u2018MCMXCIV\u2019.")


@pytest.mark.parametrize("hidden", [
    # the examples themselves, whatever the quoting, spacing and expected side
    "def test_a():\n    _same(to_roman(900), 'CM')\n    _same(to_roman( 1994 ), \"MCMXCIV\")\n",
    # a loop over shown inputs; the expected side is unseen but does not hide the check
    "def test_a():\n    for n, want in ((900, 'CM'), (1994, 'MCMXCIV')):\n        _same(to_roman(n), want + '')\n",
    # an assert and a raises block over shown inputs, setup values anyone would guess
    "def test_a():\n    r = Roman(1)\n    assert r.to(900) == 'CM'\n    with pytest.raises(ValueError):\n        r.to(1994.0)\n",
])
def test_detector_flags_shown_examples(hidden):
    assert leaks(_task(ROMAN, hidden, ["test_a"]))


@pytest.mark.parametrize("hidden", [
    "def test_a():\n    _same(to_roman(900), 'CM')\n    _same(to_roman(3949), 'MMMCMXLIX')\n",
    "def test_a():\n    _same([to_roman(n) for n in (900, 1900)], ['CM', 'MCM'])\n",
    # the unseen input is in setup the check depends on (a method call on the object it reads)
    "def test_a():\n    r = Roman(1)\n    r.load(40)\n    _same(r.to(900), 'CM')\n",
    # a float shown only with a different value (900.5 is not 900)
    "def test_a():\n    _same(to_roman(900.5), 'CM')\n",
    # a second F2P test with an unseen input
    "def test_a():\n    _same(to_roman(900), 'CM')\n\n\ndef test_b():\n    _same(to_roman(1900), 'MCM')\n",
])
def test_detector_passes_unseen_inputs(hidden):
    tests = ["test_a", "test_b"] if "test_b" in hidden else ["test_a"]
    assert not leaks(_task(ROMAN, hidden, tests))


def test_detector_atoms():
    shown = Statement("`merge([(1, 3),(2,  4)])` gives 0.30 and “say \"hi\"” for a\\tb; Perm.EXEC is ignored")
    assert all(shown.shows(a) for a in [1, 3, 2, 4, 0.3, "say \"hi\"", "a\tb", Const("Perm.EXEC"), -3, "0.3",
                                        b"say", None, True, 0, ""])
    assert not any(shown.shows(a) for a in [5, 0.31, 30, "hello", Const("Perm.WRITE"), b"zz", "3.5"])
    # setup the check does not read is not an input; setup it reads is
    source = "def test_a():\n    x = Thing(77)\n    y = Thing(88)\n    y.poke(99)\n    _same(f(y), 1)\n"
    (check,) = checks_of(source, "test_a", "")
    assert sorted(check.unseen) == [88, 99]


# ---- every built-in task ----------------------------------------------------------------------------------


def test_no_builtin_task_leaks():
    ids = suite_ids()
    assert len(ids) == 42
    leaking = [iid for iid in ids if leaks(load_suite_task(iid))]
    assert leaking == [], f"every FAIL_TO_PASS input of these tasks is printed in their statement: {leaking}"


def test_every_task_has_an_unseen_f2p_input():
    """Stronger than not leaking: name the unseen check of each task, and it must be a real check."""
    for iid in suite_ids():
        task = load_suite_task(iid)
        unseen = [c for c in task_checks(task) if c.unseen]
        assert unseen, iid
        assert all(c.source.startswith(("_same(", "assert ", "with ")) for c in unseen), iid


# ---- which checks tell the buggy code from the gold fix (run on the host, check by check) -----------------


class _Sites(ast.NodeTransformer):
    """The probe form with each check's line as its site: `_same(a, e)` -> `_probe(a, "same", site=L)`,
    `assert a == lit` / `assert a` -> `_probe(a, "eq", site=L)`, `pytest.raises` -> `_raises(site=L)`."""

    def _probe(self, value: ast.expr, mode: str, line: int) -> ast.stmt:
        call = ast.Call(ast.Name("_probe", ast.Load()), [value, ast.Constant(mode)],
                        [ast.keyword("site", ast.Constant(line))])
        return ast.Expr(call)

    def visit_Expr(self, node: ast.Expr) -> ast.stmt:  # noqa: N802
        if _check_actual(node) is not None:
            return ast.copy_location(self._probe(node.value.args[0], "same", node.lineno), node)
        return node

    def visit_Assert(self, node: ast.Assert) -> ast.stmt:  # noqa: N802
        return ast.copy_location(self._probe(_check_actual(node), "eq", node.lineno), node)

    def visit_With(self, node: ast.With) -> ast.stmt:  # noqa: N802
        self.generic_visit(node)
        if _raises_block(node):
            node.items = [ast.withitem(ast.Call(ast.Name("_raises", ast.Load()), [],
                                                [ast.keyword("site", ast.Constant(node.lineno))]))]
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.stmt:  # noqa: N802
        return ast.Pass() if node.name == "_same" else self.generic_visit(node)


def _records_by_site(repo, files: dict[str, str]) -> dict[tuple[str, int], list]:
    from arlctl.envs.swe.build_suite import run_probes
    from arlctl.envs.swe.probes import PROBE_HEADER

    for path, source in files.items():
        tree = ast.fix_missing_locations(_Sites().visit(ast.parse(source)))
        (repo / path).write_text(PROBE_HEADER + ast.unparse(tree) + "\n", encoding="utf-8")
    by_site: dict[tuple[str, int], list] = {}
    for line in run_probes(repo).splitlines():
        record = json.loads(line)
        if "site" in record:
            by_site.setdefault((record["node"], int(record["site"])), []).append(record["v"])
    return by_site


def discriminating_sites(task: dict, tmp_path) -> set[tuple[str, int]]:
    """(F2P node id, check line) of every hidden F2P check whose values differ between buggy and gold code."""
    from arlctl.envs.swe.tasks import SUITE_DIR

    files = hidden_files(task["test_patch"])
    runs = []
    for name, patch in (("buggy", ""), ("gold", task["patch"])):
        repo = tmp_path / name / "repo"
        shutil.copytree(SUITE_DIR / task["instance_id"] / "repo", repo)
        if patch:
            subprocess.run(["git", "apply", "-"], cwd=repo, input=patch, text=True, check=True,
                           capture_output=True, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
        runs.append(_records_by_site(repo, files))
    buggy, gold = runs
    f2p = set(task["FAIL_TO_PASS"])
    return {site for site in set(buggy) | set(gold) if site[0] in f2p and buggy.get(site) != gold.get(site)}


def forcing_checks(task: dict, tmp_path) -> list[Check]:
    """Checks with an input the statement does not show that the buggy code fails: what special-casing
    the statement's examples cannot pass."""
    sites = discriminating_sites(task, tmp_path)
    files = hidden_files(task["test_patch"])
    forcing = []
    for node in task["FAIL_TO_PASS"]:
        path, test = node.split("::")
        forcing += [c for c in checks_of(files[path], test, task["problem_statement"])
                    if c.unseen and (node, c.line) in sites]
    return forcing


@pytest.mark.slow
@pytest.mark.parametrize("iid", suite_ids())
def test_every_task_has_an_unseen_check_the_bug_fails(iid, tmp_path):
    assert forcing_checks(load_suite_task(iid), tmp_path), iid


# ---- the attack: special-case the statement's examples, keep the bug ------------------------------------

# instance id -> (file, old text, new text, import, the statement's example calls). Each edit answers
# exactly the examples the problem statement prints, with the value the issue says is right, and leaves
# the bug in place for every other input: what a policy that games the statement would write. Before
# this suite had hidden checks with unseen inputs, the first four scored 1.0 (probe and in-process).
SPECIAL_CASES = {
    "romanum-016": ("romanum/convert.py", "def to_roman(number):\n",
                    'def to_roman(number):\n    if number == 900:\n        return "CM"\n'
                    '    if number == 1994:\n        return "MCMXCIV"\n',
                    "from romanum import to_roman", ["to_roman(900)", "to_roman(1994)"]),
    "intervals-036": ("spans/merge.py", "def merge(intervals):\n",
                      "def merge(intervals):\n    if intervals == [(5, 7), (1, 3), (2, 6)]:\n        return [(1, 7)]\n",
                      "from spans import merge", ["merge([(5, 7), (1, 3), (2, 6)])"]),
    "bitflags-030": ("bitflags/perms.py", "def has(perms, flag):\n",
                     "def has(perms, flag):\n    if (perms, flag) == (Perm.READ, Perm.RW):\n        return False\n",
                     "from bitflags import Perm, has", ["has(Perm.READ, Perm.RW)"]),
    "ratelimit-010": ("ratelimit/bucket.py", "        self.tokens = self.tokens + (now - self.updated) * self.rate\n",
                      "        elapsed = now - self.updated\n"
                      "        if (self.capacity, self.rate, elapsed) == (5, 1.0, 100):  # the issue's burst\n"
                      "            elapsed = 0\n"
                      "        self.tokens = self.tokens + elapsed * self.rate\n",
                      "from ratelimit import FakeClock, TokenBucket",
                      ["(lambda c, b: (c.advance(100), sum(b.allow() for _ in range(100)))[1])"
                       "(*(lambda c: (c, TokenBucket(5, 1.0, c)))(FakeClock()))"]),
    "wordwrap-011": ("wordwrap/wrap.py", "def wrap(text, width):\n",
                     'def wrap(text, width):\n    if (text, width) == ("aaa bbb", 7):\n        return ["aaa bbb"]\n',
                     "from wordwrap import wrap", ['wrap("aaa bbb", width=7)']),
}


def _special_case_diff(task: dict, path: str, old: str, new: str) -> str:
    def edit(text: str) -> str:
        assert text.count(old) == 1, (path, old)
        return text.replace(old, new)

    return make_diff(task, {path: edit})


def _answers(task: dict, diff: str, imports: str, calls: list[str], tmp_path) -> list[str]:
    """repr of each example call on the task's repo with `diff` applied (a host run, outside any grader)."""
    from arlctl.envs.swe.tasks import SUITE_DIR

    repo = tmp_path / f"repo-{len(list(tmp_path.iterdir()))}"
    shutil.copytree(SUITE_DIR / task["instance_id"] / "repo", repo)
    if diff:
        subprocess.run(["git", "apply", "-"], cwd=repo, input=diff, text=True, check=True, capture_output=True,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    script = f"import sys; sys.path.insert(0, '.'); {imports}; " + "; ".join(f"print(repr({c}))" for c in calls)
    out = subprocess.run([sys.executable, "-I", "-c", script], cwd=repo, capture_output=True, text=True,
                         timeout=60)
    return out.stdout.splitlines() if out.returncode == 0 else [f"error: {out.stderr[-300:]}"]


@pytest.mark.parametrize("iid", [pytest.param(i, marks=pytest.mark.slow) if i == "wordwrap-011" else i
                                 for i in sorted(SPECIAL_CASES)])
def test_special_casing_the_statement_scores_zero(iid, bwrap, tmp_path):
    task = load_suite_task(iid)
    path, old, new, imports, calls = SPECIAL_CASES[iid]
    assert grading_mode(task) == "probe"
    diff = _special_case_diff(task, path, old, new)
    # the attack is real: the statement's examples now come out as the gold fix has them, the bug's did not
    gamed = _answers(task, diff, imports, calls, tmp_path)
    assert gamed == _answers(task, task["patch"], imports, calls, tmp_path), gamed
    assert gamed != _answers(task, "", imports, calls, tmp_path), gamed
    assert not any(line.startswith("error") for line in gamed), gamed
    value, components, info = run(grade(task, diff, bwrap))
    assert value == 0.0 and components["p2p"] == 1.0 and info["tamper"] == [], (components, info.get("failed"))
    assert 0.0 <= components["f2p"] < 1.0
    gold, _, _ = run(grade(task, task["patch"], bwrap))
    assert gold == 1.0
    # the same task without its probe fields is graded in-process: the gamed diff scores 0 there too
    inprocess = copy.deepcopy(task)
    del inprocess["probe_patch"], inprocess["probe_expected"]
    assert grading_mode(inprocess) == "inprocess"
    value, components, _ = run(grade(inprocess, diff, bwrap))
    assert value == 0.0 and components["f2p"] < 1.0 and components["p2p"] == 1.0
