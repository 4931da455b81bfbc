#!/usr/bin/env bash
# `make demo`: a short run of the GRPO loop (recipes/math_grpo.sh) on the embedded SmolLM2-135M-Instruct,
# on CPU, ending with the mean reward per iteration. The first run converts the model (about a minute).
# Longer runs: RUN=runs/math ITERS=10 TASKS_PER_ITER=32 recipes/math_grpo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export RUN=${RUN:-runs/demo}
export ITERS=${ITERS:-3}
export TASKS_PER_ITER=${TASKS_PER_ITER:-8}
export G=${G:-4}
export MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-64}
export BATCH_GROUPS=${BATCH_GROUPS:-4}
.venv/bin/arlctl model pull
bash recipes/math_grpo.sh
echo "run directory: $RUN  (try: .venv/bin/arlctl inspect $RUN/rewarded)" >&2
