"""The package layers (docs: cli -> stages -> envs -> inference -> tools -> sandbox / io -> schemas): no
module imports from a package above its own, so no two packages import each other. `arlctl report` is a
peer of the stages (cli runs it; it reads run files through io and draws trajectories with arlctl/render.py,
which `arlctl show` shares); render and errors import no other layer and sit at the bottom.

Read from the source with `ast` (every import, including the ones inside functions), so the test needs
nothing imported and fails on the first arrow that points up.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Higher imports lower. Packages of one rank (stages/serve, sandbox/io) do not import each other either.
RANK = {"cli": 7, "stages": 6, "serve": 6, "report": 6, "envs": 5, "inference": 4, "tools": 3, "sandbox": 2,
        "io": 2, "schemas": 1, "render": 1, "errors": 0}
# Re-export shims kept for one change while their importers move (issue 14); delete the entry with the shim.
SHIMS: set[str] = set()  # modules allowed to re-export from another layer (none today)


def _package(module: str) -> str | None:
    """The layered package a dotted module name lies in (arlctl.envs.swe.env -> envs), else None."""
    parts = module.split(".")
    if parts[0] in ("stages", "schemas"):
        return parts[0]
    if parts[0] == "arlctl" and len(parts) > 1 and parts[1] in RANK:
        return parts[1]
    return None


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
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
    return [f"{src} -> {dst}: {where}" for src, dst, where in arrows if RANK[dst] >= RANK[src]]


def test_no_package_imports_a_higher_or_sibling_layer():
    wrong = _against_layers(_arrows())
    assert wrong == [], "imports against the layers:\n" + "\n".join(wrong)


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
