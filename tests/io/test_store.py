"""The storage-commit primitive (arlctl/io/store.py) behaves the same on a local disk and on S3 (moto)."""

from __future__ import annotations

from pathlib import Path

import pytest

from arlctl.errors import TransientError
from arlctl.io import store
from arlctl.io.fs import join


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "root")
    return join(request.getfixturevalue("s3_bucket"), f"store-{tmp_path.name}")


def build_with(files: dict[str, bytes]):
    def build(directory: Path) -> None:
        for name, data in files.items():
            (directory / name).write_bytes(data)

    return build


def test_write_file_replaces_whole_and_reads_back(root):
    url = join(root, "a", "LATEST")
    assert store.read_file(url) is None
    store.write_file(url, "v000001\n")
    store.write_file(url, b"v000002\n")
    assert store.read_file(url) == b"v000002\n"
    store.write_file(url, lambda fh: fh.write(b"streamed"))
    assert store.read_file(url) == b"streamed"
    if "://" not in root:  # the local commit leaves no temp file behind
        assert sorted(p.name for p in Path(root, "a").iterdir()) == ["LATEST"]


def test_commit_dir_lists_only_committed_directories(root):
    store.commit_dir(build_with({"w.bin": b"x" * 10, "MARK": b"{}"}), join(root, "d1"), "MARK")
    store.commit_dir(build_with({"w.bin": b"y"}), join(root, "d2"), "MARK")  # no marker: never committed
    assert [name for name, _ in store.list_committed(root, "MARK")] == ["d1"]
    assert store.list_names(root) == ["d1", "d2"]
    assert store.is_committed(join(root, "d1"), "MARK") and not store.is_committed(join(root, "d2"), "MARK")
    assert store.dir_files(join(root, "d1")) == {"MARK": 2, "w.bin": 10}
    # A replay overwrites the directory whole.
    store.commit_dir(build_with({"w.bin": b"z", "MARK": b"{}"}), join(root, "d1"), "MARK")
    assert store.read_file(join(root, "d1", "w.bin")) == b"z"


@pytest.mark.slow
def test_commit_dir_copies_from_another_directory(root, tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    (source / "model.safetensors").write_bytes(b"weights")
    (source / "optimizer.pt").write_bytes(b"not copied")
    dest = store.commit_dir(build_with({"version.json": b"{}"}), join(root, "v000001"), "version.json",
                            copy_from=(source, ["model.safetensors"]))
    assert store.dir_files(dest) == {"model.safetensors": 7, "version.json": 2}
    # And from the committed directory on to a second one (server-side on the same store).
    again = store.commit_dir(build_with({"version.json": b"{}"}), join(root, "v000002"), "version.json",
                             copy_from=(dest, ["model.safetensors"]))
    assert store.read_file(join(str(again), "model.safetensors")) == b"weights"
    assert store.sha256(join(str(again), "model.safetensors")) == store.sha256(source / "model.safetensors")


def test_commit_dir_moves_local_staging_files_in_without_copying_them(tmp_path):
    staging = tmp_path / ".step-000001.staging"
    (staging / "trainer").mkdir(parents=True)
    (staging / "trainer" / "__0_0.distcp").write_bytes(b"shard")
    inode = (staging / "trainer" / "__0_0.distcp").stat().st_ino
    dest = store.commit_dir(build_with({"state.json": b"{}"}), tmp_path / "step-000001", "state.json",
                            copy_from=(staging, ["trainer/__0_0.distcp"]), move=True)
    moved = Path(dest) / "trainer" / "__0_0.distcp"
    # Renamed, not written again: the same inode, and gone from staging.
    assert moved.read_bytes() == b"shard" and moved.stat().st_ino == inode
    assert not (staging / "trainer" / "__0_0.distcp").exists()


def test_remove_dir_uncommits_first(root):
    store.commit_dir(build_with({"w.bin": b"x", "MARK": b"{}"}), join(root, "d1"), "MARK")
    store.remove_dir(store.child(root, "d1"), marker="MARK")
    assert store.list_committed(root, "MARK") == [] and store.list_names(root) == []
    store.remove_dir(store.child(root, "missing"), marker="MARK")  # nothing there is fine


def test_local_copy_downloads_once_and_checks(s3_bucket, tmp_path):
    url = join(s3_bucket, "copy-src")
    store.commit_dir(build_with({"config.json": b"{}", "w.bin": b"abc"}), url, "config.json")
    dest = tmp_path / "cache" / "v1"
    with pytest.raises(TransientError):
        store.local_copy(url, dest, ["config.json", "w.bin"], complete="config.json",
                         check=lambda d: (_ for _ in ()).throw(TransientError("refused")))
    assert not dest.exists() and [p.name for p in dest.parent.iterdir()] == []  # nothing half-built is left
    assert store.local_copy(url, dest, ["config.json", "w.bin"], complete="config.json") == dest
    assert (dest / "w.bin").read_bytes() == b"abc"
    store.remove_dir(url, marker="config.json")
    assert store.local_copy(url, dest, ["config.json", "w.bin"], complete="config.json") == dest  # cached
    with pytest.raises(TransientError):  # gone from the store and not cached: a retryable error
        store.local_copy(url, tmp_path / "cache" / "v2", ["config.json"], complete="config.json")


def test_scratch_copy_checks_sizes(s3_bucket):
    url = join(s3_bucket, "scratch-src")
    store.commit_dir(build_with({"a": b"12345", "M": b""}), url, "M")
    with store.scratch_copy(url, ["a"], sizes={"a": 5}) as local:
        assert (local / "a").read_bytes() == b"12345"
    assert not local.exists()
    with pytest.raises(TransientError), store.scratch_copy(url, ["a"], sizes={"a": 4}):
        pass
