import pytest

from verscmp import newer, parse_version


def test_simple():
    assert newer("1.2.4", "1.2.3")
    assert not newer("1.2", "1.2.0")


def test_bad():
    with pytest.raises(ValueError):
        parse_version("1.x")
