# Table 3's single-stage hybrids of SFT and RL, beside CurioSFT + GRPO (arXiv:2602.02244, Sec. 5.3).
"""LUFFY (arXiv:2504.14945) and RL-PLUS (arXiv:2508.00222) as variants of rl.py's update, each as
its authors' training script runs it (`rl.py --hybrid luffy|rl_plus`; the presets
config/rl_luffy.py and config/rl_plus.py cite each setting's file and line):

- the expert's response, the SFT row's target, joins each group of rollouts as its first member in
  place of one sample (`demonstrations`), and is graded like the others;
- the group's advantage is r - mean(r) over the mixed group: their scripts turn GRPO's std off
  (rl.py --adv_std false);
- the model's own tokens take -A r, unclipped (`unclipped_loss`); the expert's tokens the method's
  off-policy loss (`demonstration_loss`);
- a micro-batch's loss is its token sum / max_response_len minus 0.001 x its token-mean entropy,
  averaged over their 8 GPUs (rl.py --loss_agg rank_sum_over_max_len --entropy_coef 0.001).

RL-PLUS's code base is a copy of LUFFY's: the two differ only in `demonstration_loss`.

Prefix-RFT (arXiv:2507.01679) keeps GRPO's clipped update and changes what is sampled
(`rl.py --hybrid prefix_rft`; config/rl_prefix_rft.py says which settings are its code's, its
paper's, or chosen here, as its repository ships no training configuration):

- each group has --rollouts - --prefix_rollouts unprefixed rollouts and --prefix_rollouts that
  continue a prefix of the expert's response, one continuation each (`sample_prefixed_groups`);
  the prefix is a fraction `prefix_ratio` of it, drawn between two scheduled bounds
  (`prefix_bound`);
- its tokens are the demonstration's (`demo_tokens`) and take their own advantage
  (`prefix_rft_advantages`), zeroed on all but the highest-entropy 20% of a micro-batch's prefix
  tokens (`entropy_reshaped_advantages`); every token takes the dual clip (rl.dual_clip_loss).
Per-token tensors below are [n], one chunk of response tokens.
"""
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.distributed as dist

import data
from curio_loss import entropy
from plumbing import checkpoints, generation, run_dir
from plumbing.distributed import print0
from plumbing.generation import Sample

HYBRIDS = ("none", "luffy", "rl_plus", "prefix_rft")
SHAPED = ("luffy", "rl_plus")      # the expert's whole response leads each group, with its own loss
PREFIX_SCHEDULES = ("const", "linear_decay", "cosine_decay")

# Where the authors' code is cited: LUFFY at github.com/ElliottYan/LUFFY 01f4ae0, paths under
# luffy/verl/verl/; RL-PLUS at github.com/YihongDong/RL-PLUS eb4aa4d, under rl_plus/verl/verl/;
# Prefix-RFT at github.com/ZeroYuHuang/prefix_rft 5f5d2a1, under recipe/prefix_rft/.


@dataclass
class HybridArgs:
    """Table 3's hybrids (hybrid.py): rl.py --hybrid"""
    hybrid: Literal[HYBRIDS] = "none"
    """Table 3's hybrids: luffy, rl_plus: the expert's response is one of each group's --rollouts,
    the clip settings do not apply | prefix_rft: rollouts continue its prefixes"""
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


def check_settings(args):
    """rl.py's settings as a hybrid needs them, each refused in one line (rl.Args calls it)."""
    if args.hybrid in SHAPED and (args.policy_loss != "ppo_clip" or args.clip_ratio_c):
        raise SystemExit(f"--hybrid {args.hybrid}: its own tokens' loss is unclipped -A r; "
                         f"--policy_loss and --clip_ratio_c do not apply")
    if args.hybrid in SHAPED and args.rollouts < 2:
        raise SystemExit(f"--hybrid {args.hybrid}: needs --rollouts >= 2 (the expert's response "
                         f"takes one place in each group)")
    if args.prefix_schedule_steps < 0:
        raise SystemExit(f"--prefix_schedule_steps {args.prefix_schedule_steps}: must be >= 0")
    if args.hybrid == "prefix_rft":
        check_prefix_settings(args)


