#!/usr/bin/env bash
# Agentic learning, shown (issue 17): SmolLM2-135M learns to *use the calculator* on 3-digit x 3-digit
# multiplication, which it cannot do in its head. Behind docs/learning/agentic_tool.md.
#
#   RUN=runs/agentic recipes/agentic_tool.sh
#
#   1. held-out greedy eval of the base model (tools=calculator)                   -> RUN/eval/before-sft
#   2. cold start, SFT_ROUNDS rounds of: oracle:calculator rollouts on fresh tasks -> reward
#      -> filter --where 'reward = 1' -> train --loss sft -> sync                    (all under RUN/sft)
#   3. held-out greedy eval of the SFT policy                                       -> RUN/eval/after-sft
#   4. RL_ITERS GRPO iterations from the SFT policy: rollout (tools=calculator, G samples) -> reward -> filter
#      -> train (ppo-clip) -> sync                                                  (RUN itself)
#   5. held-out greedy eval of the RL policy                                        -> RUN/eval/after-rl
#   6. the report: recipes/agentic_tool_report.py -> OUT_DOCS/agentic_tool.{md,json,png}
#
# SFT and RL are two runs (RUN/sft, then RUN) so that RL starts with a fresh optimizer and its own --lr (a
# resumed trainer keeps its checkpoint's schedule). Tasks are JSONL files under RUN/tasks, each a pure
# function of its seed; the held-out seed is used by no training step. Restartable: an eval with rewarded
# shards, a rollout with its RUN/recipe/*.done marker are skipped; reward, filter, train and sync resume
# through their ledgers. Every command run is appended to RUN/commands.log (the report quotes it).
# Sized for 2 shared CPU cores (~40 minutes); 4 SFT steps were not enough (docs/learning/agentic_tool.md).
set -euo pipefail
cd "$(dirname "$0")/.."

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
ARLCTL=${ARLCTL:-.venv/bin/arlctl}
PYTHON=${PYTHON:-.venv/bin/python}
RUN=${RUN:-runs/agentic}
BASE_POLICY=${BASE_POLICY:-default}           # the embedded SmolLM2-135M-Instruct
DIGITS=${DIGITS:-3}                           # a DIGITS-digit x DIGITS-digit product per task
EVAL_POOL=${EVAL_POOL:-100}                   # held-out tasks generated (seed EVAL_SEED) ...
EVAL_TASKS=${EVAL_TASKS:-50}                  # ... of which each eval runs the first EVAL_TASKS
EVAL_SEED=${EVAL_SEED:-999}
SFT_ROUNDS=${SFT_ROUNDS:-3}                   # rounds of SFT (each: fresh oracle rows, then train on them)
SFT_POOL=${SFT_POOL:-32}
SFT_TASKS=${SFT_TASKS:-16}                    # oracle trajectories per round (one per task)
SFT_ROWS_PER_STEP=${SFT_ROWS_PER_STEP:-4}     # filter --batch-groups with G=1: rows per SFT step
SFT_LR=${SFT_LR:-2e-4}
RL_ITERS=${RL_ITERS:-1}
RL_TASKS=${RL_TASKS:-6}
G=${G:-4}
RL_LR=${RL_LR:-1e-5}
MAX_TURNS=${MAX_TURNS:-2}                     # call the calculator, then answer
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-64}          # the oracle's call is ~50 tokens
ENV_OPTS=(--env-opt on_no_action=end --env-opt tools=calculator)
OUT_DOCS=${OUT_DOCS:-docs/learning}
LOG=$RUN/commands.log

mkdir -p "$RUN/tasks" "$RUN/recipe"

