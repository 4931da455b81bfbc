"""The filter stage: rewarded trajectories -> batch shards, one optimizer step each (DESIGN.md §5, §9, §10).

Rules run in this order; each reports how many rows it dropped, and every dropped trajectory id is
recorded with its rule name so an audit can account for every trajectory:

  0. invalid_values   a value no stage may trust (schemas/values.py): token ids out of range (of
                      --vocab-size when given), a mask outside {0, 1}, lists of unequal length, turn
                      offsets outside the row, absurd policy versions, non-finite or positive behaviour
                      log-probs, non-finite rewards / advantages / weights; with --dedupe-threshold
                      also a turn whose tool_calls is not a JSON list of objects; with --adv turn /
                      turn-mean also unusable step rewards (a non-finite reward_step, a reward_info
                      step_rewards that is not a list of finite numbers or nulls, one per turn)
  0b. truncated       with --truncated drop, rows of status truncated (a reply cut by a token budget or the
                      context: finish_reason "length", or "max_tokens" in older rows); with --truncated keep
                      (the default) they pass this rule and completeness as ok rows do
  1. completeness     status not in --keep-status (default: ok), or no reward yet (in the turn modes also a
                      step the judge could not grade: its reward_info step_rewards entry is null)
  1b. untrusted      rows whose reward_info says trusted: false (the verdict was computed where the
                      policy's code could reach it: the swe grader's in-process mode; also any part of a
                      weighted sum that says so), and rows whose reward_info is not JSON at all (fail
                      closed); --keep-untrusted keeps them. A reward without a `trusted` key (math,
                      judges, ...) is not touched by this rule
  2. group_integrity  groups whose sample indices are not 0..n-1 in the input, or with fewer than
                      --min-group-size rows left after completeness (no baseline): whole groups only. An
                      aborted member whose index a resumed rollout wrote again is replaced, not a gap
  3. zero_variance    groups whose rewards are all equal (no learning signal; in the turn modes: whose
                      returns are equal at every turn index); a seeded --keep-uniform fraction is kept.
                      Not applied with --adv gae or distill: a critic's values or a teacher's log-probs
                      give such a group's tokens advantages of their own
  4. duplicate        a repeated trajectory_id, or an action sequence whose tool-call n-gram Jaccard
                      similarity to an earlier row of its group is >= --dedupe-threshold
  5. staleness        lag = current policy version - row policy_version > --max-lag; kept rows get
                      weight exp(-decay * lag)
  6. where            rows for which the DuckDB predicate --where is not true (evaluated over the rows
                      only: the connection has no file access, so not even --where can read or write files)
  7. balance          per batch, rows with advantage > 0 are down-weighted so that their share of the
                      total weight is at most --max-pos-frac (nothing is dropped; the count is rows touched)

A row-level rule (4-6) that leaves a group with fewer than --min-group-size trajectories drops the rest
of that group too, counted under the same rule: groups stay whole.

Per-turn rows (`rollout --history per-turn`, arlctl/turn_rows.py): every rule keeps or drops a
trajectory's rows together (a rule that condemns one row condemns its siblings, under the same rule); a
trajectory whose rows are incomplete (turn indices not 0..n-1, or not exactly its last row final) is
dropped whole under completeness; group sizes count distinct trajectories; the duplicate rule keys on
(trajectory_id, first turn index), so siblings are not duplicates but a repeated row still is; n-gram
dedupe and staleness look at the trajectory's rows together; advantages and weights are computed from
one reward per trajectory and written on each of its rows, and a batch never splits a trajectory.

Survivors are packed, whole groups in input order, into batches of --batch-groups groups with their
advantages (--adv) and weights filled in. The last batch of an invocation may be smaller; --min-groups
makes filter wait (consume nothing) until at least that many groups survive.

Turn-level credit (--adv turn | turn-mean, --gamma G; arlctl/rl/advantages.py): each turn's step reward is
turns[].reward_step (the env's), else reward_info["step_rewards"][turn index] (a judge's), else 0; the
returns R_t = r_t + G * R_{t+1}, R_last = r_last + reward, are compared per turn index within the group,
and each turn's advantage is written to turns[].advantage (schema v2), which train gives to that turn's
sampled tokens. The `advantage` column keeps its outcome meaning: the group (turn) or group-mean
(turn-mean) advantage of the reward, exactly what --adv group / group-mean would write, so a reader that
ignores turns[].advantage trains on outcomes only; the balance rule reads it too.

Train-side estimators (--adv gae | distill): the `advantage` column holds the group advantage of the reward
(the task signal; a placeholder under gae), and train, which reads the batch's filter configuration from its
lineage, replaces it by GAE over its critic's values or adds the teacher's per-token advantage (stages/train.py).

Exactly-once: a batch's lineage lists the input shards of its invocation and carries an invocation id
and the number of parts. Inputs named in a batch's lineage are consumed. If a crash left an
invocation with fewer parts than it announced, the next run with the same configuration recomputes it
and writes only the groups that are not yet in a batch.

Lineage is data, never code (see arlctl/io/ledger.py `check_filter_lineage`). Nothing read from a shard is executed: an
interrupted invocation is resumed only when its recorded config hash equals the hash of the running
invocation's own configuration, and then with that own configuration (the recorded `--where` text is
never run). A batch's lineage marks inputs consumed only when its hashes recompute (config hash of its
recorded config; invocation id of its inputs, config and version) and its inputs are plain shard names,
resolved inside --in. This is an integrity check, not authentication: whoever can write the run
directory can forge consistent lineage (or a `_filter/` manifest) that marks an input consumed, and can
plant batches that train reads. What such a writer cannot do through filter is run SQL or code, read
files outside --in, or make an inconsistent record count.
"""

