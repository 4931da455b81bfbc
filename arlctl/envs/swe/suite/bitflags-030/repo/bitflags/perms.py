"""Permissions."""

from bitflags.bits import contains_any


class Perm:
    READ = 1
    WRITE = 2
    EXEC = 4
    RW = READ | WRITE
    ALL = READ | WRITE | EXEC


def has(perms, flag):
    return contains_any(perms, flag)


def grant(perms, flag):
    return perms | flag


def revoke(perms, flag):
    return perms & ~flag
