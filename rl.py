# CurioSFT's RL stage: GRPO from an SFT checkpoint (arXiv:2602.02244, Sec. 5.2, App. E Table 6).
"""GRPO (Shao et al. 2024) with DAPO's clip-higher (Yu et al. 2025), no KL term. One process (CPU:
HF generate) or under `torchrun --nproc_per_node N` (FSDP2 trainer, one vLLM engine per GPU). Where
the paper is silent, the numerics follow verl, the RL framework the authors' code is a fork of.

    python rl.py config/rl_tiny.py --model out/sft/step_000010 --train_file data.jsonl
    torchrun --nproc_per_node 8 rl.py config/rl_paper.py --model SFT_CKPT --train_file train.parquet

One step, as the loop in `train` reads: rollouts -> reward (`math_reward`, App. E) -> group
advantages -> old log-probs -> one `policy_update` per mini-batch of prompts, which calls
`ppo_clip_loss` (the paper's clip-higher objective) on each chunk of tokens; `dual_clip_loss` and
the authors' `custom_loss_rl` sit beside it, picked by the flags. Table 3's hybrids change the step
through one hook (hybrid.py, --hybrid); the run around the loop (its directory, resume, log,
checkpoints) is plumbing/run.py, the engine's sleep, wake, weight sync and check
plumbing/generation.py. python rl.py --help lists the flags.
"""
import functools
import itertools
import math
import time
from dataclasses import asdict, dataclass
from typing import Literal

import torch
import torch.distributed as dist

import curio_loss as cl
import data
import hybrid
import measure
from chunked_logits import chunked_sum, normed_hidden, select_targets, token_log_probs
from plumbing import checkpoints, generation
from plumbing.cli import check_settings, parse_config, run_script
from plumbing.compiling import compiled_if
from plumbing.distributed import StopSignal, print0, setup_distributed, shutdown
from plumbing.grading import GRADING_MODES, answer_kind, grade, graded_text
from plumbing.grpo_log import rollout_records, step_record
from plumbing.models import (check_model_dir, clip_grad_norm, cpu_threads_per_rank, load_full_model,
                             load_tokenizer, make_optimizer, resolve_model, shard_model)
from plumbing.run import MAY_CHANGE_ON_RESUME as RUN_MAY_CHANGE, Run, TrainerArgs


POLICY_LOSSES = ("ppo_clip", "custom_loss_rl")
LOSS_AGGS = ("token_mean", "seq_sum_over_max_len", "rank_sum_over_max_len")


@dataclass
class Args(TrainerArgs, hybrid.HybridArgs):
    """rl.py settings"""
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
    reward: Literal[GRADING_MODES] = "paper"
    """paper: App. E's rule | authors_rl: the authors' RL reward | authors: their evaluation's"""
    temperature: float = 1.0
    """rollout temperature; the trainer scores tokens at the same temperature (Table 6)"""
    top_p: float = 0.95
    """rollout nucleus sampling (Table 6)"""
    vllm_sleep: bool = True
    """vLLM frees its weights and KV cache while the trainer works"""
    engine_logp_tol: float = 0.1
    """the engine check's ceiling (generation.EngineCheck): the largest mean difference in nats of
    the engine's log-probs of its samples from the trainer's before the update is refused"""
    log_rollouts: int = 2
    """groups per step kept in rollouts.jsonl: prompt, responses, rewards, advantages (0: none)"""
    # rl.py's defaults of TrainerArgs' settings
    out_dir: str = "out/rl"
    lr: float = 1e-6
    save_every: int = 50
    gpu_memory_utilization: float = 0.6

    def __post_init__(self):
        super().__post_init__()                                # TrainerArgs' and --eval_* flags
        check_settings(self, positive=["temperature", "engine_logp_tol"],
                       fraction=["clip_low", "top_p"], non_negative=["clip_high", "log_rollouts"],
                       at_least_one=["steps", "prompts_per_step", "rollouts", "mini_batch",
                                     "micro_batch", "loss_agg_ranks",
                                     "entropy_pack_tokens"])
        check_recipe(self)


def check_recipe(args):
    """The loss settings that go together (rl.Args), each refused in one line."""
    if not args.entropy_coef >= 0:
        raise SystemExit(f"--entropy_coef {args.entropy_coef!r}: must be >= 0")
    if args.entropy_coef and args.loss_agg != "rank_sum_over_max_len":
        raise SystemExit(f"--entropy_coef {args.entropy_coef}: needs --loss_agg "
                         f"rank_sum_over_max_len (the scripts that set it aggregate so)")
    hybrid.check_settings(args)
    if args.clip_ratio_c is not None and not args.clip_ratio_c > 1:      # verl asserts it too
        raise SystemExit(f"--clip_ratio_c {args.clip_ratio_c!r}: must be > 1 (or none)")
    if args.clip_ratio_c is not None and args.policy_loss != "ppo_clip":
        raise SystemExit(f"--clip_ratio_c {args.clip_ratio_c!r}: only --policy_loss ppo_clip has "
                         f"a dual clip")


