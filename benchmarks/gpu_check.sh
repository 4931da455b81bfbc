#!/usr/bin/env bash
# One pass over what needs real NVIDIA GPUs, to run once on a lent machine (no network assumed). In the
# order it runs (the most wanted first, so that a short budget loses the least):
#   1. `arlctl doctor --check train`: the device, CUDA / NCCL and the fast paths train will use
#   2. the GPUs, the driver, torch / CUDA / NCCL versions, and which Python packages are missing
#   3. synthetic batch shards (a multi-turn length spread), read by every train run below
#   4. sharded loading and peak GPU memory per rank of `arlctl train --strategy fsdp2` under torchrun (one
#      rank per GPU) for a random-init ~1.5B-shaped Llama in bf16 safetensors, --pack on, a few steps:
#      the peak while TrainerState.open loads the shards and the peak through the steps, per rank, beside
#      `arlctl plan --model DIR --gpus N --gpu-mem G` (its per-rank load and step bytes vs the measured)
#   5. packed vs padded: the same run with --pack off; tokens/s, MFU and the ratio
#   6. part 4 for a ~7B-shaped Llama, cut to fewer decoder layers where the GPUs cannot hold a whole one
#      (GPU_CHECK_7B_LAYERS; default 8 layers a GPU, at most 32), its numbers scaled to 32 layers by the
#      plan's ratio of the whole model to the cut one
#   7. the distributed equivalence tests on NCCL (`pytest tests/distributed -m distributed -k nccl`)
#   8. bf16 FSDP2 throughput (tokens/s, MFU, peak memory) of a random-init SmolLM2-135M-shaped Llama
#   9. --compile smoke: part 8 again with --compile (did it run, dynamo's graphs, tokens/s vs eager)
#  10. part 8 for a ~0.5B Llama
# Parts 4-6 and 9 write no checkpoint (rank_main.py, below, replaces train's save: a 7B's fp32 weights and
# AdamW state would take minutes and tens of GB); parts 8 and 10 write one full checkpoint at the end.
# The summary goes to $OUT/gpu_check.txt (and stdout); each part's full log lies beside it. Every part runs
# under `timeout`, capped by what is left of GPU_CHECK_BUDGET_S (default 450 s), so the whole stays under
# 8 minutes; a part that fails, runs out of time or is skipped says so and the next one runs.
#
#   OUT=/tmp/gc bash benchmarks/gpu_check.sh
#   GPU_CHECK_SMOKE=1 OUT=/tmp/gc bash benchmarks/gpu_check.sh   # tiny shapes on CPU (gloo; ranks:
#                                    # GPU_CHECK_SMOKE_RANKS, default 2): tests this script without a GPU
# Knobs (environment): PEAK_BF16_FLOPS (per GPU, default 989e12: H100/H200 SXM dense bf16), MICRO_TOKENS
# (parts 8-10, default 16384), MEM_MICRO_TOKENS (parts 4-6 and the plan, default 8192), STEPS (parts 8-10:
# timed steps after one warm-up, default 5), MEM_STEPS (parts 4-6: steps in all, the first a warm-up,
# default 3), GROUPS_PER_GPU (default 8; 8 rows of ~1.1k tokens per group, so ~70k tokens per GPU per
# step), GPU_CHECK_7B_LAYERS.
#
# Python: .venv/bin/python when the checkout has one, else python3; nothing is installed or downloaded.
# A source tree that was never pip-installed still runs: a sitecustomize shim maps arlctl.stages and
# arlctl.schemas onto stages/ and schemas/ (what pyproject's package-dir does when pip installs it).
# Memory: each rank runs `arlctl train` in-process through a small wrapper (rank_main.py, written below)
# that wraps TrainerState.open to take torch.cuda.max_memory_allocated / max_memory_reserved after the
# load (then resets the peaks), takes them again at exit (the steps), and records what the sharded load
# read (sharded_load.LOAD_STATS), what the trainer holds at the end (memory_plan.held_bytes) and the
# process's peak RSS (the only memory figure without CUDA).
set -u

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 1
OUT=${OUT:-${TMPDIR:-/tmp}/gpu_check_out}
mkdir -p "$OUT"
REPORT=$OUT/gpu_check.txt
: >"$REPORT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
PLAN_PIDS=()
cleanup() {
    local pid
    for pid in "${PLAN_PIDS[@]}"; do kill "$pid" 2>/dev/null; done
    rm -rf "$WORK"
}
trap cleanup EXIT  # models, shards and checkpoints: gigabytes
SMOKE=${GPU_CHECK_SMOKE:-0}
BUDGET=${GPU_CHECK_BUDGET_S:-450}
START=$(date +%s)
PEAK=${PEAK_BF16_FLOPS:-989e12}
STEPS=${STEPS:-5}
MEM_STEPS=${MEM_STEPS:-3}
MICRO_TOKENS=${MICRO_TOKENS:-16384}
MEM_MICRO_TOKENS=${MEM_MICRO_TOKENS:-8192}
GROUPS_PER_GPU=${GROUPS_PER_GPU:-8}

say() { printf '%s\n' "$*" | tee -a "$REPORT"; }
section() { say ""; say "== $* =="; }
skip() { say "[$1] SKIPPED: $2"; }
# Seconds a part may take: what it asks for, capped by what is left of the budget (minus a margin).
cap() {
    local left=$((BUDGET - ($(date +%s) - START) - 10))
    if ((left < $1)); then echo $((left > 0 ? left : 0)); else echo "$1"; fi
}
# run_part NAME WANT_S CMD...: CMD under timeout, its output in $OUT/NAME.log; the tail goes to the report.
run_part() {
    local name=$1 want=$2 t rc
    shift 2
    t=$(cap "$want")
    if ((t < 15)); then
        say "[$name] SKIPPED: out of time (budget ${BUDGET}s)"
        return 124
    fi
    timeout -k 10 "$t" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    if ((rc == 124 || rc == 137)); then
        say "[$name] TIMED OUT after ${t}s; last lines of $name.log:"
    elif ((rc != 0)); then
        say "[$name] FAILED (exit $rc); last lines of $name.log:"
    fi
    if ((rc != 0)); then tail -n 25 "$OUT/$name.log" | sed 's/^/    /' | tee -a "$REPORT"; fi
    return "$rc"
}

