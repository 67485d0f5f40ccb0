# Table 2's baselines and the ablation without a separate teacher, beside the CurioSFT loss
# ("Learning While Staying Curious", arXiv:2602.02244, Sec. 3, Sec. 5.2, Table 2).
"""What CurioSFT is compared with: every other loss sft.py's --loss names, and what they need.

Each loss takes the logits of the N trained positions and their expert tokens, as curio_loss.py's
do, logits [N, V] (any float dtype; all math is float32), targets [N] (long), and returns (loss [N]
float32, diagnostics: dict of detached per-token tensors [N]).

Read in this order:
  1. The losses, each a few lines beside cross-entropy (Eq. 1): the entropy bonus (Eq. 2) and its
     top-20% variant, KL to the base model, DFT, GEM, PSFT; then the self-teacher ablation.
  2. `VARIANT_LOSSES`: the one interface, loss(logits, targets, extras, cfg), through which sft.py
     calls all of them.
  3. The trainer side: `variant_micro_batch_loss`, the contract of sft.py's CurioSFT micro-batch
     loss for every other loss, with `variant_inputs` (the kl baseline's base model),
     `old_log_probs` (PSFT's ratio) and `top20_micro_batch_loss` (the top-20% mask from the
     loss's own entropies).
`LOSSES` lists every --loss, CurioSFT's first; `second_model` says which needs a second model.
"""
from dataclasses import replace

import torch

import curio_loss as cl
from chunked_logits import (cat_diags, chunked_map, chunked_sum, no_grad_logits, normed_hidden,
                            select_targets, token_log_probs)
from curio_loss import LossConfig
from plumbing.compiling import compiled, compiled_if


# The losses sft.py's --loss names. CurioSFT and its two ablations (Sec. 5.2) need the teacher's lq;
# the kl baseline needs a frozen base model and PSFT the log-probs from the start of its batch.
CURIO_LOSSES = ("curio", "curio_fixed_tau", "curio_self_teacher")
LOSSES = ("sft", *CURIO_LOSSES, "entropy", "entropy_top20", "kl", "dft", "gem", "psft")


def second_model(loss: str) -> str | None:
    """The model a loss needs beside the student: "teacher" (CurioSFT's EMA teacher, Alg. 1 line
    1), "base" (the kl baseline's frozen initial model) or None (the self-teacher ablation, and
    every other loss)."""
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; choose one of {', '.join(LOSSES)}")
    return {"curio": "teacher", "curio_fixed_tau": "teacher", "kl": "base"}.get(loss)


def config_for(loss: str, cfg: LossConfig) -> LossConfig:
    """The loss's own setting of the shared config: curio_fixed_tau's tau_hat = 1.3."""
    second_model(loss)  # an unknown name fails here
    if loss == "curio_fixed_tau" and cfg.fixed_tau is None:
        return replace(cfg, fixed_tau=1.3)
    return cfg


# ================================================================================================
# 1. The losses (Table 2)
# ================================================================================================
def ce_loss(logits, targets, cfg: LossConfig = LossConfig()):
    """Vanilla SFT, Eq. 1."""
    lp, _ = cl.student_log_prob(logits, targets)
    return -lp, {"lp": lp.detach()}


def entropy_reg_loss(logits, targets, cfg: LossConfig = LossConfig(), bonus_mask=None):
    """CE - coef * H (Eq. 2). bonus_mask [N] (bool): the bonus only where it is True, as the
    top-20% variant (Sec. 3, Table 1) takes it on the micro-batch's highest-entropy tokens
    (`top_entropy_mask`)."""
    z = cl._fp32(logits)                               # one float32 copy of bf16 logits for both
    return entropy_bonus(cl.student_log_prob(z, targets)[0], cl.entropy(z), cfg, bonus_mask)


def entropy_bonus(lp, h, cfg: LossConfig, bonus_mask=None):
    """Eq. 2 from the expert token's log-prob lp [N] and the entropy h [N]: -lp - coef * H."""
    bonus = h if bonus_mask is None else torch.where(bonus_mask, h, 0.0)
    return -lp - cfg.entropy_coef * bonus, {"lp": lp.detach(), "student_entropy": h.detach()}


