# CurioSFT SFT stage (paper Alg. 1, App. E). README.md has the commands; python sft.py --help lists every flag.
"""SFT with CurioSFT or any Table 2 baseline. The same script runs as one process (CPU or one GPU) and under
`torchrun --nproc_per_node N` (FSDP2; gloo on CPU, nccl on GPU).

    python sft.py config/sft_tiny.py --model DIR --train_file data.jsonl
    torchrun --nproc_per_node 8 sft.py config/sft_paper.py --model Qwen2.5-Math-7B-16k-think --train_file train.parquet
"""
import copy
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.distributed as dist

import checkpoints
import common
import curio_loss as cl
import data
import run_dir
from chunked_logits import cat_diags, chunked_sum, normed_hidden, select_targets, token_log_probs


LOSS_NORMS = ("batch_token_mean", "micro_batch_token_mean")


@dataclass
class Args:
    """sft.py settings"""
    REQUIRED = ("model", "train_file")
    model: str = ""
    """HF model directory (config.json, weights, tokenizer) to start from"""
    scratch: bool = False
    """initialise random weights from the model directory's config.json (the toy demo) instead of loading them"""
    train_file: str = ""
    """SFT data: .parquet / .jsonl / .json in the authors' schema (prompt, reward_model, target)"""
    out_dir: str = "out/sft"
    """checkpoints (HF format) and log.jsonl go here; an existing checkpoint here is resumed"""
    loss: Literal[tuple(cl.LOSSES)] = "curio"
    """CurioSFT, its ablations (curio_fixed_tau, curio_self_teacher) or a Table 2 baseline (curio_loss.LOSSES)"""
    epochs: int = 3
    """passes over the data (App. E)"""
    max_steps: int = -1
    """stop after this many optimiser steps (-1: all epochs); the schedule still spans all epochs"""
    global_batch: int = 256
    """sequences per data batch, over all ranks (App. E)"""
    updates_per_batch: int = 1
    """optimiser steps per data batch; PSFT's ratio needs >1 (the authors: batches of 64, mini-batches of 8)"""
    token_budget: int = 16384
    """padded tokens per micro-batch per rank (gradient accumulation fills the global batch)"""
    max_prompt_len: int = 1024
    """longer prompts are dropped, and counted"""
    max_response_len: int = 8192
    """longer responses (with EOS) are dropped, and counted"""
    system_prompt: Literal[data.SYSTEM_PROMPT_MODES] = "paper"
    """paper: Table 7's prompt around the row's question | row: Table 7 with the row's own system message (the toy
    demo's one-liner) | messages: the row's prompt messages as stored, through the chat template (the authors)"""
    lr: float = 1e-5
    """peak learning rate (App. E)"""
    warmup_steps: int = 60
    """linear warm-up from min_lr_ratio * lr to lr over this many steps, then the cosine (App. E)"""
    lr_horizon: float = 1.0
    """the cosine spans lr_horizon x the run's optimiser steps. 1: it ends at the run's end (App. E, cosine) |
    4: the authors' worker builds it over total_training_steps * 4 (fsdp_workers.py line 442), so it barely decays"""
    min_lr_ratio: float = 0.0
    """floor of the cosine, a fraction of lr. 0: decay to 0 (the paper names none; verl's default) | 1e-4: the
    authors' 1_sft.sh line 39"""
    adam_beta2: float = 0.999
    """AdamW's beta2 (beta1 0.9). The paper names no optimiser settings; 0.999 is verl's default, which produced the
    paper's numbers (fsdp_workers.py line 438)"""
    loss_norm: Literal[LOSS_NORMS] = "batch_token_mean"
    """batch_token_mean: a step's loss is the mean over all its response tokens on all ranks (the paper does not say;
    every token weighs the same whatever the GPU count) | micro_batch_token_mean: the mean over groups of norm_group
    sequences of each group's token mean (the authors: a token mean per micro-batch of 2 sequences per GPU, averaged
    over micro-batches and GPUs; dp_actor.py lines 438-441 and 522, core_algos.py line 777)"""
    norm_group: int = 2
    """sequences per group with --loss_norm micro_batch_token_mean (1_sft.sh line 43: ppo_micro_batch_size_per_gpu=2)"""
    weight_decay: float = 0.01
    """AdamW weight decay (verl's default)"""
    grad_clip: float = 1.0
    """max global gradient norm"""
    teacher_every: int = 5
    """n: teacher update period in optimiser steps (Alg. 1 line 16)"""
    teacher_mu: float = 0.99
    """mu in phi <- (1 - mu) phi + mu theta (Alg. 1 line 17, as written)"""
    loss_chunk: int = 2048
    """tokens per logits chunk: the [tokens, vocab] logits exist one chunk at a time and are recomputed in backward"""
    bf16: bool = True
    """bf16 compute with float32 master weights and reductions (CUDA only; CPU runs float32)"""
    grad_ckpt: bool = True
    """activation checkpointing of the decoder layers"""
    seed: int = 0
    """data order and from-scratch initialisation"""
    save_every: int = 0
    """checkpoint every this many optimiser steps, at the end of a data batch (0: only at the end)"""
    keep_last: int = 0
    """keep only the newest N complete checkpoints (0: all); the one a run resumed from is never deleted"""
    offload: bool = False
    """FSDP2 CPU offload of the sharded parameters, gradients and Adam states (the authors ran with offload):
    frees ~16 bytes per parameter / GPUs of GPU memory, the optimiser step runs on the CPU"""
    dist_timeout_min: float = 60.0
    """minutes a collective may wait for the slowest rank before the run is aborted"""
    log_every: int = 1
    """log (and compute the expert-token entropy) every this many optimiser steps"""
    loggers: list[str] = ()
    """extra logging backends besides log.jsonl: wandb, tensorboard (their packages are not in requirements.txt)"""

    def __post_init__(self):
        common.check_settings(
            self, positive=["lr", "grad_clip", "dist_timeout_min"], fraction=["teacher_mu", "min_lr_ratio"],
            non_negative=["warmup_steps", "weight_decay", "save_every", "keep_last"],
            at_least_one=["epochs", "global_batch", "updates_per_batch", "token_budget", "max_prompt_len",
                          "max_response_len", "norm_group", "teacher_every", "loss_chunk", "log_every"])
        if self.max_steps != -1 and self.max_steps < 1:
            raise SystemExit(f"--max_steps {self.max_steps}: must be >= 1, or -1 for every epoch")
        if not 0 < self.adam_beta2 < 1:
            raise SystemExit(f"--adam_beta2 {self.adam_beta2}: must be in (0, 1)")
        if self.lr_horizon < 1:
            raise SystemExit(f"--lr_horizon {self.lr_horizon}: must be >= 1 (the schedule never passes its horizon)")


