"""What a trainer holds between steps, built once and kept in memory (DESIGN.md §9).

`TrainerState.open` builds it for this rank: the model (LoRA-wrapped with --lora-rank, activation
checkpointing with --grad-checkpoint) under the parallel strategy (arlctl/rl/distributed.py), AdamW and the
LR schedule, the KL reference, and, when resuming, their saved states. `save` writes a checkpoint; the
trainer keeps the state for the next `train` call (`train --watch` cycles), so only the first cycle loads.

Precision. fp32: fp32 weights, compute and optimizer. bf16 with fsdp2: `MixedPrecisionPolicy` (sharded
fp32 master weights, bf16 compute, fp32 gradient reduction). bf16 with single: the model the forward runs
holds bf16 weights; the optimizer steps an fp32 master copy (`master`), whose values are copied back after
each step; checkpoints hold the master. bf16 with ddp: fp32 weights with bf16 autocast (fp32 all-reduce).

Checkpoints (`step-NNNNNN/`, committed with state.json last, locally or on an object store):
  full          HF files (config, model.safetensors, tokenizer) for `sync`, plus `trainer/`: the model and
                optimizer as torch.distributed.checkpoint shards (one file per rank that wrote it, resharded
                on load, so N ranks resume on M), `trainer/rng-R.pt` per rank, and `scheduler.pt`
  weights-only  the HF files and state.json {"full": false}: what `sync` publishes, no optimizer state
                (`--publish-every`); a resume starts from the newest *full* checkpoint and redoes the steps
                after it
The HF weights are gathered to rank 0 (`--publish-dtype`); with LoRA they are the merged weights.
Every rank writes its shard files into a staging directory beside the checkpoint (`.step-N.staging`: in place
locally; on an object store, written to a local temporary directory and uploaded); rank 0 then commits the
checkpoint, renaming (locally) or copying (object store, server-side) those files in, so each is written once.
"""

from __future__ import annotations

import copy
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from arlctl.errors import TerminalError, UsageError
from arlctl.io import ledger as run_ledger
from arlctl.io import store
from arlctl.rl import checkpoint as ckpt
from arlctl.rl import distributed as dd
from arlctl.rl.config import TrainConfig
from arlctl.rl.sharded_load import load_shards

TRAINER_DIR = "trainer"
FULL_KEY = "full"  # state.json: False for a weights-only checkpoint