def demonstrations(examples, tokenizer, max_response_len: int) -> list[Sample]:
    """Each example's expert response as a rollout: its tokens as SFT trains them (data.Example's
    response, without the leading "<think>\\n", then EOS), cut to max_response_len, so a response
    of max_response_len tokens or more keeps no EOS (LUFFY: mix_src/rl_dataset_with_target.py lines
    123-157 cut the trace to 8192 tokens, mix_vllm_rollout.py lines 162-165 append the EOS, and the
    response is cut to 8192). An example without a response is a one-line error naming its row."""
    samples = []
    for ex in examples:
        if ex.response is None:
            raise SystemExit(f"{ex.where()}: no expert response (target), which --hybrid needs")
        ids = data.tokenize_sft(tokenizer, "", ex.response)[0][:max_response_len]
        stopped = ids[-1] == tokenizer.eos_token_id
        text = tokenizer.decode(ids[:-1] if stopped else ids, skip_special_tokens=False)
        stop_text = tokenizer.decode(ids[-1:], skip_special_tokens=False) if stopped else ""
        samples.append(Sample(ids, text, None, None, "stop" if stopped else "length", stop_text))
    return samples


# ================================================================================================
# ALGO LOGIC: the per-token losses
# ================================================================================================
def unclipped_loss(lp, old_lp, adv, args):
    """The model's own tokens: -A r, r = pi_theta / pi_old, no clip and no guard on the ratio
    (LUFFY mix_src/mix_core_alg.py lines 119-123, 149, with loss_remove_clip=True; RL-PLUS
    recipe/rlplus_core_alg.py lines 111-116). rl.py's policy-loss contract: lp, old_lp, adv [n] ->
    loss [n], diagnostics (no clip binds: the clip fractions are 0)."""
    log_ratio = lp - old_lp
    ratio = torch.exp(log_ratio)
    loss = -adv * ratio
    with torch.no_grad():
        zeros = torch.zeros_like(ratio)
        diag = {"clip_high": zeros, "clip_low": zeros, "kl": ratio - 1 - log_ratio}
    return loss, diag


def demonstration_loss(hybrid: str, lp, old_lp, adv):
    """The expert's tokens, p = pi_theta(token) = exp(lp), no clip:
    luffy: -A p / (p + 0.1), policy shaping with gamma 0.1, gradient through both p's
      (mix_core_alg.py lines 165, 174-175, 208).
    rl_plus: -[p / (0.5 p_old + 0.5 pi_omega)] (A (1 - sg(p))^0.5): multiple importance sampling
      against the expert's unknown policy, taken as pi_omega = (p_old + 1) / 2, times the
      exploration-based advantage with gamma 0.5; p_old = exp(old_lp), the trainer's recomputed
      probability of the expert token (rlplus_core_alg.py lines 135-137, 165-167)."""
    if hybrid == "luffy":
        p = torch.exp(lp)
        return -adv * (p / (p + 0.1))
    if hybrid == "rl_plus":
        omega = 0.5 * (torch.exp(old_lp) + 1)
        ratio = 2 * torch.exp(lp) / (torch.exp(old_lp) + omega)
        return -ratio * (adv * (1 - torch.exp(lp.detach())) ** 0.5)
    raise ValueError(f"hybrid {hybrid!r}: expected one of {', '.join(HYBRIDS[1:])}")


def entropy_bonus_scale(mbs, args, device):
    """The authors' bonus is a token-mean entropy per micro-batch, summed over micro-batches, so its
    weight grows with their number: their GPUs pack micro-batches of up to entropy_pack_tokens
    tokens (verl's dynamic batch size; each GPU as many as the fullest of their loss_agg_ranks
    needs). Their count over all GPUs / ours over all ranks, a 0-d tensor on the device (no host
    sync), or None (--entropy_coef 0)."""
    if not args.entropy_coef:
        return None
    tokens = sum(sum(mb.batch["seq_lens"]) for mb in mbs)
    # built on the host, then copied: the dry run's fake CUDA tensors can be copied to, not made
    counts = torch.tensor([float(tokens), float(len(mbs))], dtype=torch.float64).to(device)
    dist.all_reduce(counts)                           # the mini-batch's tokens, our micro-batches
    per_gpu = counts[0] / (args.loss_agg_ranks * args.entropy_pack_tokens)
    return args.loss_agg_ranks * torch.ceil(per_gpu) / counts[1]


