"""Full justification of wrapped lines."""

from wordwrap.wrap import wrap


def pad_line(line, width):
    words = line.split()
    if len(words) == 1:
        return line.ljust(width)
    gaps = len(words) - 1
    spaces = width - sum(len(w) for w in words)
    out = ""
    for i, word in enumerate(words[:-1]):
        out += word + " " * (spaces // gaps + (1 if i < spaces % gaps else 0))
    return out + words[-1]


def justify(text, width):
    lines = wrap(text, width)
    return [pad_line(line, width) for line in lines[:-1]] + lines[-1:]