from __future__ import annotations

import json
import math
import threading
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from arlctl.errors import CorruptShardError, UsageError
from arlctl.io import ledger as run_ledger
from arlctl.io.fs import basename, join
from arlctl.io.shards import (
    Lineage,
    config_hash,
    quarantine,
    read_shard,
    scan,
    shard_name,
    write_shard,
    write_table_atomic,
)
from arlctl.rl.advantages import (
    TRAIN_SIDE_MODES,
    TURN_MODES,
    compute_advantages,
    group_ids_to_index,
)
from arlctl.schemas.values import BadValue, bad_rows, find_bad_values
from arlctl.stages.configs import FilterConfig
from arlctl.stages.jobs import FilterOptions, StageLoop, loop_of
from arlctl.stages.results import FilterIO, FilterResult
from arlctl.stages.turn_credit import (
    trajectory_returns,
    turn_step_rewards,
    uniform_per_turn,
    with_turn_credit,
)
from arlctl.turn_rows import CONTINUED, first_turn_indices

RULES = ("invalid_values", "truncated", "completeness", "untrusted", "group_integrity", "zero_variance", "duplicate", "staleness", "where", "balance")


@dataclass
class RuleResult:
    keep: np.ndarray  # [N] bool over the input rows
    weight: np.ndarray  # [N] float staleness weight
    drops: list[tuple[int, str]]  # (row index, rule)
    counts: dict[str, int]
    invalid: list[BadValue] = field(default_factory=list)  # why each invalid_values row was dropped


# ----------------------------------------------------------------------------------------------- rules


def _group_rows(group_ids: list[str], rows: np.ndarray) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for i in rows:
        groups.setdefault(group_ids[i], []).append(int(i))
    return groups


def _stable_fraction(text: str, seed: int) -> float:
    """A deterministic pseudo-random number in [0, 1) per id: reruns make the same choices."""
    return zlib.crc32(f"{seed}:{text}".encode()) / 2**32


def _action_ngrams(turns: list[dict[str, Any]], n: int) -> set[tuple[str, ...]] | None:
    """The row's tool-call n-grams; None when a turn's tool_calls is not a JSON list of objects."""
    actions: list[str] = []
    for turn in turns:
        try:
            calls = json.loads(turn["tool_calls"] or "[]")
            if not (isinstance(calls, list) and all(isinstance(c, dict) for c in calls)):
                return None
            actions += [json.dumps([c.get("name"), c.get("arguments")], sort_keys=True) for c in calls]
        except (ValueError, RecursionError):
            return None
    k = min(n, len(actions))
    return {tuple(actions[i : i + k]) for i in range(len(actions) - k + 1)} if k else set()


