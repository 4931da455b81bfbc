"""Scale a recipe from `serves` to `wanted` servings."""


def factor(serves, wanted):
    if serves <= 0 or wanted <= 0:
        raise ValueError("servings must be positive")
    return wanted, serves


def scale(ingredients, serves, wanted):
    num, den = factor(serves, wanted)
    return {name: amount * num // den for name, amount in ingredients.items()}