# settings a resumed run may change (plumbing/run.py says which and why), and rl.py's: where it
# stops (--steps), the engine's memory and weight sync, its check's ceiling, the rollouts kept.
# Not --engine (another sampler) or --grader_timeout (it sets overrunning rewards). Prefix-RFT's
# default schedule horizon is the --steps the run started with (hybrid.PrefixRFT.pin_settings)
MAY_CHANGE_ON_RESUME = RUN_MAY_CHANGE | {"steps", "vllm_sleep", "engine_logp_tol", "log_rollouts"}


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
    if args.policy_loss == "custom_loss_rl":
        loss_fn = custom_loss_rl
    else:
        loss_fn = ppo_clip_loss if args.clip_ratio_c is None else dual_clip_loss
    return hybrid.hook(args).policy_loss(loss_fn)


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
    world, mix = dist.get_world_size(), hybrid.hook(args)
    policy_loss = policy_loss_fn(args)                              # ppo_clip_loss: the paper's
    # --compile: the passes over [n, V] logits fused by torch.compile (plumbing/compiling.py)
    student_log_prob, entropy = compiled_if(args.compile, cl.student_log_prob, cl.entropy)

    def chunk_loss(h_c, y_c, old_c, adv_c, demo_c, bonus_c, _memo):
        logits = cl.loss_logits(model.lm_head(h_c))                                  # [n, V]
        lp, _ = student_log_prob(logits, y_c, args.temperature)                      # [n]
        loss, diag = policy_loss(lp, old_c, adv_c, args)
        loss = mix.token_loss(loss, lp, old_c, adv_c, demo_c)   # --hybrid: the expert's tokens'
        total = loss.sum()
        if bonus_c is not None:               # --entropy_coef: the bonus, with gradient
            bonus = (bonus_c * entropy(logits, args.temperature)).sum()
            total = total - bonus
            diag = diag | {"entropy_bonus": bonus.detach().view(1)}    # not in the logged loss
        return total, diag

    denominator = loss_denominator(mbs, args, device)
    bonus_scale = hybrid.entropy_bonus_scale(mbs, args, device)
    sums = torch.zeros(4, dtype=torch.float64, device=device)
    for mb in mbs:             # FSDP reduce-scatters each micro-batch: no full gradient is kept
        h, y = select_targets(normed_hidden(model, mb.batch), mb.batch)          # [N, H], [N]
        bonus = hybrid.entropy_bonus_weights(mb, args, bonus_scale)
        adv = mix.token_advantages(model.lm_head, h, mb)          # Prefix-RFT: its entropy rule
        total, diag = chunked_sum(chunk_loss, args.loss_chunk, h, y, mb.old_lp, adv, mb.demo,
                                  bonus)
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


@dataclass
class Sequence:
    """A prompt and one of its responses as the update trains them (per response token: its
    advantage, whether it is the expert's, the engine's log-prob of it, NaN where it sampled none)."""
    ids: list[int]
    loss_mask: list[int]
    adv: list[float]
    expert: list[bool]
    engine_lp: list[float]


def micro_batches(prompt_ids, samples, adv, args, pad_id, device,
                  demo_adv=None) -> list[list[MicroBatch]]:
    """Sequences prompt + response (the response, its EOS included when it stopped, is trained),
    grouped into mini-batches (one per optimiser step) of micro-batches: as many as micro-batches of
    `micro_batch` sequences would make (every rank the same count, as FSDP's collectives require),
    none over micro_batch longest sequences' tokens: packed with their tokens balanced
    (data.balanced_groups), or padded, sized by length to pad least (data.least_padded_split).
    adv[i][j]: the advantage of group i's sample j, demo_adv[i][j] that of its expert's tokens
    (--hybrid prefix_rft; else adv). Returns minis[m] = [MicroBatch], without old log-probs yet."""
    demo_adv, mix = adv if demo_adv is None else demo_adv, hybrid.hook(args)
    per_mini = args.mini_batch // dist.get_world_size()          # prompts per mini-batch, this rank
    minis = []
    for start in range(0, len(prompt_ids), per_mini):
        seqs = []
        for i in range(start, start + per_mini):
            for j, s in enumerate(samples[i]):
                expert = mix.demo_tokens(j, s)                          # --hybrid: its tokens
                a, a_expert = float(adv[i][j]), float(demo_adv[i][j])
                seqs.append(Sequence(prompt_ids[i] + s.token_ids,
                                     [0] * len(prompt_ids[i]) + [1] * len(s.token_ids),
                                     [a_expert if e else a for e in expert], expert,
                                     s.logprobs or [math.nan] * len(s.token_ids)))
        seqs.sort(key=lambda q: -len(q.ids))
        cap = args.micro_batch * max(args.max_prompt_len + args.max_response_len, len(seqs[0].ids))
        parts = data.split_micro_batches([len(q.ids) for q in seqs], args.micro_batch, cap,
                                         args.pack)
        minis.append([micro_batch(seqs, part, args, pad_id, device) for part in parts])
    return minis