def jaccard(a: set, b: set) -> float:
    """|a & b| / |a | b|; two empty sets are not similar (0.0): no actions is no evidence of a copy."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def _trajectory_members(table: pa.Table) -> tuple[list[list[int]], list[int]]:
    """(members, first turn index) per row: the rows of its per-turn trajectory (arlctl/turn_rows.py), or
    just itself for a whole-trajectory row; a repeated whole row is its own member (rule 4 handles it)."""
    ids = table.column("trajectory_id").to_pylist()
    first = first_turn_indices(table)
    turn_row = [r == CONTINUED or i > 0 for r, i in zip(table.column("finish_reason").to_pylist(), first, strict=True)]
    by_id: dict[str, list[int]] = {}
    for i in range(table.num_rows):
        if turn_row[i]:
            by_id.setdefault(ids[i], []).append(i)
    return [by_id[ids[i]] if turn_row[i] else [i] for i in range(table.num_rows)], first


def _is_turn_row(i: int, members: list[list[int]], first: list[int], reasons: list[str]) -> bool:
    return len(members[i]) > 1 or reasons[i] == CONTINUED or first[i] > 0


def _incomplete(rows: list[int], first: list[int], reasons: list[str]) -> bool:
    """A per-turn trajectory is complete iff its distinct turn indices are 0..n-1 and only the last is final
    (a repeated row is rule 4's, not a gap)."""
    indices = sorted({first[i] for i in rows})
    finals = {first[i] for i in rows if reasons[i] != CONTINUED}
    return indices != list(range(len(indices))) or finals != {indices[-1]}


def apply_rules(table: pa.Table, cfg: FilterConfig, current_version: int) -> RuleResult:
    """Run rules 0-6 over a table; return the keep mask, staleness weights and attributed drops.

    A per-turn trajectory's rows are kept or dropped together: a rule that drops one drops all (same rule)."""
    n = table.num_rows
    ids = table.column("trajectory_id").to_pylist()
    groups = table.column("group_id").to_pylist()
    members, first = _trajectory_members(table)
    keep = np.ones(n, dtype=bool)
    weight = np.ones(n, dtype=np.float64)
    drops: list[tuple[int, str]] = []
    counts = dict.fromkeys(RULES, 0)

    def drop(rows: list[int] | np.ndarray, rule: str, whole: bool = True) -> None:
        for i in rows:
            for j in members[int(i)] if whole else [int(i)]:
                if keep[j]:
                    keep[j] = False
                    drops.append((j, rule))
                    counts[rule] += 1

    def drop_small_groups(rule: str) -> None:
        for rows in _group_rows(groups, np.flatnonzero(keep)).values():
            if len({ids[i] for i in rows}) < cfg.min_group_size:  # G counts trajectories, not rows
                drop(rows, rule)

    # 0. invalid values: a hostile or broken row goes before any rule does arithmetic on it; in the turn
    # modes so does a row whose step rewards cannot be read.
    invalid = find_bad_values(table, cfg.vocab_size)
    drop(bad_rows(invalid), "invalid_values")
    steps: list[list[float | None] | None] = []
    if cfg.adv in TURN_MODES:
        steps, unusable = turn_step_rewards(table)
        invalid.extend(unusable)
        drop(bad_rows(unusable), "invalid_values")

    # 0b. truncated: a cut reply is trained on (keep) or not (drop); either way --keep-status does not judge it.
    status = table.column("status").to_pylist()
    if cfg.truncated == "drop":
        drop([i for i in range(n) if status[i] == "truncated"], "truncated")
    keep_status = set(cfg.keep_status) | {"truncated"}

    # 1. completeness: only finished, rewarded trajectories are trained on; a per-turn trajectory whose
    # rows are not all here (a gap in its turn indices, no final row) is not a finished trajectory either,
    # and in the turn modes nor is one with a step the judge could not grade (no score is not a 0).
    reasons = table.column("finish_reason").to_pylist()
    reward = table.column("reward").to_numpy(zero_copy_only=False).astype(np.float64)  # null -> nan
    drop([i for i in range(n) if status[i] not in keep_status or math.isnan(reward[i])
          or (_is_turn_row(i, members, first, reasons) and _incomplete(members[i], first, reasons))
          or (steps and steps[i] is not None and None in steps[i])],
         "completeness")

    # 1b. untrusted: a verdict the policy's own code could have forged is no training signal.
    if not cfg.keep_untrusted:
        drop(untrusted_rows(table), "untrusted")

    # 2. group integrity: the input must hold each group whole, and enough of it must survive.
    # Exact duplicates (same trajectory_id) are left to rule 4 rather than condemning their group here.
    # Rollout resumes per sample: an interrupted run leaves a sample `aborted` and the re-run writes it again
    # under a new id, so an aborted member whose index another member completed was replaced (as is a second
    # aborted try at one index): it is not part of the group, and is never packed.
    sample_index = table.column("sample_index").to_pylist()
    for rows in _group_rows(groups, np.arange(n)).values():
        by_id: dict[str, int] = {}
        for i in rows:
            by_id.setdefault(ids[i], sample_index[i])
        completed = {sample_index[i] for i in rows if status[i] != "aborted"}
        tried: dict[int, str] = {}  # index -> the one aborted member that stands for it
        for i in rows:
            if status[i] == "aborted" and sample_index[i] not in completed:
                tried.setdefault(sample_index[i], ids[i])
        replaced = {ids[i] for i in rows if status[i] == "aborted" and tried.get(sample_index[i]) != ids[i]}
        indices = sorted(index for tid, index in by_id.items() if tid not in replaced)
        if indices != list(range(len(indices))):
            drop(rows, "group_integrity")
        else:
            drop([i for i in rows if ids[i] in replaced], "group_integrity")
    drop_small_groups("group_integrity")

    # 3. zero variance: equal rewards give every sample advantage 0 in the group modes; equal returns at
    # every turn index give every turn advantage 0 in the turn modes.
    for gid, rows in _group_rows(groups, np.flatnonzero(keep)).items():
        if cfg.adv in TURN_MODES:
            leaders = sorted({min(members[i]) for i in rows})
            uniform = uniform_per_turn([trajectory_returns(members[r], first, steps, reward[r], cfg.gamma) for r in leaders])
        else:
            uniform = np.ptp(reward[rows]) == 0
        if uniform and cfg.adv not in TRAIN_SIDE_MODES and _stable_fraction(gid, cfg.seed) >= cfg.keep_uniform:
            drop(rows, "zero_variance")

    # 4. duplicates: a repeated (trajectory_id, first turn index) anywhere (per-turn siblings differ in
    # the index; only the repeat goes), then near-identical action sequences within a group.
    seen: set[tuple[str, int]] = set()
    for i in np.flatnonzero(keep):
        if (ids[i], first[i]) in seen:
            drop([i], "duplicate", whole=False)
        seen.add((ids[i], first[i]))
    if cfg.dedupe_threshold is not None:
        _dedupe_actions(table, cfg, keep, groups, members, first, sample_index, invalid, drop)
    drop_small_groups("duplicate")

    # 5. staleness: lag against the current policy; the oldest turn's version decides, for every row of a
    # trajectory alike (per-turn rows carry their own turn's version: the trajectory's first row is oldest).
    version = table.column("policy_version").to_numpy().astype(np.int64)  # [N]
    oldest = np.array([version[m].min() for m in members], dtype=np.int64)  # [N]
    lag = np.maximum(current_version - oldest, 0)  # [N]
    if cfg.max_lag is not None:
        drop(np.flatnonzero(keep & (lag > cfg.max_lag)), "staleness")
    weight = np.exp(-cfg.decay * lag)
    drop_small_groups("staleness")

    # 6. where: a user predicate over the schema's columns, evaluated by DuckDB; a per-turn trajectory goes
    # whole when any of its rows fails it.
    if cfg.where:
        drop(np.flatnonzero(keep & ~_where_mask(table, cfg.where)), "where")
        drop_small_groups("where")
    return RuleResult(keep=keep, weight=weight, drops=drops, counts=counts, invalid=invalid)


def untrusted_rows(table: pa.Table) -> list[int]:
    """Rows whose reward_info says `trusted: false`, at its top level or in any part of a weighted sum
    (arlctl/rewards/composite.py: {"parts": {label: info}}), or is text that is not JSON (fail closed).
    A null reward_info, or one without the key, is not untrusted: only the swe grader writes the key."""
    out = []
    for i, text in enumerate(table.column("reward_info").to_pylist()):
        if not text:
            continue
        try:
            info = json.loads(text)
        except (ValueError, RecursionError):
            out.append(i)
            continue
        stack = [info]
        while stack:
            node = stack.pop()
            if not isinstance(node, dict):
                continue
            if node.get("trusted") is False:
                out.append(i)
                break
            parts = node.get("parts")
            if isinstance(parts, dict):
                stack.extend(parts.values())
    return out


def _dedupe_actions(table, cfg, keep, groups, members, first, sample_index, invalid, drop) -> None:
    """Rule 4b: a trajectory whose tool-call n-grams (over all its rows, in turn order) are within
    --dedupe-threshold Jaccard of an earlier kept trajectory of its group is dropped whole."""
    turns = table.column("turns").to_pylist()
    for rows in _group_rows(groups, np.flatnonzero(keep)).values():
        kept: list[set] = []
        leaders = sorted({min(members[i]) for i in rows}, key=lambda r: (sample_index[r], r))
        for leader in leaders:
            traj = sorted((i for i in members[leader] if keep[i]), key=lambda r: first[r])
            if not traj:
                continue
            grams = _action_ngrams([t for i in traj for t in turns[i]], cfg.dedupe_ngram)
            if grams is None:  # only dedupe reads tool_calls, so only here is a malformed one caught
                invalid.extend(BadValue(int(i), "turns", "a turn's tool_calls is not a JSON list of objects")
                               for i in traj)
                drop(traj, "invalid_values")
            elif any(jaccard(grams, other) >= cfg.dedupe_threshold for other in kept):
                drop(traj, "duplicate")
            else:
                kept.append(grams)


def _where_mask(table: pa.Table, predicate: str) -> np.ndarray:
    import duckdb

    from arlctl.io.duck import sealed

    rows = table.append_column("__row", pa.array(np.arange(table.num_rows), pa.int64()))
    # The predicate sees the registered rows and nothing else: a sealed connection has no file reads or
    # writes (COPY ... TO), no extensions, and no SET that could turn that back on.
    con = sealed()
    try:
        con.register("trajectories", rows)
        # The predicate is parsed as one expression over the registered rows (DuckDB's relational filter),
        # never spliced into a statement, so it cannot end the query and start another.
        hit = con.table("trajectories").filter(predicate).project("__row").fetchnumpy()["__row"]
    except duckdb.Error as err:
        raise UsageError(f"--where predicate failed: {str(err).splitlines()[0]}",
                         hint="it is a SQL boolean expression over the trajectory columns, e.g. \"num_turns > 1\"") from None
    finally:
        con.close()
    mask = np.zeros(table.num_rows, dtype=bool)
    mask[np.asarray(hit, dtype=np.int64)] = True
    return mask


# ----------------------------------------------------------------------------------------------- batches


def pack_batches(table: pa.Table, weight: np.ndarray, cfg: FilterConfig) -> tuple[list[pa.Table], int]:
    """Pack surviving rows, whole groups, into batches with advantage and weight filled. Groups go oldest
    policy version first, then by task and group id: the batches depend on what was rolled out, never on the
    order rollout's groups happened to finish in (so a seeded run trains the same steps on any machine).

    Whole groups means whole trajectories too: a per-turn trajectory's rows always share a batch. The
    advantage (and the balance rule) sees one reward per trajectory, so a 10-turn trajectory is one sample
    of its group, not ten; every row of it gets that advantage and weight. In the turn modes each turn
    also gets its own advantage in turns[].advantage (see the module docstring).
    Returns (batch tables, rows touched by the balance rule).
    """
    groups = table.column("group_id").to_pylist()
    ids = table.column("trajectory_id").to_pylist()
    versions = table.column("policy_version").to_pylist()
    tasks = table.column("task_id").to_pylist()
    order = sorted(_group_rows(groups, np.arange(table.num_rows)).values(),
                   key=lambda g: (min(versions[i] for i in g), str(tasks[g[0]]), groups[g[0]]))
    sample_index = table.column("sample_index").to_numpy()
    first = first_turn_indices(table)
    batches, balanced = [], 0
    for start in range(0, len(order), cfg.batch_groups):
        rows = [i for g in order[start : start + cfg.batch_groups]
                for i in sorted(g, key=lambda r: (sample_index[r], ids[r], first[r]))]
        batch = table.take(pa.array(rows, pa.int64()))
        # One sample per trajectory: its first row in the batch stands for all of its rows.
        traj_of: dict[str, int] = {}
        owner = np.array([traj_of.setdefault(ids[i], len(traj_of)) for i in rows])  # [n] -> trajectory
        leader = np.array(_first_positions(owner), dtype=np.int64)  # [T] batch position of each trajectory
        rewards = batch.column("reward").to_numpy(zero_copy_only=False).astype(np.float64)[leader]  # [T]
        traj_groups = [batch.column("group_id")[int(k)].as_py() for k in leader]
        # The turn and train-side modes' `advantage` column holds an outcome rule's value: see the docstring.
        outcome_mode = TURN_MODES.get(cfg.adv) or TRAIN_SIDE_MODES.get(cfg.adv) or cfg.adv
        adv_t = compute_advantages(torch.from_numpy(rewards), group_ids_to_index(traj_groups), outcome_mode).numpy()  # [T]
        w_t = weight[[rows[k] for k in leader]].astype(np.float64)  # [T]
        touched = _balance(adv_t, w_t, cfg.max_pos_frac)
        balanced += int(np.isin(owner, np.flatnonzero(adv_t > 0)).sum()) if touched else 0
        batch = batch.set_column(batch.schema.get_field_index("advantage"), batch.schema.field("advantage"),
                                 pa.array(adv_t[owner], pa.float32()))
        batch = batch.set_column(batch.schema.get_field_index("weight"), batch.schema.field("weight"),
                                 pa.array(w_t[owner], pa.float32()))
        if cfg.adv in TURN_MODES:
            batch = with_turn_credit(batch, owner, rewards, traj_groups, cfg)
        batches.append(batch)
    return batches, balanced


def _first_positions(owner: np.ndarray) -> list[int]:
    """The position of each trajectory's first row, in trajectory order (owner numbers them by first row)."""
    _, first = np.unique(owner, return_index=True)
    return first.tolist()


def _balance(adv: np.ndarray, w: np.ndarray, max_pos_frac: float | None) -> int:
    """Scale positive-advantage weights in place so their share of the weight is <= max_pos_frac."""
    if max_pos_frac is None:
        return 0
    pos = adv > 0
    w_pos, w_rest = float(w[pos].sum()), float(w[~pos].sum())
    if w_pos == 0 or w_rest == 0 or w_pos / (w_pos + w_rest) <= max_pos_frac:
        return 0
    # Solve s * w_pos / (s * w_pos + w_rest) = f for the scale s.
    w[pos] *= max_pos_frac * w_rest / ((1.0 - max_pos_frac) * w_pos)
    return int(pos.sum())


# ----------------------------------------------------------------------------------------------- planning


@dataclass
class Plan:
    """What one invocation will write: computed purely from its inputs, config and policy version."""

    invocation: str
    inputs: list[str]
    current_version: int
    batches: list[pa.Table]
    audit: pa.Table  # one row per input trajectory: its outcome ("kept" or a rule) and batch part
    counts: dict[str, int]
    rows_in: int
    groups_kept: int
    invalid: list[str] = field(default_factory=list)  # "shard row i (trajectory_id): reason" per invalid row


def _read_inputs(inputs: list[str], quarantine_bad: bool) -> tuple[list[str], list[pa.Table], list[str]]:
    """Read input shards; a corrupt one raises, or with quarantine_bad is moved to _quarantine/ and skipped."""
    good, tables, bad = [], [], []
    for url in inputs:
        try:
            tables.append(read_shard(url, bad_values="keep"))  # bad rows: dropped by invalid_values
            good.append(url)
        except CorruptShardError:
            if not quarantine_bad:
                raise
            quarantine(url)
            bad.append(basename(url))
    return good, tables, bad


def plan_invocation(inputs: list[str], cfg: FilterConfig, current_version: int,
                    tables: list[pa.Table] | None = None) -> Plan:
    tables = [read_shard(url, bad_values="keep") for url in inputs] if tables is None else tables
    table = pa.concat_tables(tables) if tables else None
    source = [basename(url) for url, t in zip(inputs, tables, strict=True) for _ in range(t.num_rows)]
    invocation = config_hash({"inputs": sorted(basename(u) for u in inputs), "cfg": asdict(cfg),
                              "version": current_version})
    if table is None or table.num_rows == 0:
        empty = _audit_table([], [], [], [], [], invocation)
        return Plan(invocation, inputs, current_version, [], empty, dict.fromkeys(RULES, 0), 0, 0)
    result = apply_rules(table, cfg, current_version)
    kept_rows = np.flatnonzero(result.keep)
    batches, balanced = pack_batches(table.take(pa.array(kept_rows, pa.int64())), result.weight[kept_rows], cfg)
    result.counts["balance"] = balanced
    outcome: list[str] = ["kept"] * table.num_rows
    for i, rule in result.drops:
        outcome[i] = rule
    part_of: dict[str, int] = {}
    for part, batch in enumerate(batches):
        part_of.update(dict.fromkeys(batch.column("trajectory_id").to_pylist(), part))
    ids = table.column("trajectory_id").to_pylist()
    audit = _audit_table(ids, table.column("group_id").to_pylist(), source, outcome,
                         [part_of.get(t) if o == "kept" else None for t, o in zip(ids, outcome, strict=True)],
                         invocation)
    groups_kept = len(set(table.take(pa.array(kept_rows, pa.int64())).column("group_id").to_pylist()))
    return Plan(invocation, inputs, current_version, batches, audit, result.counts, table.num_rows, groups_kept,
                _name_invalid(result.invalid, source, ids, tables))


def _name_invalid(invalid: list[BadValue], source: list[str], ids: list[str], tables: list[pa.Table]) -> list[str]:
    """One line per dropped invalid row, naming its shard and its row within that shard."""
    starts = np.cumsum([0] + [t.num_rows for t in tables])  # first row of each shard in the concatenation
    lines, seen = [], set()
    for bad in invalid:
        if bad.row not in seen:
            seen.add(bad.row)
            row_in_shard = bad.row - int(starts[np.searchsorted(starts, bad.row, side="right") - 1])
            lines.append(f"{source[bad.row]} row {row_in_shard} (trajectory_id {ids[bad.row]!r}): {bad.reason}")
    return lines


def _audit_table(ids, groups, source, outcome, part, invocation) -> pa.Table:
    return pa.table({
        "trajectory_id": pa.array(ids, pa.string()),
        "group_id": pa.array(groups, pa.string()),
        "input_shard": pa.array(source, pa.string()),
        "rule": pa.array(outcome, pa.string()),  # "kept" or the rule that dropped it
        "batch_part": pa.array(part, pa.int32()),
        "invocation": pa.array([invocation] * len(ids), pa.string()),
    })


# ----------------------------------------------------------------------------------------------- running


def _resume(record: dict[str, Any], in_url: str, out_url: str, metrics_url: str | None,
            cfg: FilterConfig) -> list[str] | str:
    """Finish an interrupted invocation with this invocation's own config; or say why it cannot be."""
    inv = record["invocation"]
    if record["config_hash"] != config_hash(asdict(cfg)):
        return (f"interrupted invocation {inv} ({len(record['written'])} of {record['parts']} batches) was "
                f"written with another configuration (config hash {record['config_hash']}); its inputs stay "
                f"consumed: re-run filter with the options that wrote it to write its other batches")
    inputs = [join(in_url, name) for name in record["inputs"]]
    try:
        plan = plan_invocation(inputs, cfg, record["current_version"])
    except (CorruptShardError, FileNotFoundError) as err:
        return f"interrupted invocation {inv} cannot be resumed: {err}"
    if plan.invocation != inv:
        return f"interrupted invocation {inv} cannot be resumed: its inputs in {in_url} recompute to {plan.invocation}"
    return commit_plan(plan, out_url, metrics_url, cfg, record["written"])


def commit_plan(plan: Plan, out_url: str, metrics_url: str | None, cfg: FilterConfig,
                written: dict[int, str] | None = None) -> list[str]:
    """Write the plan's batches (skipping parts already written), then its audit, then its manifest."""
    written = dict(written or {})
    names = []
    for part, batch in enumerate(plan.batches):
        if part not in written:
            lineage = Lineage(stage="filter", inputs=list(plan.inputs), config_hash=config_hash(asdict(cfg)),
                              extra={"invocation": plan.invocation, "part": part, "parts": len(plan.batches),
                                     "config": asdict(cfg), "current_version": plan.current_version})
            written[part] = basename(write_shard(batch, join(out_url, shard_name("batch")), lineage))
        names.append(written[part])
    if metrics_url:
        parts = plan.audit.column("batch_part").to_pylist()
        audit = plan.audit.append_column("batch", pa.array([None if p is None else names[p] for p in parts],
                                                           pa.string()))
        write_table_atomic(audit, join(metrics_url, f"filter-{plan.invocation}.parquet"))
    run_ledger.write_filter_manifest(out_url, plan.invocation, {
        "invocation": plan.invocation, "inputs": [basename(i) for i in plan.inputs], "batches": names,
        "counts": plan.counts, "current_version": plan.current_version,
    })
    return names


def run_filter(in_url: str, out_url: str, cfg: FilterConfig, current_version: int,
               metrics_url: str | None = None, dry_run: bool = False, quarantine_bad: bool = False) -> dict[str, Any]:
    """One filter invocation over the not-yet-consumed input shards. Returns a summary dict."""
    cfg.check()
    ledger = run_ledger.read_filter_ledger(out_url)
    recovered: list[str] = []
    unresumed: list[str] = []
    if not dry_run:
        # A crash left an invocation half-written: finish it, if this invocation has its configuration.
        for _, record in sorted(ledger.unfinished.items()):
            outcome = _resume(record, in_url, out_url, metrics_url, cfg)
            if isinstance(outcome, str):
                unresumed.append(outcome)
            else:
                recovered.extend(outcome)
    pending = [u for u in scan(in_url).shards if basename(u) not in ledger.consumed]
    pending, tables, quarantined = _read_inputs(pending, quarantine_bad and not dry_run)
    plan = plan_invocation(pending, cfg, current_version, tables)
    waiting = 0 < plan.groups_kept < cfg.min_groups
    summary: dict[str, Any] = {
        "inputs": [basename(u) for u in pending], "rows_in": plan.rows_in, "rules": plan.counts,
        "dropped": sum(v for k, v in plan.counts.items() if k != "balance"), "groups_kept": plan.groups_kept,
        "rows_kept": sum(b.num_rows for b in plan.batches), "batches_planned": len(plan.batches), "batches": [],
        "current_version": current_version,
        "waiting": waiting, "dry_run": dry_run, "recovered": recovered, "quarantined": quarantined,
        "invalid": plan.invalid, "untrusted": ledger.untrusted, "unresumed": unresumed,
    }
    if dry_run or waiting or not pending:
        return summary
    summary["batches"] = commit_plan(plan, out_url, metrics_url, cfg)
    return summary


def run(cfg: FilterConfig, io: FilterIO, stop: threading.Event | None = None) -> FilterResult:
    """The stage's entry point: one invocation against the policy version of now (it moves while a daemon
    runs). An invocation commits as one unit, so `stop` has nothing to cut inside it."""
    now = io.current_version
    if now is None:
        now = run_ledger.trainer_version(io.policy_dir or None, io.ckpt_dir or None)
    return FilterResult.from_summary(run_filter(io.in_url, io.out, cfg, now, metrics_url=io.metrics,
                                                dry_run=io.dry_run, quarantine_bad=io.quarantine))


@dataclass(kw_only=True)
class FilterJob(StageLoop):
    """One `arlctl filter` invocation: the settings, where rows come from and go, and how it runs."""

    cfg: FilterConfig
    io: FilterIO


def plan_filter(cfg: FilterConfig, opts: FilterOptions) -> FilterJob:
    """Check the settings, then the IO (a wrong setting is named before the IO is looked at); nothing is
    written."""
    from arlctl.io.run import RunLayout, metrics_dir_for, resolve_io

    if opts.run is None and (opts.in_url is None or opts.out_url is None):
        raise UsageError("give --in and --out, or --run RUN")
    cfg.check()
    in_url, out_url = resolve_io("filter", opts.run, opts.in_url, opts.out_url, watch=opts.watch)
    layout = RunLayout(opts.run) if opts.run else None
    io = FilterIO(in_url=in_url, out=out_url, metrics=opts.metrics or metrics_dir_for(out_url, opts.run),
                  policy_dir=opts.policy_dir or (layout.policy if layout else None),
                  ckpt_dir=opts.ckpt_dir or (layout.checkpoints if layout else None),
                  current_version=opts.current_version, quarantine=opts.quarantine, dry_run=opts.dry_run)
    return FilterJob(cfg=cfg, io=io, **loop_of(opts))


def run_job(job: FilterJob, on_round: Callable[[FilterResult], None] | None = None) -> list[FilterResult]:
    """Filter what is pending (with --watch: every --poll s until SIGTERM/SIGINT) under the run lock; each
    round's result, in order (`on_round` sees each as it ends)."""
    from arlctl.io.stage_loop import run_stage

    results: list[FilterResult] = []

    def once(stop: Any) -> dict[str, Any]:
        result = run(job.cfg, job.io, stop)
        results.append(result)
        if on_round is not None:
            on_round(result)
        return result.to_json()

    run_stage(once, out=job.io.out, lock_name="filter", watch=job.watch, poll=job.poll, lock_wait=job.lock_wait,
              dry_run=job.io.dry_run, units=lambda summary: len(summary["batches"]))
    return results