run() {  # log the command (an argument with spaces or quotes single-quoted), then run it
  local arg line=""
  for arg in "$@"; do
    if [[ "$arg" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then line+="$arg "; else line+="'${arg//\'/\'\\\'\'}' "; fi
  done
  printf '%s\n' "${line% }" >>"$LOG"
  "$@"
}

make_tasks() {  # make_tasks FILE SEED N: N products of two DIGITS-digit numbers, a pure function of SEED
  [[ -s "$1" ]] && return 0
  "$PYTHON" - "$1" "$2" "$3" "$DIGITS" <<'EOF'
import json, random, sys
path, seed, n, digits = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(f"agentic-mul:{seed}:{digits}")
templates = ["What is {e}?", "Compute {e}.", "Evaluate {e}.", "Calculate {e}."]  # as arlctl/envs/math_gen.py
low, high = 10 ** (digits - 1), 10**digits - 1
with open(path + ".tmp", "w") as out:
    for i in range(n):
        a, b = rng.randint(low, high), rng.randint(low, high)
        task = {"task_id": f"mul{digits}-s{seed}-{i:04d}", "env": "math",
                "question": rng.choice(templates).format(e=f"{a} * {b}"), "answer": str(a * b)}
        out.write(json.dumps(task) + "\n")
import os; os.replace(path + ".tmp", path)
EOF
}

evaluate() {  # evaluate NAME POLICY: greedy held-out rollouts + reward into RUN/eval/NAME
  local name=$1 policy=$2 dir="$RUN/eval/$1"
  if compgen -G "$dir/rewarded/*.parquet" >/dev/null; then return 0; fi
  rm -rf "$dir"
  echo "== held-out eval '$name' with policy $policy" >&2
  run "$ARLCTL" rollout --env math --tasks "$RUN/tasks/eval.jsonl" --limit "$EVAL_TASKS" --policy "$policy" \
    --out "$dir/rollouts" -G 1 -c 64 --max-turns "$MAX_TURNS" --max-new-tokens "$MAX_NEW_TOKENS" --temperature 0 --seed 12345 \
    "${ENV_OPTS[@]}" -q >/dev/null
  run "$ARLCTL" reward --in "$dir/rollouts" --out "$dir/rewarded" --reward math --no-cache >/dev/null
}

rollout_once() {  # rollout_once MARKER ARGS...: a rollout that a finished run marks done (skipped after)
  local marker=$1; shift
  [[ -e "$marker" ]] && return 0
  local summary
  summary=$(run "$ARLCTL" rollout "$@" --flush-groups 1000000 --flush-seconds 1e9 "${ENV_OPTS[@]}" -q --json)
  if [[ "$summary" != *'"interrupted": false'* ]]; then
    echo "rollout for $marker was interrupted; it is rolled out again on the next run" >&2
    exit 75
  fi
  : >"$marker"
}

make_tasks "$RUN/tasks/eval.jsonl" "$EVAL_SEED" "$EVAL_POOL"
for ((r = 0; r < SFT_ROUNDS; r++)); do make_tasks "$RUN/tasks/sft-$r.jsonl" $((1 + r)) "$SFT_POOL"; done
for ((i = 0; i < RL_ITERS; i++)); do make_tasks "$RUN/tasks/rl-$i.jsonl" $((100 + i)) "$RL_TASKS"; done

# 1. The base model, tools on.
evaluate before-sft "$BASE_POLICY"

# 2. Cold start on the oracle's trajectories (reward 1 rows only; G=1, so no group baseline is needed), in
#    rounds of fresh tasks; the trainer resumes from the previous round's checkpoint.
for ((r = 0; r < SFT_ROUNDS; r++)); do
  echo "== SFT round $r on oracle:calculator trajectories" >&2
  rollout_once "$RUN/recipe/sft-$r.done" --env math --tasks "$RUN/tasks/sft-$r.jsonl" --limit "$SFT_TASKS" \
    --policy oracle:calculator --run "$RUN/sft" -G 1 --max-turns "$MAX_TURNS" --max-new-tokens "$MAX_NEW_TOKENS" \
    --prefix "sft$r"
  run "$ARLCTL" reward --run "$RUN/sft" --reward math
  run "$ARLCTL" filter --run "$RUN/sft" --where 'reward = 1' --keep-uniform 1 --min-group-size 1 \
    --batch-groups "$SFT_ROWS_PER_STEP"
  run "$ARLCTL" train --run "$RUN/sft" --policy "$BASE_POLICY" --loss sft --lr "$SFT_LR" --save-every 1000
  run "$ARLCTL" sync --run "$RUN/sft"
done

# 3. The SFT policy.
evaluate after-sft "$RUN/sft/policy"

# 4. GRPO from the SFT policy.
policy_for_rollout() {
  if [[ -e "$RUN/policy/LATEST" ]]; then echo "$RUN/policy"; else echo "$RUN/sft/policy"; fi
}
for ((i = 0; i < RL_ITERS; i++)); do
  tag=$(printf "it%04d" "$i")
  echo "== GRPO iteration $i ($tag) policy $(policy_for_rollout)" >&2
  rollout_once "$RUN/recipe/$tag.done" --env math --tasks "$RUN/tasks/rl-$i.jsonl" --policy "$(policy_for_rollout)" \
    --run "$RUN" -G "$G" -c 64 --max-turns "$MAX_TURNS" --max-new-tokens "$MAX_NEW_TOKENS" --temperature 1.0 \
    --seed "$i" --prefix "$tag"
  run "$ARLCTL" reward --run "$RUN" --reward math
  run "$ARLCTL" filter --run "$RUN" --batch-groups 8 --policy-dir "$RUN/policy"
  run "$ARLCTL" train --run "$RUN" --policy "$RUN/sft/policy" --lr "$RL_LR" --save-every 1000
  if compgen -G "$RUN/checkpoints/step-*" >/dev/null; then run "$ARLCTL" sync --run "$RUN"; fi
done

# 5. The RL policy (the SFT policy again if no group had a reward spread to learn from).
evaluate after-rl "$(policy_for_rollout)"

# 6. Report.
"$PYTHON" recipes/agentic_tool_report.py "$RUN" --out "$OUT_DOCS"