say "arlctl gpu_check  $(date -u +%Y-%m-%dT%H:%M:%SZ)  host $(hostname)  budget ${BUDGET}s  smoke=$SMOKE"
if commit=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null); then
    say "repo $REPO  commit $commit, $(git -C "$REPO" status --porcelain | wc -l | tr -d ' ') files changed"
else
    say "repo $REPO (not a git checkout)"
fi

if [ -x "$REPO/.venv/bin/python" ]; then PY=$REPO/.venv/bin/python; else PY=$(command -v python3 || echo python3); fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export ARLCTL_HOME=$WORK/home PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
if [ "$SMOKE" = 1 ]; then
    export CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1
fi
SHIM_NOTE=""
if ! "$PY" -c 'import arlctl.stages.configs' >/dev/null 2>&1; then
    mkdir -p "$WORK/shim"
    cat >"$WORK/shim/sitecustomize.py" <<'EOF'
# gpu_check.sh: arlctl is not installed; make arlctl.stages / arlctl.schemas import from the source tree.
import os

try:
    import arlctl

    if os.environ.get("ARLCTL_SRC") and os.environ["ARLCTL_SRC"] not in arlctl.__path__:
        arlctl.__path__.append(os.environ["ARLCTL_SRC"])
except Exception:
    pass
EOF
    export PYTHONPATH=$WORK/shim:$PYTHONPATH ARLCTL_SRC=$REPO
    SHIM_NOTE="arlctl is not installed: importing it from $REPO through a sitecustomize shim"
fi

# ------------------------------------------------------------------------------- 1. doctor --check train
section "1. arlctl doctor --check train"
if run_part doctor 60 env COLUMNS=200 "$PY" -m arlctl.cli.main doctor --check train; then
    sed 's/^/  /' "$OUT/doctor.log" | tee -a "$REPORT"
fi

# ------------------------------------------------------------------------------------------ 2. the machine
section "2. machine"
say "python: $PY ($("$PY" --version 2>&1))"
if [ -n "$SHIM_NOTE" ]; then say "$SHIM_NOTE"; fi
GPU_MEM_GB=80
if [ "$SMOKE" = 1 ]; then
    NGPU=${GPU_CHECK_SMOKE_RANKS:-2}
    say "SMOKE mode: tiny shapes, $NGPU rank(s) on CPU (gloo); the numbers mean nothing; the plan is asked" \
        "for $GPU_MEM_GB GiB GPUs"
elif command -v nvidia-smi >/dev/null 2>&1; then
    timeout 30 nvidia-smi 2>&1 | tee -a "$REPORT"
    NGPU=$(timeout 30 nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    mib=$(timeout 30 nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 2>/dev/null | head -n 1)
    if [[ $mib =~ ^[0-9]+$ ]]; then GPU_MEM_GB=$(awk -v m="$mib" 'BEGIN { printf "%.1f", m / 1024 }'); fi
    say "GPUs: $NGPU ($GPU_MEM_GB GiB each: the plan's --gpu-mem)"
else
    NGPU=0
    say "nvidia-smi not found"
fi

# Packages: the ones arlctl imports, checked one by one so the report names every missing one.
timeout 120 "$PY" - <<'EOF' 2>&1 | tee -a "$REPORT"
import importlib
missing = []
for name in ("torch", "transformers", "safetensors", "accelerate", "pyarrow", "numpy", "fsspec", "duckdb",
             "typer", "rich", "yaml", "gguf", "aiohttp", "pytest"):
    try:
        mod = importlib.import_module(name)
        print(f"  {name:13s} {getattr(mod, '__version__', '?')}")
    except Exception as e:  # noqa: BLE001 - report anything
        missing.append(name)
        print(f"  {name:13s} MISSING ({type(e).__name__}: {e})")
print("missing packages: " + (", ".join(missing) if missing else "none"))
try:
    import torch
    print(f"torch {torch.__version__}  cuda {torch.version.cuda}  cuda available {torch.cuda.is_available()}  "
          f"devices {torch.cuda.device_count()}")
    if torch.cuda.is_available():
        print(f"nccl {'.'.join(map(str, torch.cuda.nccl.version()))}  bf16 {torch.cuda.is_bf16_supported()}")
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            print(f"  cuda:{i} {p.name}  {p.total_memory / 2**30:.1f} GiB  sm {p.major}.{p.minor}  "
                  f"{p.multi_processor_count} SMs")
except Exception as e:  # noqa: BLE001
    print(f"torch: {type(e).__name__}: {e}")
EOF

if ! "$PY" -c 'import torch, transformers' >/dev/null 2>&1; then
    say "STOP: '$PY -c \"import torch, transformers\"' fails; install them (no PyPI here) or provide a .venv."
    say "report: $REPORT"
    exit 1
fi
for module in arlctl.stages.train arlctl.stages.filter arlctl.cli.main; do
    if ! err=$(timeout 120 "$PY" -c "import $module" 2>&1); then
        say "import $module FAILED: $(printf '%s' "$err" | tail -n 1)"
    fi
done
if ((NGPU < 1)); then
    say "STOP: no GPU (run with GPU_CHECK_SMOKE=1 to test this script on CPU)"
    exit 1
fi

# ---------------------------------------------------------------------------------------- shapes, helpers
if [ "$SMOKE" = 1 ]; then
    SMALL_MODELS="tiny"  # parts 8-10: one tiny model; part 10 is then skipped
    STEPS=1 MICRO_TOKENS=1024 GROUPS_PER_GPU=1 MEM_STEPS=2 MEM_MICRO_TOKENS=1024
    TURNS=2 TOKENS_PER_TURN=48 GROUP_SIZE=2
    LAYERS_7B=${GPU_CHECK_7B_LAYERS:-2}  # the smoke "7B" has 4 layers: cut to 2 exercises the scaling
    FULL_LAYERS_7B=4
    COMPILE_SKIP=1
else
    SMALL_MODELS="smollm2-135m llama-0.5b"
    TURNS=4 TOKENS_PER_TURN=256 GROUP_SIZE=8
    FULL_LAYERS_7B=32
    LAYERS_7B=${GPU_CHECK_7B_LAYERS:-$((8 * NGPU < 32 ? 8 * NGPU : 32))}
    COMPILE_SKIP=2  # the first two steps pay the compile (and a recompile for dynamic shapes)
fi
if ((LAYERS_7B < 1 || LAYERS_7B > FULL_LAYERS_7B)); then LAYERS_7B=$FULL_LAYERS_7B; fi
export GPU_CHECK_7B_LAYERS=$LAYERS_7B
BATCH_GROUPS=$((GROUPS_PER_GPU * NGPU))
N_BATCHES=$((STEPS + 1 > MEM_STEPS ? STEPS + 1 : MEM_STEPS))
read -r SMALL_FIRST SMALL_SECOND <<<"$SMALL_MODELS"
SMALL_SECOND=${SMALL_SECOND:-}

cat >"$WORK/prep.py" <<'EOF'
"""Random-init HF Llama directories (config + safetensors, no tokenizer: train does not need one) and
synthetic batch shards, packed the way `arlctl filter` packs them.

  prep.py batches WORK N_BATCHES BATCH_GROUPS GROUP_SIZE TURNS TOKENS_PER_TURN
  prep.py model WORK NAME     # llama-7b: $GPU_CHECK_7B_LAYERS decoder layers (and WORK/models/llama-7b-full
                              # holds the whole model's config.json alone, for `arlctl plan`)
"""
import json
import os
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SMOKE = os.environ.get("GPU_CHECK_SMOKE") == "1"
VOCAB_IDS = 32000  # batch token ids stay below every model's vocabulary here (the synthetic ones reach 49152)
SHAPES = {  # hidden, layers, heads, kv heads, intermediate, vocab, tied embeddings, dtype of the files
    "smollm2-135m": (576, 30, 9, 3, 1536, 49152, True, "float32"),
    "llama-0.5b": (1024, 24, 16, 16, 4096, 49152, False, "float32"),
    "tiny": (64, 2, 4, 2, 128, 49152, True, "float32"),
    "llama-1.5b": (2048, 24, 16, 4, 5632, 32000, False, "bfloat16"),
    "llama-7b": (4096, 32, 32, 8, 11008, 32000, False, "bfloat16"),
}
if SMOKE:  # a few MB each (the vocabulary is most of it), the same head ratios
    SHAPES.update({"llama-1.5b": (64, 2, 4, 1, 176, 32000, False, "bfloat16"),
                   "llama-7b": (128, 4, 8, 2, 344, 32000, False, "bfloat16")})


def config_of(name, layers=None):
    hidden, full, heads, kv, inter, vocab, tied, _ = SHAPES[name]
    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers or full,
                       num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=inter,
                       max_position_embeddings=32768, tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2,
                       pad_token_id=2)


