"""The exactly-once audit of a run directory: was every trajectory trained once or dropped by a named rule?

`audit_run(RUN)` reads only what the stages committed (local path or any fsspec URL) and checks:

  files      every visible shard in rollouts/, rewarded/, batches/ reads and validates (schema, version);
             no visible name in them is anything but a committed *.parquet (temp files are dot-names);
             checkpoints/ and policy/ hold only complete step-NNNNNN/ and vNNNNNN/ directories (+ LATEST)
  lineage    every trajectory id appears in exactly one rollout shard; rewarded/ holds the same ids
  units      every (group, sample index) -- a group is one task in one epoch -- has at most one trajectory
             that is not `aborted`, across every rollout shard (a resumed rollout completes only what was
             not written); a group's rows all name one task
  once       every rollout trajectory is in exactly one batch that the newest checkpoint consumed, or is
             recorded as dropped by a named filter rule in a *finished* filter invocation's audit
             (RUN/metrics/filter-<invocation>.parquet with a manifest in batches/_filter/), never both;
             no id appears twice across batches; the trainer's step == the number of consumed batches
  versions   published policy versions only increase (the observed LATEST history, when given, and the
             version.json creation times); LATEST names the newest version; within a trajectory the turn
             versions never go down; no version a row ran exceeds the trainer step by the row's end (the
             step's train metrics were written before the row finished)

With `drained=False`, trajectories not yet consumed (waiting in a stage, or in a batch not yet trained)
are counted as in flight instead of reported. `problems` lists every violation in one line each; an
empty list is a clean audit. The staleness distribution (trainer step at start − policy version) comes
along for reports (benchmarks/soak.py).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow.parquet as pq

from arlctl.errors import CorruptShardError
from arlctl.io.fs import basename, get_fs, is_local, join
from arlctl.io.ledger import LATEST, MANIFEST_DIR, STATE_FILE, VERSION_FILE
from arlctl.io.run import RunLayout
from arlctl.io.shards import read_shard, scan
from arlctl.render import one_line

# The audit reads checkpoints/, policy/ and the filter manifests itself instead of through arlctl/io/ledger.py
# on purpose: it is the checker of the ledger, so a bug there must not hide from it. Only the names are shared.
NAMED_RULES = ("invalid_values", "completeness", "untrusted", "group_integrity", "zero_variance", "duplicate", "staleness", "where")


@dataclass
class AuditReport:
    run: str
    drained: bool
    shards: dict[str, int] = field(default_factory=dict)  # visible shards per directory
    trajectories: int = 0  # rollout trajectory ids
    units: int = 0  # (group, sample index) pairs with a trajectory that is not aborted
    aborted: int = 0  # rollout trajectories ended aborted (their units may be completed by a re-run)
    trained: int = 0  # ids in consumed batches
    dropped: dict[str, int] = field(default_factory=dict)  # ids dropped, by rule
    in_flight: int = 0  # ids neither trained nor dropped (only allowed when not drained)
    trainer_step: int = 0
    consumed_batches: int = 0
    batches: int = 0
    policy_versions: list[int] = field(default_factory=list)  # published versions present, ascending
    latest: int | None = None
    staleness: dict[int, int] = field(default_factory=dict)  # lag at start -> rows
    hidden_leftovers: int = 0  # dot-named temp files (invisible to readers; a killed writer's debris)
    uncommitted_dirs: int = 0  # object stores: a checkpoint/version upload killed before its marker
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def audit_run(run: str, drained: bool = True, latest_history: list[int] | None = None,
              max_problems: int = 50) -> AuditReport:
    """Audit `run` (see the module docstring). `latest_history`: LATEST versions in observed order."""
    rd = RunLayout(run)
    report = AuditReport(run=run, drained=drained)
    get_fs(run)[0].invalidate_cache()  # s3fs caches listings per process: see what others wrote since
    problems = report.problems

    # 1. Files: every visible shard reads and validates; nothing visible is a temp or stray name.
    tables: dict[str, dict[str, Any]] = {}
    for kind in ("rollouts", "rewarded", "batches"):
        tables[kind] = {}
        listing = scan(rd.path(kind))
        report.shards[kind] = len(listing.shards)
        for stray in listing.strays:
            problems.append(f"{kind}: visible non-shard file {one_line(basename(stray))}")
        report.hidden_leftovers += _hidden_files(rd.path(kind))
        for url in listing.shards:
            try:
                # A bad value in a rollout is filter's to drop (invalid_values); in a batch it is a problem.
                tables[kind][basename(url)] = read_shard(url, columns=_COLUMNS[kind],
                                                         bad_values="raise" if kind == "batches" else "keep")
            except CorruptShardError as err:
                problems.append(f"{kind}: {err}")
    _check_dirs(rd, report)

    # 2. Lineage: one rollout shard per trajectory id; rewarded holds the same ids (1:1 by name).
    rollout_ids: dict[str, str] = {}
    rows: list[dict[str, Any]] = []
    for name, table in tables["rollouts"].items():
        for row in table.to_pylist():
            tid = row["trajectory_id"]
            if tid in rollout_ids:
                problems.append(f"trajectory {tid} in two rollout shards ({rollout_ids[tid]}, {name})")
            rollout_ids[tid] = name
            rows.append(row)
    report.trajectories = len(rollout_ids)
    _check_units(rows, report)
    for name, table in tables["rewarded"].items():
        if name not in tables["rollouts"]:
            problems.append(f"rewarded/{name} has no rollout shard of the same name")
            continue
        if set(table.column("trajectory_id").to_pylist()) != set(tables["rollouts"][name].column("trajectory_id").to_pylist()):
            problems.append(f"rewarded/{name} does not hold exactly the ids of rollouts/{name}")

    # 3. Once: consumed batches, the filter's audit of drops, and nothing twice.
    trainer = _trainer_state(rd.checkpoints)
    consumed = list(trainer.get("consumed_batches", []))
    report.trainer_step, report.consumed_batches = int(trainer.get("step", 0)), len(consumed)
    report.batches = len(tables["batches"])
    if report.trainer_step != len(consumed):
        problems.append(f"trainer step {report.trainer_step} != {len(consumed)} consumed batches")
    if len(set(consumed)) != len(consumed):
        problems.append("a batch is listed twice in consumed_batches")
    batch_of: dict[str, str] = {}
    for name, table in tables["batches"].items():
        for tid in table.column("trajectory_id").to_pylist():
            if tid in batch_of:
                problems.append(f"trajectory {tid} in two batches ({batch_of[tid]}, {name})")
            batch_of[tid] = name
    for name in consumed:
        if name not in tables["batches"]:
            problems.append(f"consumed batch {name} is missing from batches/")
    consumed_set = set(consumed)
    trained = {tid for tid, name in batch_of.items() if name in consumed_set}
    dropped = _filter_drops(rd, problems)
    report.trained = len(trained)
    report.dropped = dict(Counter(dropped.values()))
    for tid in batch_of.keys() - rollout_ids.keys():
        problems.append(f"batch trajectory {tid} has no rollout")
    for tid in rollout_ids:
        if tid in trained and tid in dropped:
            problems.append(f"trajectory {tid} was trained and also dropped by {dropped[tid]}")
        elif tid not in trained and tid not in dropped:
            report.in_flight += 1
    if drained and report.in_flight:
        missing = [t for t in rollout_ids if t not in trained and t not in dropped]
        problems.append(f"{len(missing)} trajectories neither trained nor dropped by a named rule "
                        f"(e.g. {missing[0]} in {rollout_ids[missing[0]]}, batch {batch_of.get(missing[0])})")
    if drained and len(consumed_set) != len(tables["batches"]):
        problems.append(f"{len(tables['batches']) - len(consumed_set & tables['batches'].keys())} batches not trained")

    # 4. Versions: published versions increase; rows never ran a version newer than the trainer.
    _check_versions(rd, report, latest_history or [])
    step_times = _step_times(rd.metrics)
    for row in rows:
        versions = [t["policy_version"] for t in row["turns"] or [] if t.get("policy_version") is not None]
        if versions != sorted(versions):
            problems.append(f"trajectory {row['trajectory_id']}: turn policy versions go down {versions}")
        first, last = row["policy_version"], row["policy_version_last"]
        started = row["started_at"].timestamp() if row["started_at"] is not None else None
        finished = row["finished_at"].timestamp() if row["finished_at"] is not None else None
        # A row's versions are those of its turns; the first turn may come after started_at (the row waits
        # for the policy, and a reload may land at that first turn boundary), so each version is checked
        # against the row's end: the policy it ran must have been trained before the row finished.
        for version in sorted({v for v in (*versions, first, last) if v}):
            if finished is not None and (version not in step_times or step_times[version] > finished):
                problems.append(f"trajectory {row['trajectory_id']}: policy version {version} "
                                f"exceeds the trainer step at finished_at")
        if started is not None and first is not None:
            lag = sum(1 for t in step_times.values() if t <= started) - int(first)
            report.staleness[lag] = report.staleness.get(lag, 0) + 1
    report.staleness = dict(sorted(report.staleness.items()))
    if len(problems) > max_problems:
        report.problems = problems[:max_problems] + [f"... and {len(problems) - max_problems} more"]
    return report


_COLUMNS = {
    "rollouts": ["trajectory_id", "group_id", "sample_index", "task_id", "status", "policy_version",
                 "policy_version_last", "turns", "started_at", "finished_at"],
    "rewarded": ["trajectory_id", "reward"],
    "batches": ["trajectory_id", "advantage", "weight"],
}


def _check_units(rows: list[dict[str, Any]], report: AuditReport) -> None:
    """Exactly once per unit: one non-aborted trajectory per (group, sample index); one task per group."""
    unit_owner: dict[tuple[str, int], str] = {}
    group_task: dict[str, str] = {}
    aborted: set[str] = set()
    for row in rows:
        gid, tid = row["group_id"], row["trajectory_id"]
        task = group_task.setdefault(gid, row["task_id"])
        if task != row["task_id"]:
            report.problems.append(one_line(f"group {gid} holds two tasks ({task!r}, {row['task_id']!r})"))
        if row["status"] == "aborted":
            aborted.add(tid)
            continue
        owner = unit_owner.setdefault((gid, row["sample_index"]), tid)
        if owner != tid:  # per-turn rows of one trajectory share the unit; another trajectory does not
            report.problems.append(one_line(f"group {gid} sample {row['sample_index']} (task {row['task_id']!r}) "
                                            f"was rolled out twice: trajectories {owner} and {tid}"))
    report.units, report.aborted = len(unit_owner), len(aborted)


def _hidden_files(url: str) -> int:
    fs, path = get_fs(url)
    fs.invalidate_cache(path)
    try:
        entries = fs.ls(path, detail=True)
    except FileNotFoundError:
        return 0
    return sum(1 for e in entries if basename(e["name"]).startswith(".") and e["type"] == "file")


def _check_dirs(rd: RunLayout, report: AuditReport) -> None:
    """checkpoints/ holds only complete step dirs; policy/ only complete version dirs and LATEST."""
    for kind, prefix, marker, extra in (("checkpoints", "step-", STATE_FILE, ()),
                                        ("policy", "v", VERSION_FILE, (LATEST,))):
        fs, entries = _ls(rd.path(kind))
        for entry in entries:
            name = basename(entry)
            if name.startswith((".", "_")) or name in extra:
                continue
            if not (name.startswith(prefix) and name[len(prefix):].isdigit()):
                report.problems.append(f"{kind}: visible stray entry {name}")
            elif not fs.exists(f"{entry.rstrip('/')}/{marker}"):
                if is_local(fs):  # local directories are renamed into place whole
                    report.problems.append(f"{kind}/{name} has no {marker}: a partial directory under its final name")
                else:  # object stores commit a directory by its marker, written last; readers skip the rest
                    report.uncommitted_dirs += 1


def _ls(url: str) -> tuple[Any, list[str]]:
    """(fs, entries) of a directory; [] when absent. Fresh listings: other processes write while we read,
    and on object stores a prefix whose last object was deleted (a released lease) may still look present."""
    fs, path = get_fs(url)
    fs.invalidate_cache(path)
    try:
        return fs, fs.ls(path, detail=False)
    except FileNotFoundError:
        return fs, []


def _trainer_state(ckpt_url: str) -> dict[str, Any]:
    fs, entries = _ls(ckpt_url)
    steps = sorted((int(basename(e)[5:]), e) for e in entries
                   if basename(e).startswith("step-") and basename(e)[5:].isdigit())
    for _, entry in reversed(steps):
        try:
            return json.loads(fs.cat_file(f"{entry.rstrip('/')}/{STATE_FILE}"))
        except FileNotFoundError:
            continue
    return {"step": 0, "consumed_batches": []}


def _filter_drops(rd: RunLayout, problems: list[str]) -> dict[str, str]:
    """{trajectory id: rule} from the audits of finished filter invocations (those with a manifest)."""
    _, entries = _ls(join(rd.batches, MANIFEST_DIR))
    finished = {basename(e)[: -len(".json")] for e in entries if e.endswith(".json")}
    drops: dict[str, str] = {}
    for url in scan(rd.metrics).shards:
        name = basename(url)
        if not name.startswith("filter-") or name[len("filter-"):-len(".parquet")] not in finished:
            continue  # an audit whose invocation never finished is replayed under the same name, or redone
        mfs, mpath = get_fs(url)
        try:
            with mfs.open(mpath, "rb") as fh:
                table = pq.read_table(fh, columns=["trajectory_id", "rule"])
        except Exception as err:
            problems.append(f"metrics/{name}: unreadable filter audit ({err})")
            continue
        for tid, rule in zip(table.column("trajectory_id").to_pylist(), table.column("rule").to_pylist()):
            if rule == "kept":
                continue
            if rule not in NAMED_RULES:
                problems.append(f"trajectory {tid} dropped by an unnamed rule {rule!r}")
            if tid in drops:
                problems.append(f"trajectory {tid} dropped twice ({drops[tid]}, {rule})")
            drops[tid] = rule
    return drops


def _check_versions(rd: RunLayout, report: AuditReport, history: list[int]) -> None:
    if any(b < a for a, b in zip(history, history[1:])):
        report.problems.append(f"policy/LATEST went backwards: {history}")
    fs, entries = _ls(rd.policy)
    path = get_fs(rd.policy)[1]
    created = []
    for entry in entries:
        name = basename(entry)
        if name.startswith("v") and name[1:].isdigit():
            try:
                info = json.loads(fs.cat_file(f"{entry.rstrip('/')}/{VERSION_FILE}"))
            except FileNotFoundError:
                continue
            created.append((int(name[1:]), float(info.get("created_at") or 0)))
    created.sort()
    report.policy_versions = [v for v, _ in created]
    if any(b[1] < a[1] for a, b in zip(created, created[1:])):
        report.problems.append(f"a newer policy version was published before an older one: {created}")
    try:
        latest = fs.cat_file(f"{path.rstrip('/')}/{LATEST}").decode().strip()
        report.latest = int(latest[1:])
    except (FileNotFoundError, ValueError):
        return
    if created and report.latest != created[-1][0]:
        report.problems.append(f"LATEST names v{report.latest}, not the newest published v{created[-1][0]}")


def _step_times(metrics_url: str) -> dict[int, float]:
    """{step: time its train metrics row was written}: before its checkpoint, so before its publication."""
    times: dict[int, float] = {}
    for url in scan(metrics_url).shards:
        name = basename(url)
        if name.startswith("train-step-"):
            fs, path = get_fs(url)
            try:
                with fs.open(path, "rb") as fh:
                    row = pq.read_table(fh, columns=["step", "time"]).to_pylist()[0]
                times[int(row["step"])] = float(row["time"])
            except Exception:
                continue
    return times


__all__ = ["AuditReport", "NAMED_RULES", "audit_run"]
