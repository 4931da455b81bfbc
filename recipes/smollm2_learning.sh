#!/usr/bin/env bash
# The SmolLM2-135M math learning run behind docs/learning/ (issue 4): held-out eval, K iterations of
# recipes/math_grpo.sh, held-out eval again, then the report (PNG + Markdown table).
#
#   RUN=runs/smollm2-learn ITERS=10 recipes/smollm2_learning.sh
#
# Rollouts use the vLLM backend when .venv-vllm exists (`.ci/vllm_lane.sh` builds it), the hf backend
# otherwise; training is always `arlctl train` in .venv. Held-out tasks use a seed (EVAL_SEED) that no
# training iteration uses (training iteration i uses SEED0 + i). Restartable like the loop itself.
set -euo pipefail
cd "$(dirname "$0")/.."

export RUN=${RUN:-runs/smollm2-learn}
export ITERS=${ITERS:-10}
export ENV_OPTS=${ENV_OPTS:-on_no_action=end tools=none}
export REWARD_OPTS=${REWARD_OPTS:-fallback=last_number format_weight=0.5}
export TASKS_PER_ITER=${TASKS_PER_ITER:-8}
export G=${G:-8}
export MAX_TURNS=${MAX_TURNS:-2}
export MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-96}
export BATCH_GROUPS=${BATCH_GROUPS:-4}
export LR=${LR:-2e-5}
export SEED0=${SEED0:-100}
EVAL_SEED=${EVAL_SEED:-999}
EVAL_TASKS=${EVAL_TASKS:-64}
EVAL_G=${EVAL_G:-4}
OUT_DOCS=${OUT_DOCS:-docs/learning}
if [[ -z "${ROLLOUT_ARLCTL:-}" && -x .venv-vllm/bin/arlctl ]]; then
  export ROLLOUT_ARLCTL=.venv-vllm/bin/arlctl ROLLOUT_OPTS="--backend vllm"
fi
ROLLOUT_ARLCTL=${ROLLOUT_ARLCTL:-.venv/bin/arlctl}
ARLCTL=${ARLCTL:-.venv/bin/arlctl}

env_args=(); for kv in $ENV_OPTS; do env_args+=(--env-opt "$kv"); done
reward_args=(); for kv in $REWARD_OPTS; do reward_args+=(--reward-opt "$kv"); done

evaluate() {  # evaluate NAME POLICY: held-out rollouts + reward into RUN/eval/NAME
  local name=$1 policy=$2 dir="$RUN/eval/$1"
  if ! compgen -G "$dir/rewarded/*.parquet" >/dev/null; then
    rm -rf "$dir"
    echo "== held-out eval '$name' with policy $policy" >&2
    "$ROLLOUT_ARLCTL" rollout ${ROLLOUT_OPTS:-} --env math --tasks "builtin:math?n=$EVAL_TASKS&seed=$EVAL_SEED&difficulty=${DIFFICULTY:-1}" \
      --policy "$policy" --out "$dir/rollouts" -G "$EVAL_G" -c 64 --max-turns "$MAX_TURNS" \
      --max-new-tokens "$MAX_NEW_TOKENS" --temperature 1.0 --seed 12345 "${env_args[@]}" -q >/dev/null
    "$ARLCTL" reward --in "$dir/rollouts" --out "$dir/rewarded" --reward math "${reward_args[@]}" >/dev/null
  fi
}

evaluate before default
bash recipes/math_grpo.sh
evaluate after "$RUN/policy"
.venv/bin/python recipes/learning_report.py "$RUN" --out "$OUT_DOCS"
