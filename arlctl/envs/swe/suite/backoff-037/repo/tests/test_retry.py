import pytest

from backoff import retry


def test_gives_up():
    def boom():
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        retry(boom, 3, sleep=lambda s: None)


def test_first_try():
    assert retry(lambda: 5, 3, sleep=lambda s: None) == 5
