"""Letter grades."""

BANDS = [(90, "A"), (80, "B"), (70, "C"), (60, "D")]


def letter(score):
    for floor, grade in BANDS:
        if score >= floor:
            return grade
    return "F"
