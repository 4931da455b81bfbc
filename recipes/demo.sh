#!/usr/bin/env bash
# `make demo`: watch the embedded SmolLM2-135M-Instruct get better at one-digit arithmetic, on a CPU.
#
#   1. a held-out greedy eval of the base model (64 tasks no training iteration draws: seed 999);
#   2. ITERS iterations of the GRPO loop (recipes/math_grpo.sh: rollout -> reward -> filter -> train -> sync),
#      ending with its per-iteration table (mean reward = share correct);
#   3. the same eval of the trained policy, the paired comparison (exact McNemar p), a per-iteration table,
#      and runs/demo/report.html (`arlctl report`).
#
# The settings were chosen by measurement (docs/learning/demo.md): one operation on one-digit numbers
# (`difficulty=0`), where the base model is right about a fifth of the time at temperature 0.8, so groups of
# 8 have reward variance from the first iteration, and a learning rate (1e-5) that moves it in a few steps.
# Every iteration samples the same 8 training tasks (new samples), so its row of the table measures the same
# questions; the held-out eval measures tasks training never saw.
# Restartable: every stage skips what is done. A fresh demo: rm -rf runs/demo.
set -euo pipefail
cd "$(dirname "$0")/.."

ARLCTL=${ARLCTL:-.venv/bin/arlctl}
export RUN=${RUN:-runs/demo}
export ITERS=${ITERS:-4}
export TASKS_PER_ITER=${TASKS_PER_ITER:-8}
export G=${G:-8}
export DIFFICULTY=0 KINDS=arithmetic SEED_STEP=${SEED_STEP:-0}  # the same 8 training tasks every iteration
export MAX_TURNS=1 MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-32} TEMPERATURE=${TEMPERATURE:-0.8}
export ENV_OPTS="on_no_action=end tools=none" REWARD_OPTS="fallback=last_number"
export BATCH_GROUPS=${BATCH_GROUPS:-8} LR=${LR:-1e-5}
# A SmolLM2 checkpoint with its optimizer state is ~2 GB: keep only the newest (train and sync run in turn here).
export TRAIN_OPTS=${TRAIN_OPTS:---keep-checkpoints 1}
HELDOUT=${HELDOUT:-64}
start=$(date +%s)

"$ARLCTL" model pull >/dev/null
eval_opts=(--run "$RUN" --name heldout --tasks "builtin:math?n=$HELDOUT&seed=999&difficulty=0&kinds=arithmetic"
  --greedy --max-turns 1 --max-new-tokens "$MAX_NEW_TOKENS" --env-opt on_no_action=end --env-opt tools=none
  --reward math --reward-opt fallback=last_number -q)
echo "== held-out eval of the base model ($HELDOUT tasks, greedy)" >&2
"$ARLCTL" eval "${eval_opts[@]}" --policy default >/dev/null
bash recipes/math_grpo.sh
echo "== held-out eval of the trained policy" >&2
"$ARLCTL" eval "${eval_opts[@]}" --policy "$RUN/policy" >/dev/null
latest=$(cat "$RUN/policy/LATEST")

echo
echo "Held-out, greedy, base model (v0) against the trained policy ($latest):"
"$ARLCTL" eval --run "$RUN" --name heldout --compare v0 "$latest"
"$ARLCTL" report "$RUN" --out "$RUN" >/dev/null
echo "report: $RUN/report.html   ($(( $(date +%s) - start )) s; try: $ARLCTL show ID $RUN/rewarded)"