# settings a resumed run may change: they do not change what the run computes (run_dir.claim checks the others)
MAY_CHANGE_ON_RESUME = {"out_dir", "max_steps", "save_every", "keep_last", "log_every", "loggers", "loss_chunk",
                        "grad_ckpt", "offload", "dist_timeout_min"}


# ================================================================================================
# ALGO LOGIC: the loss of one micro-batch
# ================================================================================================
def teacher_side(head, hidden_t, y, args, cfg):
    """Alg. 1 lines 6-11, chunk by chunk, without gradient: lq [N] and the teacher diagnostics."""
    lq, diags = [], []
    with torch.no_grad():
        for s in range(0, len(y), args.loss_chunk):
            q, d = cl.teacher_log_prob(head(hidden_t[s : s + args.loss_chunk]), y[s : s + args.loss_chunk], cfg)
            lq.append(q)
            diags.append(d)
    return torch.cat(lq), cat_diags(diags)


def student_loss_sum(model, h, y, extra, args, cfg, want_entropy, weights=None):
    """Sum over the N tokens of the per-token loss (times weights [N], if given), one chunk of logits at a time."""
    needs = cl.LOSSES[args.loss][1]

    def chunk(h_c, y_c, extra_c, w_c):
        logits = model.lm_head(h_c)                                # [n, V], bf16 or float32
        if needs == "base":                                        # the frozen base model's logits
            with torch.no_grad():
                extra_c = extra["base_model"].lm_head(extra_c)
        loss, diag = cl.per_token_loss(args.loss, logits, y_c, cfg, extra_c)
        if want_entropy:
            diag["student_entropy"] = cl.entropy(logits.detach())
        return (loss if w_c is None else loss * w_c).sum(), diag

    return chunked_sum(chunk, args.loss_chunk, h, y, extra.get("tensor"), weights)


