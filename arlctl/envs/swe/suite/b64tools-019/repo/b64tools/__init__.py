"""b64tools: URL-safe tokens."""

from b64tools.tokens import decode_token, encode_token

__all__ = ["encode_token", "decode_token"]
