"""No SQL text is built from data: a scan of the whole code base with `ast` (issue 26 item 4).

Two rules, checked over every module of arlctl/, stages/, schemas/, benchmarks/ and recipes/:

1. Every formatted string (f-string, `%`, `.format()`, `+` with a string) whose text looks like SQL takes
   only constants: literals, or module-level names bound once to a constant expression (in that module or
   imported from a scanned one). A column name, path or value read from a run is never one of those.
2. Every call that hands DuckDB SQL (`.execute`, `.sql`, `.query`, `duckdb.sql`, `.read_*`, a relation's
   `.filter`, and every function of ours that passes one of its parameters on to such a call, found here
   to a fixpoint) gets its SQL as a constant, or from a parameter of a function that is itself such a
   wrapper (its callers are checked in turn), or at one of the `USER_SQL` sites: SQL the user typed.

The scanner is shown to catch synthetic offending snippets and the report code as it was before the fix.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("arlctl", "stages", "schemas", "benchmarks", "recipes")

# SQL the user wrote by design, passed to DuckDB as it is: (file, function) -> why that is the user's input.
USER_SQL = {
    ("arlctl/cli/query.py", "query"): "`arlctl query SQL PATHS`: the SQL argument is the user's own query",
    ("stages/filter.py", "_where_mask"): "`arlctl filter --where`: a user's predicate, parsed as one expression",
}

# Text that reads as a SQL statement or clause (case-insensitive); prose rarely matches these shapes.
SQL_SHAPES = re.compile(
    r"\bselect\b[\s\S]*\bfrom\b|\bcopy\s*\(|\bcopy\s+\w+\s+(to|from)\b|\bcreate\s+(or\s+replace\s+)?"
    r"(temp\w*\s+)?(view|table|macro|secret|index|schema)\b|\battach\s+'|\battach\s+database\b|"
    r"^\s*(install|load|force\s+install)\s+'?\w+'?\s*;?\s*$|\bread_(parquet|csv|csv_auto|json|json_auto|ndjson|text|blob)\s*\(|"
    r"\bdescribe\s+\w|\bpragma\s+\w|\binsert\s+into\b|\bdelete\s+from\b|\bupdate\s+\w+\s+set\b|"
    r"\bunion\s+(all\s+)?(by\s+name\s+)?select\b|\bfrom\s+\w+\s+(where|group\s+by|order\s+by)\b|"
    r"\bset\s+\w+\s*(=|to)\s", re.IGNORECASE)
SQL_METHODS = {"execute", "executemany", "sql", "query", "from_query", "read_csv", "read_json", "read_parquet"}
RELATION_METHODS = {"filter", "project", "aggregate"}  # SQL expressions, when called on a DuckDB relation
RELATION_MAKERS = {"table", "view", "sql", "query", "from_arrow", "from_df", "read_parquet", "filter", "project"}


@dataclass
class Module:
    path: str  # relative to ROOT
    name: str  # dotted
    tree: ast.Module
    constants: set[str] = field(default_factory=set)
    assigned: dict[str, ast.AST] = field(default_factory=dict)  # module-level `NAME = value` (the first)
    imported: dict[str, tuple[str, str]] = field(default_factory=dict)  # local name -> (module, name)

    functions: list[tuple[str, ast.AST]] = field(default_factory=list)  # (qualified name, def) of each one
    nodes: list[tuple[ast.AST, str]] = field(default_factory=list)  # every node with its function's name

    def __post_init__(self) -> None:
        # One walk of the tree: every node, the innermost function it sits in, and every function.
        stack: list[tuple[ast.AST, str, str]] = [(self.tree, "", "<module>")]
        while stack:
            node, prefix, owner = stack.pop()
            self.nodes.append((node, owner))
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = f"{prefix}{child.name}"
                    self.functions.append((name, child))
                    stack.append((child, f"{name}.", name))
                elif isinstance(child, ast.ClassDef):
                    stack.append((child, f"{prefix}{child.name}.", owner))
                else:
                    stack.append((child, prefix, owner))
        for stmt in self.tree.body:
            if isinstance(stmt, ast.Assign):
                for t in stmt.targets:
                    if isinstance(t, ast.Name):
                        self.assigned.setdefault(t.id, stmt.value)
        for node, _ in self.nodes:
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    self.imported.setdefault(alias.asname or alias.name, (node.module, alias.name))


@dataclass
class Finding:
    path: str
    line: int
    function: str
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} in {self.function}: {self.what}"


# ----------------------------------------------------------------------------------------------- constants


def is_constant(node: ast.AST | None, names: set[str]) -> bool:
    """`node` evaluates to the same value on every run, whatever data the program reads."""
    if node is None or isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.JoinedStr):
        return all(is_constant(v, names) for v in node.values)
    if isinstance(node, ast.FormattedValue):
        return is_constant(node.value, names) and is_constant(node.format_spec, names)
    if isinstance(node, ast.BinOp):
        return is_constant(node.left, names) and is_constant(node.right, names)
    if isinstance(node, ast.UnaryOp):
        return is_constant(node.operand, names)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(is_constant(e, names) for e in node.elts)
    if isinstance(node, ast.Starred):
        return is_constant(node.value, names)
    if isinstance(node, ast.Dict):
        return all(is_constant(k, names) for k in node.keys) and all(is_constant(v, names) for v in node.values)
    if isinstance(node, ast.Subscript):  # any element of a constant container is a constant
        return is_constant(node.value, names)
    if isinstance(node, ast.IfExp):  # either constant, whichever the test picks
        return is_constant(node.body, names) and is_constant(node.orelse, names)
    # "...".format(<constants>), "sep".join(<constants>), CONSTANT_DICT.items()/values()/keys()
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in {"format", "join", "items", "values", "keys"}:
        return (is_constant(node.func.value, names) and all(is_constant(a, names) for a in node.args)
                    and all(is_constant(k.value, names) for k in node.keywords))
    return False


def module_constants(modules: dict[str, Module]) -> None:
    """Fill each module's `constants`: names bound exactly once, at module level, to a constant expression
    (or imported from a scanned module where they are such), never declared `global` in a function."""
    bound: dict[str, dict[str, list[ast.AST]]] = {}
    for mod in modules.values():
        counts: dict[str, list[ast.AST]] = {}
        for stmt in mod.tree.body:
            targets: list[ast.AST] = []
            if isinstance(stmt, ast.Assign):
                targets, value = stmt.targets, stmt.value
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                targets, value = [stmt.target], stmt.value
            for target in targets:
                if isinstance(target, ast.Name):
                    counts.setdefault(target.id, []).append(value)
                else:  # tuple unpacking and the like: every name in it is not a constant
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            counts.setdefault(name.id, []).extend([None, None])
        for node, _ in mod.nodes:
            if isinstance(node, ast.Global):
                for name in node.names:
                    counts.setdefault(name, []).extend([None, None])
            elif isinstance(node, (ast.AugAssign, ast.Delete)):
                for name in ast.walk(node):
                    if isinstance(name, ast.Name) and isinstance(name.ctx, (ast.Store, ast.Del)):
                        counts.setdefault(name.id, []).extend([None, None])
        bound[mod.name] = counts
    changed = True
    while changed:
        changed = False
        for mod in modules.values():
            for stmt in mod.tree.body:
                if isinstance(stmt, ast.ImportFrom) and stmt.module in modules and stmt.level == 0:
                    source = modules[stmt.module]
                    for alias in stmt.names:
                        local = alias.asname or alias.name
                        if alias.name in source.constants and local not in mod.constants \
                                and local not in bound[mod.name]:
                            mod.constants.add(local)
                            changed = True
            for name, values in bound[mod.name].items():
                if name in mod.constants or len(values) != 1 or values[0] is None:
                    continue
                if is_constant(values[0], mod.constants):
                    mod.constants.add(name)
                    changed = True


def constant_text(node: ast.AST, mod: Module) -> str:
    """The literal text of a string expression (module-level string constants followed), '' for the rest."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(constant_text(v, mod) if isinstance(v, ast.Constant) else " x " for v in node.values)
    if isinstance(node, ast.BinOp):
        return constant_text(node.left, mod) + " " + constant_text(node.right, mod)
    if isinstance(node, ast.Name) and node.id in mod.assigned:
        return constant_text(mod.assigned[node.id], mod)
    return ""


