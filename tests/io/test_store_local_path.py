"""store.local_path and store.stamp: the io operations callers use instead of asking whether a URL is remote."""

from pathlib import Path

from arlctl.io import store
from arlctl.trackers import ExportConfig, destination


def test_local_path_is_a_path_here_and_none_on_a_store(tmp_path):
    assert store.local_path(tmp_path / "a") == tmp_path / "a"
    assert store.local_path("memory://bucket/run") is None


def test_stamp_changes_with_the_file_locally_and_on_a_store(tmp_path):
    for url in (str(tmp_path / "servers.json"), "memory://stamp-test/servers.json"):
        assert store.stamp(url) is None
        store.write_file(url, "one")
        first = store.stamp(url)
        store.write_file(url, "two!")
        assert first is not None and store.stamp(url) not in (None, first)


def test_a_tracker_needs_a_local_directory_for_a_remote_run(tmp_path):
    import pytest

    from arlctl.errors import UsageError

    with pytest.raises(UsageError, match="is not local: give --tb-dir"):
        destination("tensorboard", "memory://bucket/run", ExportConfig(to=["tensorboard"]))
    assert Path(destination("tensorboard", str(tmp_path), ExportConfig(to=["tensorboard"]))).is_relative_to(tmp_path)
