# CurioSFT's RL stage: GRPO from an SFT checkpoint (arXiv:2602.02244, Sec. 5.2, App. E Table 6).
"""GRPO (Shao et al. 2024) with DAPO's clip-higher (Yu et al. 2025), no KL term. One process (CPU:
HF generate) or under `torchrun --nproc_per_node N` (FSDP2 trainer, one vLLM engine per GPU). Where
the paper is silent, the numerics follow verl, the RL framework the authors' code is a fork of.

    python rl.py config/rl_tiny.py --model out/sft/step_000010 --train_file data.jsonl
    torchrun --nproc_per_node 8 rl.py config/rl_paper.py --model SFT_CKPT --train_file train.parquet

One step, as the loop in `train` reads: rollouts -> reward (`math_reward`, App. E) -> group
advantages -> old log-probs -> one `policy_update` per mini-batch of prompts, which calls
`ppo_clip_loss` (the paper's clip-higher objective) on each chunk of tokens; `dual_clip_loss` and
the authors' `custom_loss_rl` sit beside it, picked by the flags. The engine's sleep, wake and
weight sync are plumbing/generation.py; python rl.py --help lists the flags.
"""
import itertools
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.distributed as dist

import curio_loss as cl
import data
import evaluation
import hybrid
from hybrid import HYBRIDS, PREFIX_SCHEDULES
from chunked_logits import chunked_sum, normed_hidden, select_targets, token_log_probs
from plumbing import checkpoints, generation, run_dir
from plumbing.cli import check_settings, parse_config, run_script
from plumbing.distributed import StopSignal, print0, setup_distributed, shutdown
from plumbing.grading import GRADING_MODES, answer_kind, grade, graded_text
from plumbing.models import (check_model_dir, clip_grad_norm, cpu_threads_per_rank, load_full_model,
                             load_tokenizer, make_optimizer, resolve_model, shard_model)


POLICY_LOSSES = ("ppo_clip", "custom_loss_rl")
LOSS_AGGS = ("token_mean", "seq_sum_over_max_len", "rank_sum_over_max_len")