def top_entropy_mask(h: torch.Tensor, top_frac: float = 0.2) -> torch.Tensor:
    """[N] bool: the ceil(top_frac * N) positions of highest entropy among h [N], the set the
    80/20 paper (Wang et al. 2025, arXiv:2506.01939) trains on: all response tokens of a
    micro-batch, chosen with topk (their get_global_entropy_top_mask, k = int(N * top_frac +
    0.9999))."""
    mask = torch.zeros_like(h, dtype=torch.bool)
    if h.numel():
        mask[h.topk(max(1, int(h.numel() * top_frac + 0.9999))).indices] = True
    return mask


def kl_to_base_loss(logits, targets, base_logits, cfg: LossConfig = LossConfig(),
                    with_entropy=False):
    """CE + coef * KL(pi_theta || pi_base), exact over the vocabulary (the expert token is not
    sampled from pi_theta, so a one-sample estimator would be biased); base_logits from the
    frozen initial model. with_entropy: the student's entropy too, from the same log-probs."""
    lp, _ = cl.student_log_prob(logits, targets)
    logp = torch.log_softmax(cl._fp32(logits), -1)
    logq = torch.log_softmax(cl._fp32(base_logits.detach()), -1)
    p, masked = logp.exp(), torch.isneginf(logp)
    kl = (p * (logp - logq).masked_fill(masked, 0.0)).sum(-1)             # 0 log 0 = 0
    diag = {"lp": lp.detach(), "kl_to_base": kl.detach()}
    if with_entropy:   # cl.entropy's sum, bit for bit: p * 0 at the -inf logits, as exp(0) * 0
        diag["student_entropy"] = -(p.detach() * logp.detach().masked_fill(masked, 0.0)).sum(-1)
    return -lp + cfg.kl_coef * kl, diag


def dft_loss(logits, targets, cfg: LossConfig = LossConfig()):
    """DFT, Dynamic Fine-Tuning (Wu et al. 2025, arXiv:2508.05629): CE scaled by the detached
    probability of the expert token, -p(y) log p(y)."""
    lp, _ = cl.student_log_prob(logits, targets)
    return -lp * lp.detach().exp(), {"lp": lp.detach()}


def gem_loss(logits, targets, cfg: LossConfig = LossConfig(), with_entropy=False):
    """GEM (Li et al. 2024, "Preserving Diversity in Supervised Fine-Tuning of Large Language
    Models", arXiv:2408.16673): -sum_v q_v w_v (log p_y - log p_v), q = softmax(z / beta) and w_v
    = sigmoid(0.01 (z_v - z_y)), both detached. with_entropy: the student's entropy too, from the
    same log-probs."""
    z = cl._fp32(logits)
    logp = torch.log_softmax(z, -1)                                       # [N, V]
    lp = logp.gather(-1, targets.unsqueeze(-1))                           # [N, 1]
    masked = torch.isneginf(logp)                                         # -inf logits [N, V]
    with torch.no_grad():
        q = torch.softmax(z / cfg.gem_beta, -1)
        w = torch.sigmoid(0.01 * (z - z.gather(-1, targets.unsqueeze(-1))))
        qw = (q * w).masked_fill(masked, 0.0)                             # masked: weigh nothing
    logp_finite = logp.masked_fill(masked, 0.0)
    loss = -(qw * (lp - logp_finite)).sum(-1)
    diag = {"lp": lp.squeeze(-1).detach()}
    if with_entropy:                                                      # cl.entropy, bit for bit
        logp_finite = logp_finite.detach()
        diag["student_entropy"] = -(logp_finite.exp() * logp_finite).sum(-1)
    return loss, diag


def psft_loss(logits, targets, old_logp=None, cfg: LossConfig = LossConfig()):
    """PSFT, Proximal SFT (Zhu et al. 2025, arXiv:2508.17784): PPO's clipped objective with
    advantage 1 on every expert token, the ratio against the log-probs taken at the start of the
    batch (old_logp [N]; None means 'now', i.e. ratio 1, where PSFT equals CE)."""
    lp, _ = cl.student_log_prob(logits, targets)
    old = lp.detach() if old_logp is None else cl._fp32(old_logp)
    ratio = torch.exp(lp - old)
    clipped = ratio.clamp(1 - cfg.psft_clip_low, 1 + cfg.psft_clip_high)
    loss = torch.maximum(-ratio, -clipped)                                # the advantage is 1
    return loss, {"lp": lp.detach(), "clipped": (ratio > 1 + cfg.psft_clip_high).float()}


