"""The run's ledger: the one reader and writer of what a run directory says has happened (DESIGN.md §5, §10).

  checkpoints/step-NNNNNN/   complete once state.json is there (train writes it last)
  policy/vNNNNNN/            complete once version.json is there (sync writes it last)
  policy/LATEST              the name of the current version; replaced atomically, only after it is complete
  batches/_filter/<inv>.json one manifest per finished filter invocation (hidden from shard readers)
  shard lineage              each output shard lists the inputs it consumed: commit of the output is commit
                             of consumption
  rollout resume             the (group, sample) units the committed rollout shards of one config hash hold
  trainer version            the newer of the version LATEST names and the newest complete checkpoint step

Nobody else spells `LATEST`, `step-%06d`, `v%06d`, `state.json`, `version.json` or `_filter`; every stage,
`status`, the supervisor and the loader ask this module. (The audit keeps its own reader on purpose: it is
the checker of this one; it still takes the names from here.) Locations come back as a Path when local
and a URL string when remote (arlctl/io/store.py).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from arlctl.errors import TerminalError
from arlctl.io import store
from arlctl.io.fs import basename, get_fs, join
from arlctl.schemas.values import MAX_POLICY_VERSION

LATEST = "LATEST"
STATE_FILE = "state.json"  # a checkpoint's marker
VERSION_FILE = "version.json"  # a policy version's marker
MANIFEST_DIR = "_filter"  # under the filter's output: one JSON per finished invocation
STEP_RE = re.compile(r"^step-(\d{6,})$")
VERSION_RE = re.compile(r"^v(\d{6,})$")

Location = store.Location
LineageOf = Callable[[str], Any]  # shard URL -> its Lineage (or None)


# ----------------------------------------------------------------------------------------------- names


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def version_dir_name(version: int) -> str:
    return f"v{version:06d}"


def parse_version(name: str | None) -> int | None:
    """The number of a `vNNNNNN` name; None for anything else."""
    match = VERSION_RE.match(name or "")
    return int(match.group(1)) if match else None


# ----------------------------------------------------------------------------------------------- checkpoints


def checkpoint_location(ckpt_dir: str | os.PathLike, step: int) -> str:
    """Where step `step` lives: a local path or a URL."""
    return str(store.child(ckpt_dir, step_dir_name(step)))


def list_checkpoints(ckpt_dir: str | os.PathLike) -> list[tuple[int, Location]]:
    """Complete checkpoints (a step-NNNNNN name holding state.json), oldest first."""
    return _numbered(store.list_committed(ckpt_dir, STATE_FILE), STEP_RE)


def checkpoint_dirs(ckpt_dir: str | os.PathLike) -> int:
    """How many step-NNNNNN names are visible, complete or still being uploaded (what `status` shows)."""
    return sum(1 for name in store.list_names(ckpt_dir) if STEP_RE.match(name))


def latest_checkpoint(ckpt_dir: str | os.PathLike) -> tuple[int, Location] | None:
    found = list_checkpoints(ckpt_dir)
    return found[-1] if found else None


def read_state(ckpt: Location) -> dict[str, Any]:
    """A checkpoint's state.json; a checkpoint without one is not complete (TerminalError)."""
    raw = store.read_file(store.child(ckpt, STATE_FILE))
    if raw is None:
        raise TerminalError(f"{ckpt} has no {STATE_FILE}: not a complete checkpoint")
    return json.loads(raw)


def state_saved_at(ckpt: Location) -> float | None:
    """When the checkpoint's state.json was written (its commit time), when the store says."""
    fs, path = get_fs(str(store.child(ckpt, STATE_FILE)))
    try:
        return float(fs.info(path).get("mtime") or 0) or None
    except Exception:  # a store without mtimes: unknown, never an error
        return None


def remove_checkpoint(ckpt: Location) -> None:
    store.remove_dir(ckpt, marker=STATE_FILE)


# ----------------------------------------------------------------------------------------------- policy versions


def list_versions(policy_dir: str | os.PathLike) -> list[tuple[int, Location]]:
    """Published versions (a vNNNNNN name holding version.json), oldest first."""
    return _numbered(store.list_committed(policy_dir, VERSION_FILE), VERSION_RE)


def version_dirs(policy_dir: str | os.PathLike) -> int:
    """How many vNNNNNN names are visible, complete or still being uploaded (what `status` shows)."""
    return sum(1 for name in store.list_names(policy_dir) if VERSION_RE.match(name))


def version_location(policy_dir: str | os.PathLike, name: str) -> str:
    return str(store.child(policy_dir, name))