@dataclass
class Args(evaluation.ValidationArgs):
    """rl.py settings"""
    REQUIRED = ("model", "train_file")
    model: str = ""
    """checkpoint to start from (an SFT checkpoint: config.json, safetensors weights, tokenizer)"""
    train_file: str = ""
    """prompts and ground truths: .parquet / .jsonl / .json in the authors' schema"""
    out_dir: str = "out/rl"
    """checkpoints and log.jsonl go here; a checkpoint already here is resumed"""
    steps: int = 500
    """GRPO steps, each on one batch of prompts (Table 6)"""
    prompts_per_step: int = 128
    """prompts per step, over all ranks (Table 6 "Batch Size")"""
    rollouts: int = 8
    """responses sampled per prompt: the GRPO group (Table 6)"""
    mini_batch: int = 64
    """prompts per optimiser step, over all ranks (Table 6: 64, so 2 updates per step)"""
    micro_batch: int = 4
    """sequences per forward/backward pass per rank"""
    lr: float = 1e-6
    """constant learning rate (Table 6)"""
    weight_decay: float = 0.01
    """AdamW weight decay"""
    grad_clip: float = 1.0
    """max global gradient norm"""
    clip_low: float = 0.2
    """eps_low: the ratio is clipped below at 1 - eps_low (Table 6)"""
    clip_high: float = 0.28
    """eps_high: the ratio is clipped above at 1 + eps_high (Table 6: DAPO's clip-higher)"""
    policy_loss: Literal[POLICY_LOSSES] = "ppo_clip"
    """ppo_clip: GRPO's (Sec. 5.2) | custom_loss_rl: the authors' scripts' (`custom_loss_rl`)"""
    clip_ratio_c: float | None = None
    """ppo_clip's dual-clip: for A < 0 the loss is at most -A * this (verl's 3) | none: no cap"""
    loss_agg: Literal[LOSS_AGGS] = "token_mean"
    """how a mini-batch's per-token losses are combined (`loss_denominator`)"""
    loss_agg_ranks: int = 8
    """rank_sum_over_max_len: the GPUs the authors' gradient averages over (their scripts: 8)"""
    adv_std: bool = True
    """divide each group's r - mean(r) by its std (GRPO); LUFFY's and RL-PLUS's scripts: false"""
    entropy_coef: float = 0.0
    """minus this x each micro-batch's token-mean entropy, with gradient (LUFFY, RL-PLUS: 0.001);
    needs --loss_agg rank_sum_over_max_len, the aggregation of the scripts that set it"""
    entropy_pack_tokens: int = 32768
    """--entropy_coef: the tokens per micro-batch the bonus counts as the authors' GPUs pack them
    (their ppo_max_token_len_per_gpu), which sets how many token means it sums"""
    hybrid: Literal[HYBRIDS] = "none"
    """Table 3's hybrids (hybrid.py): luffy, rl_plus: the expert's response is one of each group's
    --rollouts, the clip settings do not apply | prefix_rft: rollouts continue its prefixes"""
    prefix_rollouts: int = 1
    """prefix_rft: rollouts per group that continue a prefix of the expert's response"""
    prefix_schedule: Literal[PREFIX_SCHEDULES] = "cosine_decay"
    """prefix_rft: how both bounds of the prefix ratio move from their start to their end"""
    prefix_low_start: float = 0.95
    """prefix_rft: the lower bound of the prefix ratio at step 0 (ratio: lower + (upper - lower) x
    Beta(1, 1))"""
    prefix_low_end: float = 0.05
    """prefix_rft: the lower bound after --prefix_schedule_steps"""
    prefix_high_start: float = 0.95
    """prefix_rft: the upper bound at step 0"""
    prefix_high_end: float = 0.05
    """prefix_rft: the upper bound after --prefix_schedule_steps"""
    prefix_warmup_ratio: float = 0.0
    """prefix_rft: the decays first rise from 0 over this share of --prefix_schedule_steps"""
    prefix_schedule_steps: int = 0
    """prefix_rft: the steps the bounds take from start to end (0: the --steps the run starts with,
    recorded in run_config.json: a resume to another --steps keeps the schedule)"""
    prefix_entropy_mask: float = 0.8
    """prefix_rft: the lowest-entropy share of a micro-batch's prefix tokens whose advantage is 0
    (0.8: the top fifth keep theirs)"""
    reward: Literal[GRADING_MODES] = "paper"
    """paper: App. E's rule | authors_rl: the authors' RL reward | authors: their evaluation's"""
    temperature: float = 1.0
    """rollout temperature; the trainer scores tokens at the same temperature (Table 6)"""
    top_p: float = 0.95
    """rollout nucleus sampling (Table 6)"""
    max_prompt_len: int = 1024
    """longer prompts are dropped, and counted"""
    max_response_len: int = 8192
    """generation stops after this many tokens (Table 6)"""
    system_prompt: Literal[data.SYSTEM_PROMPT_MODES] = "paper"
    """the prompt around each question: paper | row | messages (data.example_prompt)"""
    loss_chunk: int = 2048
    """tokens per logits chunk: the [tokens, vocab] logits exist one chunk at a time"""
    bf16: bool = True
    """bf16 compute with float32 master weights and reductions (CUDA only; CPU runs float32)"""
    grad_ckpt: bool = True
    """activation checkpointing of the decoder layers"""
    pack: bool = True
    """padding-free micro-batches: the sequences end to end in one row, attention within each
    (plumbing/attention.py); --no-pack: right-padded rows"""
    engine: Literal[generation.ENGINES] = "auto"
    """auto: vLLM with CUDA and the vllm package, else HF generate | hf | vllm"""
    gpu_memory_utilization: float = 0.6
    """vLLM: the share of the GPU's total memory it takes while it generates"""
    vllm_sleep: bool = True
    """vLLM frees its weights and KV cache while the trainer works"""
    sync_bucket_mb: int = 1024
    """weight sync: MB of full tensors gathered from the FSDP shards per load into the engine"""
    engine_logp_tol: float = 0.1
    """the engine check's ceiling: stop before the update when the engine's log-probs of its samples
    differ from the trainer's by more than this (mean over the step's tokens, in nats), or by more
    than 10 x step 1's difference (ENGINE_FLOOR_FACTOR): a weight the sync missed
    (engine_logp_diff_mean, docs/metrics.md)"""
    gen_batch_size: int = 16
    """HF engine: prompts per generate call (vLLM schedules its own batches); no sample depends on
    it: each draws from a seed of its own"""
    grader_timeout: float = 10.0
    """seconds per graded response; an overrunning grader is killed and the response scores 0"""
    grader_workers: int = 4
    """grader processes per rank"""
    seed: int = 0
    """prompt order and sampling"""
    save_every: int = 50
    """checkpoint every this many steps (0: at the end only)"""
    keep_last: int = 0
    """keep the newest N checkpoints (0: all); the one a run resumed from is never deleted"""
    offload: bool = False
    """FSDP2 CPU offload of parameters, gradients and AdamW states (the step runs on the CPU)"""
    dist_timeout_min: float = 60.0
    """minutes a collective may wait for the slowest rank (ranks finish their rollouts apart)"""
    loggers: list[str] = ()
    """logging besides log.jsonl: wandb, tensorboard (their packages are not in requirements.txt)"""
    log_line: Literal["compact", "full"] = "compact"
    """the console's line per logged step: compact (step, loss, lr, grad norm, entropy, tokens/s,
    ...) or full (every field log.jsonl gets)"""
    log_rollouts: int = 2
    """groups per step kept in rollouts.jsonl: prompt, responses, rewards, advantages (0: none)"""

    def __post_init__(self):
        super().__post_init__()                                        # the --eval_* flags
        check_settings(
            self, positive=["lr", "grad_clip", "temperature", "grader_timeout", "dist_timeout_min",
                            "engine_logp_tol"],
            fraction=["clip_low", "top_p", "gpu_memory_utilization"],
            non_negative=["weight_decay", "clip_high", "save_every", "keep_last", "log_rollouts",
                          "prefix_warmup_ratio", "prefix_schedule_steps"],
            at_least_one=["steps", "prompts_per_step", "rollouts", "mini_batch", "micro_batch",
                          "max_prompt_len", "max_response_len", "loss_chunk", "sync_bucket_mb",
                          "gen_batch_size", "grader_workers", "loss_agg_ranks",
                          "entropy_pack_tokens"])
        if not self.entropy_coef >= 0:
            raise SystemExit(f"--entropy_coef {self.entropy_coef!r}: must be >= 0")
        if self.entropy_coef and self.loss_agg != "rank_sum_over_max_len":
            raise SystemExit(f"--entropy_coef {self.entropy_coef}: needs --loss_agg "
                             f"rank_sum_over_max_len (the scripts that set it aggregate so)")
        if self.hybrid in hybrid.SHAPED and (self.policy_loss != "ppo_clip" or self.clip_ratio_c):
            raise SystemExit(f"--hybrid {self.hybrid}: its own tokens' loss is unclipped -A r; "
                             f"--policy_loss and --clip_ratio_c do not apply")
        if self.hybrid in hybrid.SHAPED and self.rollouts < 2:
            raise SystemExit(f"--hybrid {self.hybrid}: needs --rollouts >= 2 (the expert's "
                             f"response takes one place in each group)")
        if self.hybrid == "prefix_rft":
            hybrid.check_prefix_settings(self)
        if self.clip_ratio_c is not None:
            if not self.clip_ratio_c > 1:                   # verl asserts it too
                raise SystemExit(f"--clip_ratio_c {self.clip_ratio_c!r}: must be > 1 (or none)")
            if self.policy_loss != "ppo_clip":
                raise SystemExit(f"--clip_ratio_c {self.clip_ratio_c!r}: only --policy_loss "
                                 f"ppo_clip has a dual clip")


# settings a resumed run may change: they change nothing it computes, bit for bit (run_dir.claim
# checks the rest; tests/test_resume_settings.py changes each on resume), but that a batched
# forward's rounding may move a draw that falls within it of a boundary (HF's --gen_batch_size;
# vLLM on GPUs batches by its KV cache where it binds: --gpu_memory_utilization). Not --loss_chunk
# or --offload (they reorder float sums), --engine (another sampler), --grader_timeout (it sets
# overrunning rewards). Prefix-RFT's default schedule horizon is the --steps the run started with
MAY_CHANGE_ON_RESUME = {"out_dir", "steps", "save_every", "keep_last", "loggers", "log_line",
                        "grad_ckpt", "dist_timeout_min", "gpu_memory_utilization", "vllm_sleep",
                        "sync_bucket_mb", "engine_logp_tol", "gen_batch_size", "grader_workers",
                        "log_rollouts", *evaluation.VALIDATION_MAY_CHANGE}


