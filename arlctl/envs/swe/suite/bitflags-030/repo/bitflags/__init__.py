"""bitflags: permission bit sets."""

from bitflags.perms import Perm, grant, has, revoke

__all__ = ["Perm", "has", "grant", "revoke"]