def self_teacher_loss(logits, targets, extras, cfg: LossConfig = LossConfig()):
    """Ablation 'w/o Separate Teacher' (Sec. 5.2): Alg. 1 lines 6-13 with the student's own
    logits, detached, as the teacher's. The temperature search runs once per chunk: backward's
    recompute takes its lq from extras["memo"]."""
    memo = extras["memo"]
    if "lq" not in memo:      # the trainer's teacher_log_prob: the compiled one under --compile
        teacher_log_prob = extras.get("teacher_log_prob", cl.teacher_log_prob)
        memo["lq"] = teacher_log_prob(logits.detach(), targets, cfg)
    lq, teacher_diag = memo["lq"]
    loss, diag = cl.curio_sft_loss(logits, targets, lq, cfg)
    return loss, teacher_diag | diag


# ================================================================================================
# 2. One interface: loss(logits [n, V], targets [n], extras, cfg) -> (loss [n], diagnostics).
# extras holds what a loss needs beyond the student's logits, for the chunk's n tokens
# (`variant_inputs`): base_logits [n, V] (kl), old_logp [n] (psft), top20 [n] bool (entropy_top20),
# memo, a dict that keeps the chunk's no-grad results for backward's recompute
# (chunked_logits.chunked_sum), with_entropy: the logged entropy is wanted, which GEM and kl
# give from their own log-probs (else the trainer computes it), and teacher_log_prob: the compiled
# one under --compile (curio_self_teacher). The trainer gives entropy_top20 its
# mask from the loss's own entropies (`top20_micro_batch_loss`).
# ================================================================================================
VARIANT_LOSSES = {   # --loss name -> loss; "curio" and "curio_fixed_tau" are sft.py's CurioSFT path
    "curio_self_teacher": self_teacher_loss,
    "sft": lambda z, y, extras, cfg: ce_loss(z, y, cfg),
    "entropy": lambda z, y, extras, cfg: entropy_reg_loss(z, y, cfg),
    "entropy_top20": lambda z, y, extras, cfg: entropy_reg_loss(z, y, cfg, extras["top20"]),
    "kl": lambda z, y, extras, cfg: kl_to_base_loss(z, y, extras["base_logits"], cfg,
                                                    extras.get("with_entropy", False)),
    "dft": lambda z, y, extras, cfg: dft_loss(z, y, cfg),
    "gem": lambda z, y, extras, cfg: gem_loss(z, y, cfg, extras.get("with_entropy", False)),
    "psft": lambda z, y, extras, cfg: psft_loss(z, y, extras.get("old_logp"), cfg),   # None: now
}


# ================================================================================================
# 3. The trainer side: what sft.py's loop calls for every loss but CurioSFT's
# ================================================================================================
def old_log_probs(model, micro_batches, args) -> list:
    """PSFT's ratio: the log-probs [N] of each micro-batch under the model as it is at the start of
    its data batch (sft.py calls this there); None for every other loss, and for PSFT with one
    update per batch (the paper's setting): the old log-probs are then the current ones, which
    psft_loss takes as lp.detach() for None, the same values (token_log_probs keeps a ratio of 1
    exactly 1) without a forward pass."""
    if args.loss != "psft" or args.updates_per_batch == 1:
        return [None] * len(micro_batches)
    return [token_log_probs(model, b, args.loss_chunk, with_entropy=False,
                            compile_loss=args.compile)[0]
            for b in micro_batches]


def variant_inputs(base, batch, old_logp):
    """What a variant loss needs beyond the student's logits, per response token (the extras of
    VARIANT_LOSSES, before chunking): the kl baseline's base-model hidden states base_h [N, H] (its
    logits are made per chunk), PSFT's old_logp [N]."""
    extras = {}
    if base is not None:
        with torch.no_grad():
            extras["base_h"], _ = select_targets(normed_hidden(base, batch), batch)
    if old_logp is not None:
        extras["old_logp"] = old_logp
    return extras


