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
    sections = split_sections(PLAIN)
    assert [(s.old_path, s.new_path) for s in sections] == [("pkg/mod.py", "pkg/mod.py")]
    assert filter_diff(PLAIN).diff == PLAIN
    assert paths_in(SRC + NEW_TEST) == ["pkg/mod.py", "tests/test_mod.py"]


def test_empty_and_garbage():
    assert filter_diff("").diff == "" and filter_diff("").tamper == []
    garbage = filter_diff("this is not a diff\n")
    assert garbage.diff == "" and garbage.tamper[0]["reason"] == "unparseable_diff"
