"""Training at scale, measured in one run (issues 15, 29): memory per parameter, 2 ranks vs 1, publish latency,
per-rank state at 1, 2 and 4 ranks, packed vs padded micro-batches.

1. Peak memory per parameter of `arlctl train` (one step + its checkpoint, micro-batches of one short row, so
   that weights and optimizer state rather than activations set the peak) for
     fp32 single | bf16 single (bf16 weights, fp32 master copy) | bf16 FSDP2 on 2 ranks | LoRA (fp32, r=16)
   on SmolLM2-135M and a random-init ~0.5B Llama (hidden 1024, 24 layers). On CPU the peak is the largest
   resident set of any process of the command (a rank, under torchrun), taken from the kernel's rusage of
   the finished children; each run is a fresh process. `base` is the peak of a process that imports the
   same libraries and loads the model without training, so `train - base` is what training adds.
2. Tokens/s of 2 ranks (FSDP2, gloo, one thread each) vs 1 process (two threads) on the same batches.
3. Publish latency: a weights-only checkpoint (HF safetensors for sync) vs a full one (plus the optimizer
   and model as DCP shards), the same trainer state, on local disk.
4. Scale: per-rank bytes/param at N = 1, 2, 4 for fp32 FSDP2, bf16 FSDP2 and LoRA r16 (N = 1: one
   process), from benchmarks/scale_worker.py: what a rank holds after two packed steps (its RSS over its
   RSS before the trainer), and its peaks in the steps and in the checkpoint save, against the goal for
   fp32 FSDP2 of 1.15 x 16/N B/param plus the fp32 export buffer of the largest tensor.
5. Pack: tokens/s of --pack auto vs --pack off on batches of 8 rows with a multi-turn rollout's length
   spread, with the share of padding the padded micro-batches carry.

  python benchmarks/train_scale.py                        # SmolLM2-135M, every part
  python benchmarks/train_scale.py --models smollm2,0.5b  # add the 0.5B config to the memory table
  python benchmarks/train_scale.py --parts publish        # one part
  python benchmarks/train_scale.py --parts scale,pack --ranks 1,2,4
  python benchmarks/train_scale.py --models 0.5b --parts memory --modes "fp32 single,fp32 fsdp2 x2,lora r16"

On a CPU without native bf16 (no AVX512-BF16/AMX) bf16 matmuls are emulated and a bf16 step is many times
slower than fp32: the memory rows still hold, the seconds do not mean anything there.

Ratios are what to read: every number in a row is measured in this run on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from arlctl.io.shards import Lineage, write_shard  # noqa: E402
from arlctl.rl.checkpoint import resolve_policy_path  # noqa: E402
from arlctl.stages.configs import FilterConfig
from arlctl.stages.filter import pack_batches
from arlctl.synthetic import synthetic_table  # noqa: E402

HALF_B = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=4,
              intermediate_size=4096, vocab_size=49152, tie_word_embeddings=True)
MODES = {  # name: (extra train flags, ranks)
    "fp32 single": (["--strategy", "single"], 1),
    "bf16 single": (["--strategy", "single", "--precision", "bf16"], 1),
    "bf16 fsdp2 x2": (["--strategy", "fsdp2", "--precision", "bf16"], 2),
    "lora r16": (["--strategy", "single", "--lora-rank", "16"], 1),
    "fp32 fsdp2 x2": (["--strategy", "fsdp2"], 2),  # not in the default set: the bf16 one is the recipe
}
# The `scale` part (issue 29): per-rank state at N = 1, 2, 4 for each of these, N = 1 being one process.
SCALE = {"fp32 fsdp2": {"precision": "fp32"}, "bf16 fsdp2": {"precision": "bf16"},
         "lora r16": {"precision": "fp32", "lora_rank": 16}}
MEMORY_MICRO_TOKENS = 128
DEFAULT_MODES = "fp32 single,bf16 single,bf16 fsdp2 x2,lora r16"


def model_dir(name: str, root: Path) -> Path:
    if name == "smollm2":
        return resolve_policy_path("smollm2-135m")
    dest = root / "half-b"
    if not (dest / "model.safetensors").is_file():
        import torch
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(**HALF_B)).save_pretrained(dest)
        AutoTokenizer.from_pretrained(resolve_policy_path("smollm2-135m")).save_pretrained(dest)
    return dest


def n_params(path: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), framework="pt") as fh:
        return sum(int(np.prod(fh.get_slice(k).get_shape())) for k in fh.keys())  # noqa: SIM118


def make_batches(root: Path, steps: int, groups: int, tokens_per_turn: int, turns: int) -> str:
    table = synthetic_table(steps * groups, group_size=4, seed=0, mean_turns=turns, tokens_per_turn=tokens_per_turn)
    rewards = pa.array([float(i % 2) for i in range(table.num_rows)], pa.float32())
    table = table.set_column(table.schema.get_field_index("reward"), table.schema.field("reward"), rewards)
    batches, _ = pack_batches(table, np.ones(table.num_rows), FilterConfig(batch_groups=groups))
    out = root / "batches"
    for i, batch in enumerate(batches):
        write_shard(batch, str(out / f"batch-{i:04d}.parquet"), Lineage("filter"))
    return str(out)


def run_measured(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(peak RSS in bytes of the command's largest process, wall seconds, output), in a fresh wrapper."""
    wrapper = ("import resource, subprocess, sys, json, time; t = time.perf_counter(); "
               "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
               "print(json.dumps({'rc': p.returncode, 's': time.perf_counter() - t, "
               "'rss': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, "
               "'out': (p.stdout + p.stderr)[-4000:]}))")
    res = subprocess.run([sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True, env=env)
    info = json.loads(res.stdout.strip().splitlines()[-1])
    if info["rc"] != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{info['out']}")
    return float(info["rss"]), float(info["s"]), info["out"]


def train_cmd(batches: str, policy: Path, out: Path, flags: list[str], ranks: int, steps: int,
              micro_tokens: int = 4096) -> list[str]:
    args = ["train", "--in", batches, "--out", str(out), "--policy", str(policy), "--max-steps", str(steps),
            "--lr", "1e-6", "--micro-tokens", str(micro_tokens), "--device", "cpu", "--publish-dtype", "bf16", "--json", *flags]
    if ranks == 1:
        return [sys.executable, "-m", "arlctl.cli.main", *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
            "-m", "arlctl.cli.main", *args]


def memory(models: list[str], root: Path, batches: str, modes: list[str]) -> list[dict]:
    rows = []
    for name in models:
        policy = model_dir(name, root)
        params = n_params(policy)
        load = ("import sys, torch; from arlctl.stages.train import load_model; from pathlib import Path; "
                "load_model(Path(sys.argv[1]))")
        base, _, _ = run_measured([sys.executable, "-c", load, str(policy)], env_for(1))
        for mode in modes:
            flags, ranks = MODES[mode]
            with tempfile.TemporaryDirectory(dir=root) as out:
                # One row per micro-batch: the weights and optimizer state, not the activations, set the peak.
                rss, secs, _ = run_measured(train_cmd(batches, policy, Path(out) / "ckpt", flags, ranks, 1,
                                                      micro_tokens=MEMORY_MICRO_TOKENS), env_for(ranks))
            rows.append({"model": name, "params": params, "mode": mode, "ranks": ranks,
                         "peak_gb": rss / 2**30, "bytes_per_param": rss / params,
                         "train_bytes_per_param": (rss - base) / params, "base_gb": base / 2**30, "s": secs})
            print(f"  {name:8s} {mode:14s} peak {rss / 2**30:6.2f} GB  {rss / params:6.1f} B/param  "
                  f"({(rss - base) / params:6.1f} B/param over loading, {secs:.0f}s)", flush=True)
    return rows


def scale(root: Path, ranks: list[int]) -> list[dict]:
    """Per-rank bytes/param at each world size, from benchmarks/scale_worker.py: each rank's RSS after two
    packed steps over its RSS before the trainer (what it holds: the state), and its peak in the steps and in
    the checkpoint save (the transients: FSDP2's gathered layers and root, the export's one tensor)."""
    from safetensors import safe_open

    policy = model_dir("smollm2", root)
    params = n_params(policy)
    with safe_open(str(policy / "model.safetensors"), framework="pt") as fh:
        largest = max(int(np.prod(fh.get_slice(k).get_shape())) for k in fh.keys())  # noqa: SIM118
    print(f"  {params:,} params; largest tensor {largest:,} (its fp32 export buffer {4 * largest / params:.2f} "
          "B/param); B/param of the busiest rank", flush=True)
    worker = str(Path(__file__).with_name("scale_worker.py"))
    rows = []
    for mode, settings in SCALE.items():
        for n in ranks:
            cfg = {**settings, "strategy": "single" if n == 1 else "fsdp2"}
            with tempfile.TemporaryDirectory(dir=root) as out:
                launch = [sys.executable] if n == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                           f"--nproc-per-node={n}"]
                _, secs, text = run_measured([*launch, worker, str(policy), out, json.dumps(cfg)], env_for(n))
            reports = [json.loads(line) for line in text.splitlines() if line.startswith('{"rank"')]
            assert len(reports) == n and all(r["packed"] for r in reports), text[-2000:]
            held, step_peak, save_peak = (max(r[k] for r in reports) / params for k in ("held", "step_peak", "save_peak"))
            goal = 1.15 * 16 / n + 4 * largest / params if mode == "fp32 fsdp2" else None
            rows.append({"mode": mode, "ranks": n, "held": held, "step_peak": step_peak, "save_peak": save_peak,
                         "goal": goal, "s": secs})
            verdict = "" if goal is None else f"  goal <= {goal:.2f}: {'met' if held <= goal else 'NOT met'}"
            print(f"  {mode:11s} N={n}  held {held:5.2f}  step peak {step_peak:5.2f}  save peak {save_peak:5.2f}  "
                  f"({secs:.0f}s){verdict}", flush=True)
    for mode in SCALE:
        one = next(r for r in rows if r["mode"] == mode and r["ranks"] == 1)["held"]
        print(f"  {mode:11s} held: " + "  ".join(f"N={r['ranks']} {one / r['held']:.2f}x less than N=1"
                                                 for r in rows if r["mode"] == mode and r["ranks"] > 1))
    return rows