def entropy_bonus_weights(mb, args, scale):
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


# ================================================================================================
# Prefix-RFT: prefixes of the expert's response, continued by the rollout engine
# ================================================================================================
@dataclass
class PrefixedSample(Sample):
    prefix_len: int = 0   # its first prefix_len tokens are the expert's, the rest the engine's


def check_prefix_settings(args):
    """--hybrid prefix_rft's settings, each refused in one line: a group needs an unprefixed and a
    prefixed rollout; ratios are fractions; a decay must decay as their controllers assert
    (global_step.py lines 27, 156)."""
    unprefixed = args.rollouts - args.prefix_rollouts
    if args.prefix_rollouts < 1 or unprefixed < 1:
        raise SystemExit(f"--prefix_rollouts {args.prefix_rollouts}: must be >= 1 and leave one "
                         f"of --rollouts {args.rollouts} unprefixed (the prefixes' baseline)")
    for name in ("prefix_low_start", "prefix_low_end", "prefix_high_start", "prefix_high_end",
                 "prefix_entropy_mask", "prefix_warmup_ratio"):
        if not 0 <= getattr(args, name) <= 1:
            raise SystemExit(f"--{name} {getattr(args, name)!r}: must be in [0, 1]")
    for bound in ("low", "high"):
        start, end = getattr(args, f"prefix_{bound}_start"), getattr(args, f"prefix_{bound}_end")
        if args.prefix_schedule == "linear_decay" and not start > end:
            raise SystemExit(f"--prefix_schedule linear_decay: --prefix_{bound}_start {start} "
                             f"must be above --prefix_{bound}_end {end}")
        if args.prefix_schedule == "cosine_decay" and start == end:
            raise SystemExit(f"--prefix_schedule cosine_decay: --prefix_{bound}_start {start} "
                             f"must differ from --prefix_{bound}_end {end}")


def prefix_bound(schedule: str, start: float, end: float, step: int, n_steps: int,
                 warmup_ratio: float = 0.0) -> float:
    """One bound of the prefix ratio at `step` (scheduler/global_step.py): const: `start` (lines
    5-14); linear_decay: start to end over n_steps (lines 20-50); cosine_decay: start to end along
    half a cosine, or up along it if end > start (lines 148-186). The decays first rise linearly
    from 0 to start over warmup_ratio x n_steps steps."""
    if schedule == "const":
        return start
    warmup = int(n_steps * warmup_ratio)
    if step < warmup:
        return step / warmup * start
    after = step - warmup
    if schedule == "linear_decay":
        return end if after >= n_steps else end + (1.0 - after / n_steps) * (start - end)
    if schedule == "cosine_decay":
        if after > n_steps:
            return end
        decay = 0.5 * (1 + math.cos(math.pi * after / n_steps))            # 1 -> 0
        return end + decay * (start - end) if start > end else start + (1 - decay) * (end - start)
    raise ValueError(f"prefix schedule {schedule!r}: expected one of {', '.join(PREFIX_SCHEDULES)}")


def prefix_ratio(args, step: int, draws: np.ndarray) -> np.ndarray:
    """The fraction of the expert's response each prefixed rollout starts from: lower + (upper -
    lower) x Beta(1, 1), between the two scheduled bounds (global_step.py lines 256-275, the
    BetaSampler's default alpha = beta = 1); draws: the Beta(1, 1) samples."""
    n_steps = args.prefix_schedule_steps or args.steps
    low, high = (prefix_bound(args.prefix_schedule, start, end, step, n_steps,
                              args.prefix_warmup_ratio)
                 for start, end in ((args.prefix_low_start, args.prefix_low_end),
                                    (args.prefix_high_start, args.prefix_high_end)))
    return min(low, high) + (max(low, high) - min(low, high)) * draws


