"""Train-step throughput: `arlctl train`'s step vs TRL GRPOTrainer's loss step, same model, same trajectories.

Both sides run one optimizer step per batch: forward + masked GRPO loss + backward over micro-batches,
grad-norm clip, AdamW step. Settings are matched: PPO-clip eps 0.2/0.28, no KL, token-mean aggregation
(TRL "bnpo"), behaviour log-probs from the rows (TRL `old_per_token_logps`), env tokens masked (TRL
`tool_mask`), fp32 on CPU. Micro-batches are equivalent: TRL gets per-device batches of as many rows as
it takes to make the same number of forward passes as our token-budget plan (--micro-tokens).

What differs is how each side spends the same work: we sort rows by length so micro-batches carry little
padding, and run the LM head only at the positions of trained (mask-1) tokens; TRL runs its fused head on
every completion position, environment tokens included.

Timings are interleaved (ours, TRL, ours, ...) so that machine noise hits both sides alike; the ratio is
measured in one run.

  python benchmarks/train_throughput.py                     # tiny 2-layer Llama
  python benchmarks/train_throughput.py --model smollm2 --steps 2 --groups 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import torch  # noqa: E402

from arlctl.rl.batching import plan_micro_batches  # noqa: E402
from arlctl.rl.checkpoint import resolve_policy_path  # noqa: E402
from arlctl.rl.config import TrainConfig
from arlctl.rl.trainer_state import load_model
from arlctl.stages.configs import FilterConfig
from arlctl.stages.filter import pack_batches
from arlctl.stages.train import train_step
from arlctl.synthetic import synthetic_table  # noqa: E402


def make_batches(n_steps: int, groups: int, group_size: int, turns: int, tokens_per_turn: int,
                 vocab: int) -> list[pa.Table]:
    table = synthetic_table(n_steps * groups, group_size=group_size, seed=0, mean_turns=turns,
                            tokens_per_turn=tokens_per_turn)
    cols = {}
    for name in ("prompt_ids", "response_ids"):  # keep ids inside the model's vocabulary
        cols[name] = pa.array([[t % vocab for t in ids] for ids in table.column(name).to_pylist()],
                              pa.list_(pa.int32()))
    for name, values in cols.items():
        table = table.set_column(table.schema.get_field_index(name), table.schema.field(name), values)
    # Reward variance in every group, so advantages are non-zero everywhere.
    rewards = pa.array([float(i % 2) for i in range(table.num_rows)], pa.float32())
    table = table.set_column(table.schema.get_field_index("reward"), table.schema.field("reward"), rewards)
    batches, _ = pack_batches(table, np.ones(table.num_rows), FilterConfig(batch_groups=groups))
    return batches


def trl_trainer(model_dir: str, rows_per_micro: int):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=rows_per_micro,
                      num_generations=rows_per_micro, loss_type="bnpo", epsilon=0.2, epsilon_high=0.28, beta=0.0,
                      report_to=[], use_cpu=True, bf16=False, max_completion_length=16)
    trainer = GRPOTrainer(model=load_model(model_dir), args=args,
                          reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                          train_dataset=Dataset.from_list([{"prompt": "x"}] * rows_per_micro),
                          processing_class=AutoTokenizer.from_pretrained(model_dir))
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def trl_inputs(batch: pa.Table, rows: list[int], pad: int) -> dict[str, torch.Tensor]:
    """TRL's training inputs for some rows: prompts left-padded, completions right-padded."""
    prompts = [batch.column("prompt_ids")[i].as_py() for i in rows]
    responses = [batch.column("response_ids")[i].as_py() for i in rows]
    masks = [batch.column("response_mask")[i].as_py() for i in rows]
    logps = [batch.column("response_logprobs")[i].as_py() for i in rows]
    p_len, c_len = max(map(len, prompts)), max(map(len, responses))
    b = len(rows)
    out = {"prompt_ids": torch.full((b, p_len), pad), "prompt_mask": torch.zeros(b, p_len, dtype=torch.long),
           "completion_ids": torch.full((b, c_len), pad), "completion_mask": torch.zeros(b, c_len, dtype=torch.long),
           "tool_mask": torch.zeros(b, c_len, dtype=torch.long), "old_per_token_logps": torch.zeros(b, c_len),
           "advantages": torch.tensor([batch.column("advantage")[i].as_py() for i in rows])}
    for j in range(b):
        p, c = len(prompts[j]), len(responses[j])
        out["prompt_ids"][j, p_len - p :] = torch.tensor(prompts[j])
        out["prompt_mask"][j, p_len - p :] = 1
        out["completion_ids"][j, :c] = torch.tensor(responses[j])
        out["completion_mask"][j, :c] = 1
        out["tool_mask"][j, :c] = torch.tensor(masks[j])
        out["old_per_token_logps"][j, :c] = torch.tensor(logps[j])
    return out


