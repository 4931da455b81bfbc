"""Diff splitting and filtering: what the grader keeps of an agent's diff and what it flags."""

from __future__ import annotations

import pytest

from arlctl.envs.swe.diffs import filter_diff, paths_in, protected_reason, split_sections

SRC = """diff --git a/pkg/mod.py b/pkg/mod.py
index 1111111..2222222 100644
--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -1,2 +1,2 @@
 def f(x):
-    return x < 1
+    return x <= 1
"""
NEW_TEST = """diff --git a/tests/test_mod.py b/tests/test_mod.py
new file mode 100644
index 0000000..3333333
--- /dev/null
+++ b/tests/test_mod.py
@@ -0,0 +1,2 @@
+def test_ok():
+    assert True
"""
CONFTEST = NEW_TEST.replace("tests/test_mod.py", "conftest.py")
RENAME = """diff --git a/pkg/a.py b/tests/a.py
similarity index 100%
rename from pkg/a.py
rename to tests/a.py
"""
SYMLINK = """diff --git a/pkg/link.py b/pkg/link.py
new file mode 120000
index 0000000..4444444
--- /dev/null
+++ b/pkg/link.py
@@ -0,0 +1 @@
+/etc/passwd
\\ No newline at end of file
"""
BINARY = """diff --git a/pkg/blob.bin b/pkg/blob.bin
new file mode 100644
index 0000000..5555555
Binary files /dev/null and b/pkg/blob.bin differ
"""
PLAIN = """--- pkg/mod.py
+++ pkg/mod.py
@@ -1,2 +1,2 @@
 def f(x):
-    return x < 1
+    return x <= 1
"""


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("pkg/mod.py", None),
        ("pkg/testing_utils.py", None),  # a module whose name merely starts with "test" is source
        ("tests/test_x.py", "test_file"),
        ("tests/data/fixture.json", "test_file"),
        ("pkg/test_mod.py", "test_file"),
        ("pkg/mod_test.py", "test_file"),
        ("conftest.py", "conftest"),
        ("pkg/conftest.py", "conftest"),
        ("pytest.ini", "pytest_config"),
        ("setup.cfg", "pytest_config"),
        ("tox.ini", "pytest_config"),
        ("pyproject.toml", "pytest_config"),
        ("sitecustomize.py", "import_hook"),
        ("pkg/usercustomize.py", "import_hook"),
        ("evil.pth", "import_hook"),
        (".git/config", "git_metadata"),
        ("../outside.py", "path_outside_repo"),
        ("/etc/passwd", "path_outside_repo"),
        ("pkg/__pycache__/mod.cpython-311.pyc", "bytecode"),
    ],
)
def test_protected_reason(path, reason):
    assert protected_reason(path) == reason


def test_keeps_source_and_flags_everything_else():
    result = filter_diff(SRC + NEW_TEST + CONFTEST + RENAME + SYMLINK + BINARY)
    assert result.diff == SRC
    assert result.kept == ["pkg/mod.py"]
    assert [(t["path"], t["reason"]) for t in result.tamper] == [
        ("tests/test_mod.py", "test_file"),
        ("conftest.py", "conftest"),
        ("tests/a.py", "test_file"),  # renaming a source file into tests/ is a test edit too
        ("pkg/link.py", "symlink"),
        ("pkg/blob.bin", "binary"),
    ]


def test_plain_unified_diff_and_paths():
    prefixed = PLAIN.replace("--- pkg/", "--- a/pkg/").replace("+++ pkg/", "+++ b/pkg/")
    sections = split_sections(prefixed)
    assert [(s.old_path, s.new_path) for s in sections] == [("pkg/mod.py", "pkg/mod.py")]
    assert filter_diff(prefixed).diff == prefixed
    assert paths_in(SRC + NEW_TEST) == ["pkg/mod.py", "tests/test_mod.py"]


def test_headers_and_git_must_name_the_same_paths():
    """Without a/ b/ prefixes git strips one component (it would patch mod.py, not pkg/mod.py): the
    section's paths are what git touches or the diff is refused whole, never re-read."""
    refused = filter_diff(PLAIN)
    assert refused.diff == "" and refused.kept == [] and refused.tamper == [{"path": "mod.py",
                                                                          "reason": "undeclared_path"}]


NEW_FILE = "--- /dev/null\n+++ b/pkg/new.py\n@@ -0,0 +1 @@\n+x = 1\n"


@pytest.mark.parametrize(("how", "diff", "reason"), [
    ("both_sides_dev_null", NEW_FILE.replace("b/pkg/new.py", "/dev/null"), "undeclared_path"),
    ("prefixed_dev_null", NEW_FILE.replace("/dev/null", "a/dev/null").replace("b/pkg/new.py", "b/dev/null"),
     "dev_null_path"),
    ("git_header_dev_null", "diff --git a/dev/null b/dev/null\nnew file mode 100644\n" +
     NEW_FILE.replace("b/pkg/new.py", "b/dev/null"), "dev_null_path"),
    ("empty_file_dev_null", "diff --git a/dev/null b/dev/null\nnew file mode 100644\nindex 0000000..e69de29\n",
     "dev_null_path"),
    ("quoted_dev_null", NEW_FILE.replace("b/pkg/new.py", '"/dev/null"'), "undeclared_path"),
])
def test_a_dev_null_section_never_becomes_a_path(how, diff, reason):
    """/dev/null names no file: a section whose headers name only it, or name `dev/null` as a repository
    path, is never kept as the file dev/null (git would create one)."""
    honest = ("diff --git a/pkg/new.py b/pkg/new.py\nnew file mode 100644\n" if diff.startswith("diff --git")
              else "") + NEW_FILE
    result = filter_diff(honest + diff)
    assert "dev/null" not in result.kept and "dev/null" not in result.sections, how
    assert reason in {t["reason"] for t in result.tamper}, result.tamper
    if reason == "undeclared_path":
        assert result.diff == ""  # refused whole
    else:
        assert result.kept == ["pkg/new.py"]


def test_sections_split_at_newlines_only():
    """A hunk line holding \\u2028 or \\x0c and a fake header is one line to git, and one line here."""
    for separator in ("\u2028", "\x0c", "\x1c", "\x85", "\r"):
        hidden = NEW_FILE.replace("+x = 1\n", f"+x = 1  #{separator}diff --git a/tests/t.py b/tests/t.py\n")
        sections = split_sections(hidden)
        assert len(sections) == 1 and sections[0].text == hidden, repr(separator)


def test_empty_and_garbage():
    assert filter_diff("").diff == "" and filter_diff("").tamper == []
    garbage = filter_diff("this is not a diff\n")
    assert garbage.diff == "" and garbage.tamper[0]["reason"] == "unparseable_diff"