def write_model(work, name):
    hidden, full, heads, kv, inter, vocab, tied, dtype = SHAPES[name]
    layers = int(os.environ.get("GPU_CHECK_7B_LAYERS", full)) if name == "llama-7b" else full
    out = work / "models" / name
    started = time.perf_counter()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):  # random init is much faster on the GPU
        model = LlamaForCausalLM(config_of(name, layers))
    model = model.to(getattr(torch, dtype))
    params = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
    init_s = time.perf_counter() - started
    model.save_pretrained(out)
    del model
    files = sorted(out.glob("*.safetensors"))
    size = sum(f.stat().st_size for f in files)
    (out / "params.json").write_text(json.dumps({"params": params, "shape": SHAPES[name], "layers": layers,
                                                 "full_layers": full, "weights_bytes": size}))
    cut = f", cut to {layers} of {full} layers" if layers != full else ""
    print(f"model {name}: {params / 1e6:.1f}M parameters (hidden {hidden}, {layers} layers{cut}, {heads} heads, "
          f"{kv} kv heads, intermediate {inter}, vocab {vocab}, tied {tied}); {dtype} safetensors, "
          f"{size / 2**30:.2f} GiB in {len(files)} file(s); init {init_s:.1f} s + write "
          f"{time.perf_counter() - started - init_s:.1f} s")
    if layers != full:  # the whole model's config alone: what `arlctl plan --model` needs
        config_of(name).save_pretrained(work / "models" / f"{name}-full")
        with torch.device("meta"):
            whole = sum(p.numel() for p in LlamaForCausalLM(config_of(name)).parameters())
        print(f"model {name}-full: config only, {whole / 1e6:.1f}M parameters at {full} layers")


def write_batches(work, n_batches, batch_groups, group_size, turns, tokens_per_turn):
    import numpy as np
    import pyarrow as pa

    from arlctl.io.shards import Lineage, write_shard
    from arlctl.stages.configs import FilterConfig
    from arlctl.stages.filter import pack_batches
    from arlctl.synthetic import synthetic_table

    table = synthetic_table(n_batches * batch_groups, group_size=group_size, seed=0, mean_turns=turns,
                            tokens_per_turn=tokens_per_turn)
    rewards = pa.array([float(i % 2) for i in range(table.num_rows)], pa.float32())  # variance in every group
    table = table.set_column(table.schema.get_field_index("reward"), table.schema.field("reward"), rewards)
    for column in ("prompt_ids", "response_ids"):  # a row with an id past the vocabulary is dropped by train
        field = table.schema.field(column)
        ids = table.column(column).combine_chunks()
        offsets = ids.offsets.to_numpy()
        values = ids.values.to_numpy()[offsets[0]:offsets[-1]] % VOCAB_IDS
        remapped = pa.ListArray.from_arrays(pa.array(offsets - offsets[0], pa.int32()),
                                            pa.array(values, pa.int32()), type=field.type)
        table = table.set_column(table.schema.get_field_index(column), field, remapped)
    batches, _ = pack_batches(table, np.ones(table.num_rows), FilterConfig(batch_groups=batch_groups))
    tokens, lengths = [], []
    for i, batch in enumerate(batches):
        write_shard(batch, str(work / "batches" / f"batch-{i:06d}.parquet"), Lineage("filter"))
        rows = batch.column("prompt_tokens").to_numpy() + batch.column("response_tokens").to_numpy()
        tokens.append(int(rows.sum()))
        lengths.extend(rows.tolist())
    lengths = np.array(lengths)
    print(f"{len(batches)} batch shards of {batches[0].num_rows} rows, {np.mean(tokens):.0f} tokens each; "
          f"row tokens: mean {lengths.mean():.0f}, p10 {np.percentile(lengths, 10):.0f}, "
          f"p90 {np.percentile(lengths, 90):.0f}, min {lengths.min()}, max {lengths.max()} "
          f"(ids taken mod {VOCAB_IDS})")