def prefix_length(ratio: float, demo_len: int, max_response_len: int) -> int:
    """Prefix tokens for a ratio of a demo_len-token response: int(ratio x demo_len), at most
    demo_len - 1 (rl_dataset.py lines 287-303) and max_response_len - 1 (here: the continuation
    gets a token at least). 0: the rollout is unprefixed, as theirs is (prefix_uid, line 378)."""
    return max(0, min(int(ratio * demo_len), demo_len - 1, max_response_len - 1))


def sample_prefixed_groups(engine, tokenizer, prompt_ids, examples, args, step: int, seed: int):
    """Each prompt's group, [G][rollouts] PrefixedSample: rollouts - prefix_rollouts unprefixed
    samples, then prefix_rollouts that continue a prefix of the expert's response (their slot
    order, rl_dataset.py lines 336-340). The engine continues prompt + prefix token ids, one
    sample each (their rollout.n = 1: core_algos.py lines 294-296); the response is prefix +
    continuation cut to max_response_len (ray_trainer.py line 298). The prefix is the expert's
    response as SFT trains it (`demonstrations`), its token ids as they are, not re-tokenised."""
    k, unprefixed = args.prefix_rollouts, args.rollouts - args.prefix_rollouts
    draws = np.random.default_rng(seed).beta(1.0, 1.0, size=(len(examples), k))
    ratios = prefix_ratio(args, step, draws)
    inputs, prefixes = [], []
    for i, ex in enumerate(examples):
        demo = data.tokenize_sft(tokenizer, "", ex.response)[0]       # as `demonstrations`
        demo = demo[:-1] if demo[-1] == tokenizer.eos_token_id else demo    # their demo_len: no EOS
        for j in range(args.rollouts):
            n = 0 if j < unprefixed else prefix_length(ratios[i, j - unprefixed], len(demo),
                                                       args.max_response_len)
            inputs.append(prompt_ids[i] + demo[:n])
            prefixes.append(demo[:n])
    flat = generation.generate(engine, tokenizer, inputs, 1, args.temperature, args.top_p,
                               args.max_response_len, seed,
                               batch_size=args.gen_batch_size * args.rollouts, logprobs=True)
    samples = []
    for prefix, (s,) in zip(prefixes, flat):
        samples.append(with_prefix(prefix, s, tokenizer, args.max_response_len))
    return [samples[i : i + args.rollouts] for i in range(0, len(samples), args.rollouts)]


def with_prefix(prefix: list[int], s: Sample, tokenizer, max_response_len: int) -> PrefixedSample:
    """prefix + the engine's continuation as one response, cut to max_response_len (a cut response
    keeps no EOS and finishes by "length")."""
    if not prefix:
        return PrefixedSample(s.token_ids, s.text, s.logprobs, None, s.finish_reason, s.stop_text,
                              0)
    ids = prefix + s.token_ids
    stopped = s.finish_reason == "stop" and len(ids) <= max_response_len
    ids = ids[:max_response_len]
    body = ids[:-1] if stopped and s.stop_text else ids
    text = tokenizer.decode(body, skip_special_tokens=False)
    logprobs = None if s.logprobs is None else ([math.nan] * len(prefix) + s.logprobs)[: len(ids)]
    return PrefixedSample(ids, text, logprobs, None, s.finish_reason if stopped else "length",
                          s.stop_text if stopped else "", len(prefix))     # (the prefix: nan)


def demo_tokens(hybrid: str, j: int, s: Sample) -> list[bool]:
    """Per response token of the group's j-th sample: is it the expert's? luffy, rl_plus: the whole
    first sample; prefix_rft: its prefix."""
    if hybrid in SHAPED:
        return [j == 0] * len(s.token_ids)
    n = getattr(s, "prefix_len", 0) if hybrid == "prefix_rft" else 0
    return [True] * n + [False] * (len(s.token_ids) - n)


def prefixed(samples) -> torch.Tensor:
    """[G, n] bool: which rollouts continue a prefix of at least one token."""
    rows = []
    for group in samples:
        rows.append([getattr(s, "prefix_len", 0) > 0 for s in group])
    return torch.tensor(rows)


