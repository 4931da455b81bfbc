#!/usr/bin/env bash
# The synchronous GRPO loop over one run directory: rollout -> reward -> filter -> train -> sync, K times.
#
#   RUN=runs/math ITERS=10 recipes/math_grpo.sh
#   RUN=s3://bucket/runs/math ITERS=10 recipes/math_grpo.sh     # the whole run directory on S3
#
# Restartable at any point: every stage skips what its output directory says is done. Rollouts of
# iteration i are one shard named it<i>-*.parquet, written atomically at the end of the rollout; a rollout
# that finished leaves the marker RUN/recipe/it<i>.done, and only a marked iteration is skipped. A rollout
# stopped by a signal still flushes its aborted rows as a shard (filter drops them by the completeness
# rule), so the iteration is rolled out again. Reward, filter, train and sync resume through lineage and
# checkpoints. Every knob is an environment variable (defaults below).
set -euo pipefail
cd "$(dirname "$0")/.."

ARLCTL=${ARLCTL:-.venv/bin/arlctl}
ROLLOUT_ARLCTL=${ROLLOUT_ARLCTL:-$ARLCTL}     # e.g. .venv-vllm/bin/arlctl with ROLLOUT_OPTS="--backend vllm"
ROLLOUT_OPTS=${ROLLOUT_OPTS:-}
RUN=${RUN:-runs/math-grpo}
ITERS=${ITERS:-10}
ENV_NAME=${ENV_NAME:-math}
BASE_POLICY=${BASE_POLICY:-default}          # the embedded SmolLM2-135M-Instruct
TASKS_PER_ITER=${TASKS_PER_ITER:-32}
DIFFICULTY=${DIFFICULTY:-1}
KINDS=${KINDS:-}                              # e.g. arithmetic (math env: arithmetic,word; empty: all)
G=${G:-8}
CONCURRENCY=${CONCURRENCY:-64}
MAX_TURNS=${MAX_TURNS:-3}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-96}
TEMPERATURE=${TEMPERATURE:-1.0}
ENV_OPTS=${ENV_OPTS:-on_no_action=end}
REWARD_OPTS=${REWARD_OPTS:-fallback=last_number format_weight=0.5}
BATCH_GROUPS=${BATCH_GROUPS:-8}
LR=${LR:-2e-6}
TRAIN_OPTS=${TRAIN_OPTS:-}
SEED0=${SEED0:-100}                           # training tasks of iteration i use seed SEED0 + i * SEED_STEP
SEED_STEP=${SEED_STEP:-1}                     # 0: the same tasks every iteration (make demo)

env_args=(); for kv in $ENV_OPTS; do env_args+=(--env-opt "$kv"); done
reward_args=(); for kv in $REWARD_OPTS; do reward_args+=(--reward-opt "$kv"); done

PYTHON=${PYTHON:-$(dirname "$ARLCTL")/python}

# Does anything match a glob? Local paths: the shell's own glob; RUN=s3://... (any fsspec URL): fsspec's.
exists() {
  if [[ "$1" == *://* ]]; then
    "$PYTHON" -c 'import sys, fsspec; fs, p = fsspec.core.url_to_fs(sys.argv[1]); sys.exit(0 if fs.glob(p) else 1)' "$1"
  else
    compgen -G "$1" >/dev/null
  fi
}

mark_done() {  # an empty marker object/file
  if [[ "$1" == *://* ]]; then
    "$PYTHON" -c 'import sys, fsspec; fs, p = fsspec.core.url_to_fs(sys.argv[1]); fs.pipe(p, b"")' "$1"
  else
    mkdir -p "$(dirname "$1")" && : > "$1"
  fi
}

policy_for_rollout() {
  if exists "$RUN/policy/LATEST"; then echo "$RUN/policy"; else echo "$BASE_POLICY"; fi
}

for ((i = 0; i < ITERS; i++)); do
  tag=$(printf "it%04d" "$i")
  echo "== iteration $i ($tag) policy $(policy_for_rollout)" >&2
  if ! exists "$RUN/recipe/$tag.done"; then
    summary=$("$ROLLOUT_ARLCTL" rollout $ROLLOUT_OPTS --env "$ENV_NAME" --tasks "builtin:$ENV_NAME?n=$TASKS_PER_ITER&seed=$((SEED0 + i * SEED_STEP))&difficulty=$DIFFICULTY${KINDS:+&kinds=$KINDS}" \
      --policy "$(policy_for_rollout)" --run "$RUN" -G "$G" -c "$CONCURRENCY" --max-turns "$MAX_TURNS" \
      --max-new-tokens "$MAX_NEW_TOKENS" --temperature "$TEMPERATURE" --seed "$i" \
      --prefix "$tag" --flush-groups 1000000 --flush-seconds 1e9 "${env_args[@]}" -q --json)
    if [[ "$summary" != *'"interrupted": false'* ]]; then
      echo "rollout of $tag was interrupted; it is rolled out again on the next run" >&2
      exit 75
    fi
    mark_done "$RUN/recipe/$tag.done"
  fi
  "$ARLCTL" reward --run "$RUN" --reward "$ENV_NAME" "${reward_args[@]}"
  "$ARLCTL" filter --run "$RUN" --batch-groups "$BATCH_GROUPS" --policy-dir "$RUN/policy"
  "$ARLCTL" train --run "$RUN" --policy "$BASE_POLICY" --lr "$LR" --temperature "$TEMPERATURE" $TRAIN_OPTS
  "$ARLCTL" sync --run "$RUN"
done

"$ARLCTL" query "select regexp_extract(filename, '(it[0-9]+)', 1) as iteration, count(*) as trajectories,
                 round(avg(reward), 3) as mean_reward,
                 round(avg(reward_components['correct']), 3) as correct,
                 round(avg(case when num_tool_calls > 0 then 1 else 0 end), 3) as tool_call_rate
                 from trajectories group by 1 order by 1" "$RUN/rewarded"
