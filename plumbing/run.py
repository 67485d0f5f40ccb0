"""Plumbing (a reader of the method may skip this file): what a training run of sft.py and rl.py is,
around its algorithm. TrainerArgs: the settings both trainers take, declared once (their own Args
add the method's). Run: the run in its --out_dir, from start to end: one run per directory (the
settings and the data checked on resume, plumbing/run_dir.py), the newest intact checkpoint
restored, the log, checkpoints, a stop signal's save-and-leave, the completion record."""
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.distributed as dist

import data
import measure
from plumbing import checkpoints, generation, run_dir
from plumbing.cli import check_settings
from plumbing.distributed import StopSignal, print0


@dataclass
class TrainerArgs(measure.ValidationArgs):
    """settings sft.py and rl.py share"""
    REQUIRED = ("model", "train_file")
    model: str = ""
    """the model to start from: a Hugging Face model directory (config.json, safetensors weights,
    tokenizer; rl.py: an SFT checkpoint) or a hub model's org/name"""
    train_file: str = ""
    """training data, .parquet / .jsonl / .json in the authors' schema (prompt, reward_model,
    target: the expert's response, which sft.py and rl.py's hybrids train on)"""
    out_dir: str = "out/sft"
    """checkpoints and log.jsonl go here; a checkpoint already here is resumed"""
    lr: float = 1e-5
    """learning rate: sft.py's peak (App. E), rl.py's constant one (Table 6)"""
    weight_decay: float = 0.01
    """AdamW weight decay"""
    grad_clip: float = 1.0
    """max global gradient norm"""
    max_prompt_len: int = 1024
    """longer prompts are dropped, and counted"""
    max_response_len: int = 8192
    """sft.py: longer responses (EOS included) are dropped, and counted; rl.py: generation stops
    after this many tokens (Table 6)"""
    system_prompt: Literal[data.SYSTEM_PROMPT_MODES] = "paper"
    """the prompt around each question: paper | row | messages (data.example_prompt)"""
    loss_chunk: int = 2048
    """tokens per logits chunk: the [tokens, vocab] logits exist one chunk at a time"""
    pack: bool = True
    """padding-free micro-batches: the sequences end to end in one row, attention within each
    (plumbing/attention.py); --no-pack: right-padded rows"""
    bf16: bool = True
    """bf16 compute with float32 master weights and reductions (CUDA only; CPU runs float32)"""
    grad_ckpt: bool = True
    """activation checkpointing of the decoder layers"""
    offload: bool = False
    """FSDP2 CPU offload of parameters, gradients and AdamW states (the step runs on the CPU)"""
    compile: bool = False
    """torch.compile the decoder layers and the loss's passes over [tokens, vocab] logits (fused
    kernels, fewer launches; the first steps pay the compiling, a minute or more)"""
    engine: Literal[generation.ENGINES] = "auto"
    """the sampling engine (rl.py's rollouts, --eval_every's validation), asleep while the trainer
    works: auto: vLLM with CUDA and the vllm package, else HF generate | hf | vllm"""
    gpu_memory_utilization: float = 0.5
    """vLLM: the share of the GPU's total memory the engine takes while it samples"""
    gen_batch_size: int = 16
    """HF engine: prompts per generate call (vLLM schedules its own batches); no sample depends on
    it: each draws from a seed of its own"""
    grader_workers: int = 4
    """grader processes per rank (rl.py's rewards, validation)"""
    grader_timeout: float = 10.0
    """seconds per graded response; an overrunning grader is killed and the response scores 0"""
    sync_bucket_mb: int = 1024
    """weight sync: MB of full tensors gathered from the FSDP shards per load into the engine"""
    seed: int = 0
    """data order, sampling, and --scratch's initialisation"""
    save_every: int = 0
    """checkpoint every this many steps (0: at the end only)"""
    keep_last: int = 0
    """keep the newest N checkpoints (0: all); the one a run resumed from is never deleted"""
    dist_timeout_min: float = 60.0
    """minutes a collective may wait for the slowest rank before the run is aborted"""
    loggers: list[str] = ()
    """logging besides log.jsonl: wandb, tensorboard (their packages are not in requirements.txt)"""
    log_line: Literal["compact", "full"] = "compact"
    """the console's line per logged step: compact (step, loss, lr, grad norm, entropy, tokens/s,
    ...) or full (every field log.jsonl gets)"""

    def __post_init__(self):
        super().__post_init__()                                        # the --eval_* flags
        check_settings(self, positive=["lr", "grad_clip", "dist_timeout_min", "grader_timeout"],
                       fraction=["gpu_memory_utilization"],
                       non_negative=["weight_decay", "save_every", "keep_last"],
                       at_least_one=["max_prompt_len", "max_response_len", "loss_chunk",
                                     "gen_batch_size", "grader_workers", "sync_bucket_mb"])