def micro_batch_loss(model, teacher, base, batch, old_logp, args, cfg, want_entropy, weights=None):
    """Sum of per-token losses (times weights [N] in select_targets order, if given) of one micro-batch and its
    diagnostics (Alg. 1 lines 4-13)."""
    h, y = select_targets(normed_hidden(model, batch), batch)      # [N, H], [N]
    needs, extra, diag = cl.LOSSES[args.loss][1], {}, {}
    if needs == "teacher_lq":
        if teacher is None:                                        # ablation: the student's own detached logits
            extra["tensor"], diag = teacher_side(model.lm_head, h.detach(), y, args, cfg)
        else:                                                      # the separate EMA teacher: one more forward
            with torch.no_grad():
                h_t, _ = select_targets(normed_hidden(teacher, batch), batch)
            extra["tensor"], diag = teacher_side(teacher.lm_head, h_t, y, args, cfg)
            teacher.reshard()                                      # FSDP keeps a root's weights gathered after forward
    elif needs == "base":
        with torch.no_grad():
            extra["tensor"], _ = select_targets(normed_hidden(base, batch), batch)
        extra["base_model"] = base
    elif needs == "old_logp":
        extra["tensor"] = old_logp
    total, student_diag = student_loss_sum(model, h, y, extra, args, cfg, want_entropy, weights)
    return total, diag | student_diag


@torch.no_grad()
def update_teacher(teacher, model, mu):
    """Alg. 1 line 17, as written: phi <- (1 - mu) phi + mu theta (mu = 0.99 pulls the teacher 99% of the
    way to the student). Both models are sharded alike, so this is elementwise on local shards."""
    for p_t, p_s in zip(teacher.parameters(), model.parameters()):
        p_t.copy_((1 - mu) * p_t + mu * p_s)


# ================================================================================================
# The recipe: schedule, optimiser, loss normalisation. File and line references are to the authors' code,
# github.com/HaoooWang/CurioSFT at 5a77394 (README, "Two recipes")
# ================================================================================================
def lr_at(step, total_steps, args):
    """The learning rate of optimiser step `step` (from 0) of total_steps: verl's get_cosine_schedule_with_warmup
    (verl/utils/torch_functional.py lines 509-550 in the authors' fork), which both recipes ran (App. E: verl, cosine,
    60 warm-up steps). Linear from min_lr_ratio * lr at step 0 to lr at warmup_steps, then a half cosine down to
    min_lr_ratio * lr at lr_horizon * total_steps (the horizon is never passed for lr_horizon >= 1)."""
    floor = args.min_lr_ratio
    if step < args.warmup_steps:
        return args.lr * (floor + (1 - floor) * step / args.warmup_steps)
    progress = (step - args.warmup_steps) / max(1, args.lr_horizon * total_steps - args.warmup_steps)
    return args.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))   # verl: x * coef + intercept


def make_optimizer(model, args, device):
    """AdamW with verl's defaults: betas (0.9, adam_beta2), weight decay 0.01 (fsdp_workers.py lines 435-440)."""
    return torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay,
                             betas=(0.9, args.adam_beta2), fused=device.type == "cuda" and not args.offload)


def token_weights(step_examples, n_targets, args, step):
    """{example: the weight of each of its response tokens} in one optimiser step over step_examples (all ranks), so
    that the step's loss is sum_t w_t * loss_t. batch_token_mean: 1 / (the step's response tokens).
    micro_batch_token_mean: the examples in random pairs (groups of norm_group), 1 / (groups x tokens of the
    token's group): verl's length balancing leaves each GPU's sequences in sampler order, so its micro-batches of 2
    pair sequences at random (seqlen_balancing.py lines 178-191). Same on every rank: a pure function of its inputs."""
    if args.loss_norm == "batch_token_mean":
        n_tok = sum(n_targets[i] for i in step_examples)
        return {i: 1.0 / n_tok for i in step_examples}
    order = sorted(step_examples)
    shuffle = torch.randperm(len(order), generator=torch.Generator().manual_seed(args.seed + step)).tolist()
    groups = [[order[k] for k in shuffle[g : g + args.norm_group]] for g in range(0, len(order), args.norm_group)]
    return {i: 1.0 / (len(groups) * sum(n_targets[j] for j in group)) for group in groups for i in group}


# ================================================================================================
# Plumbing: data, models, loop, checkpoints, logs
# ================================================================================================
def gather_diags(diag):
    """Per-token diagnostics of every rank, on every rank (small: a few floats per token)."""
    local = {k: v.float().cpu() for k, v in diag.items()}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, local)
    return cat_diags(everyone)


