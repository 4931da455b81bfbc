"""Parse a query string into {key: [values]}."""

from urllib.parse import unquote


def parse_query(text):
    out = {}
    for pair in text.lstrip("?").split("&"):
        if not pair:
            continue
        key, _, value = pair.partition("=")
        out.setdefault(unquote(key), []).append(unquote(value))
    return out