what, work = sys.argv[1], Path(sys.argv[2])
if what == "model":
    write_model(work, sys.argv[3])
else:
    write_batches(work, *map(int, sys.argv[3:8]))
EOF

cat >"$WORK/rank_main.py" <<'EOF'
"""One torchrun rank: `arlctl train` in this process (the CLI; the stage API if the CLI cannot import), then
this rank's memory into $GPU_CHECK_MEM_DIR/rank-R.json: the CUDA peaks while TrainerState.open loads the
model (wrapped here; the peaks are reset after it) apart from the peaks through the steps (taken at exit),
what the sharded load read, what the trainer holds at the end, the process's peak RSS, and how many graphs
dynamo compiled. GPU_CHECK_NO_SAVE=1: no checkpoint is written (train's _save is replaced here)."""
import atexit
import json
import os
import resource
import sys
import time

RECORD: dict = {}
KEEP: dict = {}


def _rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _cuda():
    import torch

    return torch if torch.cuda.is_available() and torch.cuda.is_initialized() else None


def _wrap_open() -> None:
    from arlctl.rl import trainer_state

    cls = trainer_state.TrainerState
    original = cls.__dict__["open"].__func__

    def open_(klass, *args, **kwargs):
        started = time.perf_counter()
        trainer = original(klass, *args, **kwargs)
        torch = _cuda()
        if torch is not None:
            torch.cuda.synchronize()
            free, total = torch.cuda.mem_get_info()
            RECORD.update(load_max_allocated=torch.cuda.max_memory_allocated(),
                          load_max_reserved=torch.cuda.max_memory_reserved(),
                          after_load_allocated=torch.cuda.memory_allocated(), after_load_device_used=total - free)
            torch.cuda.reset_peak_memory_stats()  # from here on: the steps
        RECORD.update(load_s=time.perf_counter() - started, load_rss=_rss())
        try:
            from arlctl.rl.sharded_load import LOAD_STATS

            RECORD["load_stats"] = dict(LOAD_STATS)
        except Exception:  # noqa: BLE001
            pass
        KEEP["trainer"] = trainer
        return trainer

    cls.open = classmethod(open_)


def _record() -> None:
    rec = dict(RECORD, rss_max=_rss())
    try:
        torch = _cuda()
        if torch is not None:
            free, total = torch.cuda.mem_get_info()
            rec.update(max_allocated=torch.cuda.max_memory_allocated(), max_reserved=torch.cuda.max_memory_reserved(),
                       device=torch.cuda.get_device_name(), device_used=total - free)
    except Exception as e:  # noqa: BLE001
        rec["cuda_error"] = repr(e)
    if KEEP.get("trainer") is not None:
        try:
            from arlctl.rl.memory_plan import held_bytes

            rec["held"] = held_bytes(KEEP["trainer"])
        except Exception as e:  # noqa: BLE001
            rec["held_error"] = repr(e)
    if "torch._dynamo" in sys.modules:
        from torch._dynamo.utils import counters

        rec["dynamo_graphs"] = int(counters["stats"]["unique_graphs"])
    path = os.path.join(os.environ["GPU_CHECK_MEM_DIR"], f"rank-{os.environ.get('RANK', '0')}.json")
    with open(path, "w") as f:
        json.dump(rec, f)


atexit.register(_record)
try:
    _wrap_open()
except Exception as e:  # noqa: BLE001 - the run goes on; its load and steps are then not told apart
    print(f"rank_main: could not wrap TrainerState.open ({e!r}): one peak for the whole run", file=sys.stderr)
if os.environ.get("GPU_CHECK_NO_SAVE") == "1":
    from arlctl.stages import train as _stage

    _stage._save = lambda *args, **kwargs: 0.0
spec = json.loads(sys.argv[1])
try:
    from arlctl.cli.main import main
except ImportError as e:  # a package only some other command needs is missing: call the stage itself
    print(f"arlctl.cli.main does not import ({e}); calling arlctl.stages.train.train", file=sys.stderr)
    from arlctl.rl.config import TrainConfig
    from arlctl.stages.train import train

    run = spec["run"]
    summary = train(f"{run}/batches", spec["policy"], f"{run}/checkpoints", TrainConfig(**spec["settings"]),
                    metrics_url=f"{run}/metrics")
    print(json.dumps({k: v for k, v in summary.items() if k != "bad_value_events"}, default=str))
else:
    sys.argv = ["arlctl", "train", "--run", spec["run"], "--policy", spec["policy"], "--json"]
    for key, value in spec["settings"].items():
        flag = f"--{key.replace('_', '-')}"
        if value is True:
            sys.argv.append(flag)
        elif value is not False:
            sys.argv += [flag, str(value)]
    print("rank_main: " + " ".join(sys.argv), file=sys.stderr)
    main()
EOF

cat >"$WORK/report.py" <<'EOF'
"""One run's numbers: tokens/s and MFU from the metrics rank 0 wrote (after --skip warm-up steps), train's
--json line, each rank's memory (rank_main.py's files), and beside them what `arlctl plan --model --json`
predicted for the fsdp2-bf16 mode (--plan; --plan-full: the whole model a cut one stands for, whose
measured peaks are scaled by the plan's ratio of the two). Writes RUN/summary.json for the comparisons."""
import argparse
import glob
import json
import os

import pyarrow.parquet as pq

GiB = 2**30
ap = argparse.ArgumentParser()
ap.add_argument("run")
ap.add_argument("model_dir")
ap.add_argument("log")
ap.add_argument("ngpu", type=int)
ap.add_argument("peak", type=float)
ap.add_argument("--skip", type=int, default=1)
ap.add_argument("--plan")
ap.add_argument("--plan-full")
a = ap.parse_args()
info = json.load(open(f"{a.model_dir}/params.json"))
params = info["params"]
rows = sorted((pq.read_table(f).to_pylist()[0] for f in glob.glob(f"{a.run}/metrics/train-step-*.parquet")),
              key=lambda r: r["step"])
summary = None
for line in open(a.log, errors="replace"):  # train --json: one line (a "[rankN]:" prefix may lead)
    if '{"' in line:
        try:
            summary = json.loads(line[line.index('{"'):])
            break
        except ValueError:
            pass