def optimiser_steps(lengths, world, args, epoch, batch_idx):
    """Alg. 1 line 2 as one flat sequence, from data batch `batch_idx` of `epoch` on: for every optimiser step,
    (epoch, batch_idx, update, batch, step_mbs). batch[r] lists rank r's micro-batches (example ids) of the data
    batch, planned as a pure function of (seed, epoch) on every rank; step_mbs are the indices of the micro-batches
    this update trains, the same on every rank (every rank has as many micro-batches)."""
    for e in range(epoch, args.epochs):
        batches = data.plan_micro_batches(lengths, args.global_batch, args.token_budget, world, args.seed, e)
        for b in range(batch_idx if e == epoch else 0, len(batches)):
            for update, part in enumerate(torch.arange(len(batches[b][0])).tensor_split(args.updates_per_batch)):
                yield e, b, update, batches[b], part.tolist()


def main():
    args, loss_cfg = common.parse_config(Args, cl.LossConfig)
    cl.config_for(args.loss, loss_cfg)
    rank, world, device = common.setup_distributed(args.dist_timeout_min)
    bf16 = args.bf16 and device.type == "cuda"
    out_dir = Path(args.out_dir)
    torch.manual_seed(args.seed)
    run_dir.claim(out_dir, run_dir.settings_of(args, loss_cfg), MAY_CHANGE_ON_RESUME,   # one run per directory
                  resuming=checkpoints.latest(out_dir) is not None)

    # ---- data: tokenised once; the response and its EOS are trained, the prompt is not
    common.check_model_dir(args.model, weights=not args.scratch)
    tokenizer = common.load_tokenizer(args.model)
    examples = data.load_examples(args.train_file, require_response=True)
    dataset, stats = data.build_sft_data(tokenizer, examples, args.max_prompt_len, args.max_response_len,
                                         args.system_prompt)
    common.print0(f"{args.train_file}: {stats['kept']} examples kept, {stats['dropped_prompt']} dropped "
                  f"(prompt > {args.max_prompt_len} tokens), {stats['dropped_response']} dropped "
                  f"(response > {args.max_response_len} tokens)")
    lengths = [len(ids) for ids, _ in dataset]
    n_targets = [int(mask[1:].sum()) for _, mask in dataset]
    batches_per_epoch = len(dataset) // args.global_batch
    if batches_per_epoch == 0:
        raise SystemExit(f"{args.train_file}: {len(dataset)} examples are fewer than one global batch "
                         f"(--global_batch {args.global_batch})")
    total_steps = args.epochs * batches_per_epoch * args.updates_per_batch

    # ---- models: the student, and the EMA teacher (Alg. 1 line 1: phi <- theta) or frozen base a loss needs
    needs = cl.LOSSES[args.loss][1]
    full = common.load_full_model(args.model, args.scratch, args.seed)
    separate = (needs == "teacher_lq" and args.loss != "curio_self_teacher") or needs == "base"
    frozen_copy = copy.deepcopy(full) if separate else None
    model = common.shard_model(full, device, bf16, args.grad_ckpt, offload=args.offload)
    other = common.shard_model(frozen_copy, device, bf16, grad_ckpt=False, trainable=False,
                               offload=args.offload) if separate else None
    teacher = other if needs == "teacher_lq" else None
    base = other if needs == "base" else None
    optimizer = make_optimizer(model, args, device)

    # ---- resume from the newest intact checkpoint
    step, epoch, batch_idx = 0, 0, 0                 # (epoch, batch_idx): the next data batch to train on
    resume_from = checkpoints.resume_point(out_dir)
    if resume_from is not None:
        position = checkpoints.restore(resume_from, model, optimizer, teacher)
        step, epoch, batch_idx = position["step"], position["epoch"], position["batch_idx"]
        common.print0(f"resumed from {resume_from} at step {step} (epoch {epoch}, batch {batch_idx})")
    last_steps = total_steps if args.max_steps == -1 else min(args.max_steps, total_steps)
    log = run_dir.RunLog(out_dir, step, last_steps, "sft", args.loggers, run_dir.settings_of(args, loss_cfg)) \
        if rank == 0 else None
    last_saved = step

    def save():
        nonlocal last_saved
        path = checkpoints.save(out_dir, step, model, tokenizer, checkpoints.trainer_state(model, optimizer, teacher),
                                {"step": step, "epoch": epoch, "batch_idx": batch_idx},
                                dtype=torch.bfloat16 if bf16 else torch.float32, keep_last=args.keep_last,
                                keep=resume_from)
        last_saved = step
        common.print0(f"saved {path}")

    # ---- the loop: one optimiser step per iteration (Alg. 1 lines 2-17)
    for epoch, batch_idx, update, batch, step_mbs in optimiser_steps(lengths, world, args, epoch, batch_idx):
        if update == 0:                                  # a new data batch: this rank's micro-batches, on the device
            mine = [{k: v.to(device) for k, v in data.collate([dataset[i] for i in mb], tokenizer.pad_token_id).items()}
                    for mb in batch[rank]]
            # PSFT's ratio: log-probs of the model as it was at the start of the data batch
            old_logp = [token_log_probs(model, b, args.loss_chunk)[0] if needs == "old_logp" else None for b in mine]
        everyone = [i for r in range(world) for k in step_mbs for i in batch[r][k]]    # this step's examples
        weight = token_weights(everyone, n_targets, args, step)         # the step's loss is sum_t w_t loss_t
        want_log = step % args.log_every == 0
        for g in optimizer.param_groups:
            g["lr"] = lr_at(step, total_steps, args)
        t0, loss_sum, diags = time.perf_counter(), torch.zeros((), dtype=torch.float64), []
        for k in step_mbs:
            w = torch.tensor([weight[i] for i in batch[rank][k] for _ in range(n_targets[i])], device=device)  # [N]
            # Alg. 1 lines 4-13: student and teacher logits, H_t, Delta_t, tau_hat_t, the per-token loss
            try:
                total, diag = micro_batch_loss(model, teacher, base, mine[k], old_logp[k], args, loss_cfg, want_log, w)
            except FloatingPointError as e:                 # curio_loss refuses NaN logits, naming them
                raise SystemExit(f"step {step + 1}: {e}; nothing after step {last_saved} is saved") from None
            # FSDP averages gradients over ranks, hence * world for the gradient of the step's loss (a gradient-sum
            # option needs PREMUL_SUM, absent in gloo). Each micro-batch's backward reduce-scatters its gradient into
            # the float32 shards: syncing only the step's last one (set_requires_gradient_sync(False) before) would
            # hold a full unsharded float32 gradient of every parameter on every rank, 30 GB for a 7B model.
            (total * world).backward()
            if base is not None:
                base.reshard()                                      # its head was gathered for the backward
            loss_sum += total.detach().double().cpu()
            diags.append(diag)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        grad_norm = (grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm).item()
        dist.all_reduce(loss_sum)
        if not (math.isfinite(loss_sum.item()) and math.isfinite(grad_norm)):
            raise SystemExit(f"step {step + 1}: the loss ({loss_sum.item()}) or the gradient norm ({grad_norm}) is "
                             f"not finite; the update was not applied and nothing after step {last_saved} is saved")
        optimizer.step()                                 # Alg. 1 line 14
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if teacher is not None and step % args.teacher_every == 0:      # Alg. 1 lines 16-17
            update_teacher(teacher, model, args.teacher_mu)
        if want_log:
            every = gather_diags(cat_diags(diags))
            dt = time.perf_counter() - t0
            record = {"step": step, "epoch": epoch, "loss": loss_sum.item(), "grad_norm": grad_norm,
                      "lr": lr_at(step - 1, total_steps, args), "tokens_per_s": sum(lengths[i] for i in everyone) / dt,
                      "step_time_s": dt, "padding_efficiency": data.padding_efficiency(lengths, sum(batch, [])),
                      **cl.summarize(every, loss_cfg.alpha)}
            if log is not None:
                log.write(record)
        if update == args.updates_per_batch - 1 or step == last_steps:   # done with this data batch: the position
            epoch, batch_idx = (epoch, batch_idx + 1) if batch_idx + 1 < batches_per_epoch else (epoch + 1, 0)
            if args.save_every and step // args.save_every > last_saved // args.save_every:
                save()                                   # (a run stopped by --max_steps resumes at the next batch)
        if step == last_steps:
            break
    if last_saved != step:
        save()
    if log is not None:
        log.close()
    run_dir.release()
    common.shutdown()


if __name__ == "__main__":
    common.run_script(main)
