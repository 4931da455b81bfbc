"""Build a query string; spaces become '+'."""

from urllib.parse import quote_plus


def build_query(params):
    parts = []
    for key, values in params.items():
        for value in values:
            parts.append(f"{quote_plus(key)}={quote_plus(value)}")
    return "&".join(parts)
