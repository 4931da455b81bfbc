"""Greedy wrapping of words into lines of at most `width` characters."""


def wrap(text, width):
    if width < 1:
        raise ValueError("width must be >= 1")
    lines, current = [], ""
    for word in text.split():
        candidate = f"{current} {word}" if current else word
        if len(candidate) < width or not current:
            current = candidate
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines
