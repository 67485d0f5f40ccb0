# CurioSFT's SFT stage: Alg. 1 of "Learning While Staying Curious" (arXiv:2602.02244), App. E.
"""SFT with CurioSFT, its ablations or a Table 2 baseline. One process (CPU or one GPU), or under
`torchrun --nproc_per_node N` (FSDP2; gloo on CPU, nccl on GPU). sft.py --help lists the flags.

    python sft.py config/sft_tiny.py --model DIR --train_file data.jsonl
    torchrun --nproc_per_node 8 sft.py config/sft_paper.py --model DIR --train_file train.parquet

Read `curio_loss_unchunked` first: Alg. 1 lines 4-13 for one micro-batch in a few lines. Then the
loop in `train` (lines 2-17): each step's `optimizer_step` takes every micro-batch's
`micro_batch_loss`, which is `curio_micro_batch_loss` (the same loss, one chunk of logits at a
time) for CurioSFT, and one call into baselines.py (`variant_micro_batch_loss`, through its
VARIANT_LOSSES) for the ablation without a separate teacher and the Table 2 baselines. The recipe
(learning-rate schedule, loss normalisation) comes after the losses, the loop's helpers after it.
The run around the loop (its directory, resume, log, checkpoints) is plumbing/run.py.
"""
import copy
import math
import time
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

import baselines
import curio_loss as cl
import data
import measure
from chunked_logits import cat_diags, chunked_sum, no_grad_logits, normed_hidden, select_targets
from plumbing import run_dir
from plumbing.cli import check_settings, parse_config, run_script
from plumbing.compiling import compiled_if
from plumbing.distributed import (StopSignal, gather_diags, print0, read_step, setup_distributed,
                                  shutdown)
from plumbing.models import (check_model_dir, clip_grad_norm, cpu_threads_per_rank, load_full_model,
                             load_tokenizer, make_optimizer, resolve_model, shard_model)
from plumbing.run import MAY_CHANGE_ON_RESUME as RUN_MAY_CHANGE, Run, TrainerArgs


LOSS_NORMS = ("batch_token_mean", "micro_batch_token_mean")


@dataclass
class Args(TrainerArgs):
    """sft.py settings"""
    loss: Literal[baselines.LOSSES] = "curio"
    """CurioSFT, its ablations (Sec. 5.2) or a Table 2 baseline (baselines.py)"""
    teacher_every: int = 5
    """n: teacher update period in optimiser steps (Alg. 1 line 16)"""
    teacher_mu: float = 0.99
    """mu in phi <- (1 - mu) phi + mu theta (Alg. 1 line 17, as written)"""
    epochs: int = 3
    """passes over the data (App. E)"""
    max_steps: int = -1
    """stop after this many optimiser steps (-1: every epoch); the schedule spans every epoch"""
    global_batch: int = 256
    """sequences per data batch, over all ranks (App. E)"""
    updates_per_batch: int = 1
    """optimiser steps per data batch; PSFT's ratio needs more than 1"""
    token_budget: int = 16384
    """tokens per micro-batch per rank (gradient accumulation fills the data batch): its sequences
    end to end with --pack, else each padded to the longest"""
    warmup_steps: int = 60
    """linear warm-up from min_lr_ratio * lr to lr, then the cosine (App. E)"""
    lr_horizon: float = 1.0
    """the cosine spans lr_horizon x the run's optimiser steps (the authors' scripts: 4)"""
    min_lr_ratio: float = 0.0
    """floor of the cosine, a fraction of lr (the authors' scripts: 1e-4)"""
    adam_beta2: float = 0.999
    """AdamW's beta2 (beta1 0.9); the paper names none, 0.999 is what its runs used"""
    loss_norm: Literal[LOSS_NORMS] = "batch_token_mean"
    """how a step's per-token losses are weighted (`token_weights`)"""
    norm_group: int = 2
    """sequences per group with --loss_norm micro_batch_token_mean"""
    scratch: bool = False
    """random weights from the directory's config.json instead of its weights (the toy demo)"""
    log_every: int = 1
    """log (and measure the student's entropy) every this many optimiser steps"""

    def __post_init__(self):
        super().__post_init__()                                # TrainerArgs' and --eval_* flags
        check_settings(self, fraction=["teacher_mu", "min_lr_ratio"], non_negative=["warmup_steps"],
                       at_least_one=["epochs", "global_batch", "updates_per_batch", "token_budget",
                                     "norm_group", "teacher_every", "log_every"])
        if self.max_steps != -1 and self.max_steps < 1:
            raise SystemExit(f"--max_steps {self.max_steps}: must be >= 1, or -1 for every epoch")
        if not 0 < self.adam_beta2 < 1:
            raise SystemExit(f"--adam_beta2 {self.adam_beta2}: must be in (0, 1)")
        if self.lr_horizon < 1:
            raise SystemExit(f"--lr_horizon {self.lr_horizon}: must be >= 1 (the schedule never "
                             f"passes its horizon)")


def check_world(args, world):
    """Refuses, before anything is loaded, a GPU count that does not divide the global batch."""
    if args.global_batch % world:
        raise SystemExit(f"--global_batch {args.global_batch} is not divisible by the number of "
                         f"GPUs (ranks), {world}")


# settings a resumed run may change (plumbing/run.py says which and why), and sft.py's: where it
# stops (--max_steps), how often it logs, validation's engine
MAY_CHANGE_ON_RESUME = RUN_MAY_CHANGE | {"max_steps", "log_every", "engine"}


# ================================================================================================
# ALGO LOGIC: the CurioSFT loss of one micro-batch (Alg. 1 lines 4-13), the teacher update (17)
# ================================================================================================
def curio_loss_unchunked(model, teacher, batch, cfg):
    """Alg. 1 lines 4-13 for one micro-batch as the paper writes them: the sum over its N response
    tokens of Eq. 6, with the [N, V] logits whole. curio_micro_batch_loss computes the same one
    chunk of tokens at a time (tests/test_sft.py holds the two together): at a 152k vocabulary
    these logits would not fit."""
    h, y = select_targets(normed_hidden(model, batch), batch)           # line 4: [N, H], [N]
    with torch.no_grad():
        h_t, _ = select_targets(normed_hidden(teacher, batch), batch)   # line 6
        lq, _ = cl.teacher_log_prob(teacher.lm_head(h_t), y, cfg)       # lines 7-11: Eq. 4, 7
    loss, _ = cl.curio_sft_loss(model.lm_head(h), y, lq, cfg)           # lines 12-13: Eq. 5, 6
    return loss.sum()


def curio_micro_batch_loss(model, teacher, batch, args, cfg, want_entropy, weights=None,
                           check=False):
    """Alg. 1 lines 4-13 for one micro-batch (CurioSFT; curio_fixed_tau only sets cfg.fixed_tau):
    the sum over its N response tokens of the per-token loss, times weights [N] if given, and
    per-token diagnostics. The [N, V] logits exist one chunk of tokens at a time, recomputed in
    backward (chunked_logits.chunked_sum). check: name the input that made a loss non-finite."""
    h, y = select_targets(normed_hidden(model, batch), batch)      # line 4: student forward, [N, H]
    lq, teacher_diags = [], []
    # --compile: the passes over [n, V] logits fused by torch.compile (plumbing/compiling.py)
    teacher_log_prob, curio_sft_loss, entropy = compiled_if(args.compile, cl.teacher_log_prob,
                                                            cl.curio_sft_loss, cl.entropy)
    with torch.no_grad():
        h_t, _ = select_targets(normed_hidden(teacher, batch), batch)   # line 6: teacher forward
        for s in range(0, len(y), args.loss_chunk):                # lines 7-11: H_t, tau_hat_t, lq
            z_t = no_grad_logits(teacher.lm_head, h_t[s : s + args.loss_chunk])        # [n, V]
            lq_chunk, diag = teacher_log_prob(z_t, y[s : s + args.loss_chunk], cfg)
            lq.append(lq_chunk)
            teacher_diags.append(diag)
    teacher.reshard()                      # FSDP keeps a root's weights gathered after its forward
    lq = torch.cat(lq) if lq else h.new_zeros(0, dtype=torch.float32)      # [N]

    def chunk_loss(h_c, y_c, lq_c, w_c, memo):
        # line 4: student logits [n, V] (bf16 on a GPU: the loss reads them without a float32 copy)
        logits = cl.loss_logits(model.lm_head(h_c))
        loss, diag = curio_sft_loss(logits, y_c, lq_c, cfg)        # lines 12-13: Eq. 5, 6
        if check:
            cl.check_finite(loss, logits, y_c, lq_c)
        if want_entropy and "entropy" not in memo:   # memo: not again in backward's recompute
            memo["entropy"] = diag["student_entropy"] = entropy(logits.detach())
        return (loss if w_c is None else loss * w_c).sum(), diag

    total, diag = chunked_sum(chunk_loss, args.loss_chunk, h, y, lq, weights)
    return total, cat_diags(teacher_diags) | diag


@torch.no_grad()
def update_teacher(teacher, model, mu):
    """Alg. 1 line 17, as written: phi <- (1 - mu) phi + mu theta (mu = 0.99 pulls the teacher 99%
    of the way to the student). Both models are sharded alike: elementwise on local shards."""
    for p_t, p_s in zip(teacher.parameters(), model.parameters()):
        p_t.copy_((1 - mu) * p_t + mu * p_s)


def micro_batch_loss(model, teacher, base, batch, old_logp, args, cfg, want_entropy, weights=None,
                     check=False):
    """The loss of one micro-batch for any --loss: CurioSFT's path with a teacher, else the
    variants' (baselines.py)."""
    if teacher is not None:
        return curio_micro_batch_loss(model, teacher, batch, args, cfg, want_entropy, weights,
                                      check)
    return baselines.variant_micro_batch_loss(model, base, batch, old_logp, args, cfg,
                                              want_entropy, weights, check)


# ================================================================================================
# The recipe: learning-rate schedule and loss normalisation (docs/recipes.md)
# ================================================================================================
def lr_at(step, total_steps, args):
    """The learning rate of optimiser step `step` (from 0) of total_steps: verl's cosine schedule
    with warm-up, which both recipes ran (App. E: cosine, 60 warm-up steps). Linear from
    min_lr_ratio * lr at step 0 to lr at warmup_steps, then a half cosine down to min_lr_ratio * lr
    at lr_horizon * total_steps (never passed for lr_horizon >= 1)."""
    floor = args.min_lr_ratio
    if step < args.warmup_steps:
        return args.lr * (floor + (1 - floor) * step / args.warmup_steps)
    horizon = args.lr_horizon * total_steps
    progress = (step - args.warmup_steps) / max(1, horizon - args.warmup_steps)
    return args.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def token_weights(step_examples, n_targets, args, step):
    """{example: the weight of each of its response tokens} in one optimiser step over
    step_examples (all ranks): the step's loss is sum_t w_t * loss_t. A pure function of its inputs,
    the same on every rank.
    batch_token_mean: 1 / (the step's response tokens): every token weighs the same, whatever the
    number of GPUs. micro_batch_token_mean (the authors' scripts: a token mean per micro-batch of 2
    sequences per GPU, averaged over micro-batches and GPUs): the examples in random groups of
    norm_group, each token weighing 1 / (groups x the tokens of its group); random, as the authors'
    length balancing pairs sequences in sampler order."""
    if args.loss_norm == "batch_token_mean":
        n_tok = sum(n_targets[i] for i in step_examples)
        return {i: 1.0 / n_tok for i in step_examples}
    order = sorted(step_examples)
    generator = torch.Generator().manual_seed(args.seed + step)
    shuffle = torch.randperm(len(order), generator=generator).tolist()
    groups = [[order[k] for k in shuffle[g : g + args.norm_group]]
              for g in range(0, len(order), args.norm_group)]
    weight = {}
    for group in groups:
        for i in group:
            weight[i] = 1.0 / (len(groups) * sum(n_targets[j] for j in group))
    return weight


