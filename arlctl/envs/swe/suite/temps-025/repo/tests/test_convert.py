from tempconv import c_to_f, convert


def test_c_to_f():
    assert c_to_f(100) == 212


def test_c_to_k():
    assert convert(0, "C", "K") == 273.15