def micro_batch(seqs: list[Sequence], part: list[int], args, pad_id, device) -> MicroBatch:
    """The micro-batch of seqs[k] for k in part, as tensors on the device."""
    part = [seqs[k] for k in part]

    def per_token(field):
        return torch.tensor(list(itertools.chain.from_iterable(getattr(q, field) for q in part)))

    batch = data.collate([(q.ids, q.loss_mask) for q in part], pad_id, device, args.pack)
    mb = MicroBatch(batch, per_token("adv").to(device), engine_lp=per_token("engine_lp").to(device))
    if args.hybrid != "none":
        mb.demo = per_token("expert").to(device)
    return mb


# ================================================================================================
# The loop
# ================================================================================================
def check_world(args, world):
    """Refuses a GPU count that does not divide the mini-batch (or a mini-batch that does not divide
    the step's prompts)."""
    if args.prompts_per_step % args.mini_batch or args.mini_batch % world:
        raise SystemExit(f"--prompts_per_step {args.prompts_per_step} must be a multiple of "
                         f"--mini_batch {args.mini_batch}, and that of the ranks ({world})")


def load_prompts(args):
    """The tokenizer and the training file's prompts that fit, and its rows: the inputs first, so
    that nothing is written before they are known good."""
    check_model_dir(args.model)
    checkpoints.verify_model_dir(args.model, rank0=dist.get_rank() == 0)
    tokenizer = load_tokenizer(args.model)
    prompts, rows = data.load_prompts(args.train_file, tokenizer, args.max_prompt_len,
                                      args.system_prompt, require_response=args.hybrid != "none")
    print0(f"{args.train_file}: {len(prompts)} prompts kept, {rows - len(prompts)} dropped "
           f"(> {args.max_prompt_len} tokens)")
    if len(prompts) < args.prompts_per_step:
        raise SystemExit(f"{len(prompts)} prompts are fewer than one step's "
                         f"{args.prompts_per_step}")
    return tokenizer, prompts, rows


def load_engine_and_policy(args, device, run, validation):
    """The rollout engine (validation's too), then the policy, sharded, and its AdamW: the engine
    first, as vLLM's share of the GPU must be free when it starts."""
    bf16 = args.bf16 and device.type == "cuda"
    engine, _ = generation.rollout_engine(
        args.model, args.engine, "bfloat16" if bf16 else "float32", args.seed + dist.get_rank(),
        args.gpu_memory_utilization,
        args.max_prompt_len + max(args.max_response_len, validation.settings.max_new_tokens),
        args.vllm_sleep, has_trainer_weights=run.resume_from is None, raw_logprobs=True)
    validation.engine = engine
    model = shard_model(load_full_model(args.model, scratch=False, seed=args.seed), device, bf16,
                        args.grad_ckpt, offload=args.offload, compile_layers=args.compile)
    optimizer = make_optimizer(model, args.lr, args.weight_decay, 0.999, device, args.offload)
    if args.offload:
        torch.set_num_threads(cpu_threads_per_rank())  # the optimiser step runs on the CPU
    return engine, model, optimizer


def score(samples, prompts: list[data.Prompt], reward_fn, args):
    """Each rollout's reward [G, n] (reward_fn: math_reward by default) and the grader's failures."""
    examples = []
    for p in prompts:
        examples += [p.example] * args.rollouts
    scores, failures = reward_fn(list(itertools.chain.from_iterable(samples)), examples)
    return torch.tensor(scores, dtype=torch.float32).view(len(prompts), args.rollouts), failures


def old_log_probs(model, minis, args) -> None:
    """Each micro-batch's old log-probs and entropy at the rollout temperature, recomputed by the
    trainer, not taken from the engine: the ratio compares two evaluations with the same numerics;
    and at temperature 1 (raw_lp) for the engine check, which compares the engine's raw ones."""
    for mb in itertools.chain.from_iterable(minis):
        mb.old_lp, mb.entropy = token_log_probs(model, mb.batch, args.loss_chunk, args.temperature,
                                                compile_loss=args.compile)
        mb.raw_lp = mb.old_lp if args.temperature == 1.0 else token_log_probs(
            model, mb.batch, args.loss_chunk, with_entropy=False, compile_loss=args.compile)[0]
    model.reshard()                     # a no-grad forward leaves the FSDP root's weights gathered


