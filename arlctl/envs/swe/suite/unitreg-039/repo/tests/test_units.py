from unitreg import convert, register


def test_builtin():
    assert convert(2, "km", "m") == 2000.0


def test_register():
    register("inch", 0.0254)
    assert convert(1, "inch", "cm") == 2.54
