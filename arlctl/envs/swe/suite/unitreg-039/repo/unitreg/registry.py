"""The registry itself: unit name -> metres."""

_units = {"m": 1.0, "km": 1000.0, "cm": 0.01}


def register(name, metres):
    if metres <= 0:
        raise ValueError("a unit must be positive")
    _units[name] = float(metres)


def registered():
    return sorted(_units)


def clear():
    global _units
    _units = {}
