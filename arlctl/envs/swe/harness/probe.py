"""The value recorder for probe grading: the tested process computes and serialises, and decides nothing.

Copied into the grading sandbox as `arlctl_probe.py` and loaded with `pytest -p arlctl_probe`. The probe
form of a test file (made by arlctl/envs/swe/probes.py when the suite is built) holds no expected values:
each check of the original test became `_probe(value)` or `with _raises(): ...`, which write the value's
typed encoding to a results file outside the repository, tagged with the running test's node id. The
trusted side (the host's grader) compares those encodings with expected values that never enter the
sandbox. Model code shares this process, so it can write, rewrite or drop records at will; what it cannot
do is know which values would pass. Stdlib only.
"""

import json
import os

_STATE = {"node": "", "out": None}
_MAX_DEPTH = 40
_MAX_ITEMS = 10_000


def _qualname(cls):
    return getattr(cls, "__qualname__", None) or getattr(cls, "__name__", "?")


def encode(value, depth=0):
    """A JSON-able, type-exact encoding of `value` (containers recursively; dicts and sets in a fixed order)."""
    import dataclasses
    import datetime
    import decimal
    import enum
    import fractions

    if depth > _MAX_DEPTH:
        return ["too_deep"]
    kind = type(value)
    if value is None:
        return ["none"]
    if kind is bool:
        return ["bool", value]
    if kind is int:
        return ["int", str(value)]
    if kind is float:
        return ["float", repr(value)]
    if kind is str:
        return ["str", value]
    if kind in (bytes, bytearray):
        return [kind.__name__, bytes(value).hex()]
    if kind in (list, tuple):
        return [kind.__name__, [encode(item, depth + 1) for item in list(value)[:_MAX_ITEMS]]]
    if kind is dict:
        pairs = [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in list(value.items())[:_MAX_ITEMS]]
        return ["dict", sorted(pairs, key=lambda pair: json.dumps(pair[0]))]
    if kind in (set, frozenset):
        return [kind.__name__, sorted((encode(item, depth + 1) for item in list(value)[:_MAX_ITEMS]), key=json.dumps)]
    if kind in (decimal.Decimal, fractions.Fraction, datetime.date, datetime.datetime, datetime.time,
                datetime.timedelta):
        return [kind.__name__, str(value)]
    if isinstance(value, enum.Enum):
        return ["enum", _qualname(kind), encode(value.value, depth + 1)]
    if isinstance(value, BaseException):
        return ["exception", _qualname(kind), encode(list(value.args), depth + 1)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name, None) for f in dataclasses.fields(value) if f.compare}
        return ["dataclass", _qualname(kind), encode(fields, depth + 1)]
    if isinstance(value, tuple) and hasattr(kind, "_fields"):  # a named tuple
        return ["namedtuple", _qualname(kind), encode(list(value), depth + 1)]
    attrs = getattr(value, "__dict__", None)
    if isinstance(attrs, dict):
        return ["object", _qualname(kind), encode({k: v for k, v in attrs.items() if not k.startswith("_")}, depth + 1)]
    return ["opaque", _qualname(kind)]


_MAX_MESSAGE = 10_000


def _write(mode, encoded, site=None):
    out = _STATE["out"]
    if out is None:
        return
    record = {"node": _STATE["node"], "mode": mode, "v": encoded}
    if site is not None:  # checks converted by `arlctl swe prepare` name their site in the test file
        record["site"] = str(site)
    out.write(json.dumps(record) + "\n")
    out.flush()


def probe(value, mode="eq", site=None):
    """Record one checked value of the running test (mode: eq for `==` and truth checks, same for _same and
    identity with None/True/False, almost for a tolerance check whose tolerance the host keeps)."""
    try:
        encoded = encode(value)
    except Exception as err:  # an object that cannot even be looked at is recorded as such
        encoded = ["unencodable", type(err).__name__]
    _write(mode, encoded, site)
    return value


def _message(value):
    try:
        return str(value)[:_MAX_MESSAGE]
    except Exception as err:  # a message that cannot be built is recorded as such
        return f"<unprintable {type(err).__name__}>"


class raises:  # noqa: N801  (used as `with _raises():`, like pytest.raises)
    """Record which exception the block raised (its class names, most derived first), and swallow it.

    With a site (prepared rows) the message is recorded too, and the exception is kept as `.value` /
    `.exception` (and its class as `.type`) for the test's later checks, as pytest's and unittest's are."""

    def __init__(self, site=None):
        self.site, self.value, self.exception, self.type = site, None, None, None

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is None:
            _write("raises", ["none"], self.site)
            return False
        if not issubclass(kind, Exception):  # KeyboardInterrupt, SystemExit: not ours to swallow
            return False
        self.type, self.value, self.exception = kind, value, value
        names = [_qualname(cls) for cls in kind.__mro__]
        _write("raises", ["raised", names] if self.site is None else ["raised", names, _message(value)], self.site)
        return True


def pytest_addoption(parser):
    parser.addoption("--arlctl-probe-out", default="")
    parser.addoption("--arlctl-start-fd", type=int, default=-1)


def _signal_started(config):
    """Tell the driver pytest came up (before any test module is imported), through a pipe it then closes."""
    fd = config.getoption("--arlctl-start-fd")
    if fd >= 0:
        os.write(fd, b"started")
        os.close(fd)


def pytest_configure(config):
    _signal_started(config)
    path = config.getoption("--arlctl-probe-out")
    if path:
        _STATE["out"] = open(path, "a", encoding="utf-8")  # noqa: SIM115  (kept open for the run)


def pytest_runtest_setup(item):
    _STATE["node"] = item.nodeid
    _write("begin", ["none"])


def pytest_runtest_teardown(item):
    _STATE["node"] = item.nodeid
    _write("end", ["none"])