def read_version_info(policy_dir: str | os.PathLike, name: str) -> dict[str, Any] | None:
    """version.json of a published version, or None when that version is not (completely) published."""
    raw = store.read_file(store.child(store.child(policy_dir, name), VERSION_FILE))
    return json.loads(raw) if raw is not None else None


def latest_url(policy_dir: str | os.PathLike) -> str:
    """The LATEST file of a policy directory (for messages and for its existence)."""
    return str(store.child(policy_dir, LATEST))


def read_latest_raw(policy_dir: str | os.PathLike) -> str | None:
    """The stripped text of POLICYDIR/LATEST, None when there is no such file (checked by the caller)."""
    raw = store.read_file(latest_url(policy_dir))
    return None if raw is None else raw.decode(errors="replace").strip()


def read_latest(policy_dir: str | os.PathLike) -> str | None:
    """The version directory name in POLICYDIR/LATEST, or None when nothing (well-formed) is published."""
    name = read_latest_raw(policy_dir)
    return name if parse_version(name) is not None else None


def latest_version(policy_dir: str | os.PathLike) -> int | None:
    """The version POLICYDIR/LATEST names, or None: one small read, no listing, no download."""
    return parse_version(read_latest_raw(policy_dir))


def write_latest(policy_dir: str | os.PathLike, name: str) -> None:
    """Point POLICYDIR/LATEST at version `name` (atomic replace; one PUT on an object store)."""
    store.write_file(latest_url(policy_dir), name + "\n")


def has_latest(directory: str | os.PathLike) -> bool:
    return store.read_file(latest_url(directory)) is not None


def remove_version(version: Location) -> None:
    store.remove_dir(version, marker=VERSION_FILE)


def _numbered(found: list[tuple[str, Location]], pattern: re.Pattern[str]) -> list[tuple[int, Location]]:
    return sorted((int(m.group(1)), loc) for name, loc in found if (m := pattern.match(name)))


# ----------------------------------------------------------------------------------------------- consumption


def consumed_inputs(out_url: str, same_name: bool = False, lineage_of: LineageOf | None = None,
                    shards: list[str] | None = None) -> set[str]:
    """Names (basenames) of every input shard recorded in the lineage of shards under out_url.

    same_name: the 1:1 rule (reward): a shard vouches only for the input of its own name, so a planted
    `other.parquet` that lists `part-1.parquet` marks nothing consumed. Unreadable lineage counts for
    nothing; its shard's readers report it. lineage_of: a cached footer reader (status); default reads.
    shards: a listing of out_url already taken (status counts the shards it derives consumption from).
    """
    return set(consuming_lineage(out_url, same_name, lineage_of, shards))


def consuming_lineage(out_url: str, same_name: bool = False, lineage_of: LineageOf | None = None,
                      shards: list[str] | None = None) -> dict[str, Any]:
    """{input basename: the lineage of the output shard that consumed it} (consumed_inputs' rule), so a stage
    can tell an input consumed under its own settings from one consumed under others."""
    from arlctl.io.shards import scan

    consumed: dict[str, Any] = {}
    for shard in scan(out_url).shards if shards is None else shards:
        lineage = _lineage(shard, lineage_of)
        if lineage is None or not isinstance(lineage.inputs, list):
            continue
        names = {basename(i) for i in lineage.inputs if isinstance(i, str)}
        for name in sorted(names & {basename(shard)} if same_name else names):
            consumed.setdefault(name, lineage)
    return consumed


def _lineage(shard: str, lineage_of: LineageOf | None) -> Any:
    from arlctl.errors import CorruptShardError
    from arlctl.io.shards import read_lineage

    try:
        return (lineage_of or read_lineage)(shard)
    except (CorruptShardError, ValueError, TypeError):
        return None


def manifest_url(batches_url: str, invocation: str) -> str:
    return join(batches_url, MANIFEST_DIR, f"{invocation}.json")


def write_filter_manifest(batches_url: str, invocation: str, manifest: dict[str, Any]) -> None:
    """Commit a finished filter invocation: its manifest names the inputs it consumed (written last)."""
    store.write_file(manifest_url(batches_url, invocation), json.dumps(manifest, indent=1, sort_keys=True))


def read_filter_manifests(batches_url: str) -> list[tuple[str, dict[str, Any] | Exception]]:
    """(file name, parsed manifest or the error that stopped its parse) for every `_filter/*.json`."""
    directory = join(batches_url, MANIFEST_DIR)
    names = sorted(n for n in store.dir_files(directory) if n.endswith(".json"))
    found: list[tuple[str, dict[str, Any] | Exception]] = []
    for name in names:
        raw = store.read_file(join(directory, name))
        if raw is None:
            continue
        try:
            found.append((name, json.loads(raw)))
        except (ValueError, RecursionError) as err:
            found.append((name, err))
    return found