def load_model(path: Path, meta: bool = False) -> Any:
    """The HF model at `path` in fp32; meta=True builds it from its config with every parameter on the meta
    device and reads no weight (sharded_load.load_shards fills each rank's shard once it is sharded)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if meta:
        from arlctl.rl.sharded_load import meta_parameters

        config = AutoConfig.from_pretrained(path, local_files_only=True)
        with meta_parameters():
            model = AutoModelForCausalLM.from_config(config).float()
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
    model.config.use_cache = False
    return model


def load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError):
        return None  # a weights-only directory: checkpoints are then weights-only too


@dataclass
class TrainerState:
    """One rank's trainer: model, optimizer, schedule and reference, plus the run's position."""

    cfg: TrainConfig
    d: dd.Dist
    strategy: str
    module: nn.Module  # what the forward calls (wrapped by the strategy)
    master: nn.Module  # what the optimizer steps and checkpoints hold (the module itself unless bf16 single)
    optimizer: Any
    scheduler: Any
    ref: Any  # None | a frozen module | LORA_REFERENCE (the model with adapters disabled)
    tokenizer: Any
    initial_policy: Path
    step: int = 0
    consumed: list[str] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)  # the state.json resumed from
    last_full: int = 0  # step of the newest full checkpoint
    teacher: Any = None  # None | a frozen module | an engine scorer (--teacher: on-policy distillation)
    ledger: Any = None  # the run's BadValueLedger (stages/train.py), carried between --watch cycles
    packed: bool | None = None  # micro-batches run packed (--pack), decided before the first step (`decide_packing`)
    packing: str = "undecided"  # what was decided, and why when padded
    heap: str = ""  # the CPU heap's policy (dd.cpu_heap): "trim" releases it after each step

    @property
    def lora(self) -> bool:
        return bool(self.cfg.lora_rank)

    @property
    def master_copy(self) -> bool:
        """bf16 single: the optimizer steps an fp32 copy of the weights the forward runs."""
        return self.master is not dd.unwrap(self.module)

    @property
    def lm(self) -> nn.Module:
        """The HF causal LM inside the compute module (sharded in place under FSDP2)."""
        return dd.unwrap(self.module).lm

    # ------------------------------------------------------------------------------------------- build

    @classmethod
    def open(cls, ckpt_dir: str, resume_ckpt: Any, state: dict[str, Any], initial_policy: Path, cfg: TrainConfig,
             d: dd.Dist) -> TrainerState:
        """Build the model, optimizer and schedule on this rank; restore them from `resume_ckpt` when given."""
        cfg = cfg.for_device(d.device)
        heap = dd.cpu_heap(d.world) if d.device.type == "cpu" else ""  # freed tensors go back to the system
        strategy = dd.resolve_strategy(cfg.strategy, d.world)
        if cfg.offload and strategy != "fsdp2":
            raise UsageError("--offload needs --strategy fsdp2 (or auto on more than one rank)")
        with ckpt.local_copy(resume_ckpt) as resume_from:
            sharded = resume_from is not None and (resume_from / TRAINER_DIR / ".metadata").is_file()
            # Weights to build from: LoRA and sharded checkpoints restore every trained tensor from the shards,
            # so the base is the initial policy (LoRA) or the checkpoint's HF files (whose dtype may differ).
            base = initial_policy if (cfg.lora_rank or resume_from is None) else resume_from
            torch.manual_seed(cfg.seed)  # whatever the build draws (LoRA's adapters have their own generator)
            # FSDP2: each rank reads only its shard of the weights (a LoRA base's too), once the model is sharded.
            by_shard = strategy == "fsdp2"
            lm = load_model(base, meta=by_shard)
            tokenizer = (load_tokenizer(resume_from) if resume_from else None) or load_tokenizer(initial_policy)
            if cfg.lora_rank:
                from arlctl.rl.lora import apply_lora, init_adapters

                lm = apply_lora(lm, cfg.lora_rank, cfg.lora_alpha, cfg.lora_target_list())
                init_adapters(lm, cfg.seed)  # real and equal on every rank, before the base is sharded
            if cfg.grad_checkpoint:
                lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if cfg.compile:
                for layer in dd.decoder_layers(lm):
                    layer.compile(dynamic=True)  # in place: FSDP2 then shards the same module
            master = dd.ScoringModel(lm, value_head=cfg.value_coef > 0, head_chunk_bytes=cfg.head_chunk_mb << 20)
            if not cfg.offload and not by_shard:
                master = master.to(d.device)
            module, master = _apply_strategy(master, strategy, cfg, d)
            if by_shard:
                load_shards(master, base, torch.device("cpu") if cfg.offload else d.device)
            params = [p for p in master.parameters() if p.requires_grad]
            optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.adam_betas, weight_decay=cfg.weight_decay)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
            trainer = cls(cfg=cfg, d=d, strategy=strategy, module=module, master=master, optimizer=optimizer,
                          scheduler=scheduler, ref=None, tokenizer=tokenizer, initial_policy=initial_policy,
                          step=int(state.get("step", 0)), consumed=list(state.get("consumed_batches", [])),
                          state=state, last_full=int(state.get("step", 0)), heap=heap)
            if resume_from is not None:
                _refuse_nonfinite_files(resume_from, resume_ckpt, d)
                if sharded:
                    trainer._load_shards(resume_from)
                else:
                    trainer._load_legacy(resume_from)
        trainer._refuse_nonfinite_start(resume_ckpt or initial_policy)
        trainer.ref = trainer._reference()
        trainer.teacher = trainer._teacher()
        return trainer

    def decide_packing(self) -> bool:
        """--pack, once, before the first step: switch every local model to packed attention and prove on its
        own weights that it packs (packing.check_packing); auto falls back to padded micro-batches with the
        reason, on refuses. Run at the first step rather than at open, so that its forward (a collective under
        FSDP2) gathers nothing the step would not."""
        from arlctl.rl import packing

        if self.packed is not None:
            return self.packed
        self.packed = False
        if self.cfg.pack == "off":
            self.packing = "padded (--pack off)"
            return False
        models = [("policy", self.module)] + [(name, m) for name, m in (("reference", self.ref),
                                                                        ("teacher", self.teacher))
                                              if isinstance(m, nn.Module)]
        for name, module in models:
            why = packing.use_rows_attention(dd.unwrap(module).lm, self.d.device)
            if why is None:
                why = packing.check_packing(module, self.d.device, self.cfg.precision)
            if why is not None:
                if self.cfg.pack == "on":
                    raise UsageError(f"--pack on: the {name} model cannot pack: {why}", hint="--pack auto or off")
                self.packing = f"padded: the {name} model cannot pack ({why})"
                return False
        self.packed, self.packing = True, "packed"
        return True

    def _load_shards(self, directory: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

        options = StateDictOptions(ignore_frozen_params=self.lora)
        holder = self._state_holder()
        model_sd, optim_sd = get_state_dict(holder, self.optimizer, options=options)
        model_sd = self._trained_only(model_sd)
        loaded = {"model": model_sd, "optim": optim_sd}
        self._same_critic(directory)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # one process: expected
            dcp.load(loaded, checkpoint_id=str(directory / TRAINER_DIR))
        set_state_dict(holder, self.optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"],
                       options=StateDictOptions(ignore_frozen_params=self.lora, strict=not self.lora))
        self.scheduler.load_state_dict(torch.load(directory / "scheduler.pt", weights_only=False))
        rng = directory / TRAINER_DIR / f"rng-{self.d.rank}.pt"
        ckpt.set_rng_state(torch.load(rng if rng.is_file() else directory / TRAINER_DIR / "rng-0.pt",
                                      weights_only=False))
        self._copy_master_to_module()

    def _same_critic(self, directory: Path) -> None:
        """A checkpoint with a value head resumes only with a critic, and one without only without: a head
        would otherwise be silently dropped, or expected where the shards hold none."""
        import torch.distributed.checkpoint as dcp

        keys = dcp.FileSystemReader(str(directory / TRAINER_DIR)).read_metadata().state_dict_metadata
        has_head = any(k.startswith("model.value_head.") for k in keys)
        if has_head != (self.cfg.value_coef > 0):
            raise UsageError(f"{directory} was trained {'with' if has_head else 'without'} a critic (value head), "
                             f"and this train has --value-coef {self.cfg.value_coef}",
                             hint="resume with --value-coef > 0" if has_head else
                             "a critic starts with its run: train into a new --out (from this policy) for PPO with a critic")

    def _load_legacy(self, directory: Path) -> None:
        """A checkpoint from before sharded checkpoints: optimizer.pt / scheduler.pt / rng.pt, one process."""
        if not (directory / "optimizer.pt").is_file():
            return  # a weights-only checkpoint or HF directory: weights only, fresh optimizer
        if self.d.active or self.lora or self.master_copy:
            raise UsageError(f"{directory} is a single-process checkpoint of an older format",
                             hint="resume it once on one process with --precision fp32; its next checkpoint is "
                                  "sharded and resumes anywhere")
        self.optimizer.load_state_dict(torch.load(directory / "optimizer.pt", map_location=self.d.device,
                                                  weights_only=False))
        self.scheduler.load_state_dict(torch.load(directory / "scheduler.pt", weights_only=False))
        ckpt.set_rng_state(torch.load(directory / "rng.pt", weights_only=False))

    def _reference(self) -> Any:
        """The frozen KL reference (the initial policy), only with --kl-coef or --kl-in-reward."""
        if not self.cfg.needs_reference():
            return None
        if self.lora:
            return LORA_REFERENCE
        return self._frozen(self.initial_policy)

    def _teacher(self) -> Any:
        """The --teacher: an engine scorer for a URL, else a frozen model sharded like the reference. Its
        vocabulary must be the policy's: the same token ids are scored."""
        spec = self.cfg.teacher
        if spec is None:
            return None
        vocab = self.lm.get_input_embeddings().num_embeddings
        if spec.startswith(("http://", "https://")):
            from arlctl.rl.teacher import EngineTeacher

            return EngineTeacher(spec)
        path = ckpt.resolve_policy_path(spec)
        teacher = self._frozen(path)
        theirs = dd.unwrap(teacher).lm.get_input_embeddings().num_embeddings
        if theirs != vocab:
            raise UsageError(f"--teacher {spec} has a vocabulary of {theirs} tokens, the policy {vocab}",
                             hint="distillation scores the policy's token ids: the teacher needs the same tokenizer")
        return teacher

    def _frozen(self, path: Path) -> Any:
        """A frozen scoring copy of the model at `path`, placed like the trained model (FSDP2: sharded)."""
        if self.strategy == "fsdp2":  # sharded on meta, then each rank reads its shard
            ref = dd.ScoringModel(load_model(path, meta=True), head_chunk_bytes=self.cfg.head_chunk_mb << 20)
            ref = ref.requires_grad_(False).eval()
            ref = dd.wrap(ref, "fsdp2", self.d, self.cfg.precision, self.cfg.offload, frozen=True)
            load_shards(ref, path, torch.device("cpu") if self.cfg.offload else self.d.device)
            return ref
        ref = dd.ScoringModel(load_model(path), head_chunk_bytes=self.cfg.head_chunk_mb << 20).requires_grad_(False).eval()
        if self.cfg.precision == "bf16" and self.strategy == "single":
            ref = ref.to(torch.bfloat16)
        return ref.to(self.d.device)

    def _refuse_nonfinite_start(self, source: Any) -> None:
        """Training on from NaN/inf weights would only skip every step: say which tensor is broken instead."""
        mine = ckpt.first_nonfinite((n, _local(t)) for n, t in self.master.state_dict().items())
        bad = next((b for b in self.d.gather_objects(mine) if b is not None), None)  # each rank checks its shards
        if bad is not None:
            raise TerminalError(f"cannot train from {source}: weight {bad[0]} holds {bad[1]}",
                                hint="move this checkpoint aside to resume from the one before it")

    # ------------------------------------------------------------------------------------------- step

    def after_backward(self) -> None:
        """bf16 single: move the gradients onto the fp32 master weights the optimizer steps."""
        if not self.master_copy:
            return
        for mp, p in zip(self.master.parameters(), self.module.parameters(), strict=True):
            if mp.requires_grad:
                mp.grad = None if p.grad is None else p.grad.detach().float()
                p.grad = None

    def after_step(self) -> None:
        self._copy_master_to_module()

    def zero_grad(self) -> None:
        """After the optimizer step: the gradients freed, and with them what the step left in the heap."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.master_copy:
            self.module.zero_grad(set_to_none=True)
        dd.release_heap(self.heap)

    def _copy_master_to_module(self) -> None:
        if not self.master_copy:
            return
        with torch.no_grad():
            for mp, p in zip(self.master.parameters(), self.module.parameters(), strict=True):
                p.copy_(mp)

    def _state_holder(self) -> nn.Module:
        """The module whose parameters the optimizer steps, as the state-dict API wants it (DDP wrapper kept)."""
        return self.master if self.master_copy else self.module

    def _trained_only(self, model_sd: dict[str, Any]) -> dict[str, Any]:
        """With LoRA, the adapters alone: `ignore_frozen_params` still keeps a tied head (it shares the frozen
        embedding), which the checkpoint need not hold: the base comes from the initial policy."""
        if not self.lora:
            return model_sd
        trained = {n.removeprefix("module.") for n, p in self._state_holder().named_parameters() if p.requires_grad}
        return {k: v for k, v in model_sd.items() if k in trained}

    # ------------------------------------------------------------------------------------------- save

    def hf_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The full weights with HF names, in --publish-dtype, on rank 0 (None elsewhere). A collective under
        FSDP2. With LoRA: the merged weights, or the adapter tensors with --publish-format adapter. The whole
        state dict at once, so checkpoints never use it (they stream: _export_state); it is the gathered
        reference that tests hold the streamed files to."""
        if self.strategy == "fsdp2":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            full = get_model_state_dict(self.master, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if not self.d.is_main:
                return None
        else:
            if not self.d.is_main:
                return None
            full = {k: v.detach().cpu() for k, v in dd.unwrap(self.master).state_dict().items()}
        # The policy's tensors only: a critic's value head is trainer state (in the shards), not published weights.
        full = {k.removeprefix("lm."): v for k, v in full.items() if k.startswith("lm.")}
        if self.lora:
            from arlctl.rl import lora

            full = (lora.adapter_state_dict(full) if self.cfg.publish_format == "adapter"
                    else lora.merged_state_dict(full, self.cfg.lora_alpha, self.cfg.lora_rank))
        dtype = torch.bfloat16 if self.cfg.publish_dtype == "bf16" else torch.float32
        return {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in full.items()}

    def _export_state(self) -> dict[str, Any]:
        """What the published checkpoint holds, HF-named and still sharded (streamed_export gathers each in
        turn): the policy's tensors, a tied head once (as write_hf_dir writes it); with LoRA the merged
        weights (each adapted one a LoraMerged) or, with --publish-format adapter, the A and B tensors alone.
        A critic's value head is trainer state (in the shards), not published weights."""
        state = {k.removeprefix("lm."): v for k, v in self.master.state_dict().items() if k.startswith("lm.")}
        if self.lora:
            from arlctl.rl import lora

            state = (lora.adapter_state_dict(state) if self.cfg.publish_format == "adapter"
                     else lora.merged_items(state, self.cfg.lora_alpha, self.cfg.lora_rank))
        if getattr(self.lm.config, "tie_word_embeddings", False) and "model.embed_tokens.weight" in state:
            state.pop("lm_head.weight", None)
        return state

    def save(self, ckpt_dir: str, state: dict[str, Any], full: bool) -> float:
        """Write step `state['step']` (full, or weights only) on every rank; rank 0 commits. Returns seconds."""
        import shutil
        import tempfile

        started = time.perf_counter()
        step = int(state["step"])
        scratch = tempfile.mkdtemp(prefix="arlctl-export-") if self.d.is_main else None
        try:
            from arlctl.rl.streamed_export import stream_weights

            weights_file = Path(scratch) / "model.safetensors" if scratch else None
            publish = torch.bfloat16 if self.cfg.publish_dtype == "bf16" else torch.float32
            bad = stream_weights(self._export_state(), weights_file, publish, self.d.broadcast)
            if bad is not None:
                raise TerminalError(f"refusing to save {run_ledger.step_dir_name(step)}: weight {bad[0]} holds "
                                    f"{bad[1]}", hint="the newest complete checkpoint is unchanged; lower --lr or --grad-clip")
            staging = str(store.child(ckpt_dir, f".{run_ledger.step_dir_name(step)}.staging"))
            shard_files: dict[str, int] = {}
            if full:
                shard_files = self._write_shards(staging)
            if self.d.is_main:
                self._commit(ckpt_dir, step, {**state, FULL_KEY: full}, staging if full else None, shard_files,
                             weights_file)
                if full:
                    store.remove_dir(staging)
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
        self.d.barrier()
        if full:
            self.last_full = step
        return time.perf_counter() - started

    def _write_shards(self, staging: str) -> dict[str, int]:
        """Every rank writes its DCP shard and RNG state under staging/trainer/; returns {name: size} of all."""
        import tempfile

        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        model_sd, optim_sd = get_state_dict(self._state_holder(), self.optimizer,
                                            options=StateDictOptions(ignore_frozen_params=self.lora))
        model_sd = self._trained_only(model_sd)
        if self.d.is_main:  # a leftover of an attempt that died: nobody may add to it
            store.remove_dir(staging)
        self.d.barrier()
        if store.local_path(staging) is not None:  # written in place; the commit moves them in (one write per file)
            mine = self._save_dcp(Path(staging) / TRAINER_DIR, model_sd, optim_sd)
        else:  # written here first, then uploaded; the commit copies them server-side
            with tempfile.TemporaryDirectory(prefix="arlctl-dcp-") as scratch:
                mine = self._save_dcp(Path(scratch) / TRAINER_DIR, model_sd, optim_sd)
                store.put_files(Path(scratch), staging, sorted(mine))
        return {name: size for part in self.d.gather_objects(mine) for name, size in part.items()}

    def _save_dcp(self, local: Path, model_sd: dict[str, Any], optim_sd: dict[str, Any]) -> dict[str, int]:
        """This rank's DCP files and RNG state in the local directory `local`; returns {trainer/name: size}."""
        import torch.distributed.checkpoint as dcp

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # one process: expected
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(local))
        torch.save(ckpt.rng_state(), local / f"rng-{self.d.rank}.pt")
        return {f"{TRAINER_DIR}/{p.name}": p.stat().st_size for p in local.iterdir() if p.is_file()}

    def _commit(self, ckpt_dir: str, step: int, state: dict[str, Any], staging: str | None,
                shard_files: dict[str, int], weights_file: Path) -> None:
        lm = self.lm

        def build(directory: Path) -> None:
            write_hf_dir(directory, None, lm, self.tokenizer, adapter=self.lora and self.cfg.publish_format
                         == "adapter", cfg=self.cfg, base=self.initial_policy, weights_file=weights_file)
            if staging is not None:
                torch.save(self.scheduler.state_dict(), directory / "scheduler.pt")
            ckpt.write_manifest(directory, state, shard_files)

        copy_from = (staging, sorted(shard_files)) if staging is not None else None
        store.commit_dir(build, run_ledger.checkpoint_location(ckpt_dir, step), run_ledger.STATE_FILE,
                         copy_from=copy_from, move=True)