# ----------------------------------------------------------------------------------------------- formatting


def formatted(node: ast.AST, mod: Module) -> tuple[str, list[ast.AST]] | None:
    """(literal text, interpolated pieces) when `node` builds a string from parts, else None."""
    if isinstance(node, ast.JoinedStr):
        pieces = [v for v in node.values if isinstance(v, ast.FormattedValue)]
        return (constant_text(node, mod), pieces) if pieces else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and _is_str(node.left, mod):
        return constant_text(node.left, mod), [node.right]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        parts = _add_chain(node)
        if any(_is_str(p, mod) for p in parts):
            return " ".join(constant_text(p, mod) for p in parts), [p for p in parts if not _is_literal(p)]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format" \
            and _is_str(node.func.value, mod):
        return constant_text(node.func.value, mod), [*node.args, *(k.value for k in node.keywords)]
    return None


def _add_chain(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _add_chain(node.left) + _add_chain(node.right)
    return [node]


def _is_literal(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant)


def _is_str(node: ast.AST, mod: Module) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)) or isinstance(node, ast.JoinedStr) \
        or (isinstance(node, ast.Name) and bool(constant_text(node, mod)))


# ----------------------------------------------------------------------------------------------- the scan


def _functions(mod: Module) -> list[tuple[str, ast.AST]]:
    """(qualified name, def node) of every function, methods included."""
    return mod.functions