def own_rollouts(hybrid: str, rollouts: int, prefix_rollouts: int) -> slice:
    """The columns of a [G, rollouts] reward table that are the model's samples alone (logged as
    own_reward_mean): all but the expert's (luffy, rl_plus) or the unprefixed ones (prefix_rft)."""
    if hybrid in SHAPED:
        return slice(1, rollouts)
    return slice(0, rollouts - prefix_rollouts if hybrid == "prefix_rft" else rollouts)


# ================================================================================================
# ALGO LOGIC: Prefix-RFT's advantages and the entropy rule
# ================================================================================================
def prefix_rft_advantages(rewards, prefixed):
    """Dr. GRPO's advantages with prefixes (core_algos.py lines 262-308,
    compute_dr_grpo_prefix_outcome_advantage, one continuation per prefix): each rollout's own
    tokens get r - mean(r) over the rollouts with its prefix, i.e. r - mean(unprefixed r) for an
    unprefixed one (mean 0 if it is alone) and r itself for a prefixed one, the only continuation
    of its prefix; its prefix tokens get (r - mean(unprefixed r)) / 1. Not the _v2 variant (lines
    310-353), whose prefixed rollouts get r - r = 0 and prefixes -mean(unprefixed r) whatever their
    reward: the demonstration would be pushed down even when its continuation is right.
    rewards [G, n] float32, prefixed [G, n] bool -> (adv [G, n] own tokens, demo_adv [G, n] prefix
    tokens, zero [G]: groups whose every advantage is 0)."""
    adv, demo_adv = rewards.clone(), torch.zeros_like(rewards)
    for g in range(len(rewards)):        # float32 means, one group at a time, as theirs
        base = rewards[g][~prefixed[g]]
        mean = torch.mean(base) if len(base) > 1 else torch.tensor(0.0)
        adv[g][~prefixed[g]] = base - mean
        demo_adv[g][prefixed[g]] = rewards[g][prefixed[g]] - mean
    zero = (adv == 0).all(-1) & (demo_adv == 0).all(-1)
    return adv, demo_adv, zero


def entropy_reshaped_advantages(lm_head, h, mb, args):
    """The `entropy` reshaper (dp_actor.py lines 132-157): in each micro-batch, the advantage of
    the prefix tokens whose entropy is in the lowest --prefix_entropy_mask share (0.8: all but the
    top 20%) is set to 0. The entropy is the current policy's at the rollout temperature, as theirs
    takes it from the update's own forward: here from the hidden states h [N, H] the update already
    has, one chunk of logits at a time, without gradient. No host read: the count of prefix tokens
    stays on the device. Returns the micro-batch's advantages [N]."""
    with torch.no_grad():
        ent = torch.cat([entropy(lm_head(h[i : i + args.loss_chunk]).float() / args.temperature)
                         for i in range(0, len(h), args.loss_chunk)])                     # [N]
        ent = ent.masked_fill(~mb.demo, math.inf)            # the prefix tokens sort first
        order = torch.sort(ent, stable=True).indices
        rank = torch.empty_like(order)
        rank[order] = torch.arange(len(order), device=order.device)
        cut = torch.floor(mb.demo.sum().double() * args.prefix_entropy_mask)  # int(n x ratio)
        return torch.where(mb.demo & (rank < cut), torch.zeros_like(mb.adv), mb.adv)


