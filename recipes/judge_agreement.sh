#!/usr/bin/env bash
# Does an LLM judge agree with the rule reward? SmolLM2 rollouts on one-digit arithmetic, rewarded twice:
# by the `math` rule (the reference) and by `--reward judge` with the shipped `math` rubric, the judge being
# SmolLM2 itself behind `arlctl serve` on 127.0.0.1 (greedy). Prints the confusion table (rule x judge, with
# the judge's null verdicts as their own column) and the agreement on the rows the judge scored.
#
#   bash recipes/judge_agreement.sh                 # 32 tasks x G 2 = 64 rows, ~10 min on 2 CPU cores
#   N=64 G=4 RUN=runs/judge2 bash recipes/judge_agreement.sh
#   RUBRIC=recipes/rubrics/math_yesno.yaml JUDGED=judged-yesno bash recipes/judge_agreement.sh
#
# The reward-model-vs-rule agreement is what to watch when a judge replaces (or joins) a rule reward.
set -euo pipefail
cd "$(dirname "$0")/.."

ARLCTL=${ARLCTL:-.venv/bin/arlctl}
PY=${PY:-.venv/bin/python}
RUN=${RUN:-runs/judge-agreement}
RUBRIC=${RUBRIC:-math}   # or recipes/rubrics/math_yesno.yaml (one word: Yes or No)
JUDGED=${JUDGED:-judged}
N=${N:-32}
G=${G:-2}
PORT=${PORT:-$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}

"$ARLCTL" model pull >/dev/null
if [[ ! -d "$RUN/rollouts" ]]; then
  "$ARLCTL" rollout --run "$RUN" --env math --tasks "builtin:math?n=$N&seed=999&difficulty=0&kinds=arithmetic" \
    --policy default -G "$G" --max-turns 1 --max-new-tokens 32 --temperature 0.8 \
    --env-opt on_no_action=end --env-opt tools=none -q
fi
"$ARLCTL" reward --run "$RUN" --reward math --reward-opt fallback=last_number >/dev/null

"$ARLCTL" serve --policy default --host 127.0.0.1 --port "$PORT" --max-batch 8 >"$RUN/judge-serve.log" 2>&1 &
serve_pid=$!
trap 'kill "$serve_pid" 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  kill -0 "$serve_pid" 2>/dev/null || { echo "judge server exited (see $RUN/judge-serve.log)" >&2; exit 1; }
  sleep 1
done
start=$(date +%s)
"$ARLCTL" reward --run "$RUN" --out "$RUN/$JUDGED" --reward judge --reward-opt "server=http://127.0.0.1:$PORT" \
  --reward-opt model=smollm2 --reward-opt "rubric=$RUBRIC" --concurrency 8 >/dev/null || true  # exit 1 only if no row was scored
echo "judged in $(( $(date +%s) - start )) s" >&2

RUN="$RUN" JUDGED="$JUDGED" "$PY" - <<'EOF'
import os

import duckdb

run, judged = os.environ["RUN"], os.environ["JUDGED"]
rows = duckdb.sql(f"""
    SELECT r.reward AS rule, j.reward AS judge
    FROM read_parquet('{run}/rewarded/*.parquet', union_by_name=true) r
    JOIN read_parquet('{run}/{judged}/*.parquet', union_by_name=true) j USING (trajectory_id)
""").fetchall()
label = lambda v: "null" if v is None else ("1" if v >= 0.5 else "0")
table = {(a, b): 0 for a in ("1", "0") for b in ("1", "0", "null")}
for rule, judge in rows:
    table[(label(rule), label(judge))] += 1
print(f"{len(rows)} rows; rule (rows) x judge (columns)")
print(f"{'':>8}{'judge 1':>10}{'judge 0':>10}{'null':>10}")
for a in ("1", "0"):
    print(f"{'rule ' + a:>8}" + "".join(f"{table[(a, b)]:>10}" for b in ("1", "0", "null")))
scored = sum(v for (a, b), v in table.items() if b != "null")
agree = table[("1", "1")] + table[("0", "0")]
if scored:
    print(f"agreement on the {scored} rows the judge scored: {agree / scored:.3f}; "
          f"judge null (no readable verdict or a failed request): {len(rows) - scored}")
else:
    print("the judge scored no row")
EOF