@dataclass
class Wrappers:
    """Our functions that hand any of their parameters to DuckDB as SQL: (module, name, is a method) ->
    {position among the call's positional arguments: parameter name} of each such parameter."""

    found: dict[tuple[str, str, bool], dict[int, str]] = field(default_factory=dict)

    def params(self, call: ast.Call, mod: Module) -> dict[int, str]:
        func = call.func
        if isinstance(func, ast.Attribute):  # a method call: every method of that name we wrote
            out: dict[int, str] = {}
            for (_, name, method), params in self.found.items():
                if method and name == func.attr:
                    out.update(params)
            return out
        if not isinstance(func, ast.Name):
            return {}
        if (mod.name, func.id, False) in self.found:
            return self.found[(mod.name, func.id, False)]
        source = mod.imported.get(func.id)
        if source is not None and (*source, False) in self.found:
            return self.found[(*source, False)]
        return {}


def sql_arguments(call: ast.Call, mod: Module, wrappers: Wrappers) -> list[ast.AST]:
    """The arguments of `call` that DuckDB reads as SQL ([] when `call` hands DuckDB no SQL).

    A method named like a DuckDB SQL entry point (`.execute`, `.sql`, ...) counts wherever it is called,
    whatever the receiver: a scan that guessed which objects are connections could guess wrong, and a
    false alarm here is cheaper than a miss (every such call in the code base is a DuckDB one today)."""
    func = call.func
    params = dict(wrappers.params(call, mod))
    if isinstance(func, ast.Attribute):
        if func.attr in SQL_METHODS:
            params.setdefault(0, "sql")
            params.setdefault(-1, "query")
        elif func.attr in RELATION_METHODS:
            receiver = func.value  # pyarrow's Table.filter and the like take no SQL: only a relation's
            if isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Attribute) \
                    and receiver.func.attr in RELATION_MAKERS:
                params.setdefault(0, "sql")
    out = [call.args[i] for i in sorted(params) if 0 <= i < len(call.args)]
    names = set(params.values())
    out += [k.value for k in call.keywords if k.arg in names]
    return out


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    names = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    return names[1:] if names and names[0] in {"self", "cls"} else names


