# CurioSFT RL stage: GRPO from an SFT checkpoint (paper Sec. 5.2, App. E Table 6). python rl.py --help lists every flag.
"""GRPO (Shao et al. 2024) with DAPO's clip-higher and no KL term, as the paper's RL stage. The same script runs as one
process (CPU: HF `generate`) and under `torchrun --nproc_per_node N` (FSDP2 trainer, one vLLM engine per GPU).

    python rl.py config/rl_tiny.py --model out/sft/step_000010 --train_file data.jsonl
    torchrun --nproc_per_node 8 rl.py config/rl_paper.py --model out/sft/step_000540 --train_file train.parquet

One step: wake the engine and load the trainer's weights into it -> rollouts (prompts x rollouts) -> the engine
sleeps -> rewards -> group advantages -> old log-probs recomputed by the trainer -> one optimiser step per
mini-batch of prompts.
"""
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

import checkpoints
import common
import curio_loss as cl
import data
import evaluate
import run_dir
from chunked_logits import chunked_sum, normed_hidden, select_targets, token_log_probs


POLICY_LOSSES = ("ppo_clip", "custom_loss_rl")
LOSS_AGGS = ("token_mean", "seq_sum_over_max_len")


@dataclass
class Args:
    """rl.py settings"""
    REQUIRED = ("model", "train_file")
    model: str = ""
    """HF checkpoint directory to start from (an SFT checkpoint: config.json, weights, tokenizer)"""
    train_file: str = ""
    """prompts and ground truths: .parquet / .jsonl / .json in the authors' schema (target not needed)"""
    out_dir: str = "out/rl"
    """checkpoints (HF format) and log.jsonl go here; an existing checkpoint here is resumed"""
    steps: int = 500
    """GRPO steps: each generates, scores and trains on one batch of prompts (Table 6 "Training Steps")"""
    prompts_per_step: int = 128
    """prompts per step, over all ranks (Table 6 "Batch Size")"""
    rollouts: int = 8
    """responses sampled per prompt: the GRPO group (Table 6 "Rollout Numbers")"""
    mini_batch: int = 64
    """prompts per optimiser step, over all ranks: prompts_per_step / mini_batch steps per batch (Table 6: 64; the
    authors' 2_rl.sh line 38: 32, so 4 updates per step)"""
    micro_batch: int = 4
    """sequences per forward/backward pass per rank (gradient accumulation fills the mini-batch)"""
    lr: float = 1e-6
    """constant learning rate (Table 6)"""
    weight_decay: float = 0.01
    """AdamW weight decay (verl's actor default)"""
    grad_clip: float = 1.0
    """max global gradient norm (verl's actor default)"""
    clip_low: float = 0.2
    """eps_low: the ratio is clipped below at 1 - eps_low (Table 6 "Clip Lower")"""
    clip_high: float = 0.28
    """eps_high: the ratio is clipped above at 1 + eps_high (Table 6 "Clip Higher", DAPO's clip-higher; the authors'
    scripts never set it: 0.2, verl's clip_ratio default read at dp_actor.py line 471)"""
    policy_loss: Literal[POLICY_LOSSES] = "ppo_clip"
    """ppo_clip: max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)), r = pi / pi_old (GRPO with clip-higher, Sec. 5.2) |
    custom_loss_rl: min(-A log pi, -A clip(r, 1 - eps_low, 1 + eps_high)), the authors' custom_loss with
    algo_type="rl" (core_algos.py lines 779-783): REINFORCE for A < 0, the ratio clipped on both sides for A > 0"""
    loss_agg: Literal[LOSS_AGGS] = "token_mean"
    """how a mini-batch's per-token losses are combined. token_mean: their mean over the response tokens of all ranks
    (verl's default loss_agg_mode, DAPO's token-level loss; the paper does not say) | seq_sum_over_max_len: each
    sequence's token sum / max_response_len, averaged over the mini-batch's sequences (the authors: core_algos.py
    line 783 on micro-batches of one sequence, divided by the 32 micro-batches per GPU at dp_actor.py line 522)"""
    temperature: float = 1.0
    """rollout temperature; the trainer scores tokens at the same temperature (Table 6)"""
    top_p: float = 0.95
    """rollout nucleus sampling (Table 6: 0.95; the authors' scripts leave verl's 1.0, rollout.yaml line 14)"""
    max_prompt_len: int = 1024
    """longer prompts are dropped, and counted"""
    max_response_len: int = 8192
    """generation stops after this many tokens (Table 6)"""
    system_prompt: Literal[data.SYSTEM_PROMPT_MODES] = "paper"
    """paper: Table 7's prompt around the row's question | row: Table 7 with the row's own system message (the toy
    demo's one-liner) | messages: the row's prompt messages as stored, through the chat template (the authors)"""
    loss_chunk: int = 2048
    """tokens per logits chunk: [tokens, vocab] logits exist one chunk at a time, recomputed in backward"""
    bf16: bool = True
    """bf16 compute with float32 master weights and reductions (CUDA only; CPU runs float32)"""
    grad_ckpt: bool = True
    """activation checkpointing of the decoder layers"""
    engine: Literal["auto", "hf", "vllm"] = "auto"
    """generation engine: auto (vLLM with CUDA and vllm installed, else HF generate) | hf | vllm"""
    gpu_memory_utilization: float = 0.6
    """vLLM: fraction of TOTAL GPU memory for its weights and KV cache while it generates. With vllm_sleep the
    trainer keeps only its parameter and optimiser shards meanwhile (12 bytes per parameter / GPUs)"""
    vllm_sleep: bool = True
    """vLLM sleep mode: the engine frees its weights and KV cache while the trainer works (--no-vllm-sleep keeps
    them, and the trainer has only the rest of the GPU: lower gpu_memory_utilization)"""
    sync_bucket_mb: int = 1024
    """weight sync: MB of full tensors (in the engine's dtype) gathered from the FSDP shards per load into it"""
    gen_batch_size: int = 16
    """HF engine: prompts per generate call (vLLM schedules its own batches)"""
    grader_timeout: float = 10.0
    """seconds per graded response; an overrunning grader is killed and the response scores 0"""
    grader_workers: int = 4
    """grader processes per rank"""
    seed: int = 0
    """prompt order and sampling"""
    save_every: int = 50
    """checkpoint every this many steps (0: only at the end)"""
    keep_last: int = 0
    """keep only the newest N complete checkpoints (0: all); the one a run resumed from is never deleted"""
    offload: bool = False
    """FSDP2 CPU offload of the sharded parameters, gradients and Adam states: the optimiser step runs on the CPU"""
    dist_timeout_min: float = 60.0
    """minutes a collective may wait for the slowest rank (ranks that finish their rollouts early wait in the
    next collective: NCCL's default 10 minutes can abort a paper-scale step)"""
    loggers: list[str] = ()
    """extra logging backends besides log.jsonl: wandb, tensorboard (their packages are not in requirements.txt)"""

    def __post_init__(self):
        common.check_settings(
            self, positive=["lr", "grad_clip", "temperature", "grader_timeout", "dist_timeout_min"],
            fraction=["clip_low", "top_p", "gpu_memory_utilization"], non_negative=["weight_decay", "clip_high",
                                                                                    "save_every", "keep_last"],
            at_least_one=["steps", "prompts_per_step", "rollouts", "mini_batch", "micro_batch", "max_prompt_len",
                          "max_response_len", "loss_chunk", "sync_bucket_mb", "gen_batch_size", "grader_workers"])