def make_spread_batches(root: Path, steps: int) -> tuple[str, float]:
    """Batches of 8 rows whose lengths spread as a multi-turn rollout's do (3 turns on average, up to 14x
    apart), and the share of padding in their padded micro-batches at the default --micro-tokens."""
    from arlctl.io.shards import read_shard, scan
    from arlctl.rl.batching import plan_micro_batches

    out = root / "spread"
    table = synthetic_table(steps * 2, group_size=4, seed=1, mean_turns=3, tokens_per_turn=128)
    rewards = pa.array([float(i % 2) for i in range(table.num_rows)], pa.float32())
    table = table.set_column(table.schema.get_field_index("reward"), table.schema.field("reward"), rewards)
    batches, _ = pack_batches(table, np.ones(table.num_rows), FilterConfig(batch_groups=2))
    for i, batch in enumerate(batches):
        write_shard(batch, str(out / f"batch-{i:04d}.parquet"), Lineage("filter"))
    real = padded = 0
    for url in scan(str(out)).shards:
        b = read_shard(url)
        lengths = [p + r for p, r in zip(b.column("prompt_tokens").to_pylist(), b.column("response_tokens").to_pylist(),
                                         strict=True)]
        for group in plan_micro_batches(lengths, 8192):
            real += sum(lengths[i] for i in group)
            padded += len(group) * max(lengths[i] for i in group)
    return str(out), 1 - real / padded


