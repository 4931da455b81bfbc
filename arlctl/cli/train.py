"""`arlctl train`: batch shards -> optimizer steps -> checkpoints (thin layer over stages/train.py)."""

from __future__ import annotations

from typing import Any

import typer

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.cli.daemon import LOCK_WAIT_HELP, POLL_HELP, WATCH_HELP, run_stage
from arlctl.errors import UsageError
from arlctl.io.fs import join

HELP = """Train the policy on batch shards: one optimizer step per shard, in name order, each shard once.

Loss: PPO-clip on mask-1 tokens against the recorded behaviour log-probs, optional truncated
importance sampling (--tis-cap) and k3 KL to the initial policy (--kl-coef), named aggregation
(--loss-agg), per-row weights. Resumes from the newest checkpoint in --out by default.

Non-finite values never reach the weights: a row with a bad value (NaN/inf log-prob, advantage or
weight; token id outside the vocabulary; ...) is left out of its step, and a step whose gradient is still
non-finite is skipped (its batch counts as consumed). Each event is a warning here, a count in --json
(skipped_nonfinite, rows_dropped_invalid) and in the step's metrics (errors, last_error).

  arlctl train --run RUN --policy smollm2-135m

  arlctl train --in RUN/batches --policy RUN/policy --out RUN/checkpoints --lr 1e-6 --micro-tokens 4096

  arlctl train --run s3://bucket/run --policy smollm2-135m    # checkpoints uploaded, state.json last
"""


def register(app: typer.Typer) -> None:
    @app.command("train", help=HELP)
    @handle_errors
    def train_cmd(
        in_url: str = typer.Option(None, "--in", help="Batch shards (default RUN/batches)."),
        out: str = typer.Option(None, "--out", help="Checkpoint directory, local or a URL (default RUN/checkpoints)."),
        policy: str = typer.Option(None, "--policy", help="Initial weights: HF dir, policy dir or model name."),
        run: str = typer.Option(None, "--run", help="Run directory that fills the defaults."),
        metrics: str = typer.Option(None, "--metrics", help="Per-step metrics (default RUN/metrics)."),
        lr: float = typer.Option(1e-6, "--lr", help="Peak learning rate (AdamW)."),
        weight_decay: float = typer.Option(0.0, "--weight-decay"),
        warmup_steps: int = typer.Option(0, "--warmup-steps"),
        lr_schedule: str = typer.Option("constant", "--lr-schedule", help="constant | cosine (after warmup)."),
        cosine_steps: int = typer.Option(1000, "--cosine-steps", help="Cosine horizon in steps."),
        grad_clip: float = typer.Option(1.0, "--grad-clip", help="Max gradient norm."),
        eps_low: float = typer.Option(0.2, "--eps-low", help="PPO clip below: ratio >= 1 - eps_low."),
        eps_high: float = typer.Option(0.2, "--eps-high", help="PPO clip above: ratio <= 1 + eps_high."),
        tis_cap: float = typer.Option(None, "--tis-cap", help="Truncated importance-sampling cap."),
        kl_coef: float = typer.Option(0.0, "--kl-coef", help="k3 KL to the initial policy."),
        loss_agg: str = typer.Option("token-mean", "--loss-agg",
                                     help="token-mean | seq-mean-token-sum | seq-mean-token-mean."),
        micro_tokens: int = typer.Option(8192, "--micro-tokens", help="Padded tokens per micro-batch."),
        precision: str = typer.Option("fp32", "--precision", help="fp32 | bf16 (autocast)."),
        temperature: float = typer.Option(1.0, "--temperature", help="Sampling temperature of the rollouts."),
        save_every: int = typer.Option(1, "--save-every", help="Checkpoint every N steps (and at the end)."),
        keep_checkpoints: int = typer.Option(0, "--keep-checkpoints",
                                             help="Keep only the newest N checkpoints (0: keep all; "
                                                  "2+ while `arlctl sync --watch` copies them)."),
        max_steps: int = typer.Option(None, "--max-steps", help="At most N steps in this invocation."),
        seed: int = typer.Option(0, "--seed"),
        device: str = typer.Option("auto", "--device", help="auto (cuda when available) | cpu | cuda:N."),
        resume: bool = typer.Option(True, "--resume/--no-resume", help="Continue from the newest checkpoint."),
        watch: bool = typer.Option(False, "--watch", help=WATCH_HELP),
        poll: float = typer.Option(5.0, "--poll", help=POLL_HELP),
        lock_wait: float = typer.Option(0.0, "--lock-wait", help=LOCK_WAIT_HELP),
        as_json: bool = typer.Option(False, "--json", help="One JSON summary on stdout."),
    ) -> None:
        from arlctl.stages.train import TrainConfig, train

        if run is None and (in_url is None or out is None):
            raise UsageError("give --in and --out, or --run RUN")
        in_url = in_url or join(run, "batches")
        out = out or join(run, "checkpoints")
        metrics = metrics or (join(run, "metrics") if run else None)
        cfg = TrainConfig(lr=lr, weight_decay=weight_decay, warmup_steps=warmup_steps, lr_schedule=lr_schedule,
                          cosine_steps=cosine_steps, grad_clip=grad_clip, eps_low=eps_low, eps_high=eps_high,
                          tis_cap=tis_cap, kl_coef=kl_coef, loss_agg=loss_agg, micro_tokens=micro_tokens,
                          precision=precision, temperature=temperature, save_every=save_every,
                          keep_checkpoints=keep_checkpoints, max_steps=max_steps, seed=seed, device=device)
        def once(stop) -> dict:
            summary = train(in_url, policy, out, cfg, metrics_url=metrics, resume=resume, on_step=_line)
            if not summary["steps"]:
                if not watch:
                    console.print("nothing to do: every batch shard is already consumed")
            else:
                console.print(f"trained {summary['steps']} steps; checkpoint {summary['checkpoint']}")
                if summary["skipped_nonfinite"] or summary["rows_dropped_invalid"]:
                    console.print(f"[yellow]warning:[/] {summary['skipped_nonfinite']} steps skipped and "
                                  f"{summary['rows_dropped_invalid']} rows dropped for bad values")
            if as_json and (summary["steps"] or not watch):
                print_json(summary)
            return summary

        run_stage(once, out=out, lock_name="train", watch=watch, poll=poll, lock_wait=lock_wait,
                  units=lambda summary: summary["steps"])


def _line(step: int, m: dict[str, Any]) -> None:
    console.print(
        f"step [bold]{step:>5}[/]  loss {m['loss']:+.4f}  reward {m['reward_mean']:.3f}  "
        f"adv|{m['advantage_abs_mean']:.3f}|  kl {m['approx_kl']:.2e}  ent {m['entropy']:.3f}  "
        f"clip {m['clip_frac_low']:.3f}/{m['clip_frac_high']:.3f}  gnorm {m['grad_norm']:.3f}  "
        f"lr {m['lr']:.1e}  {m['tokens_per_s']:.0f} tok/s"
    )
    if m.get("warning"):
        # markup=False: the text quotes values read from a shard.
        console.print(f"warning: step {step}: {m['warning']}", markup=False, style="yellow", soft_wrap=True)
