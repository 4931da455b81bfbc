#!/usr/bin/env bash
# One pass over what needs real NVIDIA GPUs, to run once on a lent machine (no network assumed):
#   a. the GPUs, the driver, torch / CUDA / NCCL versions, and which Python packages are missing
#   b. bf16 FSDP2 throughput of `arlctl train` under torchrun (one rank per GPU) on synthetic batch shards,
#      for a random-init SmolLM2-135M-shaped Llama and a ~0.5B Llama: tokens/s, MFU, peak GPU memory
#   c. the distributed equivalence tests on NCCL (`pytest tests/distributed -m distributed -k nccl`)
# The summary goes to $OUT/gpu_check.txt (and stdout); each part's full log lies beside it. Every part runs
# under `timeout`, capped by what is left of GPU_CHECK_BUDGET_S (default 450 s), so the whole stays under
# 8 minutes; a part that fails or runs out of time says so and the next one runs.
#
#   OUT=/tmp/gc bash benchmarks/gpu_check.sh
#   GPU_CHECK_SMOKE=1 OUT=/tmp/gc bash benchmarks/gpu_check.sh   # tiny shapes on CPU (gloo; ranks:
#                                    # GPU_CHECK_SMOKE_RANKS, default 2): tests this script without a GPU
# Knobs (environment): PEAK_BF16_FLOPS (per GPU, default 989e12: H100/H200 SXM dense bf16), MICRO_TOKENS
# (default 16384), STEPS (timed steps after one warm-up, default 5), GROUPS_PER_GPU (default 8; 8 rows of
# ~1.1k tokens per group, so ~70k tokens per GPU per step).
#
# Python: .venv/bin/python when the checkout has one, else python3; nothing is installed or downloaded.
# A source tree that was never pip-installed still runs: a sitecustomize shim maps arlctl.stages and
# arlctl.schemas onto stages/ and schemas/ (what pyproject's package-dir does when pip installs it).
# Peak memory: each rank runs `arlctl train` in-process through a small wrapper (rank_main.py, written
# below) that records torch.cuda.max_memory_allocated and max_memory_reserved at exit.
set -u

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 1
OUT=${OUT:-${TMPDIR:-/tmp}/gpu_check_out}
mkdir -p "$OUT"
REPORT=$OUT/gpu_check.txt
: >"$REPORT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT  # models, shards and checkpoints: gigabytes
SMOKE=${GPU_CHECK_SMOKE:-0}
BUDGET=${GPU_CHECK_BUDGET_S:-450}
START=$(date +%s)
PEAK=${PEAK_BF16_FLOPS:-989e12}
STEPS=${STEPS:-5}
MICRO_TOKENS=${MICRO_TOKENS:-16384}
GROUPS_PER_GPU=${GROUPS_PER_GPU:-8}

say() { printf '%s\n' "$*" | tee -a "$REPORT"; }
section() { say ""; say "== $* =="; }
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

# ------------------------------------------------------------------------------------------ a. the machine
section "a. machine"
if [ -x "$REPO/.venv/bin/python" ]; then PY=$REPO/.venv/bin/python; else PY=$(command -v python3 || echo python3); fi
say "python: $PY ($("$PY" --version 2>&1))"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export ARLCTL_HOME=$WORK/home PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
if [ "$SMOKE" = 1 ]; then
    export CUDA_VISIBLE_DEVICES=""
    NGPU=${GPU_CHECK_SMOKE_RANKS:-2}
    say "SMOKE mode: tiny shapes, $NGPU rank(s) on CPU (gloo); the numbers mean nothing"