def update(model, optimizer, minis, args, device, failed):
    """One optimiser step per mini-batch (Table 6: 128 prompts, mini-batches of 64: 2); the first
    is on-policy (ratio 1). Returns the summed [loss, clip_low, clip_high, kl, tokens] and each
    update's gradient norm; failed(why): the run's stop for an update that must not apply."""
    stats, grad_norms = torch.zeros(5, dtype=torch.float64), []
    for mbs in minis:
        try:
            sums, grad_norm = policy_update(model, optimizer, mbs, args, device)
        except FloatingPointError as e:
            raise failed(str(e)) from None
        stats += sums
        grad_norms.append(grad_norm)
    return stats, grad_norms


def train(args, device, reward_fn=None):
    """GRPO in an initialised process group. reward_fn(samples, examples) -> (rewards, failures)
    defaults to math_reward. Returns the log records (every rank computes them)."""
    reward_fn = reward_fn or functools.partial(math_reward, grading=args.reward,
                                               timeout_s=args.grader_timeout,
                                               workers=args.grader_workers)
    rank, world = dist.get_rank(), dist.get_world_size()
    check_world(args, world)
    stop = StopSignal()                      # SIGTERM / Ctrl-C: finish the step, save, leave
    tokenizer, prompts, rows = load_prompts(args)
    validation = measure.Validation(args, tokenizer)     # a bad eval file: refused now, not later
    mix = hybrid.hook(args)                                    # --hybrid's points of the step
    mix.pin_settings(args.out_dir)
    run = Run(args, device, stop, asdict(args), MAY_CHANGE_ON_RESUME, asdict(Args()), rows,
              args.steps, "--steps")
    if run.complete:
        return []
    engine, model, optimizer = load_engine_and_policy(args, device, run, validation)
    at = run.start(model, optimizer, None, {"step": 0}, "grpo", floats=("engine_logp_floor",),
                   records=["rollouts.jsonl"])
    step, records = at["step"], []
    engine_check = generation.EngineCheck(args.engine_logp_tol, at.get("engine_logp_floor"))

    while step < args.steps:
        t0 = time.perf_counter()
        # ---- ALGO LOGIC. Rollouts: this rank's prompts x `rollouts` samples from the current
        # policy, a seed per (step, rank) so that runs repeat, with the engine's log-probs of them
        # (only to check them against the trainer's, below)
        synced = not engine.has_trainer_weights
        try:
            generation.wake(engine, model, args.sync_bucket_mb << 20)  # with the trainer's weights
        except generation.SyncError as e:
            raise run.failed(step + 1, str(e)) from None
        t_sync = time.perf_counter()
        mine, epoch = step_prompts(len(prompts), step, args, rank, world)
        group_prompts = [prompts[i] for i in mine]
        samples = mix.rollouts(engine, tokenizer, group_prompts, step,
                               rollout_seed(args, step, rank, world, len(mine)))      # [G][n]
        generation.sleep(engine)                                      # the trainer has the GPU
        t_gen = time.perf_counter()

        # ---- reward (App. E) and group advantages
        rewards, failures = score(samples, group_prompts, reward_fn, args)           # [G, n]
        adv, demo_adv, zero_std = mix.advantages(
            rewards, samples, functools.partial(group_advantages, use_std=args.adv_std))
        t_reward = time.perf_counter()

        # ---- old log-probs; the engine check: a weight the sync missed stops the run here
        minis = micro_batches([p.ids for p in group_prompts], samples, adv.tolist(), args,
                              tokenizer.pad_token_id, device, demo_adv.tolist())
        old_log_probs(model, minis, args)
        mbs = list(itertools.chain.from_iterable(minis))
        logp_diff = engine_check([mb.engine_lp for mb in mbs], [mb.raw_lp for mb in mbs], synced,
                                 functools.partial(run.failed, step + 1))

        # ---- one optimiser step per mini-batch of prompts
        stats, grad_norms = update(model, optimizer, minis, args, device,
                                   functools.partial(run.failed, step + 1))
        step += 1
        t_train = time.perf_counter()

        # ---- log and save
        records.append(step_record(step, epoch, rewards, mix.own(rewards), zero_std, samples, minis,
                                   stats, grad_norms, failures,
                                   (t0, t_sync, t_gen, t_reward, t_train), logp_diff, args, device))
        run.write(records[-1], rollouts=rollout_records(step, group_prompts, samples, rewards, adv,
                                                        args.log_rollouts, mix))
        validation.after(step, model, tokenizer, run)     # a part of this step, when it is due
        run.after_step({"step": step, "engine_logp_floor": engine_check.floor}, tokenizer)
    run.finish(step)
    return records


def main():
    (args,) = parse_config(Args)
    _, _, device = setup_distributed(args.dist_timeout_min)
    args.model = resolve_model(args.model)                  # org/name: the hub's copy
    train(args, device)
    shutdown()


if __name__ == "__main__":
    run_script(main)