@dataclass
class FilterLedger:
    """What a filter output directory says was consumed, and which invocations were interrupted."""

    consumed: set[str] = field(default_factory=set)  # input basenames named by a manifest or a trusted batch
    finished: set[str] = field(default_factory=set)  # invocations with a manifest
    unfinished: dict[str, dict[str, Any]] = field(default_factory=dict)  # invocation -> checked record + written
    untrusted: list[str] = field(default_factory=list)  # "name: why" for records that count for nothing
    finished_inputs: set[str] = field(default_factory=set)  # inputs of the finished invocations
    foreign_inputs: set[str] = field(default_factory=set)  # inputs named by batches filter did not write
    shards: list[str] = field(default_factory=list)  # the batch listing these sets were read from (after the manifests)

    def drained(self) -> set[str]:
        """Inputs whose rows are all in visible batches: a finished invocation's, or an interrupted one's whose
        every part is there. An invocation writes its batches one by one, each naming every input; counting
        the inputs at its first batch would hide the rows of the batches still to come (status's backlog).
        A batch written by something else (no invocation) holds its inputs' rows too: they count here, though
        filter does not take them as consumed."""
        whole = (r["inputs"] for r in self.unfinished.values() if len(r["written"]) >= r["parts"])
        return self.finished_inputs.union(self.foreign_inputs, *whole)


def check_filter_lineage(lineage: Any) -> dict[str, Any] | str:
    """The checked record of a filter batch's lineage, or why it is not trusted (stages/filter.py's docstring:
    lineage is data; it counts only when its hashes recompute and its inputs are plain shard names)."""
    from arlctl.io.shards import config_hash, is_shard_name

    if lineage is None or lineage.stage != "filter":
        return "not written by filter"
    extra = lineage.extra if isinstance(lineage.extra, dict) else {}
    config, version, part, parts = (extra.get(k) for k in ("config", "current_version", "part", "parts"))
    inputs = lineage.inputs
    if not (isinstance(inputs, list) and all(isinstance(i, str) and is_shard_name(basename(i)) for i in inputs)):
        return "its inputs are not a list of shard names"
    if not (isinstance(config, dict) and _is_int(version) and 0 <= version <= MAX_POLICY_VERSION
            and _is_int(part) and _is_int(parts) and 0 <= part < parts):
        return "its invocation record is malformed"
    if lineage.config_hash != config_hash(config):
        return "its config hash does not match its recorded config"
    names = sorted(basename(i) for i in inputs)
    if extra.get("invocation") != config_hash({"inputs": names, "cfg": config, "version": version}):
        return "its invocation id does not match its inputs, config and version"
    return {"invocation": extra["invocation"], "inputs": names, "config_hash": lineage.config_hash,
            "current_version": version, "parts": parts, "part": part}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_filter_ledger(batches_url: str, lineage_of: LineageOf | None = None) -> FilterLedger:
    """Filter's consumption rule, for filter itself and for status: an input is consumed once a finished
    invocation's manifest names it or a trusted batch does (the interrupted invocation is then finished, not
    re-read). A malformed manifest, unreadable lineage or lineage that does not check counts for nothing and
    is named under `untrusted`; a shard not written by filter records nothing. lineage_of: a cached footer
    reader (status); by default each footer is read, a corrupt one raising CorruptShardError, caught here."""
    from arlctl.errors import CorruptShardError
    from arlctl.io.shards import read_lineage, scan

    found = FilterLedger()
    for name, manifest in read_filter_manifests(batches_url):
        try:
            if isinstance(manifest, Exception):
                raise manifest
            inputs, invocation = manifest["inputs"], manifest["invocation"]
            if not (isinstance(invocation, str) and isinstance(inputs, list) and all(isinstance(i, str) for i in inputs)):
                raise TypeError("inputs or invocation of the wrong type")
        except (ValueError, KeyError, TypeError, RecursionError) as err:
            found.untrusted.append(f"{MANIFEST_DIR}/{name}: malformed manifest ({type(err).__name__})")
            continue
        found.finished_inputs.update(basename(i) for i in inputs)
        found.finished.add(invocation)
    found.consumed.update(found.finished_inputs)
    found.shards = scan(batches_url).shards
    for shard in found.shards:
        try:
            lineage = (lineage_of or read_lineage)(shard)
        except CorruptShardError as err:
            found.untrusted.append(f"{basename(shard)}: {err.reason}")
            continue
        if lineage is None:
            continue
        if lineage.stage != "filter" and "invocation" not in (lineage.extra or {}):
            if isinstance(lineage.inputs, list):  # not a filter batch: it records nothing filter consumed
                found.foreign_inputs.update(basename(i) for i in lineage.inputs if isinstance(i, str))
            continue
        record = check_filter_lineage(lineage)
        if isinstance(record, str):
            found.untrusted.append(f"{basename(shard)}: {record}")
            continue
        found.consumed.update(record["inputs"])
        if record["invocation"] not in found.finished:
            started = found.unfinished.setdefault(record["invocation"], {**record, "written": {}})
            started["written"][record["part"]] = basename(shard)
    return found