def variant_micro_batch_loss(model, base, batch, old_logp, args, cfg, want_entropy,
                             weights=None, check=False):
    """sft.curio_micro_batch_loss's contract for every other --loss: VARIANT_LOSSES[loss] on each
    chunk, given variant_inputs (base: the kl baseline's frozen model; old_logp [N]: PSFT's
    log-probs from the start of its data batch)."""
    h, y = select_targets(normed_hidden(model, batch), batch)              # [N, H], [N]
    if args.loss == "entropy_top20":
        return top20_micro_batch_loss(model, h, y, args, cfg, weights, check)
    extras = variant_inputs(base, batch, old_logp)
    # --compile: the passes over [n, V] logits fused (plumbing/compiling.py)
    entropy, teacher_log_prob = compiled_if(args.compile, cl.entropy, cl.teacher_log_prob)
    variant_loss = VARIANT_LOSSES[args.loss]
    if args.compile and args.loss != "curio_self_teacher":   # (its memo: its teacher side alone)
        variant_loss = compiled(variant_loss)

    def chunk_loss(h_c, y_c, w_c, *extras_and_memo):
        memo = extras_and_memo[-1]
        chunk_extras = dict(zip(extras, extras_and_memo[:-1])) | {"memo": memo}
        # memo: the logged entropy is not computed again in backward's recompute; compiled, the
        # recompute runs the forward's graph, entropy included (a checkpoint needs the same saves)
        chunk_extras["with_entropy"] = want_entropy and ("entropy" not in memo or args.compile)
        if args.loss == "curio_self_teacher":
            chunk_extras["teacher_log_prob"] = teacher_log_prob
        if "base_h" in chunk_extras:
            with torch.no_grad():
                base_h = chunk_extras.pop("base_h")
                chunk_extras["base_logits"] = no_grad_logits(base.lm_head, base_h)   # [n, V]
        logits = model.lm_head(h_c)                                            # [n, V]
        if args.loss == "sft":
            logits = cl.loss_logits(logits)
        elif args.loss != "curio_self_teacher" and not args.compile:   # (compiled: fused)
            # one float32 copy for the loss and the logged entropy (the self-teacher's teacher side
            # reads bf16 logits blockwise)
            logits = cl._fp32(logits)
        loss, diag = variant_loss(logits, y_c, chunk_extras, cfg)
        if check:
            other = chunk_extras.get("base_logits", chunk_extras.get("old_logp"))
            cl.check_finite(loss, logits, y_c, other)
        if chunk_extras["with_entropy"]:
            # the entropy bonus, GEM and kl computed it already: the same values, not a second pass
            memo["entropy"] = diag.get("student_entropy")
            if memo["entropy"] is None:
                memo["entropy"] = diag["student_entropy"] = entropy(logits.detach())
        return (loss if w_c is None else loss * w_c).sum(), diag

    return chunked_sum(chunk_loss, args.loss_chunk, h, y, weights, *extras.values())


def top20_micro_batch_loss(model, h, y, args, cfg, weights=None, check=False):
    """entropy_top20's micro-batch loss: the bonus (Eq. 2) on the micro-batch's top-20% entropy
    tokens, whose mask needs every chunk's entropy before any chunk's loss. Each chunk's checkpoint
    (chunked_logits.chunked_map) gives lp and H [n] with their gradient; the mask comes from those
    entropies (no other pass of the head), and the chunks' losses are summed as chunked_sum does."""
    def chunk_terms(h_c, y_c):
        z = cl._fp32(model.lm_head(h_c))                                      # [n, V] float32
        lp, ent = cl.student_log_prob(z, y_c)[0], cl.entropy(z)
        if check:                                        # every token's bonus: finite or not alike
            cl.check_finite(-lp - cfg.entropy_coef * ent, z, y_c)
        return lp, ent

    terms = chunked_map(chunk_terms, args.loss_chunk, h, y)
    mask = top_entropy_mask(torch.cat([ent.detach() for _, ent in terms]))
    total, diags = h.new_zeros((), dtype=torch.float32), []
    for k, (lp, ent) in enumerate(terms):
        part = slice(k * args.loss_chunk, (k + 1) * args.loss_chunk)
        loss, diag = entropy_bonus(lp, ent, cfg, mask[part])
        total = total + (loss if weights is None else loss * weights[part]).sum()
        diags.append(diag)
    return total, cat_diags(diags)