# settings a resumed run may change: they do not change what the run computes (run_dir.claim checks the others)
MAY_CHANGE_ON_RESUME = {"out_dir", "steps", "save_every", "keep_last", "loggers", "loss_chunk", "grad_ckpt", "offload",
                        "dist_timeout_min", "engine", "gpu_memory_utilization", "vllm_sleep", "sync_bucket_mb",
                        "gen_batch_size", "grader_timeout", "grader_workers"}


# ================================================================================================
# ALGO LOGIC: reward, group advantage, clipped surrogate
# ================================================================================================
def math_reward(samples, examples, timeout_s=10.0, workers=4):
    """App. E: 1 when the response closes </think> and the text after it verifies against the ground truth
    with math-verify (multiple-choice letters for MC data), else 0. Graded in worker processes (evaluate.grade).
    The reward hook's contract: (samples, examples) -> (rewards, grader failures)."""
    kinds = [evaluate.answer_kind(ex.data_source, ex.ground_truth) for ex in examples]
    return evaluate.grade([s.text for s in samples], [ex.ground_truth for ex in examples], kinds, timeout_s, workers)


def group_advantages(rewards, eps=1e-6):
    """GRPO's outcome advantage, one group per prompt: A_i = (r_i - mean(r)) / (std(r) + eps), unbiased std as
    verl (8 rollouts, one correct: +2.474867 for it, -0.353552 for the others); a group of one rollout has no std,
    and verl takes mean 0, std 1 there (core_algos.py lines 309-311): A = r / (1 + eps). rewards [G, n] -> A [G, n]
    and the mask [G] of groups that carry no learning signal: every advantage exactly 0 (rewards all equal, n > 1:
    float32 rewards summed in float64 are exact, so r - mean = 0; or a single reward of 0)."""
    r = rewards.double()
    if r.shape[-1] == 1:
        adv = r / (1 + eps)
    else:
        adv = (r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + eps)   # std: unbiased (n - 1)
    return adv.float(), (adv == 0).all(-1)


