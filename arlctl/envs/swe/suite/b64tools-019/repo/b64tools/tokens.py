"""URL-safe base64 tokens without padding."""

import base64

from b64tools.padding import add_padding


def encode_token(data):
    return base64.b64encode(data).decode("ascii")


def decode_token(token):
    return base64.urlsafe_b64decode(add_padding(token))