# ================================================================================================
# ALGO LOGIC: reward, group advantages, the clipped surrogate, one policy update
# ================================================================================================
def math_reward(samples, examples, grading="paper", timeout_s=10.0, workers=4):
    """App. E ("paper"): 1 when the response closes </think> and the text after it verifies against
    the ground truth with math-verify (an option label for multiple choice), else 0. "authors_rl":
    the authors' reward, which also counts the last \\boxed{} of the whole response, reasoning
    included (plumbing/grading.py). The reward hook's contract: (samples, examples) -> (rewards,
    grader failures)."""
    kinds = [answer_kind(ex.data_source, ex.ground_truth) for ex in examples]
    texts = [graded_text(s.text, s.stop_text, grading) for s in samples]
    return grade(texts, [ex.ground_truth for ex in examples], kinds, timeout_s, workers, grading)


def group_advantages(rewards, eps=1e-6, use_std=True):
    """GRPO's outcome advantage, one group per prompt: A_i = (r_i - mean(r)) / (std(r) + eps), with
    verl's unbiased std (8 rollouts, one correct: +2.474867 for it, -0.353552 for the others). A
    group of one rollout has no std; verl takes mean 0, std 1 there: A = r / (1 + eps).
    rewards [G, n] -> A [G, n], and zero_std [G]: the groups whose every advantage is exactly 0,
    which carry no learning signal (rewards all equal, n > 1: float32 rewards summed in float64 are
    exact, so r - mean = 0; or a single reward of 0). use_std=False: r - mean(r), and r for a
    group of one (LUFFY's and RL-PLUS's scripts, verl's grpo_use_std=False)."""
    r = rewards.double()
    if not use_std:
        adv = r - r.mean(-1, keepdim=True) if r.shape[-1] > 1 else r
    elif r.shape[-1] == 1:
        adv = r / (1 + eps)
    else:
        adv = (r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + eps)   # std: n - 1
    return adv.float(), (adv == 0).all(-1)


def policy_ratio(lp, old_lp):
    """r = pi_theta / pi_old per token [n], and log r."""
    log_ratio = (lp - old_lp).clamp(-20.0, 20.0)                    # verl's guard against overflow
    return torch.exp(log_ratio), log_ratio


def ppo_clip_loss(lp, old_lp, adv, args):
    """The paper's policy loss (Sec. 5.2, Table 6): GRPO's clipped surrogate with DAPO's
    clip-higher, per token; the caller averages it over tokens (--loss_agg token_mean).
    lp, old_lp, adv [n] -> loss [n], diagnostics. With A > 0 only the upper clip can bind
    (r > 1 + eps_high: no gradient), with A < 0 only the lower one; eps_high > eps_low lets
    unlikely good tokens grow further, against entropy collapse."""
    ratio, log_ratio = policy_ratio(lp, old_lp)                                           # [n]
    clipped = ratio.clamp(1 - args.clip_low, 1 + args.clip_high)      # Table 6: eps 0.2 / 0.28
    loss = torch.maximum(-adv * ratio, -adv * clipped)               # max(-A r, -A clip(r))
    return loss, clip_diagnostics(ratio, log_ratio, adv, args, low_binds=adv < 0)


def dual_clip_loss(lp, old_lp, adv, args):
    """ppo_clip_loss with verl's dual clip (Ye et al. 2020; --clip_ratio_c c): for A < 0 the loss
    is at most -A c, with no gradient beyond. Its tokens count as clipped high."""
    loss, diag = ppo_clip_loss(lp, old_lp, adv, args)
    loss = torch.where(adv < 0, torch.minimum(loss, -adv * args.clip_ratio_c), loss)
    with torch.no_grad():
        capped = (adv < 0) & (policy_ratio(lp, old_lp)[0] > args.clip_ratio_c)
        diag["clip_high"] = torch.maximum(diag["clip_high"], capped.float())
    return loss, diag


def custom_loss_rl(lp, old_lp, adv, args):
    """The authors' scripts' policy loss (their `custom_loss` with algo_type "rl"):
    min(-A log pi, -A clip(r)). For A < 0 the first term is the smaller (-A log pi <= 0 <
    -A clip(r)): REINFORCE, never clipped; for A > 0 the second: gradient -A r inside the range,
    none outside it on either side."""
    ratio, log_ratio = policy_ratio(lp, old_lp)
    clipped = ratio.clamp(1 - args.clip_low, 1 + args.clip_high)
    loss = torch.minimum(-adv * lp, -adv * clipped)
    return loss, clip_diagnostics(ratio, log_ratio, adv, args, low_binds=adv > 0)


@torch.no_grad()
def clip_diagnostics(ratio, log_ratio, adv, args, low_binds):
    """Per token: clip_high / clip_low, the tokens whose gradient a clip cut off (A > 0 and the
    ratio above 1 + eps_high; below 1 - eps_low where the lower clip binds); kl, Schulman's k3
    estimate of KL(pi_old || pi_theta), r - 1 - log r ("Approximating KL Divergence", 2020)."""
    return {"clip_high": ((adv > 0) & (ratio > 1 + args.clip_high)).float(),
            "clip_low": (low_binds & (ratio < 1 - args.clip_low)).float(),
            "kl": ratio - 1 - log_ratio}


def policy_loss_fn(args):
    """The per-token policy loss the flags pick: ppo_clip_loss (the paper's), dual_clip_loss
    (--clip_ratio_c), custom_loss_rl (--policy_loss custom_loss_rl, the authors' scripts), and the
    hybrids' unclipped loss on the model's own tokens (--hybrid)."""
    if args.policy_loss not in POLICY_LOSSES:
        raise ValueError(f"policy_loss {args.policy_loss!r}: expected one of "
                         f"{', '.join(POLICY_LOSSES)}")
    if args.hybrid in hybrid.SHAPED:
        return hybrid.unclipped_loss               # their scripts: loss_remove_clip=True
    if args.policy_loss == "custom_loss_rl":
        return custom_loss_rl
    return ppo_clip_loss if args.clip_ratio_c is None else dual_clip_loss


