#!/usr/bin/env bash
# The main job. Until the learning loop lands this shows the data tools on synthetic shards.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/demo}
mkdir -p "$RUN"
.venv/bin/python - "$RUN" <<'PY'
import sys
from arlctl.io.shards import Lineage, shard_name, write_shard
from arlctl.synthetic import synthetic_table
out = f"{sys.argv[1]}/rewarded"
write_shard(synthetic_table(64, 4, seed=0), f"{out}/{shard_name('part')}", Lineage(stage="synthetic"))
print(f"wrote 256 synthetic trajectories to {out}")
PY
.venv/bin/arlctl inspect "$RUN/rewarded"
.venv/bin/arlctl query "select env, count(*) as n, round(avg(reward), 3) as mean_reward from trajectories group by 1 order by 1" "$RUN/rewarded"