def trl_step(trainer, optimizer, batch: pa.Table, rows_per_micro: int, grad_clip: float) -> float:
    started = time.perf_counter()
    model = trainer.model
    model.train()
    n = batch.num_rows
    for start in range(0, n, rows_per_micro):  # TRL's micro-batches are consecutive rows, as sampled
        rows = list(range(start, min(n, start + rows_per_micro)))
        inputs = trl_inputs(batch, rows, getattr(trainer, "pad_token_id", 0) or 0)
        loss = trainer.compute_loss(model, inputs)
        (loss * len(rows) / n).backward()  # accumulate as a mean over micro-batches
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="tiny | smollm2 | an HF directory")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per side (after one warm-up step)")
    ap.add_argument("--groups", type=int, default=4, help="groups per batch")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--turns", type=int, default=6, help="mean turns per trajectory")
    ap.add_argument("--tokens-per-turn", type=int, default=300)
    ap.add_argument("--micro-tokens", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave the default)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model_dir = str(resolve_policy_path("smollm2-135m" if args.model == "smollm2" else args.model))
    ours = load_model(model_dir)
    vocab = ours.config.vocab_size
    batches = make_batches(args.steps + 1, args.groups, args.group_size, args.turns, args.tokens_per_turn, vocab)
    cfg = TrainConfig(lr=1e-6, eps_low=0.2, eps_high=0.28, loss_agg="token-mean", micro_tokens=args.micro_tokens)
    lengths = [p + r for p, r in zip(batches[0].column("prompt_tokens").to_pylist(),
                                     batches[0].column("response_tokens").to_pylist(), strict=True)]
    n_micro = len(plan_micro_batches(lengths, args.micro_tokens))
    rows_per_micro = math.ceil(batches[0].num_rows / n_micro)
    trainer = trl_trainer(model_dir, rows_per_micro)
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=cfg.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt_ours, lambda s: 1.0)
    opt_trl = torch.optim.AdamW(trainer.model.parameters(), lr=cfg.lr)

    times_ours, times_trl = [], []
    for i, batch in enumerate(batches):  # step 0 is the warm-up for both sides
        t_ours = train_step(ours, None, opt_ours, sched, batch, cfg)["step_time_s"]
        t_trl = trl_step(trainer, opt_trl, batch, rows_per_micro, cfg.grad_clip)
        if i:
            times_ours.append(t_ours)
            times_trl.append(t_trl)
    tokens = [sum(b.column("prompt_tokens").to_pylist()) + sum(b.column("response_tokens").to_pylist())
              for b in batches[1:]]
    ours_tps = sum(tokens) / sum(times_ours)
    trl_tps = sum(tokens) / sum(times_trl)
    trained = sum(sum(b.column("generated_tokens").to_pylist()) for b in batches[1:]) / sum(tokens)
    result = {
        "model": args.model, "rows_per_batch": batches[0].num_rows, "tokens_per_batch": statistics.mean(tokens),
        "trained_token_fraction": round(trained, 3), "micro_batches": n_micro, "trl_rows_per_micro": rows_per_micro,
        "ours_tokens_per_s": round(ours_tps, 1), "trl_tokens_per_s": round(trl_tps, 1),
        "ratio": round(ours_tps / trl_tps, 2), "steps": args.steps, "threads": torch.get_num_threads(),
        "ours_step_s": [round(t, 3) for t in times_ours], "trl_step_s": [round(t, 3) for t in times_trl],
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"model {args.model}: {result['rows_per_batch']} rows/batch, {result['tokens_per_batch']:.0f} "
              f"tokens/batch ({trained:.0%} trained), {n_micro} micro-batches (TRL: {rows_per_micro} rows each)")
        print(f"  arlctl train  {ours_tps:10.1f} tokens/s   steps {result['ours_step_s']}")
        print(f"  TRL GRPO      {trl_tps:10.1f} tokens/s   steps {result['trl_step_s']}")
        print(f"  ratio         {result['ratio']:.2f}x (goal >= 1.5x)")


if __name__ == "__main__":
    main()
