from b64tools import decode_token


def test_decode():
    assert decode_token("aGk") == b"hi"