LORA_REFERENCE = "lora-base"


def lr_lambda(cfg: TrainConfig) -> Any:
    """LR multiplier per step: linear warmup, then constant or cosine down to min_lr_ratio."""
    import math

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / (cfg.warmup_steps + 1)
        if cfg.lr_schedule == "constant":
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.cosine_steps))
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def write_hf_dir(directory: Path, weights: dict[str, torch.Tensor] | None, lm: nn.Module, tokenizer: Any, *,
                 adapter: bool = False, cfg: TrainConfig | None = None, base: Path | None = None,
                 weights_file: Path | None = None) -> None:
    """An HF model directory from a full state dict, or from `weights_file` (a model.safetensors already
    written, tensor by tensor: streamed_export): config, generation config, safetensors, tokenizer.

    Tied embeddings are written once (as HF does); the loader ties them again. With adapter=True the
    directory is a peft adapter directory beside the base policy `base`.
    """
    from safetensors.torch import save_file

    if adapter:
        from arlctl.rl import lora

        lora.write_adapter_dir(directory, weights, str(base), cfg.lora_rank, cfg.lora_alpha, cfg.lora_target_list(),
                               weights_file=weights_file)
    else:
        config = lm.config
        config.save_pretrained(directory)
        if getattr(lm, "generation_config", None) is not None and lm.can_generate():
            lm.generation_config.save_pretrained(directory)
        if weights_file is not None:
            import shutil

            shutil.move(str(weights_file), str(directory / "model.safetensors"))
        else:
            if getattr(config, "tie_word_embeddings", False) and "model.embed_tokens.weight" in weights:
                weights = {k: v for k, v in weights.items() if k != "lm_head.weight"}
            save_file({k: v.clone() for k, v in weights.items()}, str(directory / "model.safetensors"),
                      metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)


