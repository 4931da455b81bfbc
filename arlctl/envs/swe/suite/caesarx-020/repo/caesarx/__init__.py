"""caesarx: Caesar and ROT13 ciphers."""

from caesarx.cipher import rot13, shift

__all__ = ["shift", "rot13"]
