"""Built-in defaults."""

DEFAULTS = {"debug": False, "workers": 4, "name": "app"}