@dataclass
class MicroBatch:
    batch: dict                          # prompt + response sequences, collated, on the device
    adv: torch.Tensor                    # [N] each response token's advantage, select_targets order
    old_lp: torch.Tensor | None = None   # [N] log-probs of the sampling policy, at its temperature
    entropy: torch.Tensor | None = None  # [N] that policy's entropy there (logged)
    demo: torch.Tensor | None = None     # [N] bool, --hybrid: the token is the expert's
    engine_lp: torch.Tensor | None = None  # [N] the engine's log-probs of its samples (NaN: none)
    raw_lp: torch.Tensor | None = None   # [N] the trainer's at temperature 1, as the engine's are


def policy_update(model, optimizer, mbs: list[MicroBatch], args, device):
    """One optimiser step on one mini-batch (this rank's micro-batches): the policy loss of every
    response token over all ranks, combined as --loss_agg says (no KL term), its gradient clipped
    to --grad_clip, then AdamW. The [N, V] logits exist one chunk at a time, recomputed in
    backward (chunked_logits.chunked_sum). Returns this rank's sums [loss, clip_low, clip_high,
    kl, tokens] and the global gradient norm, read in the update's one host sync."""
    world = dist.get_world_size()
    policy_loss = policy_loss_fn(args)                              # ppo_clip_loss: the paper's

    def chunk_loss(h_c, y_c, old_c, adv_c, demo_c, bonus_c, _memo):
        logits = cl.loss_logits(model.lm_head(h_c))                                  # [n, V]
        lp, _ = cl.student_log_prob(logits, y_c, args.temperature)                   # [n]
        loss, diag = policy_loss(lp, old_c, adv_c, args)
        if demo_c is not None:                # --hybrid: the expert's tokens take its own loss
            demo_loss = hybrid.demonstration_loss(args.hybrid, lp, old_c, adv_c)
            loss = torch.where(demo_c, demo_loss, loss)
        total = loss.sum()
        if bonus_c is not None:               # --entropy_coef: the bonus, with gradient
            bonus = (bonus_c * cl.entropy(logits, args.temperature)).sum()
            total = total - bonus
            diag = diag | {"entropy_bonus": bonus.detach().view(1)}    # not in the logged loss
        return total, diag

    denominator = loss_denominator(mbs, args, device)
    bonus_scale = entropy_bonus_scale(mbs, args, device)
    sums = torch.zeros(4, dtype=torch.float64, device=device)
    for mb in mbs:             # FSDP reduce-scatters each micro-batch: no full gradient is kept
        h, y = select_targets(normed_hidden(model, mb.batch), mb.batch)          # [N, H], [N]
        bonus = entropy_bonus_weights(mb, args, bonus_scale)
        adv, demo = mb.adv, mb.demo if args.hybrid in hybrid.SHAPED else None
        if args.hybrid == "prefix_rft":       # the prefix tokens' top-20% entropy rule
            adv = hybrid.entropy_reshaped_advantages(model.lm_head, h.detach(), mb, args)
        total, diag = chunked_sum(chunk_loss, args.loss_chunk, h, y, mb.old_lp, adv, demo, bonus)
        del h, y                  # the graph keeps them for backward; not into the next forward
        # FSDP averages gradients over ranks, hence * world: the mini-batch's loss over all ranks
        (total * world / denominator).backward()
        policy_loss_sum = total.detach()
        if "entropy_bonus" in diag:
            policy_loss_sum = policy_loss_sum + diag["entropy_bonus"].sum()
        sums += torch.stack([policy_loss_sum, diag["clip_low"].sum(), diag["clip_high"].sum(),
                             diag["kl"].sum()]).double()
    grad_norm = clip_grad_norm(model, args.grad_clip)
    host = torch.cat([sums, grad_norm.double().view(1)]).cpu()      # the update's host sync
    grad_norm = host[-1].item()
    if not math.isfinite(grad_norm):                   # global: every rank stops alike
        raise FloatingPointError(f"the gradient norm is not finite ({grad_norm}); the update was "
                                 f"not applied")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    tokens = sum(len(mb.adv) for mb in mbs)
    return torch.cat([host[:-1], torch.tensor([float(tokens)], dtype=torch.float64)]), grad_norm


def entropy_bonus_scale(mbs: list[MicroBatch], args, device):
    """The authors' bonus is a token-mean entropy per micro-batch, summed over micro-batches, so its
    weight grows with their number: their GPUs pack micro-batches of up to entropy_pack_tokens
    tokens (verl's dynamic batch size; each GPU as many as the fullest of their loss_agg_ranks
    needs). Their count over all GPUs / ours over all ranks, a 0-d tensor on the device (no host
    sync), or None (--entropy_coef 0)."""
    if not args.entropy_coef:
        return None
    tokens = sum(sum(mb.batch["seq_lens"]) for mb in mbs)
    counts = torch.tensor([float(tokens), float(len(mbs))], dtype=torch.float64, device=device)
    dist.all_reduce(counts)                           # the mini-batch's tokens, our micro-batches
    per_gpu = counts[0] / (args.loss_agg_ranks * args.entropy_pack_tokens)
    return args.loss_agg_ranks * torch.ceil(per_gpu) / counts[1]


def entropy_bonus_weights(mb: MicroBatch, args, scale):
    """[N] each token's weight in the micro-batch's entropy bonus, in the units of its summed loss,
    or None (--entropy_coef 0). With --loss_agg rank_sum_over_max_len the micro-batch's loss over
    the denominator is then its token sum / (max_response_len x ranks) - coef x scale x its
    token-mean entropy / ranks: what the authors' actors backpropagate on each of their GPUs,
    averaged (LUFFY mix_src/mix_actor.py lines 202, 226, 243; verl's dp_actor.py lines 100-103),
    with as many token means in all (entropy_bonus_scale)."""
    if not args.entropy_coef:
        return None
    n = len(mb.adv)
    weight = args.entropy_coef * args.max_response_len / max(n, 1)
    return (scale * weight).float() * torch.ones_like(mb.adv)


