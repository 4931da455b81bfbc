"""KEY=VALUE parsing."""

from dotenvx.lines import meaningful_lines, unquote


def parse(text):
    env = {}
    for line in meaningful_lines(text):
        if "=" not in line:
            raise ValueError(f"not KEY=VALUE: {line!r}")
        key, value = line.split("=")[:2]
        env[key.strip()] = unquote(value.strip())
    return env