# ================================================================================================
# The loop (Alg. 1 lines 2-17) and what it needs
# ================================================================================================
def plan_steps(lengths, world, args, epoch, batch_idx):
    """Alg. 1 line 2 as one flat sequence, from data batch `batch_idx` of `epoch` on: for every
    optimiser step (epoch, batch_idx, update, batch, step_mbs). batch[r] lists rank r's
    micro-batches (example ids) of the data batch, planned as a pure function of (seed, epoch) on
    every rank; step_mbs are the indices of the micro-batches this update trains, the same on every
    rank (every rank has as many micro-batches)."""
    for e in range(epoch, args.epochs):
        batches = data.plan_micro_batches(lengths, args.global_batch, args.token_budget, world,
                                          args.seed, e, args.pack)
        for b in range(batch_idx if e == epoch else 0, len(batches)):
            parts = torch.arange(len(batches[b][0])).tensor_split(args.updates_per_batch)
            for update, part in enumerate(parts):
                yield e, b, update, batches[b], part.tolist()


def per_token(weight, examples, n_targets, device):
    """[N] the weight of each response token of `examples`, in select_targets order."""
    w = []
    for i in examples:
        w += [weight[i]] * n_targets[i]
    return torch.tensor(w).to(device)     # built on the host, then copied (fake tensors can copy)


def ends_mid_batch(args):
    """run_dir.check_end's objection to going on from a --max_steps end inside a data batch: the
    position moved to the next batch, whose rest would be skipped (the schedule spans every epoch
    and the data plan is max_steps' own: any other end goes on exactly)."""
    return lambda step: (f"step {step} is inside a data batch (--updates_per_batch "
                         f"{args.updates_per_batch}), whose remaining updates would be skipped"
                         if step % args.updates_per_batch else None)


def micro_batch_backward(total, base):
    """Backward of a micro-batch's loss. FSDP averages gradients over ranks, hence * world for the
    gradient of the step's loss. Each micro-batch's backward reduce-scatters its gradient into the
    float32 shards: syncing only the last one would hold a full float32 gradient of every
    parameter on every rank (30 GB at 7B)."""
    (total * dist.get_world_size()).backward()
    if base is not None:
        base.reshard()                                       # its head was gathered for backward


def why_not_finite(model, teacher, base, micro_batches, old_logp, args, cfg) -> str:
    """After a step whose loss or gradient norm is not finite: the micro-batches' forwards again,
    with curio_loss.check_finite on every chunk, to name the input to blame. Every rank runs all of
    its own (FSDP's forwards are collectives), so that all stop together."""
    reason = None
    with torch.no_grad():
        for batch, old in zip(micro_batches, old_logp):
            try:
                micro_batch_loss(model, teacher, base, batch, old, args, cfg, False, check=True)
            except FloatingPointError as e:
                reason = reason or str(e)
            if base is not None:
                base.reshard()
    return reason or "every per-token loss is finite, the gradient norm is not"


