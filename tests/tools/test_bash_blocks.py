"""Tests of the fenced bash block parser (exactly one block per turn)."""

from __future__ import annotations

from arlctl.tools.bash_blocks import parse_bash_blocks


def test_one_block():
    text = "I will list files.\n```bash\nls -la /repo && cat setup.py\n```\n"
    calls, errors = parse_bash_blocks(text)
    assert errors == []
    assert len(calls) == 1
    assert calls[0].name == "bash"
    assert calls[0].arguments == {"command": "ls -la /repo && cat setup.py"}


def test_multiline_command_is_kept_verbatim():
    text = "```bash\ncat <<'EOF' > a.py\nprint(1)\nEOF\n```"
    calls, _ = parse_bash_blocks(text)
    assert calls[0].arguments["command"] == "cat <<'EOF' > a.py\nprint(1)\nEOF"


def test_zero_blocks_is_an_error_unless_allowed():
    calls, errors = parse_bash_blocks("I think the bug is in parse().")
    assert calls == []
    assert len(errors) == 1
    assert "no ```bash block found" in errors[0].message
    assert parse_bash_blocks("just prose", allow_none=True) == ([], [])


def test_other_languages_do_not_count():
    calls, errors = parse_bash_blocks("```python\nprint(1)\n```")
    assert calls == []
    assert "no ```bash block" in errors[0].message


def test_several_blocks_is_an_error():
    text = "```bash\nls\n```\nthen\n```sh\npwd\n```"
    calls, errors = parse_bash_blocks(text)
    assert calls == []
    assert "found 2 ```bash blocks, expected exactly one" in errors[0].message
    assert "ls" in errors[0].raw and "pwd" in errors[0].raw


def test_unclosed_block_is_an_error():
    calls, errors = parse_bash_blocks("```bash\nls -la\n")
    assert calls == []
    assert "unclosed ```bash block" in errors[0].message


def test_empty_block_is_an_error():
    calls, errors = parse_bash_blocks("```bash\n\n```")
    assert calls == []
    assert "empty" in errors[0].message