def clipped_loss(lp, old_lp, adv, clip_low, clip_high, policy_loss="ppo_clip"):
    """Per-token policy loss and diagnostics, r = pi_theta / pi_old, clip(r) = r clipped to [1 - eps_low, 1 + eps_high].
    ppo_clip: max(-A r, -A clip(r)). With A > 0 only the upper clip can bind (r > 1 + eps_high: no gradient), with
    A < 0 only the lower one; eps_high > eps_low (clip-higher) lets unlikely good tokens grow further, against entropy
    collapse. custom_loss_rl (the authors' scripts): min(-A log pi, -A clip(r)). For A < 0 the first term is the
    smaller (-A log pi <= 0 < -A clip(r)): REINFORCE, never clipped; for A > 0 the second (-A clip(r) < 0 <= -A log pi):
    gradient -A r inside the range, none outside it on either side. The clip fractions count the tokens whose
    gradient a clip cut off."""
    log_ratio = (lp - old_lp).clamp(-20.0, 20.0)                           # verl's guard against exp overflow
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high)
    if policy_loss == "ppo_clip":
        loss, low_binds = torch.maximum(-adv * ratio, -adv * clipped), adv < 0
    elif policy_loss == "custom_loss_rl":
        loss, low_binds = torch.minimum(-adv * lp, -adv * clipped), adv > 0     # core_algos.py lines 780-782
    else:
        raise ValueError(f"policy_loss {policy_loss!r}: expected one of {', '.join(POLICY_LOSSES)}")
    with torch.no_grad():
        diag = {"clip_high": ((adv > 0) & (ratio > 1 + clip_high)).float(),
                "clip_low": (low_binds & (ratio < 1 - clip_low)).float(),
                "kl": ratio - 1 - log_ratio}                                # k3 estimate of KL(pi_old || pi_theta)
    return loss, diag


# ------------------------------------------------------------------------------------------------
# The trainer's side: the loss of one micro-batch
# ------------------------------------------------------------------------------------------------
def micro_batch_loss(model, batch, old_lp, adv, args):
    """Sum over the micro-batch's response tokens of the clipped loss, and per-token diagnostics. old_lp, adv:
    [N] in select_targets order. Each logits chunk is recomputed in backward (chunked_logits.chunked_sum)."""
    h, y = select_targets(normed_hidden(model, batch), batch)      # [N, H], [N]

    def chunk(h_c, y_c, old_c, adv_c):
        logits = model.lm_head(h_c).float() / args.temperature             # [n, V]
        lp, _ = cl.student_log_prob(logits, y_c)
        loss, diag = clipped_loss(lp, old_c, adv_c, args.clip_low, args.clip_high, args.policy_loss)
        return loss.sum(), diag

    return chunked_sum(chunk, args.loss_chunk, h, y, old_lp, adv)


