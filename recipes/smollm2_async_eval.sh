#!/usr/bin/env bash
# Held-out evaluation of the daemon run (recipes/smollm2_async.yaml) and its report in docs/learning/.
#
#   RUN=runs/smollm2-async recipes/smollm2_async_eval.sh
#
# Publishes the newest checkpoint (one `arlctl sync`), then evaluates the base model (v0) and RUN/policy
# (its LATEST version) with `arlctl eval` on arithmetic tasks of seed 999, which no training rollout uses
# (training draws seed 100):
#   RUN/evals/greedy/vNNNNNN    GREEDY_TASKS tasks at temperature 0, one answer each (paired by task)
#   RUN/evals/sampled/vNNNNNN   SAMPLED_TASKS tasks x 4 samples at temperature 1.0 (pass@1, 2, 4)
# prints the paired comparison (`arlctl eval --compare`: exact McNemar on the greedy evals) and writes the
# report (per policy-version curve, held-out table, McNemar test) with learning_report.py.
# `arlctl eval` skips a version whose summary.json exists, so the script is restartable.
set -euo pipefail
cd "$(dirname "$0")/.."

RUN=${RUN:-runs/smollm2-async}
GREEDY_TASKS=${GREEDY_TASKS:-400}
SAMPLED_TASKS=${SAMPLED_TASKS:-100}
OUT_DOCS=${OUT_DOCS:-docs/learning}
NAME=${NAME:-smollm2_async}
EVAL=${EVAL_ARLCTL:-${ROLLOUT_ARLCTL:-.venv-vllm/bin/arlctl}}  # rolls out with vLLM: the arlctl of its venv
ARLCTL=${ARLCTL:-.venv/bin/arlctl}
export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-0-1}  # nothing else runs: both cores

"$ARLCTL" sync --run "$RUN" --keep 3 >&2

evaluate() {  # evaluate NAME POLICY N [sampling options...]
  local name=$1 policy=$2 n=$3
  shift 3
  echo "== held-out eval '$name': policy $policy, $n tasks $*" >&2
  "$EVAL" eval --run "$RUN" --name "$name" --policy "$policy" --backend vllm --backend-opt enforce_eager=false \
    --env math --tasks "builtin:math?n=$n&seed=999&difficulty=1&kinds=arithmetic" -c 64 --max-turns 1 \
    --max-new-tokens 96 --seed 12345 --env-opt on_no_action=end --env-opt tools=none \
    --reward math --reward-opt fallback=last_number --reward-opt format_weight=0.5 -q "$@" >&2
}

evaluate greedy default "$GREEDY_TASKS" --greedy
evaluate greedy "$RUN/policy" "$GREEDY_TASKS" --greedy
evaluate sampled default "$SAMPLED_TASKS" --samples 4 --temperature 1.0
evaluate sampled "$RUN/policy" "$SAMPLED_TASKS" --samples 4 --temperature 1.0
LATEST=$(cat "$RUN/policy/LATEST")
"$ARLCTL" eval --run "$RUN" --name greedy --compare v0 "$LATEST" >&2
.venv/bin/python recipes/learning_report.py "$RUN" --out "$OUT_DOCS" --name "$NAME" --by version --bin 5