def loss_denominator(mbs: list[MicroBatch], args, device):
    """What a mini-batch's summed per-token loss is divided by, over all ranks. token_mean: its
    response tokens (DAPO's token-level mean; the paper does not say; verl 0.5's "token-mean" is
    another, a mean per micro-batch: docs/recipes.md). seq_sum_over_max_len: its
    sequences x max_response_len, i.e. each sequence's token sum / max_response_len averaged over
    sequences (the authors' scripts: micro-batches of one sequence). rank_sum_over_max_len:
    max_response_len x loss_agg_ranks, each GPU's token sum / max_response_len averaged over their
    GPUs (LUFFY's and RL-PLUS's scripts: loss_remove_token_mean on 8 GPUs, mix_core_alg.py lines
    233-234); the same whatever this run's GPU count."""
    if args.loss_agg == "rank_sum_over_max_len":
        return torch.full((), float(args.max_response_len * args.loss_agg_ranks), device=device)
    if args.loss_agg == "token_mean":
        count = sum(len(mb.adv) for mb in mbs)
    else:
        count = sum(len(mb.batch["seq_lens"]) for mb in mbs) * args.max_response_len
    denominator = torch.full((), float(count), device=device)    # nccl: CUDA tensors only
    dist.all_reduce(denominator)
    return denominator


# ================================================================================================
# Prompts and rollouts to tensors
# ================================================================================================
@dataclass
class Prompt:
    example: data.Example
    text: str        # the prompt as the engine sees it
    ids: list[int]   # its token ids


def load_prompts(args, tokenizer) -> tuple[list[Prompt], int]:
    """Every example of the training file whose prompt fits max_prompt_len, and the file's rows."""
    kept, dropped = [], 0
    examples = data.load_examples(args.train_file, require_response=args.hybrid != "none")
    for ex in examples:
        text = data.example_prompt(ex, tokenizer, args.system_prompt)
        ids = generation.encode(tokenizer, text)
        if len(ids) > args.max_prompt_len:
            dropped += 1
        else:
            kept.append(Prompt(ex, text, ids))
    print0(f"{args.train_file}: {len(kept)} prompts kept, {dropped} dropped "
           f"(> {args.max_prompt_len} tokens)")
    return kept, len(examples)


def step_prompts(n_prompts, step, args, rank, world):
    """Indices of this rank's prompts at `step`: a disjoint shard of the step's prompts_per_step.
    The order is a fixed permutation per epoch from (seed, epoch): a resumed run sees the same."""
    per_epoch = n_prompts // args.prompts_per_step
    epoch, k = divmod(step, per_epoch)
    shuffle = torch.Generator().manual_seed(args.seed + epoch)
    order = torch.randperm(n_prompts, generator=shuffle).tolist()
    chosen = order[k * args.prompts_per_step : (k + 1) * args.prompts_per_step]
    share = args.prompts_per_step // world
    return chosen[rank * share : (rank + 1) * share], epoch


def rollout_seed(args, step, rank, world, n_prompts):
    """The sampling seed of this rank at `step`: one block of n_prompts * rollouts seeds per (seed,
    step, rank), since both engines draw sample j of prompt i from seed + i * rollouts + j, however
    they batch the prompts. Torch's CPU generator keeps only the low 32 bits: so < 2**31."""
    return (args.seed * 1_000_003 + step * world + rank) * n_prompts * args.rollouts % 2**31


