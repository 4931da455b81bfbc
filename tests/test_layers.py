"""The package layers, highest first: cli -> command engines (supervisor, plan, audit, stats) ->
stages / report / trackers -> rewards / synthetic / doctor -> envs / serve / rl -> inference -> tools / models /
runstate -> sandbox / io -> schemas / render / settings / turn_rows -> errors. No module imports from a
package above its own or of its rank, every package and top-level module has a rank, and the package import
graph has no cycle. The doctor's checks sit below the stages: rollout's plan runs the ones its envs and
backend need before any work (stages/rollout_job.py). `arlctl report` is a peer of the stages (cli runs it;
it reads run files through io and draws trajectories with arlctl/render.py, which `arlctl show` shares).

Read from the source with `ast` (every import, including the ones inside functions), so the test needs
nothing imported and fails on the first arrow that points up.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Higher imports lower. Packages and modules of one rank do not import each other either. Every package
# and top-level module under arlctl/ (and stages, schemas) has a rank: a new one fails until it is placed.
RANK = {"cli": 9, "supervisor": 8, "plan": 8, "audit": 8, "stats": 8,
        "stages": 7, "report": 7, "trackers": 7, "rewards": 6, "harnesses": 6, "synthetic": 6, "doctor": 6, "envs": 5, "serve": 5, "rl": 5,
        "inference": 4, "tools": 3, "models": 3, "runstate": 3, "sandbox": 2, "io": 2,
        "schemas": 1, "render": 1, "settings": 1, "turn_rows": 1, "errors": 0}
# Re-export shims kept for one change while their importers move (issue 14); delete the entry with the shim.
SHIMS: set[str] = set()  # modules allowed to re-export from another layer (none today)


def _package(module: str) -> str | None:
    """The layered package a dotted module name lies in (arlctl.envs.swe.env -> envs), else None."""
    parts = module.split(".")
    if parts[0] in ("stages", "schemas"):
        return parts[0]
    if parts[0] == "arlctl" and len(parts) > 1 and parts[1] != "__init__":
        return parts[1]
    return None


def _layers(root: Path = ROOT) -> set[str]:
    """Every package and top-level module under arlctl/, plus stages and schemas."""
    found = {"stages", "schemas"}
    for entry in (root / "arlctl").iterdir():
        if entry.suffix == ".py" and entry.stem != "__init__" or (entry / "__init__.py").is_file():
            found.add(entry.stem)
    return found


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "arlctl":  # from arlctl import models
            found.extend((node.lineno, f"arlctl.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return found


def _arrows(root: Path = ROOT) -> list[tuple[str, str, str]]:
    """(from package, to package, "file:line module") for every import between two layered packages."""
    arrows = []
    for top in ("arlctl", "stages", "schemas"):
        for path in sorted((root / top).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            source = _package(".".join(path.relative_to(root).with_suffix("").parts))
            if source is None or relative in SHIMS:
                continue
            for line, module in _imports(path):
                target = _package(module)
                if target is not None and target != source:
                    arrows.append((source, target, f"{relative}:{line} {module}"))
    return arrows


def _against_layers(arrows: list[tuple[str, str, str]]) -> list[str]:
    return [f"{src} -> {dst}: {where}" for src, dst, where in arrows
            if src in RANK and dst in RANK and RANK[dst] >= RANK[src]]


def _cycles(arrows: list[tuple[str, str, str]]) -> list[list[str]]:
    """Package cycles of the import graph, ranks aside (each as a path a -> ... -> a), found by DFS."""
    graph: dict[str, set[str]] = {}
    for src, dst, _ in arrows:
        graph.setdefault(src, set()).add(dst)
    found, done = [], set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            found.append(path[path.index(node):] + [node])
            return
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, path + [node])
        done.add(node)

    for start in sorted(graph):
        visit(start, [])
    return found


def test_every_package_and_module_is_ranked():
    unranked = sorted(_layers() - set(RANK))
    assert unranked == [], f"place these in RANK: {unranked}"


@pytest.mark.slow
def test_no_package_cycles():
    assert _cycles(_arrows()) == []


def test_the_cycle_check_finds_a_planted_cycle(tmp_path):
    # rewards <-> stages, as composite.py's import of stages.rollout_job once made it.
    (tmp_path / "arlctl" / "rewards").mkdir(parents=True)
    (tmp_path / "stages").mkdir()
    (tmp_path / "arlctl" / "rewards" / "c.py").write_text("from arlctl.stages.rollout_job import parse_env_options\n")
    (tmp_path / "stages" / "r.py").write_text("from arlctl.rewards.c import x\n")
    assert _cycles(_arrows(tmp_path)) == [["rewards", "stages", "rewards"]]
    (tmp_path / "arlctl" / "newpkg").mkdir()
    (tmp_path / "arlctl" / "newpkg" / "__init__.py").write_text("")
    assert "newpkg" in _layers(tmp_path) and "newpkg" not in RANK  # an unplaced package would fail the test above


@pytest.mark.slow
def test_no_package_imports_a_higher_or_sibling_layer():
    wrong = _against_layers(_arrows())
    assert wrong == [], "imports against the layers:\n" + "\n".join(wrong)


@pytest.mark.slow
def test_the_check_flags_an_upward_import_and_sees_the_real_ones(tmp_path):
    # The check above would pass vacuously if the reader found nothing: it must flag a planted arrow up...
    (tmp_path / "arlctl" / "tools").mkdir(parents=True)
    (tmp_path / "arlctl" / "sandbox").mkdir()
    (tmp_path / "arlctl" / "tools" / "x.py").write_text("from arlctl.envs.base import ToolCall\n")
    (tmp_path / "arlctl" / "sandbox" / "y.py").write_text("def f():\n    import arlctl.inference.hf\n")
    assert _against_layers(_arrows(tmp_path)) == ["sandbox -> inference: arlctl/sandbox/y.py:2 arlctl.inference.hf",
                                                  "tools -> envs: arlctl/tools/x.py:1 arlctl.envs.base"]
    # ...and see the downward arrows the real tree has.
    assert {("envs", "tools"), ("envs", "sandbox"), ("cli", "stages"), ("cli", "report"), ("report", "render"),
            ("cli", "render"), ("report", "io")} <= {(a, b) for a, b, _ in _arrows()}


def test_report_importing_the_cli_again_would_be_flagged(tmp_path):
    # The cycle this layering ended: report/samples.py drew trajectories with cli/show.py's renderer.
    (tmp_path / "arlctl" / "report").mkdir(parents=True)
    (tmp_path / "arlctl" / "report" / "samples.py").write_text("from arlctl.cli.show import render\n")
    (tmp_path / "arlctl" / "render.py").write_text("from arlctl.report.samples import render_html\n")
    assert _against_layers(_arrows(tmp_path)) == ["render -> report: arlctl/render.py:1 arlctl.report.samples",
                                                  "report -> cli: arlctl/report/samples.py:1 arlctl.cli.show"]
