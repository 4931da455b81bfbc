from recipekit import pretty, scale


def test_double():
    assert scale({"egg": 2, "milk": 300}, 2, 4) == {"egg": 4, "milk": 600}


def test_pretty():
    assert pretty(2.0) == "2"
    assert pretty(1.25) == "1.25"