elif command -v nvidia-smi >/dev/null 2>&1; then
    timeout 30 nvidia-smi 2>&1 | tee -a "$REPORT"
    NGPU=$(timeout 30 nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    say "GPUs: $NGPU"
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
    say "arlctl is not installed: importing it from $REPO through a sitecustomize shim"
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

# ---------------------------------------------------------------------------------- b. train throughput
section "b. arlctl train: bf16 FSDP2 throughput, $NGPU rank(s)"
if [ "$SMOKE" = 1 ]; then
    MODELS="tiny"
    STEPS=1 MICRO_TOKENS=1024 GROUPS_PER_GPU=1
    TURNS=1 TOKENS_PER_TURN=32 GROUP_SIZE=2
    export OMP_NUM_THREADS=1
else
    MODELS="smollm2-135m llama-0.5b"
    TURNS=4 TOKENS_PER_TURN=256 GROUP_SIZE=8
fi
BATCH_GROUPS=$((GROUPS_PER_GPU * NGPU))
N_BATCHES=$((STEPS + 1))

cat >"$WORK/prep.py" <<'EOF'
"""Random-init HF Llama directories (config + safetensors, no tokenizer: train does not need one) and
synthetic batch shards, packed the way `arlctl filter` packs them."""
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from arlctl.io.shards import Lineage, write_shard
from arlctl.stages.configs import FilterConfig
from arlctl.stages.filter import pack_batches
from arlctl.synthetic import synthetic_table

work, models = Path(sys.argv[1]), sys.argv[2].split()
n_batches, batch_groups, group_size, turns, tokens_per_turn = map(int, sys.argv[3:8])
VOCAB = 49152
SHAPES = {  # hidden, layers, heads, kv heads, intermediate, tied embeddings
    "smollm2-135m": (576, 30, 9, 3, 1536, True),
    "llama-0.5b": (1024, 24, 16, 16, 4096, False),
    "tiny": (64, 2, 4, 2, 128, True),
}
device = "cuda" if torch.cuda.is_available() else "cpu"
for name in models:
    hidden, layers, heads, kv, inter, tied = SHAPES[name]
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv, intermediate_size=inter, max_position_embeddings=32768,
                         tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    with torch.device(device):  # random init is much faster on the GPU
        model = LlamaForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
    model.save_pretrained(work / "models" / name)
    (work / "models" / name / "params.json").write_text(json.dumps({"params": params, "shape": SHAPES[name]}))
    print(f"model {name}: {params / 1e6:.1f}M parameters (hidden {hidden}, {layers} layers, {heads} heads, "
          f"{kv} kv heads, intermediate {inter}, vocab {VOCAB}, tied {tied})")
    del model

table = synthetic_table(n_batches * batch_groups, group_size=group_size, seed=0, mean_turns=turns,
                        tokens_per_turn=tokens_per_turn)
rewards = pa.array([float(i % 2) for i in range(table.num_rows)], pa.float32())  # variance in every group
table = table.set_column(table.schema.get_field_index("reward"), table.schema.field("reward"), rewards)
batches, _ = pack_batches(table, np.ones(table.num_rows), FilterConfig(batch_groups=batch_groups))
tokens = []
for i, batch in enumerate(batches):
    write_shard(batch, str(work / "batches" / f"batch-{i:06d}.parquet"), Lineage("filter"))
    tokens.append(sum(batch.column("prompt_tokens").to_pylist()) + sum(batch.column("response_tokens").to_pylist()))
print(f"{len(batches)} batch shards of {batches[0].num_rows} rows, {np.mean(tokens):.0f} tokens each "
      f"(longest row {max(max(b.column('prompt_tokens').to_numpy() + b.column('response_tokens').to_numpy()) for b in batches)})")
EOF

cat >"$WORK/rank_main.py" <<'EOF'
"""One torchrun rank: `arlctl train` in this process (the CLI; the stage API if the CLI cannot import), then
this rank's peak CUDA memory into $GPU_CHECK_MEM_DIR/rank-R.json."""
import atexit
import json
import os
import sys


def _peak_memory() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        path = os.path.join(os.environ["GPU_CHECK_MEM_DIR"], f"rank-{os.environ.get('RANK', '0')}.json")
        with open(path, "w") as f:
            json.dump({"max_allocated": torch.cuda.max_memory_allocated(),
                       "max_reserved": torch.cuda.max_memory_reserved(),
                       "device": torch.cuda.get_device_name()}, f)


atexit.register(_peak_memory)
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
        sys.argv += [f"--{key.replace('_', '-')}", str(value)]
    main()
EOF

cat >"$WORK/report.py" <<'EOF'
"""tokens/s, MFU and peak memory of one run, from the metrics rank 0 wrote, train's --json line and the
ranks' memory files."""
import glob
import json
import sys

import pyarrow.parquet as pq

run, model_dir, log, ngpu, peak = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
params = json.load(open(f"{model_dir}/params.json"))["params"]
rows = sorted((pq.read_table(f).to_pylist()[0] for f in glob.glob(f"{run}/metrics/train-step-*.parquet")),
              key=lambda r: r["step"])
summary = None
for line in open(log, errors="replace"):  # train --json: one line (a "[rankN]:" prefix may lead)
    if '{"' in line:
        try:
            summary = json.loads(line[line.index('{"'):])
            break
        except ValueError:
            pass
print(f"  params {params / 1e6:.1f}M  steps written {len(rows)}  world_size "
      f"{summary.get('world_size') if summary else '?'}  final save {summary.get('save_s') if summary else '?'} s")
timed = rows[1:]  # step 1 is the warm-up (CUDA context, allocator, kernels)
if timed:
    tokens = sum(r["seq_tokens"] for r in timed)
    seconds = sum(r["step_time_s"] for r in timed)
    tps = tokens / seconds
    mfu = 6 * params * tps / (peak * ngpu)
    print(f"  tokens/s {tps:,.0f} over {len(timed)} steps after a warm-up ({tokens / len(timed):,.0f} tokens, "
          f"{seconds / len(timed):.2f} s per step; warm-up step {rows[0]['step_time_s']:.2f} s)")
    print(f"  tokens/s per GPU {tps / ngpu:,.0f}   MFU {mfu:.1%}  (6 x params x tokens/s / ({peak:.3g} x {ngpu}))")
    # Synthetic behaviour log-probs are far from a random model's, so most tokens are clipped and the
    # gradient is tiny: these numbers only show that the steps ran, not that anything learns.
    print(f"  loss {[round(r['loss'], 4) for r in rows]}  grad_norm {[float('%.3g' % r['grad_norm']) for r in rows]}")
else:
    print("  no timed step: the metrics hold " + str(len(rows)) + " steps")
if summary:
    print(f"  train --json tokens_per_s (mean over every step, warm-up included) {summary.get('tokens_per_s')}")
for f in sorted(glob.glob(f"{run}/memory/rank-*.json")):
    m = json.load(open(f))
    print(f"  {f.rsplit('/', 1)[1][:-5]}: peak allocated {m['max_allocated'] / 2**30:.2f} GiB, "
          f"reserved {m['max_reserved'] / 2**30:.2f} GiB ({m['device']})")
EOF

say "shapes: $MODELS; $N_BATCHES batches of $BATCH_GROUPS groups x $GROUP_SIZE rows (~$TURNS turns x" \
    "$TOKENS_PER_TURN tokens); --micro-tokens $MICRO_TOKENS; first step is the warm-up"
say "MFU assumes a bf16 dense peak of $PEAK FLOP/s per GPU (H100/H200 SXM; set PEAK_BF16_FLOPS otherwise) and"
say "6 x params FLOPs per token (attention FLOPs not counted; the LM head runs only on trained tokens, so"
say "6N somewhat overcounts for env/prompt tokens)"
if run_part prep 150 "$PY" "$WORK/prep.py" "$WORK" "$MODELS" "$N_BATCHES" "$BATCH_GROUPS" "$GROUP_SIZE" \
    "$TURNS" "$TOKENS_PER_TURN"; then
    grep -E '^(model|[0-9]+ batch shards)' "$OUT/prep.log" | sed 's/^/  /' | tee -a "$REPORT"
    for model in $MODELS; do
        run=$WORK/run-$model
        mkdir -p "$run/memory"
        ln -s "$WORK/batches" "$run/batches"
        settings="{\"strategy\": \"fsdp2\", \"precision\": \"bf16\", \"micro_tokens\": $MICRO_TOKENS,"
        settings+=" \"save_every\": 1000, \"lr\": 1e-6}"
        spec="{\"run\": \"$run\", \"policy\": \"$WORK/models/$model\", \"settings\": $settings}"
        say "[$model] $NGPU rank(s): arlctl train --strategy fsdp2 --precision bf16 --micro-tokens $MICRO_TOKENS" \
            "--save-every 1000 --json (one full checkpoint at the end)"
        export GPU_CHECK_MEM_DIR=$run/memory
        run_part "train-$model" 200 "$PY" -m torch.distributed.run --standalone \
            --nproc-per-node "$NGPU" "$WORK/rank_main.py" "$spec"
        if compgen -G "$run/metrics/train-step-*.parquet" >/dev/null; then  # also after a timeout: steps so far
            timeout 60 "$PY" "$WORK/report.py" "$run" "$WORK/models/$model" "$OUT/train-$model.log" "$NGPU" \
                "$PEAK" 2>&1 | tee -a "$REPORT"
        fi
        rm -rf "$run/checkpoints"  # keep the disk free for the next model
    done
fi

# ------------------------------------------------------------------------- c. distributed tests on NCCL
section "c. tests/distributed on NCCL"
if [ "$SMOKE" = 1 ]; then
    say "SMOKE mode: no NCCL tests"
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

say ""
say "done in $(($(date +%s) - START)) s; report $REPORT, logs in $OUT"