def packed_vs_padded(root: Path, steps: int, rounds: int) -> dict:
    """Tokens/s of --pack auto vs --pack off on SmolLM2, interleaved (auto, off, auto, ...)."""
    policy = model_dir("smollm2", root)
    batches, pad_share = make_spread_batches(root, steps)
    print(f"  {pad_share:.0%} of the padded micro-batches' tokens are padding", flush=True)
    speeds: dict[str, list[float]] = {"auto": [], "off": []}
    for _ in range(rounds):
        for pack in speeds:
            with tempfile.TemporaryDirectory(dir=root) as ckpt:
                _, _, text = run_measured(train_cmd(batches, policy, Path(ckpt) / "c", ["--strategy", "single", "--pack",
                                                    pack, "--save-every", "1000", "--micro-tokens", "8192"], 1, steps),
                                          env_for(1))
            summary = json.loads([line for line in text.splitlines() if line.startswith("{")][-1])
            assert summary["packing"] == ("packed" if pack == "auto" else "padded (--pack off)"), summary["packing"]
            speeds[pack].append(float(summary["tokens_per_s"]))
    med = {k: statistics.median(v) for k, v in speeds.items()}
    ratio = med["auto"] / med["off"]
    print(f"  packed {med['auto']:.0f} tokens/s  padded {med['off']:.0f} tokens/s  ratio {ratio:.2f}x "
          f"(median of {rounds}; goal >= 1.5x where padding >= 40%)", flush=True)
    return {"pad_share": pad_share, "packed_tokens_per_s": med["auto"], "padded_tokens_per_s": med["off"], "ratio": ratio}


