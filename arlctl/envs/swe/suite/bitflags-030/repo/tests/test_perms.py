from bitflags import Perm, grant, has, revoke


def test_single_bits():
    p = grant(0, Perm.READ)
    assert has(p, Perm.READ)
    assert not has(p, Perm.WRITE)


def test_revoke():
    assert revoke(Perm.ALL, Perm.EXEC) == Perm.RW
