"""Run under torchrun by the tests: `train` once per --loss-agg mode with one strategy, each into OUT/<mode>."""

from __future__ import annotations

import json
import os
import sys

from arlctl.rl.config import TrainConfig
from arlctl.stages.train import train


def main() -> None:
    batches, policy, out, strategy, modes, settings = sys.argv[1:7]
    for mode in modes.split(","):
        cfg = TrainConfig(strategy=strategy, loss_agg=mode, **{"device": "cpu", **json.loads(settings)})
        summary = train(batches, policy, f"{out}/{mode}", cfg,
                        on_step=lambda step, m: print(f"trained step {step}", flush=True))
        report = {"rank": int(os.environ.get("RANK", "0")), "mode": mode, "steps": summary["steps"],
                  "world_size": summary["world_size"], "skipped": summary["skipped_nonfinite"],
                  "events": summary["bad_value_events"], "packing": summary.get("packing")}
        # one write per line: both ranks share the pipe, and a report split across writes could interleave
        sys.stdout.write(json.dumps(report) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