# settings of TrainerArgs a resumed run may change: they change nothing it computes, bit for bit
# (run_dir.claim checks the rest; tests/test_resume_settings.py changes each on resume), but that a
# batched forward's rounding may move a draw that falls within it of a boundary (HF's
# --gen_batch_size; vLLM on GPUs batches by its KV cache where it binds: --gpu_memory_utilization).
# Not --loss_chunk, --pack, --offload or --compile (they reorder float sums). Validation (its --eval_*
# flags) changes only the val_* records
MAY_CHANGE_ON_RESUME = {"out_dir", "save_every", "keep_last", "loggers", "log_line", "grad_ckpt",
                        "dist_timeout_min", "gpu_memory_utilization", "gen_batch_size",
                        "grader_workers", "sync_bucket_mb", *measure.VALIDATION_MAY_CHANGE}


class Run:
    """A training run in args.out_dir: claimed (run_dir.claim: the settings and the training data
    the run was started with, compared on resume) and checked for its end (run_dir.check_end:
    `complete` when it is at last_step already, with nothing loaded). Then start() restores the newest
    intact checkpoint and opens the log, save() and after_step() write checkpoints and leave on a
    stop signal, finish() records the completion."""

    def __init__(self, args, device, stop: StopSignal, settings: dict, may_change: set[str],
                 defaults: dict, rows: int, last_step: int, flag: str, why_not_on=None):
        self.args, self.device, self.stop, self.last_step = args, device, stop, last_step
        self.dtype = torch.bfloat16 if args.bf16 and device.type == "cuda" else torch.float32
        self.out_dir, self.rank0 = Path(args.out_dir), dist.get_rank() == 0
        self.settings, self.log, self.last_saved = settings, None, 0
        identity = {**run_dir.file_identity(args.train_file), "rows": rows} if self.rank0 else None
        run_dir.claim(self.out_dir, settings, may_change, data=identity, defaults=defaults,
                      resuming=checkpoints.latest(self.out_dir) is not None)
        self.resume_from = checkpoints.resume_point(self.out_dir)    # the newest intact one
        self.complete = run_dir.check_end(self.out_dir, self.resume_from, last_step, flag,
                                          why_not_on)
        if self.complete:
            run_dir.release()                                          # nothing is loaded

    def start(self, model, optimizer, teacher, position: dict, desc: str, floats=(),
              records=()) -> dict:
        """The run's position ({"step": 0, ...} to start): the checkpoint's where one is resumed
        (with `floats`, named values it keeps). Opens the log on rank 0 and cuts the run's other
        records, val_samples.jsonl and `records` (rl.py's rollouts.jsonl), back to the step, as
        the log is: no step twice."""
        p = position
        if self.resume_from is not None:
            p = checkpoints.restore(self.resume_from, model, optimizer, teacher, floats)
            where = f" (epoch {p['epoch']}, batch {p['batch_idx']})" if "epoch" in p else ""
            print0(f"resumed from {self.resume_from} at step {p['step']}{where}")
        self.model, self.optimizer, self.teacher = model, optimizer, teacher
        self.last_saved = p["step"]
        if self.rank0:
            self.log = run_dir.RunLog(self.out_dir, p["step"], self.last_step, desc,
                                      self.args.loggers, self.settings, line=self.args.log_line)
            val_samples = self.out_dir / "val_samples.jsonl"
            if val_samples.exists() or self.args.eval_every:
                run_dir.keep_steps_upto(val_samples, p["step"])
            for name in records:
                run_dir.keep_steps_upto(self.out_dir / name, p["step"])
        return p

    def write(self, record: dict, **files: list[dict]) -> None:
        """A record of log.jsonl and, for each name=records, those records appended to the run's
        NAME.jsonl (rl.py's rollouts): rank 0's."""
        if self.log is None:
            return
        self.log.write(record)
        for name, lines in files.items():
            with open(self.out_dir / f"{name}.jsonl", "a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in lines))

    def save(self, position: dict, tokenizer) -> None:
        """A checkpoint at position["step"]: the HF model, the sharded trainer state and the
        position (every rank)."""
        state = checkpoints.trainer_state(self.model, self.optimizer, self.teacher)
        path = checkpoints.save(self.out_dir, position["step"], self.model, tokenizer, state,
                                position, dtype=self.dtype, keep_last=self.args.keep_last,
                                keep=self.resume_from)
        self.last_saved = position["step"]
        print0(f"saved {path}")

    def after_step(self, position: dict, tokenizer) -> None:
        """Where a step may end the run's work (sft.py: at the end of a data batch): a checkpoint
        every --save_every steps and at the last step; on a stop signal (every rank agrees), a
        checkpoint and the exit."""
        step, every = position["step"], self.args.save_every
        stopping = step < self.last_step and self.stop.requested(self.device)
        due = every and step // every > self.last_saved // every
        if due or stopping or (step == self.last_step and self.last_saved != step):
            self.save(position, tokenizer)
        if stopping:
            run_dir.leave_after_signal(self.out_dir, step, self.stop.name, self.log)

    def failed(self, step: int, why: str) -> SystemExit:
        """The one-line stop of a step that must not be applied."""
        return SystemExit(f"step {step}: {why}; nothing after step {self.last_saved} is saved")

    def finish(self, step: int) -> None:
        """The end: complete.json when the last step is reached and saved, the log closed, the
        directory released."""
        if step == self.last_step and self.last_saved == step:
            run_dir.mark_complete(self.out_dir, step)
        if self.log is not None:
            self.log.close()
        run_dir.release()
