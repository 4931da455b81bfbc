"""Averages of scores."""


def weighted_average(scores, weights):
    """Average of scores with relative weights."""
    if len(scores) != len(weights):
        raise ValueError("scores and weights differ in length")
    if not scores:
        raise ValueError("no scores")
    return float(sum(s * w for s, w in zip(scores, weights)))
