"""Slugs: lowercase ASCII words joined by dashes."""

import re

from slugger.ascii import to_ascii


def slugify(text):
    text = to_ascii(text).lower()
    words = re.findall(r"[a-z0-9]+", text)
    return "-".join(words)


def unique_slug(text, taken):
    base = slugify(text)
    slug, n = base, 2
    while slug in taken:
        slug = f"{base}-{n}"
        n += 1
    return slug
