"""Pointers from the code to the docs land: the README became a front page and its sections moved to docs/,
so every `docs/PAGE.md` the source names exists, and a `docs/PAGE.md: section` names a heading (or a bold
lead-in) of that page. Two hints a user meets are checked as they are raised."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from arlctl.envs.base import as_env
from arlctl.errors import UsageError
from arlctl.rewards import rubrics

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [p for d in ("arlctl", "stages", "schemas") for p in sorted((ROOT / d).rglob("*.py"))]
POINTER = re.compile(r"docs/([\w/.-]+?\.md)(?::\s*([a-z][a-z -]*[a-z]))?")


def sections(page: Path) -> list[str]:
    """The headings and bold lead-ins (`**Reward protocol.**`) of a markdown page, lower-cased."""
    text = page.read_text()
    return [m.lower() for m in re.findall(r"^#+\s+(.+)$", text, flags=re.M) + re.findall(r"\*\*([^*]+)\*\*", text)]


def pointers() -> list[tuple[str, str, str | None]]:
    found = []
    for path in SOURCES:
        for match in POINTER.finditer(path.read_text()):
            found.append((str(path.relative_to(ROOT)), match.group(1), match.group(2)))
    return found


def test_the_source_points_at_docs_pages():
    assert len(pointers()) >= 10  # the scan finds them (a broken pattern would pass everything below)


@pytest.mark.parametrize(("source", "page", "section"), pointers())
def test_every_docs_pointer_names_a_page_and_section_that_exist(source, page, section):
    target = ROOT / "docs" / page
    assert target.is_file(), f"{source} points at docs/{page}, which does not exist"
    if section:
        wanted = section.removeprefix("the ").strip()
        assert any(wanted in heading for heading in sections(target)), \
            f"{source}: docs/{page} has no section {section!r}"


def test_a_non_env_is_told_where_the_env_protocol_is():
    with pytest.raises(UsageError) as caught:
        as_env(object())
    assert "docs/environments.md" in caught.value.hint and "README" not in caught.value.hint
    assert "`async close()`" in (ROOT / "docs" / "environments.md").read_text()


def test_an_unknown_rubric_is_told_where_rubric_files_are():
    with pytest.raises(UsageError) as caught:
        rubrics.resolve("no-such-rubric")
    assert "docs/environments.md: model-based rewards" in caught.value.hint