def optimiser_step(model, optimizer, mbs, args):
    """One optimiser step on one mini-batch: the policy loss of every rank's response tokens, combined as --loss_agg
    says (no KL term). mbs: this rank's micro-batches [(batch, adv [N], old_lp [N], entropy [N])].
    Returns this rank's sums [loss, clip_low, clip_high, kl, tokens] and the global gradient norm."""
    world = dist.get_world_size()
    if args.loss_agg == "token_mean":                                      # divide by the response tokens
        count = sum(len(mb[1]) for mb in mbs)
    else:                                                                  # by sequences x max_response_len
        count = sum(len(mb[0]["input_ids"]) for mb in mbs) * args.max_response_len
    denominator = torch.tensor(float(count), device=mbs[0][1].device)     # nccl: CUDA tensors only
    dist.all_reduce(denominator)
    sums = torch.zeros(5, dtype=torch.float64)
    for batch, adv, old_lp, _ in mbs:   # FSDP reduce-scatters each micro-batch: no full unsharded gradient is kept
        total, diag = micro_batch_loss(model, batch, old_lp, adv, args)
        # FSDP averages gradients over ranks, hence * world: the gradient of the mini-batch's loss over all ranks
        (total * world / denominator).backward()
        sums += torch.tensor([total.item(), diag["clip_low"].sum().item(), diag["clip_high"].sum().item(),
                              diag["kl"].sum().item(), len(adv)], dtype=torch.float64)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
    grad_norm = (grad_norm.full_tensor() if isinstance(grad_norm, DTensor) else grad_norm).item()
    if not math.isfinite(grad_norm):                   # global: every rank stops alike
        raise FloatingPointError(f"the gradient norm is not finite ({grad_norm}); the update was not applied")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return sums, grad_norm


@torch.no_grad()
def full_weight_buckets(model, dtype, bucket_bytes):
    """The trainer's weights as full tensors in `dtype`, [(hf_name, tensor)] lists of about bucket_bytes each.
    Each DTensor shard is cast first, so its all-gather (p.full_tensor()) moves `dtype` bytes, not float32's. Every
    rank must iterate it in step: the all-gathers run in state_dict order on every rank. Tied aliases (lm_head.weight
    when it is the embedding) are left out: state_dict lists them, named_parameters does not."""
    own = {name for name, _ in model.named_parameters()} | {name for name, _ in model.named_buffers()}
    bucket, size = [], 0
    for name, full in common.full_tensors(model, dtype, skip=set(model.state_dict()) - own):
        bucket.append((name, full))
        size += full.nbytes
        if size >= bucket_bytes:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


@torch.no_grad()
def sync_weights(model, engine, bucket_bytes=1 << 30):
    """Load the trainer's current weights into the generation engine, in the engine's dtype, one bucket of full
    tensors at a time; every rank calls it. Raises if an engine parameter got no weight: after vLLM's level-2
    sleep it would hold garbage. Names are the HF checkpoint names both engines load."""
    if engine.kind == "vllm":
        # vLLM 0.32 with distributed_executor_backend="external_launcher" runs its engine in this process, so
        # LLM.apply_model(fn) calls fn on this rank's nn.Module (worker_base.py apply_model, one worker per engine).
        # Qwen2ForCausalLM.load_weights (models/qwen2.py, AutoWeightsLoader in models/utils.py) takes (hf_name,
        # tensor) pairs, writes q/k/v and gate/up into their fused parameters, copies into the existing storage
        # (param.data.copy_: CUDA graphs keep valid pointers), logs a warning for every tensor whose dtype is not
        # its parameter's (hence the cast), and returns the names of the parameters it loaded. A tied lm_head.weight
        # must not come without the embedding in the same call (AutoWeightsLoader._check_skipped_aliases raises).
        llm = engine.model
        dtype = llm.apply_model(lambda m: next(m.parameters()).dtype)[0]
        params = set(llm.apply_model(lambda m: [name for name, _ in m.named_parameters()])[0])
        loaded = set()
        for bucket in full_weight_buckets(model, dtype, bucket_bytes):
            loaded |= llm.apply_model(lambda m: m.load_weights(bucket))[0]
        # cached KV blocks were computed by the old weights (vLLM's sleep also drops them: EngineCore.sleep)
        if not llm.reset_prefix_cache():
            raise RuntimeError("vLLM could not reset its prefix cache after the weight sync (requests in flight?)")
        # never llm.collective_rpc("reload_weights") without weights: it re-reads the checkpoint on disk
    else:
        params, loaded = {name for name, _ in engine.model.named_parameters()}, set()
        dtype = next(engine.model.parameters()).dtype
        for bucket in full_weight_buckets(model, dtype, bucket_bytes):
            unexpected = engine.model.load_state_dict(dict(bucket), strict=False).unexpected_keys
            if unexpected:
                raise RuntimeError(f"weight sync: the HF engine has no parameter {unexpected[0]!r}")
            loaded |= {name for name, _ in bucket}
    if params - loaded:
        raise RuntimeError(f"weight sync: {len(params - loaded)} engine parameters got no weight, e.g. "
                           f"{sorted(params - loaded)[0]!r}")


