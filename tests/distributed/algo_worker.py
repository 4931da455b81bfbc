"""Run under torchrun by test_algorithm_ranks: per estimator, 3 steps straight and 2 + 1 with a resume from disk."""

from __future__ import annotations

import json
import os
import sys

from arlctl.rl.config import TrainConfig
from arlctl.stages.train import train


def main() -> None:
    out, policy, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    for name, case in cases.items():
        cfg = {"strategy": "fsdp2", "device": "cpu", **case["settings"]}
        straight = train(case["batches"], policy, f"{out}/{name}-straight", TrainConfig(**cfg))
        first = train(case["batches"], policy, f"{out}/{name}-split", TrainConfig(**{**cfg, "max_steps": 2}))
        rest = train(case["batches"], policy, f"{out}/{name}-split", TrainConfig(**cfg))  # a new trainer, from disk
        report = {"rank": int(os.environ.get("RANK", "0")), "case": name, "straight": straight["steps"],
                  "first": first["steps"], "rest": rest["steps"], "resumed_from": rest["resumed_from"],
                  "world_size": straight["world_size"]}
        sys.stdout.write(json.dumps(report) + "\n")  # one write per line: both ranks share the pipe
        sys.stdout.flush()


if __name__ == "__main__":
    main()
