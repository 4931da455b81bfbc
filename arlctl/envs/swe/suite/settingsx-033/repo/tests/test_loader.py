import pytest

from settingsx import load


def test_override():
    assert load({"workers": 8})["workers"] == 8


def test_invalid():
    with pytest.raises(ValueError):
        load({"workers": 0})