# ================================================================================================
# The hook rl.py's GRPO step calls (`hook`): one object per --hybrid, each method a point of the
# step that a hybrid changes. GRPO is the step as the paper runs it; each hybrid overrides its own.
# ================================================================================================
class GRPO:
    """--hybrid none: GRPO's own step at every point of the hook."""
    expert_first = False   # rollouts.jsonl: the first response of each group is the expert's

    def __init__(self, args):
        self.args = args

    def pin_settings(self, out_dir) -> None:
        """Settings that depend on the run's start, fixed before the run is claimed."""

    def rollouts(self, engine, tokenizer, prompts, step: int, seed: int):
        """Each prompt's group, [G][rollouts] samples of the policy, with the engine's log-probs."""
        a = self.args
        return generation.generate(engine, tokenizer, [p.text for p in prompts], a.rollouts,
                                   a.temperature, a.top_p, a.max_response_len, seed,
                                   batch_size=a.gen_batch_size, logprobs=True)

    def advantages(self, rewards, samples, group_advantages):
        """(adv [G, n] of each rollout's own tokens, demo_adv [G, n] of its expert's tokens,
        zero_std [G]) from the rewards [G, n] and GRPO's group_advantages."""
        adv, zero_std = group_advantages(rewards)
        return adv, adv, zero_std

    def demo_tokens(self, j: int, s: Sample) -> list[bool]:
        """Per response token of a group's j-th sample: is it the expert's?"""
        return demo_tokens(self.args.hybrid, j, s)

    def policy_loss(self, loss_fn):
        """The per-token policy loss of the model's own tokens."""
        return loss_fn

    def token_advantages(self, lm_head, h, mb):
        """A micro-batch's per-token advantages [N] as the update takes them."""
        return mb.adv

    def token_loss(self, loss, lp, old_lp, adv, demo):
        """The per-token loss [n] with the expert's tokens' own (demo [n] bool, or None)."""
        return loss

    def own(self, rewards):
        """The columns of rewards [G, n] that are the model's own samples."""
        return rewards[:, own_rollouts(self.args.hybrid, self.args.rollouts,
                                       self.args.prefix_rollouts)]

    def group_record(self, group) -> dict:
        """What rollouts.jsonl adds to a group's record."""
        return {}


class Shaped(GRPO):
    """luffy, rl_plus: the expert's response leads each group; its tokens take the method's loss,
    the model's own the unclipped -A r."""
    expert_first = True

    def rollouts(self, engine, tokenizer, prompts, step, seed):
        a = self.args
        samples = generation.generate(engine, tokenizer, [p.text for p in prompts],
                                      a.rollouts - 1, a.temperature, a.top_p, a.max_response_len,
                                      seed, batch_size=a.gen_batch_size, logprobs=True)
        expert = demonstrations([p.example for p in prompts], tokenizer, a.max_response_len)
        return [[demo, *group] for demo, group in zip(expert, samples)]

    def policy_loss(self, loss_fn):
        return unclipped_loss              # their scripts: loss_remove_clip=True

    def token_loss(self, loss, lp, old_lp, adv, demo):
        return torch.where(demo, demonstration_loss(self.args.hybrid, lp, old_lp, adv), loss)


class PrefixRFT(GRPO):
    """prefix_rft: some rollouts continue prefixes of the expert's response; their prefix tokens take
    their own advantage, zeroed by the entropy rule."""

    def pin_settings(self, out_dir) -> None:
        """--prefix_schedule_steps 0: the schedule spans the --steps the run started with, recorded
        as the setting (a resume compares it as any other), so that a run taken on to more steps
        samples as one run with that horizon would, not as one that had always had the new
        --steps. A record of 0 (a run begun before the horizon was recorded) keeps following
        --steps."""
        a = self.args
        if a.prefix_schedule_steps:
            return
        recorded = run_dir.recorded(out_dir) if checkpoints.latest(out_dir) is not None else {}
        horizon = recorded.get("prefix_schedule_steps", a.steps)
        if horizon and horizon != a.steps:
            print0(f"--hybrid prefix_rft: the prefix schedule spans {horizon} steps, the --steps "
                   f"the run started with (run_config.json), not --steps {a.steps}")
        a.prefix_schedule_steps = horizon

    def rollouts(self, engine, tokenizer, prompts, step, seed):
        return sample_prefixed_groups(engine, tokenizer, [p.ids for p in prompts],
                                      [p.example for p in prompts], self.args, step, seed)

    def advantages(self, rewards, samples, group_advantages):
        return prefix_rft_advantages(rewards, prefixed(samples))

    def token_advantages(self, lm_head, h, mb):
        return entropy_reshaped_advantages(lm_head, h.detach(), mb, self.args)

    def group_record(self, group) -> dict:
        return {"prefix_lengths": [s.prefix_len for s in group]}


def hook(args) -> GRPO:
    """The hook of --hybrid: what rl.py's step calls where a hybrid may change it."""
    kinds = {"none": GRPO, "luffy": Shaped, "rl_plus": Shaped, "prefix_rft": PrefixRFT}
    return kinds[args.hybrid](args)