def _local_values(fn: ast.AST, name: str) -> list[ast.AST] | None:
    """Every value `name` is bound to inside `fn` (None for a `for` target or any binding not understood)."""
    values: list[ast.AST] = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == name:
                    values.append(node.value)
                elif any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(target)):
                    return None
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and isinstance(node.target, ast.Name) \
                and node.target.id == name:
            if isinstance(node, ast.AugAssign) or node.value is None:
                return None
            values.append(node.value)
        elif isinstance(node, (ast.For, ast.comprehension)) and any(
                isinstance(n, ast.Name) and n.id == name for n in ast.walk(node.target)):
            values.append(node.iter)  # an element of a constant iterable is a constant
        elif isinstance(node, (ast.With, ast.ExceptHandler)) and name in {
                n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                and not isinstance(node, ast.ExceptHandler)}:
            return None
    return values


def scan(modules: dict[str, Module]) -> list[Finding]:
    module_constants(modules)
    wrappers = Wrappers()
    units = []  # (module, wrapper key, parameters, calls) of every function that passes a parameter on
    for mod in modules.values():
        for qualname, fn in _functions(mod):
            if (mod.path, fn.name) in USER_SQL:
                continue
            params = _parameters(fn)
            calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call)
                     and any(isinstance(a, ast.Name) and a.id in params
                             for a in (*n.args, *(k.value for k in n.keywords)))]
            if calls:
                units.append((mod, (mod.name, fn.name, "." in qualname and _is_method(fn)), params, calls))
    changed = True
    while changed:  # wrappers of wrappers, to a fixpoint
        changed = False
        for mod, key, params, calls in units:
            found = wrappers.found.get(key, {})
            for call in calls:
                for a in sql_arguments(call, mod, wrappers):
                    if isinstance(a, ast.Name) and a.id in params and params.index(a.id) not in found:
                        found = {**found, params.index(a.id): a.id}
            if found != wrappers.found.get(key, {}):
                wrappers.found[key] = found
                changed = True
    findings: list[Finding] = []
    for mod in modules.values():
        defs = dict(_functions(mod))
        for node, where in mod.nodes:
            built = formatted(node, mod)
            if built is not None and SQL_SHAPES.search(built[0]):
                bad = [p for p in built[1] if not is_constant(p, mod.constants)]
                if bad:
                    findings.append(Finding(mod.path, node.lineno, where, "SQL text built from "
                                            + ", ".join(ast.unparse(p) for p in bad)))
            if isinstance(node, ast.Call):
                for arg in sql_arguments(node, mod, wrappers):
                    problem = _sql_source_problem(arg, mod, defs.get(where), where)
                    if problem:
                        findings.append(Finding(mod.path, node.lineno, where, problem))
    return findings