# ================================================================================================
# Plumbing: prompts, rollouts to tensors, the loop, checkpoints, logs
# ================================================================================================
def load_prompts(args, tokenizer):
    """[(example, prompt text, prompt ids)] of every example whose prompt fits max_prompt_len."""
    kept, dropped = [], 0
    for ex in data.load_examples(args.train_file):
        text = data.example_prompt(ex, tokenizer, args.system_prompt)
        ids = tokenizer.encode(text, add_special_tokens=False)         # as evaluate.generate encodes it
        if len(ids) > args.max_prompt_len:
            dropped += 1
        else:
            kept.append((ex, text, ids))
    common.print0(f"{args.train_file}: {len(kept)} prompts kept, {dropped} dropped (> {args.max_prompt_len} tokens)")
    return kept


def step_prompts(n_prompts, step, args, rank, world):
    """Indices of this rank's prompts at `step`: a disjoint shard of the step's prompts_per_step. The order
    is a fixed permutation per epoch from (seed, epoch), so a resumed run sees the same prompts."""
    per_epoch = n_prompts // args.prompts_per_step
    epoch, k = divmod(step, per_epoch)
    order = torch.randperm(n_prompts, generator=torch.Generator().manual_seed(args.seed + epoch)).tolist()
    chosen = order[k * args.prompts_per_step : (k + 1) * args.prompts_per_step]
    share = args.prompts_per_step // world
    return chosen[rank * share : (rank + 1) * share], epoch


def rollout_seed(args, step, rank, world, n_prompts):
    """The sampling seed of this rank at `step`: one block of n_prompts * rollouts seeds per (seed, step, rank),
    since vLLM seeds request i with seed + i * rollouts (+ the sample's index). HF seeds torch once with it, and
    torch's CPU generator keeps only its low 32 bits: hence < 2**31."""
    return (args.seed * 1_000_003 + step * world + rank) * n_prompts * args.rollouts % 2**31


def micro_batches(prompt_ids, samples, adv, args, pad_id, device):
    """Sequences prompt + response (the response, its EOS included when it stopped, is trained), grouped into
    mini-batches (one per optimiser step) of micro-batches of `micro_batch` sequences, sorted by length so
    padding stays small. Every rank has the same counts, as FSDP's collectives require.
    Returns mini[m] = [(collated batch, adv per response token [N])]."""
    per_mini = args.mini_batch // dist.get_world_size()                    # prompts per mini-batch on this rank
    minis = []
    for start in range(0, len(prompt_ids), per_mini):
        seqs = [(prompt_ids[i] + s.token_ids, [0] * len(prompt_ids[i]) + [1] * len(s.token_ids), float(adv[i, j]))
                for i in range(start, start + per_mini) for j, s in enumerate(samples[i])]
        seqs.sort(key=lambda t: -len(t[0]))
        mbs = []
        for first in range(0, len(seqs), args.micro_batch):
            part = seqs[first : first + args.micro_batch]
            batch = data.collate([(ids, mask) for ids, mask, _ in part], pad_id)
            adv_tok = torch.tensor([a for _, mask, a in part for _ in range(sum(mask))])   # [N], select_targets order
            mbs.append(({k: v.to(device) for k, v in batch.items()}, adv_tok.to(device)))
        minis.append(mbs)
    return minis


