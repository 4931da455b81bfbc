#!/usr/bin/env bash
# Held-out evaluation of the daemon run (recipes/smollm2_async.yaml) and its report in docs/learning/.
#
#   RUN=runs/smollm2-async recipes/smollm2_async_eval.sh
#
# Publishes the newest checkpoint (one `arlctl sync`), then evaluates the base model and RUN/policy on
# arithmetic tasks of seed 999, which no training rollout uses (training draws seed 100):
#   greedy-before / greedy-after   GREEDY_TASKS tasks at temperature 0, one sample each (paired by task)
#   before / after                 SAMPLED_TASKS tasks x 4 samples at temperature 1.0
# and writes the report (per policy-version curve, held-out table, McNemar test) with learning_report.py.
# Each eval is skipped when its rewarded shards exist, so the script is restartable.
set -euo pipefail
cd "$(dirname "$0")/.."

RUN=${RUN:-runs/smollm2-async}
GREEDY_TASKS=${GREEDY_TASKS:-400}
SAMPLED_TASKS=${SAMPLED_TASKS:-100}
OUT_DOCS=${OUT_DOCS:-docs/learning}
NAME=${NAME:-smollm2_async}
ROLLOUT=${ROLLOUT_ARLCTL:-.venv-vllm/bin/arlctl}
ARLCTL=${ARLCTL:-.venv/bin/arlctl}
export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-0-1}  # nothing else runs: both cores

"$ARLCTL" sync --run "$RUN" --keep 3 >&2

evaluate() {  # evaluate NAME POLICY TEMPERATURE G N
  local name=$1 policy=$2 temperature=$3 g=$4 n=$5 dir="$RUN/eval/$1"
  if compgen -G "$dir/rewarded/*.parquet" >/dev/null; then return; fi
  rm -rf "$dir"; mkdir -p "$RUN/eval"
  echo "== held-out eval '$name': policy $policy, temperature $temperature, $n tasks x $g" >&2
  "$ROLLOUT" rollout --backend vllm --backend-opt enforce_eager=false --env math \
    --tasks "builtin:math?n=$n&seed=999&difficulty=1&kinds=arithmetic" --policy "$policy" \
    --out "$dir/rollouts" -G "$g" -c 64 --max-turns 1 --max-new-tokens 96 --temperature "$temperature" \
    --seed 12345 --env-opt on_no_action=end --env-opt tools=none -q --json >"$dir.json"
  "$ARLCTL" reward --in "$dir/rollouts" --out "$dir/rewarded" --reward math \
    --reward-opt fallback=last_number --reward-opt format_weight=0.5 >/dev/null
}

evaluate greedy-before default 0 1 "$GREEDY_TASKS"
evaluate greedy-after "$RUN/policy" 0 1 "$GREEDY_TASKS"
evaluate before default 1.0 4 "$SAMPLED_TASKS"
evaluate after "$RUN/policy" 1.0 4 "$SAMPLED_TASKS"
.venv/bin/python recipes/learning_report.py "$RUN" --out "$OUT_DOCS" --name "$NAME" --by version --bin 5