def load_sft_data(args):
    """The tokenizer, the tokenised examples (the response and its EOS are trained, the prompt is
    not), their lengths, their response-token counts, and the file's rows: the inputs first, so
    that nothing is written before they are known good."""
    check_model_dir(args.model, weights=not args.scratch)
    tokenizer = load_tokenizer(args.model)
    examples = data.load_examples(args.train_file, require_response=True)
    dataset, stats = data.build_sft_data(tokenizer, examples, args.max_prompt_len,
                                         args.max_response_len, args.system_prompt)
    print0(f"{args.train_file}: {stats['kept']} examples kept, {stats['dropped_prompt']} dropped "
           f"(prompt > {args.max_prompt_len} tokens), {stats['dropped_response']} dropped "
           f"(response > {args.max_response_len} tokens)")
    if len(dataset) < args.global_batch:
        raise SystemExit(f"{args.train_file}: {len(dataset)} examples are fewer than one global "
                         f"batch (--global_batch {args.global_batch})")
    lengths = [len(ids) for ids, _ in dataset]
    n_targets = [int(mask[1:].sum()) for _, mask in dataset]
    return tokenizer, dataset, lengths, n_targets, len(examples)


def load_models(args, device, bf16):
    """The student sharded and, if the loss needs one, the second model: CurioSFT's teacher, a copy
    of the student (Alg. 1 line 1: phi <- theta), or the kl baseline's frozen base, sharded alike.
    Returns (model, teacher, base), None for the model the loss does not use."""
    student = load_full_model(args.model, args.scratch, args.seed)
    second = baselines.second_model(args.loss)
    initial = copy.deepcopy(student) if second else None
    model = shard_model(student, device, bf16, args.grad_ckpt, offload=args.offload,
                        compile_layers=args.compile)
    other = None
    if second:
        other = shard_model(initial, device, bf16, grad_ckpt=False, trainable=False,
                            offload=args.offload, compile_layers=args.compile)
    return model, (other if second == "teacher" else None), (other if second == "base" else None)


def optimizer_step(models, optimizer, micro_batches, old_logp, weights, args, cfg, want_log, step,
                   run):
    """Alg. 1 lines 4-14 on this rank's micro-batches of optimiser step `step` (from 0): each one's
    loss and backward (its gradient reduce-scattered), the gradient clipped, the update. Returns the
    step's loss (all ranks), gradient norm and logged diagnostics, read in the step's one host sync.
    A loss or norm that is not finite stops the run before the update, naming the input to blame."""
    model, teacher, base = models
    device = micro_batches[0]["input_ids"].device
    loss, diags = torch.zeros((), dtype=torch.float64, device=device), []
    for batch, old, w in zip(micro_batches, old_logp, weights):     # lines 4-13, one at a time
        total, diag = micro_batch_loss(model, teacher, base, batch, old, args, cfg, want_log, w)
        micro_batch_backward(total, base)
        loss += total.detach()
        if want_log:
            diags.append(diag)
    grad_norm = clip_grad_norm(model, args.grad_clip)
    dist.all_reduce(loss)                                              # the step's loss, all ranks
    loss, grad_norm, diags = read_step(loss, grad_norm, cat_diags(diags))   # the host sync
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        why = why_not_finite(model, teacher, base, micro_batches, old_logp, args, cfg)
        raise run.failed(step + 1, f"{why}; the update was not applied")
    optimizer.step()                                                   # line 14
    optimizer.zero_grad(set_to_none=True)
    return loss, grad_norm, diags