def _apply_strategy(scorer: dd.ScoringModel, strategy: str, cfg: TrainConfig,
                    d: dd.Dist) -> tuple[nn.Module, nn.Module]:
    """(module for the forward, module the optimizer steps)."""
    if strategy == "single" and cfg.precision == "bf16":
        compute = copy.deepcopy(scorer).to(torch.bfloat16)
        return compute, scorer
    module = dd.wrap(scorer, strategy, d, cfg.precision, cfg.offload)
    return module, dd.unwrap(module)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _refuse_nonfinite_files(directory: Path, source: Any, d: dd.Dist) -> None:
    """A checkpoint whose published weights hold NaN/inf is corrupt, whatever its shards say: refuse it.
    Each rank checks its share of every tensor's rows, by byte range (no rank reads a whole tensor)."""
    from arlctl.rl.sharded_load import nonfinite_share

    mine = nonfinite_share(directory, d.rank, d.world)
    bad = next((b for b in d.gather_objects(mine) if b is not None), None)
    if bad is not None:
        raise TerminalError(f"cannot train from {source}: weight {bad[0]} holds {bad[1]}",
                            hint="move this checkpoint aside to resume from the one before it")


def full_checkpoint_state(state: dict[str, Any]) -> bool:
    """A checkpoint's state.json says it is full (older checkpoints, without the key, are)."""
    return bool(state.get(FULL_KEY, True))


__all__ = ["LORA_REFERENCE", "TRAINER_DIR", "TrainerState", "full_checkpoint_state", "load_model", "load_tokenizer",
           "lr_lambda", "write_hf_dir"]
