"""The pytest-xdist groups of the suite: which tests may not run beside one of their own kind.

`--dist loadgroup` (pyproject's addopts) sends the tests of one `xdist_group` to one worker, in turn:
torchrun worlds (each already takes every core), the chaos runs (each supervises a whole daemon loop), and
the tests that start the second docker engine (it has one socket and one data root; that module names its
group), and the plugin tests (they pip-install a package into the shared venv and uninstall it after). Everything else, docker sandboxes included, runs side by side. (`make test` runs the torchrun and
chaos tiers in a serial pass of their own; the groups keep them apart under `pytest -m chaos` on xdist.)
tests/conftest.py imports the hook;
tests/test_xdist_groups.py checks it on a real pytest-xdist run.
"""

from __future__ import annotations

import pytest

try:  # pytest >= 9: a node's id is a NodeId
    from _pytest.nodeid import coerce_node_id
except ImportError:  # pragma: no cover - older pytest reads item._nodeid, as xdist sets it
    coerce_node_id = None

SERIAL_GROUPS = {"distributed": "torchrun", "chaos": "chaos"}  # marker -> group


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        for marker, group in SERIAL_GROUPS.items():
            if item.get_closest_marker(marker) is not None and item.get_closest_marker("xdist_group") is None:
                item.add_marker(pytest.mark.xdist_group(group))
        # A worker names a grouped test `NODEID@GROUP`: that suffix is what the controller's loadgroup
        # scheduler groups by. pytest-xdist 3.8 sets it on `item._nodeid`, which pytest 9 no longer reads
        # (the id is `item._id`), so every group was spread over the workers; set it here unless xdist did.
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})
        if groups and getattr(config.option, "loadgroup", False) and "@" not in item.nodeid:
            grouped = f"{item.nodeid}@{'_'.join(groups)}"
            if coerce_node_id is None:
                item._nodeid = grouped
            else:
                item._id = coerce_node_id(grouped)
