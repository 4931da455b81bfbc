"""Parse "1.2.3" into comparable parts."""


def parse_version(text):
    parts = text.strip().lstrip("v").split(".")
    if not all(p.isdigit() for p in parts):
        raise ValueError(f"bad version {text!r}")
    return tuple(parts)