print(f"  params {params / 1e6:.1f}M  steps written {len(rows)}  world_size "
      f"{summary.get('world_size') if summary else '?'}  packing {summary.get('packing') if summary else '?'}  "
      f"final save {summary.get('save_s') if summary else '?'} s")
out = {"params": params, "steps": len(rows), "packing": summary.get("packing") if summary else None}
timed = rows[a.skip:]  # the first step(s): the warm-up (CUDA context, allocator, kernels, the packing probe)
if timed:
    tokens = sum(r["seq_tokens"] for r in timed)
    forward = sum(r.get("forward_tokens") or 0 for r in timed)
    seconds = sum(r["step_time_s"] for r in timed)
    tps = tokens / seconds
    mfu = 6 * params * tps / (a.peak * a.ngpu)
    print(f"  tokens/s {tps:,.0f} over {len(timed)} steps after {a.skip} warm-up ({tokens / len(timed):,.0f} tokens, "
          f"{seconds / len(timed):.2f} s per step; every step's s: {[round(r['step_time_s'], 2) for r in rows]})")
    print(f"  tokens/s per GPU {tps / a.ngpu:,.0f}   MFU {mfu:.1%}  (6 x params x tokens/s / ({a.peak:.3g} x {a.ngpu}))")
    padding = 1 - tokens / forward if forward else None
    if forward:
        print(f"  forwarded {forward / len(timed):,.0f} tokens a step ({padding:.0%} padding) in "
              f"{sum(r['micro_batches'] for r in timed) / len(timed):.1f} micro-batches; packed "
              f"{bool(timed[0].get('packed'))}")
    # Synthetic behaviour log-probs are far from a random model's, so most tokens are clipped and the
    # gradient is tiny: these numbers only show that the steps ran, not that anything learns.
    print(f"  loss {[round(r['loss'], 4) for r in rows]}  grad_norm {[float('%.3g' % r['grad_norm']) for r in rows]}")
    out.update(tokens_per_s=tps, mfu=mfu, padding=padding, timed_steps=len(timed),
               step_time_s=[r["step_time_s"] for r in rows])
else:
    print(f"  no timed step: the metrics hold {len(rows)} steps and the first {a.skip} are the warm-up")
if summary:
    print(f"  train --json tokens_per_s (mean over every step, warm-up included) {summary.get('tokens_per_s')}")

mems = []
for f in sorted(glob.glob(f"{a.run}/memory/rank-*.json"), key=lambda f: int(f.rsplit("-", 1)[1][:-5])):
    m = json.load(open(f))
    m["rank"] = f.rsplit("/", 1)[1][:-5]
    mems.append(m)
weights_bytes = info.get("weights_bytes") or sum(os.path.getsize(f) for f in glob.glob(f"{a.model_dir}/*.safetensors"))
cuda = any("max_allocated" in m for m in mems)
for m in mems:  # one line a rank
    r, stats, h = m["rank"], m.get("load_stats") or {}, m.get("held")
    read = (f"; read {stats['bytes_read'] / GiB:.3f} of {weights_bytes / GiB:.3f} GiB of weights "
            f"({stats['bytes_read'] / weights_bytes:.0%}, 1/{a.ngpu} = {1 / a.ngpu:.0%})") if stats.get("bytes_read") else ""
    held = (f"; held at the end: weights {h['weights'] / GiB:.2f} GiB, grads {h['grads'] / GiB:.2f}, AdamW "
            f"{h['optimizer'] / GiB:.2f}") if h else ""
    graphs = f"; dynamo compiled {m['dynamo_graphs']} graph(s)" if m.get("dynamo_graphs") else ""
    if "max_allocated" in m and "load_max_allocated" in m:
        print(f"  {r}: load {m['load_s']:.1f} s, peak allocated {m['load_max_allocated'] / GiB:.2f} GiB (reserved "
              f"{m['load_max_reserved'] / GiB:.2f}), then held {m['after_load_allocated'] / GiB:.2f}{read}; steps: peak "
              f"allocated {m['max_allocated'] / GiB:.2f} GiB (reserved {m['max_reserved'] / GiB:.2f}; device used at "
              f"exit {m['device_used'] / GiB:.2f}){held}{graphs}")
    elif "max_allocated" in m:  # the wrapper could not tell the load from the steps
        print(f"  {r}: whole run: peak allocated {m['max_allocated'] / GiB:.2f} GiB (reserved "
              f"{m['max_reserved'] / GiB:.2f}){read}{held}{graphs}")
    else:
        load = f" ({m['load_rss'] / GiB:.2f} by the end of the {m['load_s']:.1f} s load)" if "load_rss" in m else ""
        print(f"  {r}: no CUDA, GPU peaks not measured: peak RSS {m['rss_max'] / GiB:.2f} GiB{load}{read}{held}{graphs}")
if mems and "device" in mems[0]:
    print(f"  (ranks on {mems[0]['device']}; peaks: torch.cuda.max_memory_allocated / max_memory_reserved)")
if mems:
    out["dynamo_graphs"] = mems[0].get("dynamo_graphs")
else:
    print("  no rank wrote its memory file (rank_main.py's exit hook did not run)")


def mode_of(path):
    if not path or not os.path.isfile(path):
        return None, None
    try:
        plan = json.load(open(path))
    except ValueError:
        return None, None
    return plan, next((m for m in plan["modes"] if m["mode"] == "fsdp2-bf16"), None)


plan, mode = mode_of(a.plan)
if a.plan and mode is None:
    print(f"  plan: no fsdp2-bf16 row in {a.plan} (see the plan's log)")
