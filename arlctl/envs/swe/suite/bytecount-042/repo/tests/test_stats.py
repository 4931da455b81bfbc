from bytecount import char_count, longest_line


def test_ascii(tmp_path):
    p = tmp_path / "a.txt"
    p.write_bytes(b"hello\nworld!\n")
    assert char_count(p) == 12
    assert longest_line(p) == "world!"
