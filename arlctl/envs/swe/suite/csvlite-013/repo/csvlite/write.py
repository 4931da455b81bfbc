"""Format one CSV line."""


def quote(field):
    if any(c in field for c in ',"\n'):
        return '"' + field.replace('"', '""') + '"'
    return field


def format_line(fields):
    return ",".join(quote(f) for f in fields)