if mode:
    act = mode["activations_per_token"] * mode["micro_tokens"]
    print(f"  plan fsdp2-bf16 per rank ({plan['gpus']} x {plan['gpu_mem_gb']:g} GiB, --micro-tokens "
          f"{plan['micro_tokens']}): load {mode['load_peak'] / GiB:.2f} GiB, step peak {mode['step_peak'] / GiB:.2f} "
          f"(state {mode['state'] / GiB:.2f}: weights {mode['weights'] / GiB:.2f} + grads {mode['grads'] / GiB:.2f} "
          f"+ AdamW {mode['optimizer'] / GiB:.2f}; gathered layers + a layer's grads {mode['transient'] / GiB:.2f}; "
          f"activations {act / GiB:.2f}); trains {mode['trains']}, loads {mode['loads']}")
    if plan["gpus"] == 1:
        print("  (on one rank the plan counts no gathered layers: it takes --strategy auto, single there; this run "
              "is fsdp2 on one rank, which still gathers each layer in bf16)")
    if cuda and all("load_max_allocated" in m for m in mems):
        load = max(m["load_max_allocated"] for m in mems)
        step = max(m["max_allocated"] for m in mems)
        reserved = max(max(m["load_max_reserved"], m["max_reserved"]) for m in mems)
        print(f"  measured (the most of any rank) vs plan: load {load / GiB:.2f} vs {mode['load_peak'] / GiB:.2f} GiB "
              f"({load / mode['load_peak']:.2f}x); steps {step / GiB:.2f} vs {mode['step_peak'] / GiB:.2f} GiB "
              f"({step / mode['step_peak']:.2f}x); peak reserved {reserved / GiB:.2f} GiB + the plan's {plan['reserve_gb']:g} GiB "
              f"reserve <= {plan['gpu_mem_gb']:g} GiB: {reserved / GiB + plan['reserve_gb'] <= plan['gpu_mem_gb']}")
        out.update(measured_load=load, measured_step=step, plan_load=mode["load_peak"], plan_step=mode["step_peak"])
        held = [m["held"] for m in mems if m.get("held")]
        if held:
            w = max(h["weights"] for h in held)
            o = max(h["optimizer"] for h in held)
            print(f"  held at the end (most of any rank) vs plan: weights {w / GiB:.2f} vs {mode['weights'] / GiB:.2f} GiB, "
                  f"AdamW {o / GiB:.2f} vs {mode['optimizer'] / GiB:.2f} GiB")
    elif not cuda:
        print("  measured vs plan: skipped: no CUDA (the RSS above holds the CPU copies, not comparable)")
    full_plan, full = mode_of(a.plan_full)
    if a.plan_full and full is None:
        print(f"  plan for the whole model: none in {a.plan_full} (see its log)")
    if full:
        layers, whole = info.get("layers"), info.get("full_layers")
        ratio_step, ratio_load = full["step_peak"] / mode["step_peak"], full["load_peak"] / mode["load_peak"]
        print(f"  whole model ({whole} layers, {full_plan['model']['params'] / 1e9:.2f}B params), plan fsdp2-bf16 per "
              f"rank: load {full['load_peak'] / GiB:.2f} GiB, step peak {full['step_peak'] / GiB:.2f} (state "
              f"{full['state'] / GiB:.2f}, activations {full['activations_per_token'] * full['micro_tokens'] / GiB:.2f});"
              f" trains {full['trains']}, loads {full['loads']} on {full_plan['gpus']} x {full_plan['gpu_mem_gb']:g} GiB")
        per_layer = (full["step_peak"] - mode["step_peak"]) / (whole - layers) if whole != layers else 0.0
        print(f"  plan per decoder layer: {per_layer / GiB:.3f} GiB a rank at the step")
        if "measured_step" not in out:
            print(f"  measured peaks scaled to {whole} layers: skipped: no CUDA measurement")
        else:
            print(f"  measured {layers}-layer peaks scaled to {whole} layers by the plan's ratio: load "
                  f"{out['measured_load'] * ratio_load / GiB:.2f} GiB (x{ratio_load:.2f}), steps "
                  f"{out['measured_step'] * ratio_step / GiB:.2f} GiB (x{ratio_step:.2f}): an estimate, not a measurement")
json.dump(out, open(f"{a.run}/summary.json", "w"))
EOF

cat >"$WORK/compare.py" <<'EOF'
"""Two runs' summary.json (report.py): packed vs padded, or compiled vs eager."""
import json
import sys

kind, first, second = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
if not first.get("tokens_per_s") or not second.get("tokens_per_s"):
    print(f"  {kind}: skipped: a run has no timed step")
    sys.exit(0)
ratio = first["tokens_per_s"] / second["tokens_per_s"]
if kind == "pack":
    pad = second.get("padding")
    print(f"  packed {first['tokens_per_s']:,.0f} tokens/s (MFU {first['mfu']:.1%}, {first['packing']}) vs padded "
          f"{second['tokens_per_s']:,.0f} tokens/s (MFU {second['mfu']:.1%}, {second['packing']})"
          + (f"; the padded run forwarded {pad:.0%} padding" if pad is not None else ""))
    print(f"  packed / padded tokens/s: {ratio:.2f}x")
else:
    graphs = first.get("dynamo_graphs")
    print(f"  --compile ran {first['steps']} steps, dynamo graphs {graphs if graphs is not None else 'none'}"
          f" ({'compiled' if graphs else 'NOTHING COMPILED'}): {first['tokens_per_s']:,.0f} tokens/s (MFU "
          f"{first['mfu']:.1%}) vs eager {second['tokens_per_s']:,.0f} (MFU {second['mfu']:.1%}): compiled / eager "
          f"{ratio:.2f}x; steps' s compiled {[round(s, 2) for s in first['step_time_s']]}, eager "
          f"{[round(s, 2) for s in second['step_time_s']]}")
EOF