def train(args, device, reward_fn=None):
    """The GRPO loop in an initialised process group. reward_fn(samples, examples) -> (rewards, failures)
    defaults to math_reward. Returns the log records (every rank computes them)."""
    if reward_fn is None:
        def reward_fn(samples, examples):
            return math_reward(samples, examples, args.grader_timeout, args.grader_workers)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.prompts_per_step % args.mini_batch or args.mini_batch % world:
        raise SystemExit(f"--prompts_per_step {args.prompts_per_step} must be a multiple of --mini_batch "
                         f"{args.mini_batch}, and that of the number of ranks ({world})")
    bf16 = args.bf16 and device.type == "cuda"
    out_dir = Path(args.out_dir)
    run_dir.claim(out_dir, asdict(args), MAY_CHANGE_ON_RESUME, resuming=checkpoints.latest(out_dir) is not None)

    # ---- engine first: vLLM's gpu_memory_utilization is a share of TOTAL memory and must be free at creation
    kind = evaluate.engine_kind(args.engine)
    if kind == "vllm" and "RANK" not in os.environ:   # external_launcher reads RANK / LOCAL_RANK
        raise SystemExit("engine vllm: the colocated engine needs CUDA, the vllm package and torchrun, also on one "
                         "GPU (torchrun --nproc_per_node 1 rl.py ...); --engine hf runs anywhere")
    sleeps = kind == "vllm" and args.vllm_sleep
    engine, tokenizer = evaluate.load_engine(
        args.model, kind, dtype="bfloat16" if bf16 else "float32", seed=args.seed + rank, logprobs=False,
        tensor_parallel_size=1, distributed_executor_backend="external_launcher",   # one engine per rank, in-process
        gpu_memory_utilization=args.gpu_memory_utilization, max_model_len=args.max_prompt_len + args.max_response_len,
        enable_sleep_mode=sleeps)
    if sleeps:
        # vLLM 0.32 LLM.sleep (v1/worker/gpu_worker.py Worker.sleep, device_allocator/cumem.py): level 1 copies the
        # weights to pinned CPU memory and back at every wake; level 2 discards them (and the KV cache), keeping
        # only the model's buffers (rotary cos/sin caches, attention scales) on the CPU and restoring them on
        # wake_up(["weights"]). Every weight is reloaded from the trainer before each rollout, so level 2.
        engine.model.sleep(level=2)
    prompts = load_prompts(args, tokenizer)
    if len(prompts) < args.prompts_per_step:
        raise SystemExit(f"{len(prompts)} prompts are fewer than one step's {args.prompts_per_step}")

    model = common.shard_model(common.load_full_model(args.model, scratch=False, seed=args.seed), device, bf16,
                               args.grad_ckpt, offload=args.offload)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay,   # verl's defaults
                                  betas=(0.9, 0.999), fused=device.type == "cuda" and not args.offload)

    step, stale = 0, sleeps                          # stale: the engine lacks the trainer's weights
    resume_from = checkpoints.resume_point(out_dir)
    if resume_from is not None:
        step, stale = checkpoints.restore(resume_from, model, optimizer, None)["step"], True
        common.print0(f"resumed from {resume_from} at step {step}")
    log = run_dir.RunLog(out_dir, step, args.steps, "grpo", args.loggers, asdict(args)) if rank == 0 else None
    records, last_saved = [], step

    while step < args.steps:
        t0 = time.perf_counter()
        # ---- the engine wakes for the rollouts only, in the order that keeps memory lowest: weights, the trainer's
        # weights into them, then the KV cache (vLLM 0.32 LLM.wake_up(tags): the scheduler runs once all is awake)
        if sleeps:
            torch.cuda.empty_cache()                 # the trainer's freed blocks (activations, grads) back to CUDA
            engine.model.wake_up(tags=["weights"])
        if stale:                                    # the engine idles while the trainer updates
            sync_weights(model, engine, args.sync_bucket_mb << 20)
        if sleeps:
            torch.cuda.empty_cache()                 # the sync's buckets
            engine.model.wake_up(tags=["kv_cache"])
        t_sync = time.perf_counter()

        # ---- rollouts: this rank's prompts x `rollouts` samples, a seed per (step, rank) so runs repeat. No
        # log-probs from the engine: the trainer recomputes them below
        mine, epoch = step_prompts(len(prompts), step, args, rank, world)
        examples = [prompts[i][0] for i in mine]
        samples = evaluate.generate(engine, tokenizer, [prompts[i][1] for i in mine], args.rollouts, args.temperature,
                                    args.top_p, args.max_response_len, rollout_seed(args, step, rank, world, len(mine)),
                                    batch_size=args.gen_batch_size, logprobs=False)
        if sleeps:
            engine.model.sleep(level=2)              # the trainer has the GPU until the next rollouts
        t_gen = time.perf_counter()
        scores, failures = reward_fn([s for group in samples for s in group],
                                     [ex for ex in examples for _ in range(args.rollouts)])
        rewards = torch.tensor(scores, dtype=torch.float32).view(len(mine), args.rollouts)     # [G, n]
        adv, flat_groups = group_advantages(rewards)                       # [G, n], [G]
        t_reward = time.perf_counter()

        # ---- old log-probs: the policy that generated, as the trainer computes it (ratio = 1 at the first update)
        minis = micro_batches([prompts[i][2] for i in mine], samples, adv, args, tokenizer.pad_token_id, device)
        # old log-probs (and entropy) at the rollout temperature, recomputed by the trainer rather than taken from
        # the engine: the ratio must compare two evaluations with the same numerics (kernels, dtype, top-p differ)
        minis = [[(batch, adv_tok, *token_log_probs(model, batch, args.loss_chunk, args.temperature))
                  for batch, adv_tok in mbs] for mbs in minis]
        model.reshard()                              # a no-grad forward leaves the FSDP root's weights gathered

        # ---- one optimiser step per mini-batch (Table 6: 128 prompts, mini-batches of 64 -> 2 steps). Clip fractions
        # and KL are measured at each update's forward: the first mini-batch of a step is on-policy (ratio 1)
        stats, grad_norms = torch.zeros(5, dtype=torch.float64), []
        for mbs in minis:
            try:
                sums, grad_norm = optimiser_step(model, optimizer, mbs, args)
            except FloatingPointError as e:
                raise SystemExit(f"step {step + 1}: {e}; nothing after step {last_saved} is saved") from None
            stats += sums
            grad_norms.append(grad_norm)
        step, stale = step + 1, True
        t_train = time.perf_counter()

        # ---- log: sums over ranks, then means
        ent = torch.cat([mb[3] for mbs in minis for mb in mbs])           # [response tokens of this rank]
        local = {"reward": rewards.sum().item(), "correct": (rewards == 1).sum().item(), "rollouts": rewards.numel(),
                 "flat_groups": flat_groups.sum().item(), "groups": len(mine),
                 "length": sum(len(s.token_ids) for g in samples for s in g),
                 "truncated": sum(s.finish_reason == "length" for g in samples for s in g),
                 "entropy": ent.double().sum().item(), "failures": failures,
                 **dict(zip(["loss", "clip_low", "clip_high", "kl", "tokens"], stats.tolist()))}
        summed = torch.tensor(list(local.values()), dtype=torch.float64, device=device)
        dist.all_reduce(summed)
        g = dict(zip(local, summed.tolist()))
        record = {"step": step, "epoch": epoch, "reward_mean": g["reward"] / g["rollouts"],
                  "accuracy": g["correct"] / g["rollouts"],                # reward 1; = reward_mean for 0/1 rewards
                  "zero_var_groups": int(g["flat_groups"]), "zero_var_frac": g["flat_groups"] / g["groups"],
                  "response_length": g["length"] / g["rollouts"], "truncated_frac": g["truncated"] / g["rollouts"],
                  "entropy": g["entropy"] / g["tokens"], "loss": g["loss"] / g["tokens"],
                  "clip_frac_low": g["clip_low"] / g["tokens"], "clip_frac_high": g["clip_high"] / g["tokens"],
                  "approx_kl": g["kl"] / g["tokens"], "grad_norm": sum(grad_norms) / len(grad_norms),
                  "grader_failures": int(g["failures"]), "lr": args.lr, "sync_s": t_sync - t0, "gen_s": t_gen - t_sync,
                  "reward_s": t_reward - t_gen, "train_s": t_train - t_reward}
        records.append(record)
        if log is not None:
            log.write(record)
        if (args.save_every and step % args.save_every == 0) or step == args.steps:
            path = checkpoints.save(out_dir, step, model, tokenizer, checkpoints.trainer_state(model, optimizer, None),
                                    {"step": step}, dtype=torch.bfloat16 if bf16 else torch.float32,
                                    keep_last=args.keep_last, keep=resume_from)
            last_saved = step
            common.print0(f"saved {path}")
    if log is not None:
        log.close()
    run_dir.release()
    return records


def main():
    (args,) = common.parse_config(Args)
    _, _, device = common.setup_distributed(args.dist_timeout_min)
    train(args, device)
    common.shutdown()


if __name__ == "__main__":
    common.run_script(main)
