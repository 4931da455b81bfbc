"""`arlctl plan`: a capacity and cost ledger calibrated from a run's own shards and metrics.

Two halves. `calibrate(run)` reads what the stages recorded into `Rates` (per-trajectory costs and each
pool's measured throughput); `ledger(rates, ...)` is pure arithmetic over `Rates`, so it can be checked by
hand. Where the run does not record something, the rate is None and `Rates.not_recorded` says so; the
ledger never invents it.

The pools (DESIGN.md §1: rollout = inference + environments, reward, training) and the model:

  trajectories per step  B = mean `rows` of the train metrics rows (one batch shard = one step)
  inference              an engine generating C tok/s finishes C / G trajectories/s (G = generated tokens
                         per trajectory); keeping it busy needs in-flight = (C / G) x wall_s (Little's law)
  environment            in-flight ~= 1.3 x sandboxes (the rollout-scale seed), so sandboxes = in-flight / 1.3
                         and a trajectory holds wall_s / 1.3 sandbox-seconds; one of an env that holds no
                         sandbox (math: envs/registry.uses_sandbox) holds none, and where no env of the run
                         holds one every sandbox line prints "none"
  reward                 reward_s worker-seconds per trajectory (reward invocation seconds / rows)
  trainer                train_step_s device-seconds per step (measured on the device count that ran it)

At a target of X steps/hour: T = X x B / 3600 trajectories/s, inference GPUs = ceil(T x G / C),
sandboxes = ceil(T x sandbox_wall_s / 1.3) (sandbox_wall_s = wall_s where every env holds one),
reward workers = ceil(T x reward_s), trainer GPUs = ceil(X x step_s / 3600).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

INFLIGHT_PER_SANDBOX = 1.3  # rollout-scale seed: trajectories in flight per sandbox (others are generating)
TRAJECTORY_COLUMNS = ["env", "prompt_tokens", "response_tokens", "generated_tokens", "num_turns",
                      "wall_time_s", "gen_time_s", "env_time_s", "turns"]


@dataclass(frozen=True)
class Rates:
    """What a run measured. Per trajectory unless the name says otherwise; None = not recorded."""

    trajectories: int  # rows the per-trajectory means are over
    generated_tokens: float  # mask-1 tokens
    prefill_tokens: float  # context read before each generation, summed over turns (no prefix cache)
    prefill_tokens_cached: float  # with a perfect prefix cache only new tokens: prompt + environment tokens
    turns: float
    wall_s: float
    gen_s: float  # waiting on the policy
    env_s: float  # environment-seconds: waiting on env.step (tools, sandboxed commands)
    reward_s: float | None = None  # reward worker-seconds per trajectory
    train_tokens: float | None = None  # trained (mask-1) tokens per trajectory, from the train metrics
    rows_per_step: float | None = None  # trajectories per optimizer step
    train_step_s: float | None = None  # seconds per optimizer step
    engine_tok_s: float | None = None  # generated tokens per second of one inference engine
    rollout_traj_s: float | None = None  # trajectories/s one rollout invocation achieved, as run
    reward_rows_s: float | None = None  # rows/s one reward invocation achieved, as run
    sources: dict[str, str] = field(default_factory=dict)  # rate -> where it came from
    not_recorded: list[str] = field(default_factory=list)
    # Wall seconds per trajectory spent in envs that hold a sandbox (a math trajectory counts 0), and
    # those envs; None: not known, so every trajectory is taken to hold one (sandbox_wall_s = wall_s).
    sandbox_wall_s: float | None = None
    sandbox_envs: tuple[str, ...] | None = None

    @property
    def uses_sandbox(self) -> bool:
        return self.sandbox_envs is None or bool(self.sandbox_envs)


@dataclass(frozen=True)
class Prices:
    gpu_hour: float | None = None
    cpu_hour: float | None = None
    cpus_per_sandbox: float = 1.0


@dataclass
class Ledger:
    per_trajectory: dict[str, float | None]
    per_step: dict[str, float | None]  # unit-seconds one optimizer step needs from each pool
    as_run: dict[str, Any]  # steps/hour each pool sustained as measured, and the bottleneck
    balance: dict[str, float | None]  # per inference GPU, from the seed
    target: dict[str, Any] | None
    cost: dict[str, float | None]
    rates: dict[str, float | None]
    sources: dict[str, str]
    not_recorded: list[str]
    uses_sandbox: bool  # False: no measured env holds a sandbox; the sandbox figures are 0 and print "none"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def ledger(rates: Rates, target_steps_per_hour: float | None = None, prices: Prices = Prices(),
           inflight_per_sandbox: float = INFLIGHT_PER_SANDBOX) -> Ledger:
    """The ledger of `rates`: per step, as run, the seed's balance, the target's pools and the cost."""
    r, b = rates, rates.rows_per_step
    sandbox_s = _sandbox_wall(r) / inflight_per_sandbox
    per_trajectory = {"generated_tokens": r.generated_tokens, "prefill_tokens": r.prefill_tokens,
                      "prefill_tokens_cached": r.prefill_tokens_cached, "turns": r.turns, "wall_s": r.wall_s,
                      "gen_s": r.gen_s, "env_s": r.env_s, "sandbox_s": sandbox_s, "reward_s": r.reward_s,
                      "train_tokens": r.train_tokens}
    per_step = {
        "trajectories": b,
        "inference_gpu_s": _mul(b, _div(r.generated_tokens, r.engine_tok_s)),
        "sandbox_s": _mul(b, sandbox_s) if r.uses_sandbox else 0.0,
        "env_s": _mul(b, r.env_s),
        "reward_s": _mul(b, r.reward_s),
        "trainer_gpu_s": r.train_step_s,
    }
    return Ledger(per_trajectory=per_trajectory, per_step=per_step, as_run=_as_run(r),
                  balance=_balance(r, inflight_per_sandbox),
                  target=_target(r, target_steps_per_hour, inflight_per_sandbox, prices),
                  cost=_cost(r, per_step, prices), rates=_rates(r), sources=dict(r.sources),
                  not_recorded=list(r.not_recorded), uses_sandbox=r.uses_sandbox)


def _sandbox_wall(r: Rates) -> float:
    """Wall seconds per trajectory that hold a sandbox."""
    return r.wall_s if r.sandbox_wall_s is None else r.sandbox_wall_s


def _as_run(r: Rates) -> dict[str, Any]:
    """Steps/hour each pool sustained in this run with the resources it had (one invocation each), and the
    slowest: the bottleneck. Inside rollout, the side trajectories waited on longer limits it."""
    per_hour = {
        "rollout": _mul(3600.0, _div(r.rollout_traj_s, r.rows_per_step)),
        "reward": _mul(3600.0, _div(r.reward_rows_s, r.rows_per_step)),
        "trainer": _div(3600.0, r.train_step_s),
    }
    known = {pool: v for pool, v in per_hour.items() if v is not None}
    bottleneck = min(known, key=known.__getitem__) if known else None
    return {"steps_per_hour": per_hour, "bottleneck": bottleneck,
            "rollout_waits_on": "environment" if r.env_s > r.gen_s else "inference"}


def _balance(r: Rates, inflight_per_sandbox: float) -> dict[str, float | None]:
    """What one busy inference GPU needs around it (the seed's balance)."""
    traj_s = _div(r.engine_tok_s, r.generated_tokens)  # trajectories/s one engine finishes
    in_flight = _mul(traj_s, r.wall_s)
    sandboxes = _div(_mul(traj_s, _sandbox_wall(r)), inflight_per_sandbox) if r.uses_sandbox else 0.0
    return {"trajectories_per_s_per_gpu": traj_s, "in_flight_per_gpu": in_flight,
            "sandboxes_per_gpu": sandboxes,
            "env_cores_per_gpu": _mul(traj_s, r.env_s), "reward_workers_per_gpu": _mul(traj_s, r.reward_s)}


def _target(r: Rates, steps_per_hour: float | None, inflight_per_sandbox: float,
            prices: Prices) -> dict[str, Any] | None:
    if steps_per_hour is None:
        return None
    traj_s = _mul(steps_per_hour / 3600.0, r.rows_per_step)
    in_flight = _mul(traj_s, r.wall_s)
    sandboxes = _ceil(_div(_mul(traj_s, _sandbox_wall(r)), inflight_per_sandbox)) if r.uses_sandbox else 0
    pools = {
        "steps_per_hour": steps_per_hour, "trajectories_per_s": traj_s, "in_flight": in_flight,
        "sandboxes": sandboxes,
        "inference_gpus": _ceil(_div(_mul(traj_s, r.generated_tokens), r.engine_tok_s)),
        "trainer_gpus": _ceil(_mul(steps_per_hour / 3600.0, r.train_step_s)),
        "reward_workers": _ceil(_mul(traj_s, r.reward_s)),
        "env_cores": _mul(traj_s, r.env_s),
    }
    gpus = _add(pools["inference_gpus"], pools["trainer_gpus"])
    cpus = _add(_mul(pools["sandboxes"], prices.cpus_per_sandbox), pools["reward_workers"])
    per_hour = _add(_mul(gpus, prices.gpu_hour), _mul(cpus, prices.cpu_hour))
    per_step = _div(per_hour, steps_per_hour)
    pools.update({"cost_per_hour": per_hour, "cost_per_step": per_step,
                  "cost_per_1k_trajectories": _mul(1000.0, _div(per_step, r.rows_per_step))})
    return pools


def _cost(r: Rates, per_step: dict[str, float | None], prices: Prices) -> dict[str, float | None]:
    """Busy cost: only the unit-seconds a step uses (whole units at a target cost more: see target)."""
    gpu_s = _add(per_step["inference_gpu_s"], per_step["trainer_gpu_s"])
    cpu_s = _add(_mul(per_step["sandbox_s"], prices.cpus_per_sandbox), per_step["reward_s"])
    gpu_cost, cpu_cost = _mul(gpu_s, _div(prices.gpu_hour, 3600.0)), _mul(cpu_s, _div(prices.cpu_hour, 3600.0))
    per_step_cost = _add(gpu_cost, cpu_cost)
    return {"gpu_hour": prices.gpu_hour, "cpu_hour": prices.cpu_hour, "gpu_s_per_step": gpu_s,
            "cpu_s_per_step": cpu_s, "gpu_per_step": gpu_cost, "cpu_per_step": cpu_cost, "per_step": per_step_cost,
            "per_1k_trajectories": _mul(1000.0, _div(per_step_cost, r.rows_per_step))}


def _rates(r: Rates) -> dict[str, float | None]:
    return {"trajectories_measured": r.trajectories, "rows_per_step": r.rows_per_step,
            "train_step_s": r.train_step_s, "engine_tok_s": r.engine_tok_s, "rollout_traj_s": r.rollout_traj_s,
            "reward_rows_s": r.reward_rows_s}


# ----------------------------------------------------------------------------------------------- calibration


def calibrate(run: str, last: int = 20) -> Rates:
    """Rates from the run's newest `last` trajectory shards (RUN/rollouts, else RUN/rewarded) and its metrics
    rows (the newest `last` train steps, every rollout and reward invocation)."""
    from arlctl.errors import UsageError
    from arlctl.io.run import RunLayout

    layout = RunLayout(run)
    rows, notes = _trajectory_rows(layout, last)
    if not rows:
        raise UsageError(f"{run} holds no trajectories to calibrate from (RUN/rollouts and RUN/rewarded are empty)",
                         hint="run `arlctl rollout --run RUN` (and reward, filter, train) first")
    n = len(rows)
    prefill = [sum(r["prompt_tokens"] + t["gen_start"] for t in r["turns"]) for r in rows]
    cached = [r["prompt_tokens"] + sum(t["gen_start"] - (p["gen_start"] + p["gen_len"])
                                       for p, t in zip(r["turns"], r["turns"][1:])) for r in rows]
    metrics = _metrics_values(run, last, notes)
    train, rollout, reward = metrics["train"], metrics["rollout"], metrics["reward"]
    sources = {"per_trajectory": f"{n} trajectories in the newest {last} shards of RUN/{rows[0]['_dir']}"}
    engine_tok_s = _ratio(rollout, "backend_generated_tokens", "backend_busy_s")
    if engine_tok_s is not None:
        sources["engine_tok_s"] = "generated tokens / busy seconds of the inference engine (rollout metrics)"
    else:
        engine_tok_s = _ratio(rollout, "generated_tokens", "seconds")
        if engine_tok_s is not None:
            sources["engine_tok_s"] = ("generated tokens / rollout seconds: a lower bound (the engine's busy time "
                                       "is not recorded by this backend)")
    if reward:
        sources["reward_s"] = "reward invocation wall seconds / rows (reward metrics)"
    if train:
        sources["train"] = f"the newest {len(train)} train metrics rows (rows, step_time_s, tokens)"
    sandbox_envs, sandbox_wall_s = _sandbox_use(rows, sources, notes)
    if train:
        notes.append("trainer devices: train metrics rows do not record the world size; step time is taken as "
                     "one device's")
    return Rates(
        trajectories=n, generated_tokens=_mean(r["generated_tokens"] for r in rows), prefill_tokens=sum(prefill) / n,
        prefill_tokens_cached=sum(cached) / n, turns=_mean(r["num_turns"] for r in rows),
        wall_s=_mean(r["wall_time_s"] for r in rows), gen_s=_mean(r["gen_time_s"] for r in rows),
        env_s=_mean(r["env_time_s"] for r in rows),
        reward_s=_ratio(reward, "seconds", "rows"), train_tokens=_ratio(train, "tokens", "rows"),
        rows_per_step=_mean(v["rows"] for v in train if "rows" in v) if train else None,
        train_step_s=_mean(v["step_time_s"] for v in train if "step_time_s" in v) if train else None,
        engine_tok_s=engine_tok_s, rollout_traj_s=_ratio(rollout, "trajectories", "seconds"),
        reward_rows_s=_ratio(reward, "rows", "seconds"), sources=sources, not_recorded=notes,
        sandbox_wall_s=sandbox_wall_s, sandbox_envs=sandbox_envs)


def _sandbox_use(rows: list[dict[str, Any]], sources: dict[str, str],
                 notes: list[str]) -> tuple[tuple[str, ...], float]:
    """The envs of `rows` that hold a sandbox, and the wall seconds per trajectory spent in them."""
    from arlctl.envs.registry import uses_sandbox

    holds = {env: uses_sandbox(env) for env in sorted({str(r["env"]) for r in rows})}
    for env, known in holds.items():
        if known is None:
            notes.append(f"env {env} is not built in: whether it holds a sandbox is unknown; taken as holding "
                         "one")
    sandboxed = tuple(env for env, known in holds.items() if known is not False)
    if not sandboxed:
        sources["sandboxes"] = (f"env {next(iter(holds))} holds no sandbox" if len(holds) == 1
                                else f"envs {', '.join(holds)} hold no sandbox")
        return (), 0.0
    notes.append("sandbox-seconds: no stage records how long a trajectory holds a sandbox; the ledger uses "
                 f"wall_s / {INFLIGHT_PER_SANDBOX} (the seed: in-flight ~= {INFLIGHT_PER_SANDBOX} x sandboxes) "
                 f"for the trajectories of {', '.join(sandboxed)}" + (
                     f"; those of {', '.join(e for e in holds if e not in sandboxed)} hold none"
                     if len(sandboxed) < len(holds) else ""))
    return sandboxed, _mean(r["wall_time_s"] if str(r["env"]) in sandboxed else 0.0 for r in rows)


def _trajectory_rows(layout: Any, last: int) -> tuple[list[dict[str, Any]], list[str]]:
    from arlctl.errors import CorruptShardError
    from arlctl.io.shards import read_shard, scan

    notes: list[str] = []
    for name, url in (("rollouts", layout.rollouts), ("rewarded", layout.rewarded)):
        shards = scan(url).shards[-last:]
        rows: list[dict[str, Any]] = []
        for shard in shards:
            try:
                table = read_shard(shard, columns=TRAJECTORY_COLUMNS, bad_values="keep")
            except CorruptShardError as err:
                notes.append(f"skipped an unreadable shard: {err}")
                continue
            rows.extend({**r, "_dir": name} for r in table.to_pylist())
        if rows:
            return rows, notes
    return [], notes


def _metrics_values(run: str, last: int, notes: list[str]) -> dict[str, list[dict[str, float]]]:
    """Numeric values of the newest `last` train rows and of every rollout and reward row in RUN/metrics."""
    from arlctl.trackers.points import list_sources, read_source

    sources = list_sources(run).sources
    picked = [s for s in sources if s.stream == "train"][-last:]
    picked += [s for s in sources if s.stream in ("rollout", "reward")]
    out: dict[str, list[dict[str, float]]] = {"train": [], "rollout": [], "reward": []}
    for source in picked:
        try:
            out[source.stream].extend(p.values for p in read_source(source).points)
        except Exception as err:  # named in the output, never silently dropped
            notes.append(f"skipped an unreadable metrics file {source.url}: {type(err).__name__}: {err}")
    for stream, what in (("train", "rows_per_step, train_step_s, train_tokens"), ("rollout", "engine_tok_s, rollout_traj_s"),
                         ("reward", "reward_s, reward_rows_s")):
        if not out[stream]:
            notes.append(f"{what}: no {stream} metrics rows in RUN/metrics")
    return out


def _ratio(rows: list[dict[str, float]], num: str, den: str) -> float | None:
    """sum(num) / sum(den) over the rows that have both; None when none do or the denominator is 0."""
    pairs = [(v[num], v[den]) for v in rows if num in v and den in v]
    total = sum(d for _, d in pairs)
    return sum(n for n, _ in pairs) / total if pairs and total > 0 else None


def _mean(values: Any) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


# ----------------------------------------------------------------------------------------------- rendering


def render(led: Ledger, run: str) -> Any:
    """The ledger as one Rich table (sections as row groups); unknown values print as "not recorded"."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"capacity and cost ledger: {run}", title_justify="left", show_header=True)
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_column("unit / note", style="dim")
    t = led.per_trajectory

    def sandbox(name: str, value: Any, note: str) -> tuple[str, Any, str]:
        """A sandbox line: "none" where no env of the run holds a sandbox (math), not 0 of a derived figure."""
        return (name, value, note) if led.uses_sandbox else (name, "none", led.sources.get("sandboxes", ""))

    sections: list[tuple[str, list[tuple[str, Any, str]]]] = [
        ("per trajectory", [
            ("generated tokens", t["generated_tokens"], "mask-1 tokens"),
            ("prefill tokens", t["prefill_tokens"], "no prefix cache: each turn re-reads its context"),
            ("prefill tokens, cached", t["prefill_tokens_cached"], "perfect prefix cache: prompt + env tokens"),
            ("turns", t["turns"], ""), ("wall", t["wall_s"], "s"), ("waiting on the policy", t["gen_s"], "s"),
            ("environment", t["env_s"], "s (env.step)"),
            sandbox("sandbox", t["sandbox_s"], f"s, derived: wall / {INFLIGHT_PER_SANDBOX} (not recorded)"),
            ("reward", t["reward_s"], "worker-s"), ("train tokens", t["train_tokens"], "trained (mask-1) tokens"),
        ]),
        ("per optimizer step", [
            ("trajectories", led.per_step["trajectories"], "rows per batch shard"),
            ("inference", led.per_step["inference_gpu_s"], "GPU-s"),
            sandbox("sandboxes", led.per_step["sandbox_s"], "sandbox-s"), ("environment", led.per_step["env_s"], "s"),
            ("reward", led.per_step["reward_s"], "worker-s"), ("trainer", led.per_step["trainer_gpu_s"], "GPU-s"),
        ]),
        ("as run (steps/hour)", [
            *((pool, v, "") for pool, v in led.as_run["steps_per_hour"].items()),
            ("bottleneck", led.as_run["bottleneck"], f"rollout waits on {led.as_run['rollout_waits_on']}"),
        ]),
        ("balance per inference GPU", [
            ("trajectories/s", led.balance["trajectories_per_s_per_gpu"],
             f"at {_num(led.rates['engine_tok_s'])} tok/s: {led.sources.get('engine_tok_s', 'not recorded')}"),
            ("in flight", led.balance["in_flight_per_gpu"], "trajectories"),
            sandbox("sandboxes", led.balance["sandboxes_per_gpu"], f"in flight / {INFLIGHT_PER_SANDBOX}"),
            ("environment cores", led.balance["env_cores_per_gpu"], ""),
            ("reward workers", led.balance["reward_workers_per_gpu"], ""),
        ]),
    ]
    if led.target is not None:
        g = led.target
        sections.append((f"target {_num(g['steps_per_hour'])} steps/hour", [
            ("trajectories/s", g["trajectories_per_s"], ""), ("in flight", g["in_flight"], "trajectories"),
            sandbox("sandboxes", g["sandboxes"], ""), ("inference GPUs", g["inference_gpus"], ""),
            ("trainer GPUs", g["trainer_gpus"], ""), ("reward workers", g["reward_workers"], ""),
            ("environment cores", g["env_cores"], ""), ("$ per hour", g["cost_per_hour"], "whole units"),
            ("$ per step", g["cost_per_step"], ""), ("$ per 1k trajectories", g["cost_per_1k_trajectories"], ""),
        ]))
    c = led.cost
    sections.append(("cost (busy seconds only)", [
        ("$ per step", c["per_step"], f"GPU ${_num(c['gpu_hour'])}/h, CPU ${_num(c['cpu_hour'])}/h"),
        ("$ per 1k trajectories", c["per_1k_trajectories"], ""),
    ]))
    for title, rows in sections:
        table.add_section()
        table.add_row(Text(title, style="bold"), "", "")
        for name, value, note in rows:
            table.add_row(f"  {name}", Text(_num(value), style="" if value is not None else "yellow"), note)
    if led.not_recorded:
        table.add_section()
        for note in led.not_recorded:
            table.add_row(Text("not recorded", style="yellow"), "", Text(note))
    return table


def _num(value: Any) -> str:
    if value is None:
        return "not recorded"
    if isinstance(value, str):
        return value
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"


# None-propagating arithmetic: a rate the run did not record leaves everything built on it unknown.


def _mul(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a * b


def _div(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def _ceil(a: float | None) -> int | None:
    return None if a is None else math.ceil(a - 1e-9)


__all__ = ["INFLIGHT_PER_SANDBOX", "Ledger", "Prices", "Rates", "calibrate", "ledger", "render"]