# prep_model NAME: write the random model (prep.py model); its line goes to the report.
prep_model() {
    if run_part "prep-$1" "$2" "$PY" "$WORK/prep.py" model "$WORK" "$1"; then
        grep -E '^model' "$OUT/prep-$1.log" | sed 's/^/  /' | tee -a "$REPORT"
        return 0
    fi
    return 1
}
# plan_bg NAME DIR: `arlctl plan --model DIR` (text into $OUT/plan-NAME.txt, --json into $WORK) in the
# background, beside a train run (it builds the model on the meta device: CPU only).
plan_bg() {
    local args=(plan --model "$2" --gpus "$NGPU" --gpu-mem "$GPU_MEM_GB" --micro-tokens "$MEM_MICRO_TOKENS")
    (
        timeout 120 env COLUMNS=100 "$PY" -m arlctl.cli.main "${args[@]}" >"$OUT/plan-$1.txt" 2>&1
        timeout 120 "$PY" -m arlctl.cli.main "${args[@]}" --json >"$WORK/plan-$1.json" 2>>"$OUT/plan-$1.txt"
    ) &
    PLAN_PIDS+=("$!")
}
plan_show() {  # plan_show NAME DIR [brief]: wait for the plans, then NAME's table into the report
    local pid
    for pid in "${PLAN_PIDS[@]}"; do wait "$pid" 2>/dev/null; done
    PLAN_PIDS=()
    say "  arlctl plan --model $2 --gpus $NGPU --gpu-mem $GPU_MEM_GB --micro-tokens $MEM_MICRO_TOKENS:"
    if [ "${3:-}" = brief ]; then  # the legend once (part 4) is enough
        sed -e '/^state: /,/that trains *$/d' -e 's/^/    /' "$OUT/plan-$1.txt" | tee -a "$REPORT"
    else
        sed 's/^/    /' "$OUT/plan-$1.txt" | tee -a "$REPORT"
    fi
}
# train_run LABEL MODEL WANT_S NO_SAVE SETTINGS: `arlctl train` under torchrun, one rank per GPU, into
# $WORK/run-LABEL (log $OUT/train-LABEL.log); SETTINGS: JSON members beside strategy fsdp2 and bf16.
train_run() {
    local label=$1 model=$2 want=$3 nosave=$4 run=$WORK/run-$1 settings spec flags rc
    rm -rf "$run"
    mkdir -p "$run/memory"
    ln -s "$WORK/batches" "$run/batches"
    settings="{\"strategy\": \"fsdp2\", \"precision\": \"bf16\", \"save_every\": 1000, \"lr\": 1e-6, $5}"
    spec="{\"run\": \"$run\", \"policy\": \"$WORK/models/$model\", \"settings\": $settings}"
    flags=$("$PY" -c 'import json, sys
print(" ".join(f"--{k.replace(chr(95), chr(45))}" + ("" if v is True else f" {v}") for k, v in json.loads(sys.argv[1]).items()))' "$settings")
    if [ "$nosave" = 1 ]; then flags+=" --json (no checkpoint: rank_main.py skips train's saves)"
    else flags+=" --json (one full checkpoint at the end)"; fi
    say "[$label] $NGPU rank(s): arlctl train $flags"
    export GPU_CHECK_MEM_DIR=$run/memory GPU_CHECK_NO_SAVE=$nosave
    run_part "train-$label" "$want" "$PY" -m torch.distributed.run --standalone --nproc-per-node "$NGPU" \
        "$WORK/rank_main.py" "$spec"
    rc=$?
    rm -rf "$run/checkpoints"  # keep the disk free for the next model
    return "$rc"
}
# run_report LABEL MODEL [report.py options]: the run's numbers (also after a timeout: the steps so far).
run_report() {
    local label=$1 run=$WORK/run-$1 model=$2
    shift 2
    if compgen -G "$run/metrics/train-step-*.parquet" >/dev/null; then
        timeout 60 "$PY" "$WORK/report.py" "$run" "$WORK/models/$model" "$OUT/train-$label.log" \
            "$NGPU" "$PEAK" "$@" 2>&1 | tee -a "$REPORT"
    else
        say "  [$label] no step was written: no numbers"
    fi
}

# ----------------------------------------------------------------------------------------- 3. batch shards
section "3. batch shards (read by every train run below)"
say "$N_BATCHES batches of $BATCH_GROUPS groups x $GROUP_SIZE rows (~$TURNS turns x $TOKENS_PER_TURN tokens: Poisson" \
    "turns, gamma tokens a turn: a multi-turn length spread)"
say "MFU below assumes a bf16 dense peak of $PEAK FLOP/s per GPU (H100/H200 SXM; set PEAK_BF16_FLOPS otherwise)"
say "and 6 x params FLOPs per token (attention FLOPs not counted; the LM head runs only on trained tokens, so"
say "6N somewhat overcounts for env/prompt tokens)"
BATCHES_OK=0
if run_part prep-batches 90 "$PY" "$WORK/prep.py" batches "$WORK" "$N_BATCHES" "$BATCH_GROUPS" "$GROUP_SIZE" \
    "$TURNS" "$TOKENS_PER_TURN"; then
    grep -E '^[0-9]+ batch shards' "$OUT/prep-batches.log" | sed 's/^/  /' | tee -a "$REPORT"
    BATCHES_OK=1
fi
MEM_SETTINGS="\"micro_tokens\": $MEM_MICRO_TOKENS, \"max_steps\": $MEM_STEPS"

# ------------------------------------------------------------------ 4. sharded load + peak memory: 1.5B
section "4. sharded load and peak GPU memory per rank: llama-1.5b, bf16 FSDP2, $NGPU rank(s), --pack on"
if [ "$BATCHES_OK" != 1 ]; then
    skip mem-llama-1.5b "no batch shards (part 3)"
elif prep_model llama-1.5b 150; then
    plan_bg llama-1.5b "$WORK/models/llama-1.5b"
    if ! train_run mem-llama-1.5b llama-1.5b 180 1 "$MEM_SETTINGS, \"pack\": \"on\"" &&
        grep -q 'cannot pack' "$OUT/train-mem-llama-1.5b.log"; then  # the finding; the memory still counts
        say "  --pack on refused the model (above): the memory run again with --pack off; part 5 is then skipped"
        train_run mem-llama-1.5b llama-1.5b 180 1 "$MEM_SETTINGS, \"pack\": \"off\""
        rm -f "$WORK/run-mem-llama-1.5b/packed"
    else
        touch "$WORK/run-mem-llama-1.5b/packed"
    fi
    plan_show llama-1.5b "$WORK/models/llama-1.5b"
    run_report mem-llama-1.5b llama-1.5b --plan "$WORK/plan-llama-1.5b.json"
else
    skip mem-llama-1.5b "the model was not written"
fi

# -------------------------------------------------------------------------- 5. packed vs padded: 1.5B
section "5. packed vs padded tokens/s and MFU: llama-1.5b, bf16 FSDP2, $NGPU rank(s)"
if [ ! -f "$WORK/run-mem-llama-1.5b/summary.json" ] || [ ! -f "$WORK/run-mem-llama-1.5b/packed" ]; then
    skip pad-llama-1.5b "part 4 left no packed numbers (its run failed, ran out of time or could not pack)"
else
    say "packed: part 4's run (--pack on); padded: the same with --pack off (micro-batches of rows x the longest" \
        "row <= --micro-tokens $MEM_MICRO_TOKENS)"
    train_run pad-llama-1.5b llama-1.5b 180 1 "$MEM_SETTINGS, \"pack\": \"off\""
    run_report pad-llama-1.5b llama-1.5b
    if [ -f "$WORK/run-pad-llama-1.5b/summary.json" ]; then
        timeout 60 "$PY" "$WORK/compare.py" pack "$WORK/run-mem-llama-1.5b/summary.json" \
            "$WORK/run-pad-llama-1.5b/summary.json" 2>&1 | tee -a "$REPORT"
    else
        say "  packed / padded: skipped: the padded run has no numbers"
    fi
fi
rm -rf "$WORK/models/llama-1.5b"  # disk for the 7B

# -------------------------------------------------------------------- 6. sharded load + peak memory: 7B
section "6. sharded load and peak GPU memory per rank: llama-7b ($LAYERS_7B of $FULL_LAYERS_7B layers), bf16" \
    "FSDP2, $NGPU rank(s), --pack on"
if ((LAYERS_7B < FULL_LAYERS_7B)); then
    say "cut to $LAYERS_7B of $FULL_LAYERS_7B decoder layers (GPU_CHECK_7B_LAYERS; default 8 a GPU): a whole 7B holds" \
        "~16 bytes a parameter of fp32 weights, grads and AdamW (~95 GB over the ranks) besides its activations," \
        "and its write and load would take much of the budget; the measured peaks are scaled to $FULL_LAYERS_7B" \
        "layers by the plan's ratio of the whole model to the cut one"
fi
if [ "$BATCHES_OK" != 1 ]; then
    skip mem-llama-7b "no batch shards (part 3)"
elif prep_model llama-7b 180; then
    plan_bg llama-7b "$WORK/models/llama-7b"
    full_args=()
    if [ -f "$WORK/models/llama-7b-full/config.json" ]; then
        plan_bg llama-7b-full "$WORK/models/llama-7b-full"
        full_args=(--plan-full "$WORK/plan-llama-7b-full.json")
    fi
    train_run mem-llama-7b llama-7b 200 1 "$MEM_SETTINGS, \"pack\": \"on\""
    plan_show llama-7b "$WORK/models/llama-7b" brief
    if ((${#full_args[@]})); then
        say "  and for the whole model's config ($FULL_LAYERS_7B layers):"
        sed -e '/^state: /,/that trains *$/d' -e 's/^/    /' "$OUT/plan-llama-7b-full.txt" | tee -a "$REPORT"
    fi
    run_report mem-llama-7b llama-7b --plan "$WORK/plan-llama-7b.json" "${full_args[@]}"
else
    skip mem-llama-7b "the model was not written"
fi
rm -rf "$WORK/models/llama-7b"

# ------------------------------------------------------------------------- 7. distributed tests on NCCL
section "7. tests/distributed on NCCL"
if [ "$SMOKE" = 1 ]; then
    say "SMOKE mode: no CUDA, so the NCCL tests would skip: collected only (checks that -k nccl selects them)"
    if run_part pytest-nccl 90 "$PY" -m pytest tests/distributed -q -p no:cacheprovider -m distributed -k nccl \
        --collect-only -n 0; then
        grep -E '::|collected|selected' "$OUT/pytest-nccl.log" | sed 's/^/  /' | tee -a "$REPORT"
    fi
else
    if ((NGPU == 1)); then
        say "one GPU: an NCCL world here has one rank per GPU, so only 1-rank NCCL runs are possible"
    fi
    # -m distributed: pyproject's addopts deselect the distributed tier by default.
    run_part pytest-nccl 150 "$PY" -m pytest tests/distributed -q -p no:cacheprovider -m distributed -k nccl -rA
    rc=$?
    if ((rc == 0)); then
        grep -E '^(PASSED|SKIPPED|XFAIL)|passed|skipped' "$OUT/pytest-nccl.log" | sed 's/^/  /' | tee -a "$REPORT"
    elif ((rc == 5)); then
        say "exit 5 means no test in tests/distributed matched -k nccl: nothing ran"
    fi
fi

# ---------------------------------------------------------------------------- 8-10. train throughput
throughput() {  # throughput MODEL PART: part 8 / 10
    section "$2. arlctl train throughput: $1, bf16 FSDP2, $NGPU rank(s)"
    say "$N_BATCHES batches (all of part 3's); --micro-tokens $MICRO_TOKENS; the first step is the warm-up"
    if [ "$BATCHES_OK" != 1 ]; then
        skip "train-$1" "no batch shards (part 3)"
        return 1
    fi
    if ! prep_model "$1" 120; then
        skip "train-$1" "the model was not written"
        return 1
    fi
    train_run "$1" "$1" 200 0 "\"micro_tokens\": $MICRO_TOKENS"
    run_report "$1" "$1"
    [ -f "$WORK/run-$1/summary.json" ]
}
if throughput "$SMALL_FIRST" 8; then EAGER_OK=1; else EAGER_OK=0; fi

section "9. --compile smoke: $SMALL_FIRST, bf16 FSDP2, $NGPU rank(s), vs part 8's eager run"
if [ "$EAGER_OK" != 1 ]; then
    skip "train-compile-$SMALL_FIRST" "part 8's eager run has no numbers"
else
    say "torch.compile of each decoder layer (dynamic shapes); tokens/s after $COMPILE_SKIP warm-up step(s) (they pay" \
        "the compile)"
    train_run "compile-$SMALL_FIRST" "$SMALL_FIRST" 200 1 "\"micro_tokens\": $MICRO_TOKENS, \"compile\": true"
    run_report "compile-$SMALL_FIRST" "$SMALL_FIRST" --skip "$COMPILE_SKIP"
    if [ -f "$WORK/run-compile-$SMALL_FIRST/summary.json" ]; then
        timeout 60 "$PY" "$WORK/compare.py" compile "$WORK/run-compile-$SMALL_FIRST/summary.json" \
            "$WORK/run-$SMALL_FIRST/summary.json" 2>&1 | tee -a "$REPORT"
    else
        say "  compiled vs eager: skipped: the compiled run has no numbers"
    fi
fi

if [ -n "$SMALL_SECOND" ]; then
    throughput "$SMALL_SECOND" 10
else
    section "10. arlctl train throughput: a second model"
    skip train-second "SMOKE mode: one tiny model (part 8)"
fi

say ""
say "done in $(($(date +%s) - START)) s; report $REPORT, logs in $OUT"
