from wordstat import top_words, word_count


def test_simple():
    assert word_count("the cat sat") == 3


def test_top():
    assert top_words("b a b c b a", 2) == [("b", 3), ("a", 2)]
