"""The rate card: (upper limit in kg, inclusive; price)."""

BRACKETS = [(1.0, 4.0), (5.0, 7.5), (20.0, 15.0)]


def bracket_index(weight):
    for index, (limit, _) in enumerate(BRACKETS):
        if weight < limit:
            return index
    raise ValueError(f"{weight} kg is over the maximum of {BRACKETS[-1][0]} kg")