def filter_consumed(batches_url: str, lineage_of: LineageOf | None = None) -> set[str]:
    """Inputs whose rows filter has put into batches: `read_filter_ledger(...).drained()`."""
    return read_filter_ledger(batches_url, lineage_of).drained()


@dataclass
class WrittenSamples:
    """What earlier rollout invocations with one configuration committed to a directory (for resume)."""

    samples: dict[str, set[int]] = field(default_factory=dict)  # group_id -> sample indices written (not aborted)
    shards: int = 0  # committed shards of that configuration
    other_configs: dict[str, int] = field(default_factory=dict)  # another config hash -> its shards
    unreadable: list[str] = field(default_factory=list)  # shards whose footer or rows could not be read

    @property
    def count(self) -> int:
        return sum(len(indices) for indices in self.samples.values())


def written_samples(out_url: str, config_hash: str) -> WrittenSamples:
    """The (group, sample) units committed under out_url by rollouts of `config_hash` (rollout resume).

    A unit is written when a committed shard of stage rollout with that hash holds a row for it whose status
    is not `aborted` (per-turn rows share their trajectory's status). Shards of another hash are counted,
    not read; an unreadable shard counts for nothing (no stage can read its rows either) and is named.
    """
    from arlctl.errors import CorruptShardError
    from arlctl.io.shards import read_lineage, read_shard, scan

    found = WrittenSamples()
    for shard in scan(out_url).shards:
        try:
            lineage = read_lineage(shard)
            if lineage is None or lineage.stage != "rollout":
                continue
            if lineage.config_hash != config_hash:
                found.other_configs[lineage.config_hash] = found.other_configs.get(lineage.config_hash, 0) + 1
                continue
            table = read_shard(shard, columns=["group_id", "sample_index", "status"], bad_values="keep")
        except (CorruptShardError, FileNotFoundError) as err:
            found.unreadable.append(f"{basename(shard)}: {getattr(err, 'reason', err)}")
            continue
        found.shards += 1
        for group_id, index, status in zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True):
            if status != "aborted":
                found.samples.setdefault(group_id, set()).add(index)
    return found


def trainer_version(policy_dir: str | os.PathLike | None, ckpt_dir: str | os.PathLike | None) -> int:
    """The version the trainer is at: the newer of what policy/LATEST names and the newest complete checkpoint
    step, 0 before either (a directory given as None is not looked at). Filter's staleness, status's waiting
    lag and the rollout daemon's projected lag all start from this number.

    A number past MAX_POLICY_VERSION is a TerminalError naming where it was read: sync and train never write
    one (a run would need a billion optimizer steps), so something else did, and every lag measured from it
    would be wrong."""
    found = []
    if policy_dir is not None and (published := latest_version(policy_dir)) is not None:
        found.append((published, latest_url(policy_dir)))
    if ckpt_dir is not None and (newest := latest_checkpoint(ckpt_dir)) is not None:
        found.append((newest[0], str(newest[1])))
    for version, where in found:
        if version > MAX_POLICY_VERSION:
            raise TerminalError(f"{where} names policy version {version}, beyond any real run (> 10^9)",
                                hint="LATEST and checkpoint names are written by sync and train; check who wrote this")
    return max((version for version, _ in found), default=0)


def trained_batches(ckpt_dir: str | os.PathLike) -> list[str]:
    """Batch names the newest complete checkpoint has consumed (every one since step 0)."""
    latest = latest_checkpoint(ckpt_dir)
    return list(read_state(latest[1]).get("consumed_batches", [])) if latest else []


__all__ = [
    "LATEST", "MANIFEST_DIR", "STATE_FILE", "STEP_RE", "VERSION_FILE", "VERSION_RE", "checkpoint_dirs",
    "checkpoint_location",
    "FilterLedger", "check_filter_lineage", "consumed_inputs", "consuming_lineage", "filter_consumed", "has_latest", "latest_checkpoint",
    "latest_url", "latest_version", "list_checkpoints", "list_versions", "manifest_url", "parse_version",
    "read_filter_manifests", "read_latest", "read_latest_raw", "read_state", "read_version_info",
    "remove_checkpoint", "remove_version", "state_saved_at", "step_dir_name", "trained_batches", "trainer_version",
    "version_dir_name",
    "version_dirs", "version_location", "write_filter_manifest", "write_latest", "WrittenSamples", "written_samples",
]