def train(args, user_loss_cfg, device):
    """Alg. 1 in an initialised process group: the data, the run directory, the models, then one
    optimiser step per iteration of the loop, checkpoints and the log. user_loss_cfg: the loss
    settings as given (cl.LossConfig; recorded with the run's settings)."""
    cfg = baselines.config_for(args.loss, user_loss_cfg)
    rank, world = dist.get_rank(), dist.get_world_size()
    check_world(args, world)
    stop = StopSignal()                      # SIGTERM / Ctrl-C: finish the data batch, save, leave
    bf16 = args.bf16 and device.type == "cuda"
    torch.manual_seed(args.seed)
    tokenizer, dataset, lengths, n_targets, rows = load_sft_data(args)
    validation = measure.Validation(args, tokenizer)     # a bad eval file: refused now, not later
    batches_per_epoch = len(dataset) // args.global_batch
    total_steps = args.epochs * batches_per_epoch * args.updates_per_batch
    last_step = total_steps if args.max_steps == -1 else min(args.max_steps, total_steps)
    run = Run(args, device, stop, run_dir.settings_of(args, user_loss_cfg), MAY_CHANGE_ON_RESUME,
              run_dir.settings_of(Args(), cl.LossConfig()), rows, last_step, "--max_steps",
              ends_mid_batch(args))
    if run.complete:
        return
    if args.eval_every:   # validation's engine, asleep; first: vLLM's share of the GPU must be free
        validation.own_engine(args, device, bf16, random_weights=args.scratch)
    model, teacher, base = load_models(args, device, bf16)
    optimizer = make_optimizer(model, args.lr, args.weight_decay, args.adam_beta2, device,
                               args.offload)
    if args.offload:
        torch.set_num_threads(cpu_threads_per_rank())  # the optimiser step runs on the CPU
    at = run.start(model, optimizer, teacher, {"step": 0, "epoch": 0, "batch_idx": 0}, "sft")
    step = at["step"]

    # ---- ALGO LOGIC: one optimiser step per iteration (Alg. 1 lines 2-17)
    for epoch, batch_idx, update, batch, step_mbs in plan_steps(lengths, world, args, at["epoch"],
                                                                at["batch_idx"]):
        if update == 0:                 # a new data batch: this rank's micro-batches, on the device
            mine = [data.collate_ids(mb, dataset, tokenizer.pad_token_id, device, args.pack)
                    for mb in batch[rank]]
            old_logp = baselines.old_log_probs(model, mine, args)     # PSFT's ratio; else None
        step_examples = data.examples_of(batch, step_mbs)                # every rank's, this step
        weight = token_weights(step_examples, n_targets, args, step)   # loss: sum_t w_t loss_t
        weights = [per_token(weight, batch[rank][k], n_targets, device) for k in step_mbs]
        for g in optimizer.param_groups:
            g["lr"] = lr_at(step, total_steps, args)
        want_log, t0 = step % args.log_every == 0, time.perf_counter()
        loss, grad_norm, diags = optimizer_step(
            (model, teacher, base), optimizer, [mine[k] for k in step_mbs],
            [old_logp[k] for k in step_mbs], weights, args, cfg, want_log, step, run)  # l. 4-14
        step += 1
        if teacher is not None and step % args.teacher_every == 0:     # Alg. 1 lines 16-17
            update_teacher(teacher, model, args.teacher_mu)
        if want_log:
            all_diags = gather_diags(diags)                            # rank 0's; None elsewhere
            dt = time.perf_counter() - t0
            if run.log is not None:
                run.write({"step": step, "epoch": epoch, "loss": loss, "grad_norm": grad_norm,
                           "lr": lr_at(step - 1, total_steps, args),
                           "tokens_per_s": sum(lengths[i] for i in step_examples) / dt,
                           "step_time_s": dt, "padding_efficiency": data.padding_efficiency(
                               lengths, sum(batch, []), args.pack),
                           **cl.summarize(all_diags, cfg.alpha)})
        validation.after(step, model, tokenizer, run)    # a part of this step, when it is due
        if update == args.updates_per_batch - 1 or step == last_step:  # this data batch is done
            epoch, batch_idx = (epoch, batch_idx + 1) if batch_idx + 1 < batches_per_epoch \
                else (epoch + 1, 0)
            run.after_step({"step": step, "epoch": epoch, "batch_idx": batch_idx}, tokenizer)
        if step == last_step:
            break
    run.finish(step)


def main():
    args, user_loss_cfg = parse_config(Args, cl.LossConfig)
    _, world, device = setup_distributed(args.dist_timeout_min)
    check_world(args, world)                      # before a hub download
    args.model = resolve_model(args.model, weights=not args.scratch)   # org/name: the hub's copy
    train(args, user_loss_cfg, device)
    shutdown()


if __name__ == "__main__":
    run_script(main)