def micro_batches(prompt_ids, samples, adv, args, pad_id, device,
                  demo_adv=None) -> list[list[MicroBatch]]:
    """Sequences prompt + response (the response, its EOS included when it stopped, is trained),
    grouped into mini-batches (one per optimiser step) of micro-batches: as many as micro-batches of
    `micro_batch` sequences would make (every rank the same count, as FSDP's collectives require),
    none over micro_batch longest sequences' tokens: packed with their tokens balanced
    (data.balanced_groups), or padded, sized by length to pad least (data.least_padded_split).
    adv[i][j]: the advantage of group i's sample j, demo_adv[i][j] that of its expert's tokens
    (--hybrid prefix_rft; else adv). Returns minis[m] = [MicroBatch], without old log-probs yet."""
    demo_adv = adv if demo_adv is None else demo_adv
    per_mini = args.mini_batch // dist.get_world_size()          # prompts per mini-batch, this rank
    minis = []
    for start in range(0, len(prompt_ids), per_mini):
        seqs = []   # (ids, loss mask, then per response token: advantage, expert's?, engine log-p)
        for i in range(start, start + per_mini):
            for j, s in enumerate(samples[i]):
                mask = [0] * len(prompt_ids[i]) + [1] * len(s.token_ids)
                expert = hybrid.demo_tokens(args.hybrid, j, s)           # --hybrid: its tokens
                a, a_expert = float(adv[i][j]), float(demo_adv[i][j])
                engine_lp = s.logprobs or [math.nan] * len(s.token_ids)    # the expert's: none
                seqs.append((prompt_ids[i] + s.token_ids, mask,
                             [a_expert if e else a for e in expert], expert, engine_lp))
        seqs.sort(key=lambda t: -len(t[0]))
        groups = -(-len(seqs) // args.micro_batch)
        cap = args.micro_batch * max(args.max_prompt_len + args.max_response_len, len(seqs[0][0]))
        lengths = [len(t[0]) for t in seqs]
        if args.pack:
            parts = data.balanced_groups(lengths, groups, args.micro_batch)
        else:
            sizes = data.least_padded_split(lengths, groups, cap)
            ends = itertools.accumulate(sizes)
            parts = [range(end - size, end) for end, size in zip(ends, sizes)]
        mbs = []
        for indices in parts:
            part = [seqs[k] for k in indices]
            batch = data.collate([(ids, mask) for ids, mask, *_ in part], pad_id, device,
                                 args.pack)
            adv_tok = torch.tensor(list(itertools.chain.from_iterable(t[2] for t in part)))  # [N]
            engine_lp = torch.tensor(list(itertools.chain.from_iterable(t[4] for t in part)))  # [N]
            mb = MicroBatch(batch, adv_tok.to(device), engine_lp=engine_lp.to(device))
            if args.hybrid != "none":
                demo = torch.tensor(list(itertools.chain.from_iterable(t[3] for t in part)))
                mb.demo = demo.to(device)
            mbs.append(mb)
        minis.append(mbs)
    return minis


def rollout_records(step, prompts: list[Prompt], samples, rewards, adv, groups: int,
                    expert_first: bool = False) -> list[dict]:
    """The first `groups` of this rank's GRPO groups at `step`, as rollouts.jsonl keeps them (what
    verl's rollout_data_dir and TRL's log_completions keep): each group's prompt, its responses with
    their rewards, advantages, finish reasons and lengths in tokens; under --hybrid (expert_first)
    "expert_first": true says the first response is the expert's; under --hybrid prefix_rft
    "prefix_lengths" says how many of each response's first tokens are the expert's."""
    mark = {"expert_first": True} if expert_first else {}
    records = []
    for i, (p, group) in enumerate(zip(prompts[:groups], samples)):
        prefixes = {}
        if isinstance(group[0], hybrid.PrefixedSample):
            prefixes = {"prefix_lengths": [s.prefix_len for s in group]}
        records.append({"step": step, "data_source": p.example.data_source, "prompt": p.text,
                        **mark, "ground_truth": p.example.ground_truth,
                        "responses": [s.text for s in group], "rewards": rewards[i].tolist(),
                        "advantages": adv[i].tolist(), **prefixes,
                        "finish_reasons": [s.finish_reason for s in group],
                        "lengths": [len(s.token_ids) for s in group]})
    return records


def step_record(step, epoch, rewards, zero_std, samples, minis, stats, grad_norms, failures, times,
                logp_diff, args, device):
    """The step's log record: sums over ranks, then means. Under --hybrid the rollout fields count
    the expert's response too; own_reward_mean and own_accuracy are the model's samples alone."""
    flat = list(itertools.chain.from_iterable(samples))
    own = rewards[:, hybrid.own_rollouts(args.hybrid, args.rollouts, args.prefix_rollouts)]
    entropy = torch.cat([mb.entropy for mb in itertools.chain.from_iterable(minis)])   # [tokens]
    local = {"reward": rewards.sum().item(), "correct": (rewards == 1).sum().item(),
             "rollouts": rewards.numel(), "zero_std": zero_std.sum().item(), "groups": len(samples),
             "length": sum(len(s.token_ids) for s in flat),
             "truncated": sum(s.finish_reason == "length" for s in flat),
             "failures": failures,
             "own_reward": own.sum().item(), "own_correct": (own == 1).sum().item(),
             "own_rollouts": own.numel(),
             **dict(zip(["loss", "clip_low", "clip_high", "kl", "tokens"], stats.tolist()))}
    # on the device, with the entropy's sum (there already): the record's one host read, below
    summed = torch.cat([torch.tensor(list(local.values()), dtype=torch.float64).to(device),
                        entropy.double().sum().view(1)])
    dist.all_reduce(summed)
    g = dict(zip([*local, "entropy"], summed.cpu().tolist()))
    t0, t_sync, t_gen, t_reward, t_train = times
    hybrid_fields = {}
    if args.hybrid != "none":
        hybrid_fields = {"own_reward_mean": g["own_reward"] / g["own_rollouts"],
                         "own_accuracy": g["own_correct"] / g["own_rollouts"]}
    return {"step": step, "epoch": epoch, "reward_mean": g["reward"] / g["rollouts"],
            **hybrid_fields,
            "accuracy": g["correct"] / g["rollouts"],     # reward 1: reward_mean for 0/1 rewards
            "zero_std_groups": int(g["zero_std"]), "zero_std_frac": g["zero_std"] / g["groups"],
            "response_length": g["length"] / g["rollouts"],
            "truncated_frac": g["truncated"] / g["rollouts"],
            "entropy": g["entropy"] / g["tokens"], "loss": g["loss"] / g["tokens"],
            "clip_frac_low": g["clip_low"] / g["tokens"],
            "clip_frac_high": g["clip_high"] / g["tokens"],
            "approx_kl": g["kl"] / g["tokens"], "grad_norm": sum(grad_norms) / len(grad_norms),
            "engine_logp_diff_mean": logp_diff[0], "engine_logp_diff_max": logp_diff[1],
            "grader_failures": int(g["failures"]), "lr": args.lr, "sync_s": t_sync - t0,
            "gen_s": t_gen - t_sync, "reward_s": t_reward - t_gen, "train_s": t_train - t_reward}


# ================================================================================================
# The loop
# ================================================================================================
# The engine check: step 1 samples from the checkpoint the engine and the trainer both loaded, so
# its difference is this device's and dtype's numeric floor between the two implementations (float32
# on a CPU, HF and vLLM engines: 1.2e-7 to 1.9e-7 nats). Later steps move it little, a weight the
# sync got wrong by orders of magnitude: on CPUs, 10 healthy runs of 4 steps stayed within 1.1 x
# their step 1, layer 0's down_proj delivered x3 gave 0.03 nats, 1e5 x (tests/test_rl.py
# test_the_engine_check_*, tests/test_vllm_cpu.py); 10 x leaves room to both sides. The floor counts
# as at least ENGINE_FLOOR_MIN (float32's rounding of log-probs of a few nats); --engine_logp_tol
# stays the ceiling (bf16 engines: a floor of hundredths, not measured here). A sleeping engine (vLLM
# on GPUs) drops its weights at creation, so its step 1 already syncs: a sync wrong from its first
# load is then left to the ceiling.
ENGINE_FLOOR_FACTOR = 10.0
ENGINE_FLOOR_MIN = 1e-6


def engine_logp_limit(floor: float, args) -> float:
    """The largest mean engine difference a step may have, given step 1's (floor)."""
    return min(args.engine_logp_tol, ENGINE_FLOOR_FACTOR * max(floor, ENGINE_FLOOR_MIN))


@torch.no_grad()
def engine_logp_diff(minis) -> tuple[float, float]:
    """(mean, max) over all ranks of |engine log-prob - trainer's log-prob| per response token the
    engine sampled, both the model's own at temperature 1 before top-p (the engine's raw log-probs:
    generation.rollout_engine), i.e. the same quantity from two implementations: with the trainer's
    weights in the engine they differ by numerics only; (nan, nan) without tokens. No mask indexing
    (a host sync on a GPU): one read, the step's check before its update."""
    mbs = list(itertools.chain.from_iterable(minis))
    engine_lp = torch.cat([mb.engine_lp for mb in mbs])                                 # [N]
    trainer_lp = torch.cat([mb.raw_lp for mb in mbs]).float()
    sampled = ~engine_lp.isnan()                       # the expert's tokens have no engine log-p
    diff = torch.where(sampled, (engine_lp - trainer_lp).abs(), 0.0)
    sums = torch.stack([diff.double().sum(), sampled.double().sum()])
    top = torch.cat([diff, diff.new_zeros(1)]).amax().double()
    dist.all_reduce(sums)
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    read = torch.stack([sums[0] / sums[1].clamp(min=1), top, (sums[1] == 0).double()])
    mean, top, none = read.cpu().tolist()                                     # the host read
    return (math.nan, math.nan) if none else (mean, top)


def pin_prefix_schedule(args, recorded: dict) -> None:
    """--prefix_schedule_steps 0: the schedule spans the --steps the run started with, recorded as
    the setting (a resume compares it as any other), so that a run taken on to more steps samples
    as one run with that horizon would, not as one that had always had the new --steps. A record of
    0 (a run begun before the horizon was recorded) keeps following --steps."""
    horizon = recorded.get("prefix_schedule_steps", args.steps)
    if horizon and horizon != args.steps:
        print0(f"--hybrid prefix_rft: the prefix schedule spans {horizon} steps, the --steps the "
               f"run started with (run_config.json), not --steps {args.steps}")
    args.prefix_schedule_steps = horizon


def check_world(args, world):
    """Refuses a GPU count that does not divide the mini-batch (or a mini-batch that does not divide
    the step's prompts)."""
    if args.prompts_per_step % args.mini_batch or args.mini_batch % world:
        raise SystemExit(f"--prompts_per_step {args.prompts_per_step} must be a multiple of "
                         f"--mini_batch {args.mini_batch}, and that of the ranks ({world})")


def train(args, device, reward_fn=None):
    """GRPO in an initialised process group. reward_fn(samples, examples) -> (rewards, failures)
    defaults to math_reward. Returns the log records (every rank computes them)."""
    if reward_fn is None:
        def reward_fn(samples, examples):
            return math_reward(samples, examples, args.reward, args.grader_timeout,
                               args.grader_workers)
    rank, world = dist.get_rank(), dist.get_world_size()
    check_world(args, world)
    bf16 = args.bf16 and device.type == "cuda"
    out_dir = Path(args.out_dir)
    stop = StopSignal()                      # SIGTERM / Ctrl-C: finish the step, save, leave
    check_model_dir(args.model)              # the inputs first: nothing is written till they pass
    checkpoints.verify_model_dir(args.model, rank0=rank == 0)
    tokenizer = load_tokenizer(args.model)
    prompts, rows = load_prompts(args, tokenizer)
    if len(prompts) < args.prompts_per_step:
        raise SystemExit(f"{len(prompts)} prompts are fewer than one step's "
                         f"{args.prompts_per_step}")
    val_cfg = evaluation.eval_settings(args, args.gen_batch_size, args.grader_timeout,
                                       args.grader_workers)
    val_set = evaluation.load_eval_file(args.eval_file, tokenizer, val_cfg) if args.eval_every \
        else None                                     # a bad eval file: refused now, not later
    train_data = {**run_dir.file_identity(args.train_file), "rows": rows} if rank == 0 else None
    resuming = checkpoints.latest(out_dir) is not None
    if args.hybrid == "prefix_rft" and not args.prefix_schedule_steps:
        pin_prefix_schedule(args, run_dir.recorded(out_dir) if resuming else {})
    run_dir.claim(out_dir, asdict(args), MAY_CHANGE_ON_RESUME, resuming=resuming, data=train_data,
                  defaults=asdict(Args()))
    resume_from = checkpoints.resume_point(out_dir)                # the newest intact checkpoint
    # the learning rate is constant and the prompts and seeds a function of the step: a finished
    # run goes on to a larger --steps as one run to it would
    if run_dir.check_end(out_dir, resume_from, args.steps, "--steps"):
        run_dir.release()                                          # complete: nothing is loaded
        return []
    # the engine first: vLLM's share of the GPU must be free when it starts
    engine, _ = generation.rollout_engine(
        args.model, args.engine, "bfloat16" if bf16 else "float32", args.seed + rank,
        args.gpu_memory_utilization,
        args.max_prompt_len + max(args.max_response_len, val_cfg.max_new_tokens), args.vllm_sleep,
        has_trainer_weights=resume_from is None, raw_logprobs=True)
    model = shard_model(load_full_model(args.model, scratch=False, seed=args.seed), device, bf16,
                        args.grad_ckpt, offload=args.offload)
    optimizer = make_optimizer(model, args.lr, args.weight_decay, 0.999, device, args.offload)
    if args.offload:
        torch.set_num_threads(cpu_threads_per_rank())  # the optimiser step runs on the CPU
    step, floor = 0, None        # floor: step 1's engine difference, which the checkpoints carry
    if resume_from is not None:
        position = checkpoints.restore(resume_from, model, optimizer, None,
                                       floats=("engine_logp_floor",))
        step, floor = position["step"], position.get("engine_logp_floor")
        print0(f"resumed from {resume_from} at step {step}")
    log, rollouts_file = None, out_dir / "rollouts.jsonl"
    val_samples = out_dir / "val_samples.jsonl"                       # --eval_every's samples
    if rank == 0:
        log = run_dir.RunLog(out_dir, step, args.steps, "grpo", args.loggers, asdict(args),
                             line=args.log_line)
        run_dir.keep_steps_upto(rollouts_file, step)      # as log.jsonl: no step twice on resume
        if val_samples.exists() or args.eval_every:
            run_dir.keep_steps_upto(val_samples, step)
    records, last_saved = [], step

    while step < args.steps:
        t0 = time.perf_counter()
        # ---- ALGO LOGIC. Rollouts: this rank's prompts x `rollouts` samples from the current
        # policy, a seed per (step, rank) so that runs repeat, with the engine's log-probs of them
        # (only to check them against the trainer's, below)
        synced = not engine.has_trainer_weights
        try:
            generation.wake(engine, model, args.sync_bucket_mb << 20)  # with the trainer's weights
        except generation.SyncError as e:
            raise SystemExit(f"step {step + 1}: {e}; nothing after step {last_saved} is "
                             f"saved") from None
        t_sync = time.perf_counter()
        mine, epoch = step_prompts(len(prompts), step, args, rank, world)
        examples = [prompts[i].example for i in mine]
        seed = rollout_seed(args, step, rank, world, len(mine))
        texts = [prompts[i].text for i in mine]
        if args.hybrid == "prefix_rft":   # some continue prefixes of the expert's response
            samples = hybrid.sample_prefixed_groups(engine, tokenizer,
                                                    [prompts[i].ids for i in mine], examples, args,
                                                    step, seed)
        else:
            sampled = args.rollouts - (args.hybrid in hybrid.SHAPED)     # the expert's takes one
            samples = generation.generate(engine, tokenizer, texts, sampled, args.temperature,
                                          args.top_p, args.max_response_len, seed,
                                          batch_size=args.gen_batch_size, logprobs=True)   # [G][n]
        if args.hybrid in hybrid.SHAPED:      # luffy, rl_plus: the expert's response leads a group
            expert = hybrid.demonstrations(examples, tokenizer, args.max_response_len)
            samples = [[demo, *group] for demo, group in zip(expert, samples)]
        generation.sleep(engine)                                      # the trainer has the GPU
        t_gen = time.perf_counter()

        # ---- reward (App. E) and group advantages
        flat_samples = list(itertools.chain.from_iterable(samples))
        flat_examples = [ex for ex in examples for _ in range(args.rollouts)]
        scores, failures = reward_fn(flat_samples, flat_examples)
        rewards = torch.tensor(scores, dtype=torch.float32).view(len(mine), args.rollouts)  # [G,n]
        adv, zero_std = group_advantages(rewards, use_std=args.adv_std)      # [G, n], [G]
        demo_adv = None
        if args.hybrid == "prefix_rft":   # its own tokens' and its prefix tokens' advantages
            prefixed = hybrid.prefixed(samples)                                       # [G, n]
            adv, demo_adv, zero_std = hybrid.prefix_rft_advantages(rewards, prefixed)
            demo_adv = demo_adv.tolist()
        t_reward = time.perf_counter()

        # ---- old log-probs and entropy at the rollout temperature, recomputed by the trainer, not
        # taken from the engine: the ratio compares two evaluations with the same numerics
        minis = micro_batches([prompts[i].ids for i in mine], samples, adv.tolist(), args,
                              tokenizer.pad_token_id, device, demo_adv)
        for mbs in minis:
            for mb in mbs:
                mb.old_lp, mb.entropy = token_log_probs(model, mb.batch, args.loss_chunk,
                                                        args.temperature)
                mb.raw_lp = mb.old_lp if args.temperature == 1.0 else token_log_probs(
                    model, mb.batch, args.loss_chunk, with_entropy=False)[0]   # the check's
        model.reshard()                 # a no-grad forward leaves the FSDP root's weights gathered
        # the engine sampled from the trainer's policy? A weight the sync missed shows here, as
        # plausible losses would not: stop before training on stale rollouts
        logp_diff = engine_logp_diff(minis)
        floor = logp_diff[0] if floor is None else floor      # a resume without one: its first
        limit = engine_logp_limit(floor, args)
        if not logp_diff[0] <= limit:                                         # nan stops too
            cause = ("a weight the sync missed or left stale" if synced else
                     "the engine does not run the trainer's model (dtype? checkpoint?)")
            raise SystemExit(f"step {step + 1}: the engine's log-probs of its samples differ from "
                             f"the trainer's by {logp_diff[0]:.3g} nats on average (max "
                             f"{logp_diff[1]:.3g}), above {limit:.3g} ({ENGINE_FLOOR_FACTOR:g} x "
                             f"step 1's {floor:.3g}, at least {ENGINE_FLOOR_MIN:g}; at most "
                             f"--engine_logp_tol {args.engine_logp_tol}): {cause}; stopped before "
                             f"the update, nothing after step {last_saved} is saved")

        # ---- one optimiser step per mini-batch (Table 6: 128 prompts, mini-batches of 64: 2);
        # the first mini-batch of a step is on-policy (ratio 1)
        stats, grad_norms = torch.zeros(5, dtype=torch.float64), []
        for mbs in minis:
            try:
                sums, grad_norm = policy_update(model, optimizer, mbs, args, device)
            except FloatingPointError as e:
                raise SystemExit(f"step {step + 1}: {e}; nothing after step {last_saved} is "
                                 f"saved") from None
            stats += sums
            grad_norms.append(grad_norm)
        step += 1
        t_train = time.perf_counter()

        # ---- log and save
        record = step_record(step, epoch, rewards, zero_std, samples, minis, stats, grad_norms,
                             failures, (t0, t_sync, t_gen, t_reward, t_train), logp_diff, args,
                             device)
        records.append(record)
        if log is not None:
            log.write(record)
            kept = rollout_records(step, [prompts[i] for i in mine], samples, rewards, adv,
                                   args.log_rollouts, expert_first=args.hybrid in hybrid.SHAPED)
            with open(rollouts_file, "a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in kept))
        if evaluation.eval_due(step, args.eval_every):      # validation, a part of this step
            evaluation.validate(engine, model, tokenizer, val_set, val_cfg, step, log, val_samples,
                                args.sync_bucket_mb << 20)
        stopping = step < args.steps and stop.requested(device)        # every rank agrees
        if (args.save_every and step % args.save_every == 0) or step == args.steps or stopping:
            state = checkpoints.trainer_state(model, optimizer, None)
            path = checkpoints.save(out_dir, step, model, tokenizer, state,
                                    {"step": step, "engine_logp_floor": floor},
                                    dtype=torch.bfloat16 if bf16 else torch.float32,
                                    keep_last=args.keep_last, keep=resume_from)
            last_saved = step
            print0(f"saved {path}")
        if stopping:
            run_dir.leave_after_signal(out_dir, step, stop.name, log)
    if step == args.steps and last_saved == step:
        run_dir.mark_complete(out_dir, step)
    if log is not None:
        log.close()
    run_dir.release()
    return records


def main():
    (args,) = parse_config(Args)
    _, _, device = setup_distributed(args.dist_timeout_min)
    args.model = resolve_model(args.model)                  # org/name: the hub's copy
    train(args, device)
    shutdown()


if __name__ == "__main__":
    run_script(main)
