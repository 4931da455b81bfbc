"""Escape the five HTML special characters."""

REPLACEMENTS = [("<", "&lt;"), (">", "&gt;"), ('"', "&quot;"), ("'", "&#x27;"), ("&", "&amp;")]


def escape(text):
    for char, entity in REPLACEMENTS:
        text = text.replace(char, entity)
    return text
