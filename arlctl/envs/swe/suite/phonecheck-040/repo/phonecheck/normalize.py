"""Normalisation to digits with a leading +."""

from phonecheck.validate import is_valid


def normalize(text, default_country="1"):
    if not is_valid(text):
        raise ValueError(f"not a phone number: {text!r}")
    digits = "".join(c for c in text if c.isdigit())
    if not text.strip().startswith("+"):
        digits = default_country + digits
    return "+" + digits