def _is_method(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    names = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    return bool(names) and names[0] in {"self", "cls"}


def _sql_source_problem(arg: ast.AST, mod: Module, fn: ast.AST | None, where: str) -> str | None:
    """Why the SQL handed to DuckDB at this call is not known to be constant (None when it is)."""
    if (mod.path, where.split(".")[-1]) in USER_SQL:
        return None
    if isinstance(arg, ast.Name) and fn is not None and arg.id in _parameters(fn):
        return None  # a wrapper: its callers are checked
    known = mod.constants | (_constant_locals(fn, mod) if fn is not None else set())
    if is_constant(arg, known):
        return None
    return f"DuckDB is handed SQL that is not a constant: {ast.unparse(arg)}"


def _constant_locals(fn: ast.AST, mod: Module) -> set[str]:
    """Local names of `fn` (not parameters) every binding of which is a constant expression: a query
    picked from constants by a test, a loop over a constant dict of queries."""
    params = set(_parameters(fn)) | {a.arg for a in (*fn.args.kwonlyargs, fn.args.vararg, fn.args.kwarg) if a}
    params |= {a.arg for a in (*fn.args.posonlyargs, *fn.args.args)}
    candidates = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} - params
    for node in ast.walk(fn):  # a name also bound some other way (import, except, def, match, global) is not
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            candidates -= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar, ast.FunctionDef,
                               ast.AsyncFunctionDef, ast.ClassDef)) and node.name and node is not fn:
            candidates.discard(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            candidates -= set(node.names)
    values = {name: _local_values(fn, name) for name in candidates}
    known = set(mod.constants)
    changed = True
    while changed:
        changed = False
        for name, bound in values.items():
            if name not in known and bound and all(is_constant(v, known) for v in bound):
                known.add(name)
                changed = True
    return known - mod.constants


def load(paths: dict[str, str]) -> dict[str, Module]:
    """Modules from {relative path: source}."""
    out = {}
    for rel, source in paths.items():
        name = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        out[name] = Module(rel, name, ast.parse(source, filename=rel))
    return out


@functools.cache
def code_base() -> dict[str, Module]:
    """Every scanned module, parsed once per test session (the scan only adds to `constants`)."""
    files = {}
    for root in SCANNED:
        for path in sorted((ROOT / root).rglob("*.py")):
            files[str(path.relative_to(ROOT))] = path.read_text(encoding="utf-8")
    return load(files)


# ----------------------------------------------------------------------------------------------- tests


@pytest.mark.slow
def test_the_code_base_builds_no_sql_from_data():
    modules = code_base()
    findings = scan(modules)
    assert not findings, "SQL built from something that is not a constant:\n" + "\n".join(map(str, findings))


@pytest.mark.slow
def test_the_scan_walks_every_source_root_and_the_sql_modules():
    paths = {m.path for m in code_base().values()}
    for root in SCANNED:
        assert any(p.startswith(f"{root}/") for p in paths), root
    assert not any(p.startswith("tests/") for p in paths)
    for known in ("arlctl/stats.py", "arlctl/report/sources.py", "arlctl/report/data.py", "arlctl/cli/query.py",
                  "arlctl/cli/inspect.py", "arlctl/cli/show.py", "arlctl/io/duck.py", "stages/filter.py",
                  "benchmarks/shards_bench.py", "recipes/learning_report.py"):
        assert known in paths, known
    assert len(paths) > 100  # the whole tree, not a hand-picked list


def test_every_user_sql_site_still_exists():
    """An allowlist entry whose function is gone (or no longer hands DuckDB SQL) is stale."""
    modules = {m.path: m for m in code_base().values()}
    for path, function in USER_SQL:
        names = {q.split(".")[-1] for q, _ in _functions(modules[path])}
        assert function in names, (path, function)


NAMES = 'VIEW = "t"\ndef one(con, sql):\n    return con.execute(sql).fetchone()\n'  # a module snippets import


def _scan_snippet(source: str, extra: dict[str, str] | None = None) -> list[Finding]:
    return scan(load({"pkg/snippet.py": source, **(extra or {})}))


OFFENDING = {
    "f-string with a column name": 'def f(con, col):\n    con.execute(f"select \\"{col}\\" from t")\n',
    "percent format": 'def f(con, col):\n    return con.execute("select %s from t" % col)\n',
    "str.format": 'def f(con, col):\n    con.sql("select {} from t".format(col))\n',
    "concatenation": 'def f(con, path):\n    con.execute("copy (select 1) to \'" + path + "\'")\n',
    "read_parquet over a path": 'import duckdb\ndef f(p):\n    duckdb.sql(f"select * from read_parquet(\'{p}\')")\n',
    "non-SQL-looking fragment at the call": 'def f(con, x):\n    con.execute(f"{x} 1")\n',
    "built into a local first": 'def f(con, cols):\n    q = ", ".join(cols)\n    con.execute(q)\n',
    "through a wrapper of ours": ('def one(con, sql):\n    return con.execute(sql).fetchone()\n'
                                  'def g(con, row):\n    return one(con, row.strip())\n'),
    "a method wrapper": ('class V:\n    def rows(self, sql):\n        return self.con.execute(sql)\n'
                         'def g(v, view):\n    return v.rows("describe " + view)\n'),
    "a relation filter": 'def f(con, col):\n    con.table("t").filter(f"{col} > 1")\n',
    "a module name reassigned": ('VIEW = "t"\ndef set_view(v):\n    global VIEW\n    VIEW = v\n'
                                 'def f(con):\n    con.execute(f"select * from {VIEW}")\n'),
    "SQL-looking text anywhere": 'def f(name):\n    return f"create view v as select * from {name}"\n',
    "the second SQL parameter of a wrapper": ('def run(con, a, b):\n    con.execute(a)\n    con.execute(b)\n'
                                              'def g(con, x):\n    run(con, "select 1 from t", x.strip())\n'),
    "a wrapper called by keyword": ('def rows(con, statement):\n    return con.execute(statement)\n'
                                    'def g(con, x):\n    return rows(con, statement=x.strip())\n'),
    "an imported wrapper": ('from pkg.names import one\ndef g(con, x):\n    return one(con, x.strip())\n'),
    "a local rebound to data": ('def f(con, x):\n    q = "select 1 from t"\n    if x:\n        q = x\n'
                                '    con.execute(q)\n'),
    "a local picked from data": 'def f(con, qs, k):\n    q = qs[k]\n    con.execute(q)\n',
    "a closure over data": ('def f(con, x):\n    def g():\n        con.execute(x)\n    g()\n'),
    "duckdb reached by __import__": ('def f(x):\n    __import__("duckdb").sql(x.strip())\n'),
    "a constant computed from a loop variable": (
        'OPEN = ("a", "b")\nPIECES = " + ".join(f"length({o})" for o in OPEN)\n'
        'def f(con):\n    con.execute(f"select {PIECES} from t")\n'),
}


@pytest.mark.parametrize("case", sorted(OFFENDING))
def test_the_scan_catches_synthetic_offenders(case):
    findings = _scan_snippet(OFFENDING[case], {"pkg/names.py": NAMES})
    assert any(f.path == "pkg/snippet.py" for f in findings), f"{case}: not flagged"


CLEAN = {
    "constants and bound values": ('VIEW = "t"\nCOLS = ("a", "b")\nQ = f"select {\', \'.join(COLS)} from {VIEW}"\n'
                                   'def f(con, x):\n    con.execute(Q + " where a = $x", {"x": x})\n'),
    "imported constant": ('from pkg.names import VIEW\n'
                          'def f(con):\n    con.execute(f"select count(*) from {VIEW}")\n'),
    "a constant picked by a test": ('A = "select 1 from t"\nB = "select 2 from t"\n'
                                    'def f(con, flag):\n    con.execute(A if flag else B)\n'),
    "a loop over constant queries": ('QS = {"a": "select 1 from t", "b": "select 2 from t"}\n'
                                     'def f(con):\n    for k, q in QS.items():\n        con.execute(q)\n'),
    "prose is not SQL": 'def f(path):\n    return f"no shards found at {path}"\n',
    "a local query picked by a test": ('A = {"r": "select 1 from t"}\nB = {"r": "select null from t"}\n'
                                       'def f(con, flag):\n    q = A if flag else B\n    con.execute(q["r"])\n'),
    "a wrapper passing its parameter on": ('from pkg.names import one\ndef g(con, sql):\n    return one(con, sql)\n'
                                           'def h(con):\n    return g(con, "select 1 from t")\n'),
    "pyarrow filter": 'def f(table, mask):\n    return table.filter(mask)\n',
}


@pytest.mark.parametrize("case", sorted(CLEAN))
def test_the_scan_passes_constant_sql(case):
    findings = _scan_snippet(CLEAN[case], {"pkg/names.py": NAMES})
    assert not findings, f"{case}: {findings}"


BEFORE_FIX = "6107045"  # main before issue 26 item 4: the report spliced metrics column names into SQL


@pytest.mark.parametrize("path", ["arlctl/report/data.py", "arlctl/report/sources.py", "arlctl/io/duck.py",
                                  "arlctl/stats.py"])
def test_the_scan_flags_the_code_as_it_was_before_the_fix(path):
    shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{BEFORE_FIX}:{path}"], capture_output=True,
                           text=True)
    if shown.returncode != 0:
        pytest.skip(f"no git history here ({shown.stderr.strip()})")
    findings = _scan_snippet(shown.stdout, {"arlctl/io/duck.py": 'VIEW = "trajectories"\n'}
                             if path != "arlctl/io/duck.py" else None)
    assert findings, path
    if path == "arlctl/report/data.py":  # the planted-column break-out of the issue: train()'s select list
        assert any(f.function == "train" for f in findings), findings