def env_for(ranks: int) -> dict[str, str]:
    threads = str(max(1, (os.cpu_count() or 2) // ranks))
    return {**os.environ, "OMP_NUM_THREADS": threads, "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}


def throughput(root: Path, batches: str, steps: int) -> dict:
    policy = model_dir("smollm2", root)
    out: dict[str, float] = {}
    for label, flags, ranks in (("1 process", ["--strategy", "single"], 1), ("2 ranks", ["--strategy", "fsdp2"], 2)):
        with tempfile.TemporaryDirectory(dir=root) as ckpt:
            _, _, text = run_measured(train_cmd(batches, policy, Path(ckpt) / "c", flags + ["--save-every", "1000"],
                                                ranks, steps), env_for(ranks))
        summary = json.loads([line for line in text.splitlines() if line.startswith("{")][-1])  # --json
        out[label] = float(summary["tokens_per_s"])
        print(f"  {label:10s} {out[label]:8.0f} tokens/s (mean of {steps} steps)", flush=True)
    out["ratio"] = out["2 ranks"] / out["1 process"]
    return out


def publish_latency(root: Path, repeats: int) -> dict:
    import torch

    from arlctl.rl import distributed as dd
    from arlctl.rl.config import TrainConfig
    from arlctl.rl.trainer_state import TrainerState

    torch.set_num_threads(os.cpu_count() or 1)
    policy = model_dir("smollm2", root)
    cfg = TrainConfig(device="cpu")
    trainer = TrainerState.open(str(root / "pub"), None, {"step": 0}, policy, cfg, dd.Dist())
    # Give AdamW its state (as after a step), so a full checkpoint holds what it holds in a run.
    for p in trainer.master.parameters():
        p.grad = torch.zeros_like(p)
    trainer.optimizer.step()
    timings: dict[str, list[float]] = {"weights-only": [], "full": []}
    for i in range(repeats):
        for kind in ("weights-only", "full"):
            step = 2 * i + (kind == "full") + 1
            state = {"step": step, "consumed_batches": []}
            timings[kind].append(trainer.save(str(root / "pub"), state, full=kind == "full"))
    med = {k: statistics.median(v) for k, v in timings.items()}
    print(f"  weights-only {med['weights-only']:.2f}s  full {med['full']:.2f}s  "
          f"ratio {med['full'] / med['weights-only']:.1f}x (median of {repeats})", flush=True)
    return {**med, "ratio": med["full"] / med["weights-only"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2", help="comma-separated: smollm2, 0.5b")
    ap.add_argument("--parts", default="memory,throughput,publish,scale,pack",
                    help="memory, throughput, publish, scale (per-rank bytes/param at --ranks), pack (packed vs padded)")
    ap.add_argument("--ranks", default="1,2,4", help="world sizes of the scale part")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the pack part")
    ap.add_argument("--steps", type=int, default=3, help="steps for the tokens/s comparison")
    ap.add_argument("--repeats", type=int, default=3, help="saves per kind for the publish latency")
    ap.add_argument("--tokens-per-turn", type=int, default=24)
    ap.add_argument("--modes", default=DEFAULT_MODES, help=f"memory rows, comma-separated, of: {', '.join(MODES)}")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    parts = args.parts.split(",")
    root = Path(tempfile.mkdtemp(prefix="train-scale-"))
    result: dict = {}
    # Small batches (8 rows of ~60 tokens): the weights and optimizer state, not the activations, set the peak.
    batches = make_batches(root, max(args.steps, 1), groups=2, tokens_per_turn=args.tokens_per_turn, turns=2)
    if "memory" in parts:
        print("peak memory per parameter (one step + its checkpoint):")
        result["memory"] = memory(args.models.split(","), root, batches, args.modes.split(","))
    if "throughput" in parts:
        print("tokens/s, SmolLM2-135M:")
        result["throughput"] = throughput(root, batches, args.steps)
    if "publish" in parts:
        print("publish latency, SmolLM2-135M:")
        result["publish"] = publish_latency(root, args.repeats)
    if "scale" in parts:
        print("per-rank bytes/param, SmolLM2-135M (two packed steps, then a full checkpoint):")
        result["scale"] = scale(root, [int(n) for n in args.ranks.split(",")])
    if "pack" in parts:
        print("packed vs padded micro-batches, SmolLM2-135M, multi-turn length spread:")
        result["pack"] = packed_vs_padded(root, args.steps, args.rounds)
    if args.json:
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"done in {time.perf_counter() - start:.0f}s")
