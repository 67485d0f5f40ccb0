# The CurioSFT loss ("Learning While Staying Curious", arXiv:2602.02244): Sec. 4, Alg. 1, App. A-D.
"""The CurioSFT loss, per token. Math only.

It takes the logits of the N trained positions (padding removed) and their expert tokens,
    logits [N, V] (any float dtype; all math is float32), targets [N] (long),
and returns (loss [N] float32, diagnostics: dict of detached per-token tensors [N]). sft.py sums
the per-token losses with the recipe's token weights and feeds the diagnostics to `summarize`.

Read in this order:
  1. `curio_loss_reference`: the paper read literally, one token at a time (Eq. 4-7, App. D).
  2. `teacher_log_prob` (Alg. 1 lines 6-11: H_t, Delta_t, tau_hat_t, lq) and `curio_sft_loss`
     (lines 12-13, Eq. 5-6): the same, vectorized over tokens, as training runs it;
     `solve_temperature` is App. B and D.
  3. The logging statistics.
The speed helpers (blockwise passes over the vocabulary for a logsumexp and for the authors'
low-entropy rule) sit at the end under their own banner: they change the cost, not the result.
Table 2's baselines and the ablation without a separate teacher are in baselines.py.
"""
import math
from dataclasses import dataclass
from typing import Literal

import torch


@dataclass
class LossConfig:
    """loss settings (curio_loss.LossConfig)"""
    alpha: float = 1.0
    """weight of the self-exploratory distillation term L_SED (Eq. 6)"""
    delta_max: float = 0.5
    """largest entropy increment in nats (Eq. 7)"""
    gamma: float = 2.0
    """sigmoid sharpness of the entropy increment (Eq. 7)"""
    h_pivot: float = 1.2
    """entropy pivot in nats: tokens above it get most of delta_max (Eq. 7, Sec. 5.4)"""
    tau_min: float = 1.1
    """lower end of the teacher temperature search (App. D)"""
    tau_max: float = 1.5
    """upper end of the teacher temperature search (App. D)"""
    top_k: int = 512
    """logits used for the entropy in the temperature search (App. D)"""
    solver: Literal["bisect", "newton"] = "bisect"
    """bisect: the paper's and the authors' search | newton: safeguarded Newton (App. B)"""
    bisect_iters: int = 20
    """bisection steps, as in the authors' code: the bracket shrinks to 0.4 / 2^20 = 4e-7"""
    newton_iters: int = 6
    """safeguarded Newton steps: quadratic convergence reaches bisection's accuracy in about 5"""
    low_entropy_threshold: float | None = 0.03
    """the authors' code, not the paper: tau_min where the teacher entropy is <= this (none: off)"""
    fixed_tau: float | None = None
    """ablation 'w/o adaptive temp.' (Sec. 5.2): one teacher temperature for every token"""
    # the Table 2 baselines' settings (baselines.py): one set of loss flags serves every --loss
    entropy_coef: float = 0.06
    """entropy-regularisation weight (Sec. 3; 0.06 in the paper's sweep)"""
    kl_coef: float = 0.1
    """weight of KL(pi_theta || pi_base) for the kl baseline (not given in the paper)"""
    gem_beta: float = 0.7
    """GEM: temperature of its detached target distribution"""
    psft_clip_low: float = 0.2
    """PSFT: the ratio is clipped below at 1 - psft_clip_low"""
    psft_clip_high: float = 0.28
    """PSFT: the ratio is clipped above at 1 + psft_clip_high"""

    def __post_init__(self):  # ValueError: the scripts print it as one line naming the flag
        checks = {"alpha": self.alpha >= 0, "delta_max": self.delta_max >= 0,
                  "gamma": self.gamma > 0,
                  "tau_min": 0 < self.tau_min <= self.tau_max, "top_k": self.top_k >= 1,
                  "bisect_iters": self.bisect_iters >= 1, "newton_iters": self.newton_iters >= 1,
                  "solver": self.solver in ("bisect", "newton"),
                  "fixed_tau": self.fixed_tau is None or self.fixed_tau > 0,
                  "psft_clip_low": 0 <= self.psft_clip_low < 1,
                  "psft_clip_high": self.psft_clip_high >= 0}
        for name, ok in checks.items():
            if not ok:      # NaN fails every comparison, so it lands here too
                raise ValueError(f"--{name} {getattr(self, name)!r}: out of range")


# ------------------------------------------------------------------------------------------------
# Entropy (App. A) and the entropy increment (Eq. 7)
# ------------------------------------------------------------------------------------------------
def _fp32(x: torch.Tensor) -> torch.Tensor:
    """At least float32: bf16 logits are upcast, float64 (theorem tests) is kept."""
    return x if x.dtype == torch.float64 else x.float()


def _half(x: torch.Tensor) -> bool:
    """bf16 or fp16 logits, as a GPU's head makes them: the speed helpers read them in blocks
    instead of one float32 copy of all of them (unless BLOCKWISE is off). Not under torch.compile
    (--compile): inductor fuses the plain expressions' upcast and passes into a few kernels."""
    return (BLOCKWISE and x.dtype in (torch.bfloat16, torch.float16)
            and not torch.compiler.is_compiling())


def loss_logits(logits: torch.Tensor) -> torch.Tensor:
    """A chunk's logits as the trainers' losses take them: a GPU's bf16 ones as they are (the
    speed helpers read them in float32 blocks), else at least float32, one copy for the loss and
    the logged entropy."""
    return logits if _half(logits) else _fp32(logits)


def entropy(logits: torch.Tensor, tau: torch.Tensor | float = 1.0) -> torch.Tensor:
    """H(softmax(logits / tau)) over the last dim, float32; -inf logits (masked tokens) add 0."""
    at_one = isinstance(tau, (int, float)) and tau == 1
    if _half(logits) and at_one and not (torch.is_grad_enabled() and logits.requires_grad):
        return _full_entropy(logits, logits.amax(-1))     # logged: blockwise, no float32 copy
    z = _fp32(logits)
    # x / 1 is x, bit for bit: no [N, V] pass (forward and backward) at tau = 1
    logp = torch.log_softmax(z if at_one else z / tau, dim=-1)
    # 0 * log 0 = 0; masked_fill (not where) also keeps the backward free of 0 * inf = NaN
    logp = logp.masked_fill(torch.isneginf(logp), 0.0)
    return -(logp.exp() * logp).sum(-1)


def entropy_increment(h: torch.Tensor, cfg: LossConfig) -> torch.Tensor:
    """Eq. 7: Delta_t = Delta_max * sigmoid(gamma * (H_t - H_pivot))."""
    return cfg.delta_max * torch.sigmoid(cfg.gamma * (h - cfg.h_pivot))


# ------------------------------------------------------------------------------------------------
# 1. CurioSFT, token by token: the reference a reader reads first (full vocabulary, no
# approximation)
# ------------------------------------------------------------------------------------------------
def curio_loss_reference(student_logits, teacher_logits, targets, cfg: LossConfig = LossConfig()):
    """Eq. 4-7 and App. D for one token at a time, full-vocabulary entropies, scalar bisection.
    Slow. student_logits, teacher_logits [N, V], targets [N] -> loss [N]."""
    losses = []
    for z_s, z_t, y in zip(_fp32(student_logits), _fp32(teacher_logits.detach()), targets.tolist()):
        lp = torch.log_softmax(z_s, -1)[y]                        # log pi_theta(y_t | s_t; tau=1)
        h = entropy(z_t).item()                                   # H_t of the teacher at tau=1
        if cfg.fixed_tau is not None:                             # ablation: one temperature
            tau = cfg.fixed_tau
        else:
            target = h + cfg.delta_max / (1 + math.exp(-cfg.gamma * (h - cfg.h_pivot)))  # Eq. 7
            lo, hi = cfg.tau_min, cfg.tau_max
            if target <= entropy(z_t, lo).item():                 # the coldest is hot enough
                tau = lo
            elif target >= entropy(z_t, hi).item():               # even the hottest is not
                tau = hi
            else:                                                 # App. D: bisection on H(tau)
                for _ in range(cfg.bisect_iters):
                    mid = (lo + hi) / 2
                    lo, hi = (mid, hi) if entropy(z_t, mid).item() < target else (lo, mid)
                tau = (lo + hi) / 2
            if cfg.low_entropy_threshold is not None and h <= cfg.low_entropy_threshold:
                tau = cfg.tau_min                                 # the authors' code: near-one-hot
        lq = torch.log_softmax(z_t / tau, -1)[y]                  # Eq. 4: log pi_phi(y_t | s_t)
        losses.append(-lp + cfg.alpha * 0.5 * (lp - lq) ** 2)     # Eq. 1 + alpha * Eq. 5 (Eq. 6)
    return torch.stack(losses) if losses else student_logits.new_zeros(0, dtype=torch.float32)


# ================================================================================================
# ALGO LOGIC. 2. CurioSFT, vectorized over tokens: what training runs
# ================================================================================================
def student_log_prob(logits, targets, temperature: float = 1.0):
    """lp = log pi_theta(y_t | s_t) [N] float32 at `temperature` (log softmax(logits / T)[y_t]),
    and the log-partition [N]. bf16 logits (a GPU's) take _LogProb: the same, blockwise."""
    if _half(logits):
        return _LogProb.apply(logits, targets, temperature)
    z = _fp32(logits)
    z = z if temperature == 1.0 else z / temperature
    lse = torch.logsumexp(z, dim=-1)
    return z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse, lse


def _tempered_entropy(logits: torch.Tensor, tau: torch.Tensor):
    """H of pi = softmax(logits / tau) for logits [N, k], tau [N], and pi itself."""
    logp = torch.log_softmax(logits / tau.unsqueeze(-1), dim=-1)
    p = logp.exp()
    return -(p * logp.masked_fill(p == 0, 0.0)).sum(-1), p


def _entropy_and_variance(logits: torch.Tensor, tau: torch.Tensor):
    """H and Var_pi[z] of softmax(logits / tau) for logits [N, k], tau [N].
    App. B: dH/dtau = Var / tau^3."""
    h, p = _tempered_entropy(logits, tau)
    z = logits.masked_fill(torch.isneginf(logits), 0.0)  # p = 0 there; avoids 0 * inf
    mean = (p * z).sum(-1, keepdim=True)
    var = (p * (z - mean) ** 2).sum(-1)
    return h, var


def solve_temperature(logits: torch.Tensor, target: torch.Tensor, cfg: LossConfig):
    """Sec. 4.2, App. D: tau in [tau_min, tau_max] with H(tau) = target, vectorized over tokens.
    logits [N, k] (float32, the top-k), target [N] -> tau [N], clamped_low [N], clamped_high [N].

    H(tau) is non-decreasing (App. B), so the root is bracketed by [tau_min, tau_max]; a target
    outside [H(tau_min), H(tau_max)] clamps to that end. A fixed number of steps, no data-dependent
    branches.
    """
    n = logits.shape[0]
    lo = logits.new_full((n,), cfg.tau_min)
    hi = logits.new_full((n,), cfg.tau_max)
    h_lo, h_hi = _tempered_entropy(logits, lo)[0], _tempered_entropy(logits, hi)[0]
    if cfg.solver == "bisect":
        for _ in range(cfg.bisect_iters):
            mid = 0.5 * (lo + hi)
            too_cold = _tempered_entropy(logits, mid)[0] < target
            lo, hi = torch.where(too_cold, mid, lo), torch.where(too_cold, hi, mid)
        tau = 0.5 * (lo + hi)
    elif cfg.solver == "newton":
        # Newton on f(tau) = H(tau) - target with f' = Var/tau^3 (App. B), kept inside the bracket:
        # a step that leaves it (or a zero derivative) falls back to the bracket's midpoint. H is
        # convex here, so Newton often closes in from one side; once converged, rounding can put its
        # step a hair past the bracket's edge: that step is clamped, not replaced by a far midpoint.
        tau = 0.5 * (lo + hi)
        for _ in range(cfg.newton_iters):
            h, var = _entropy_and_variance(logits, tau)
            too_cold = h < target
            lo, hi = torch.where(too_cold, tau, lo), torch.where(too_cold, hi, tau)
            step = tau - (h - target) * tau**3 / var
            inside = torch.isfinite(step) & (step > lo - 1e-6) & (step < hi + 1e-6)
            tau = torch.where(inside, torch.minimum(torch.maximum(step, lo), hi), 0.5 * (lo + hi))
    else:
        raise ValueError(f"LossConfig.solver must be 'bisect' or 'newton', got {cfg.solver!r}")
    clamped_low, clamped_high = target <= h_lo, target >= h_hi
    tau = torch.where(clamped_low, cfg.tau_min, torch.where(clamped_high, cfg.tau_max, tau))
    return tau, clamped_low, clamped_high


def teacher_log_prob(teacher_logits, targets, cfg: LossConfig = LossConfig()):
    """Alg. 1 lines 6-11 for all N tokens: lq = log softmax(z_tch / tau_hat_t)[y_t] over the full
    vocabulary.

    teacher_logits [N, V] (any float dtype; never upcast whole), targets [N] -> lq [N] float32,
    diagnostics.
    Cost: one top-k (_top_k_values: a pass over V, then a top-k over 1/16 of it) and one logsumexp
    at tau_hat over V (_log_sum_exp); the low-entropy rule adds a pass at tau=1 (_full_entropy);
    each search step is O(k). No value is read back to the host.
    """
    with torch.no_grad():
        z = teacher_logits.detach()                                           # [N, V]
        n, v = z.shape
        top = _fp32(_top_k_values(z, min(cfg.top_k, v)))                     # [N, k], App. D
        h_top = entropy(top)                                                  # H_t, top-k
        z_max = top.amax(-1)                                                  # in the top-k
        diag = {"teacher_entropy": h_top}
        if cfg.fixed_tau is not None:                                         # 'w/o adaptive temp.'
            tau = top.new_full((n,), cfg.fixed_tau)
        else:
            target = h_top + entropy_increment(h_top, cfg)                    # Eq. 7: H_t + Delta_t
            tau, low, high = solve_temperature(top, target, cfg)              # [N]
            diag |= {"clamped_low": low.float(), "clamped_high": high.float()}
            if cfg.low_entropy_threshold is not None:                         # the authors' rule
                forced = _full_entropy(z, z_max) <= cfg.low_entropy_threshold
                tau = torch.where(forced, cfg.tau_min, tau)
                # one state per token: a forced token is not also counted as clamped
                diag |= {"forced_tau_min": forced.float(), "clamped_low": (low & ~forced).float(),
                         "clamped_high": (high & ~forced).float()}
        inv_tau = 1.0 / tau
        z_y = _fp32(z.gather(-1, targets.unsqueeze(-1)).squeeze(-1))
        lq = (z_y - z_max) * inv_tau - _log_sum_exp(z, z_max, inv_tau)       # Eq. 4
        diag |= {"tau": tau, "lq": lq}
    return lq, diag


def curio_sft_loss(student_logits, targets, lq, cfg: LossConfig = LossConfig()):
    """CurioSFT given the teacher's lq [N] (teacher_log_prob): the per-token loss
    -lp + alpha/2 (lp - lq)^2 (Eq. 1, 5, 6; Alg. 1 lines 12-13). Its gradient w.r.t. lp is
    -(1 - alpha (lp - lq)): cross-entropy with a per-token weight w_t that falls below 1 (even
    below 0) once the student is more confident than the flatter teacher, and rises above 1 where
    the expert token is unfamiliar."""
    lp, _ = student_log_prob(student_logits, targets)
    loss = -lp + cfg.alpha * 0.5 * (lp - lq) ** 2                  # Eq. 6: Eq. 1 + alpha * Eq. 5
    return loss, {"lp": lp.detach(), "weight": 1 - cfg.alpha * (lp.detach() - lq)}


def check_finite(loss, logits, targets, other=None) -> None:
    """Raise FloatingPointError naming the input that made a per-token loss non-finite (other:
    the teacher's lq, the base model's logits or the old log-probs)."""
    if bool(torch.isfinite(loss).all()):
        return
    if torch.isnan(logits).any():
        raise FloatingPointError(f"the loss is not finite: the student logits contain NaN "
                                 f"({int(torch.isnan(logits).sum())} values)")
    if other is not None and other.is_floating_point() and torch.isnan(other).any():
        raise FloatingPointError("the loss is not finite: the teacher/base logits or old log-probs "
                                 "contain NaN")
    if torch.isneginf(logits.gather(-1, targets.unsqueeze(-1))).any():
        raise FloatingPointError("the loss is not finite: an expert token has a -inf student logit "
                                 "(probability 0)")
    raise FloatingPointError("the loss is not finite: check the logits for inf values")


# ------------------------------------------------------------------------------------------------
# Logging
# ------------------------------------------------------------------------------------------------
def split_entropy(h: torch.Tensor, x: torch.Tensor | None = None, top_frac: float = 0.2):
    """Mean of x (default: h itself) over the top-20% highest-entropy positions and over the
    bottom 80% (Fig. 2a/b). h, x [N] -> (top, bottom)."""
    if h.numel() == 0:
        return float("nan"), float("nan")
    x = h if x is None else x
    cut = torch.quantile(h.float(), 1 - top_frac)
    top, bottom = x[h >= cut], x[h < cut]
    return top.mean().item(), (bottom.mean().item() if bottom.numel() else float("nan"))


def summarize(diag: dict[str, torch.Tensor], alpha: float = 1.0) -> dict[str, float]:
    """Per-batch scalars from per-token diagnostics concatenated over a batch (any of the keys)."""
    out = {}
    if "lp" in diag:
        out["ce"] = -diag["lp"].mean().item()
    if "lq" in diag:
        out["distill"] = (0.5 * (diag["lp"] - diag["lq"]) ** 2).mean().item()
        tau = diag["tau"]
        out |= {"tau_mean": tau.mean().item(), "tau_min": tau.min().item(),
                "tau_max": tau.max().item()}
    for key in ("clamped_low", "clamped_high", "forced_tau_min", "clipped"):
        if key in diag:
            out[f"frac_{key}"] = diag[key].mean().item()
    if "weight" in diag:  # w_t = 1 - alpha (lp - lq): CE's per-token multiplier under CurioSFT
        w = diag["weight"]
        out |= {"w_mean": w.mean().item(), "w_frac_neg": (w < 0).float().mean().item(),
                "w_frac_above_1": (w > 1).float().mean().item()}
        if "teacher_entropy" in diag:  # where it acts: branching (high H_t) vs factual tokens
            out["w_top20"], out["w_bottom80"] = split_entropy(diag["teacher_entropy"], w)
    for key in ("teacher_entropy", "student_entropy"):
        if key in diag:
            out[f"{key}_top20"], out[f"{key}_bottom80"] = split_entropy(diag[key])
    if "kl_to_base" in diag:
        out["kl_to_base"] = diag["kl_to_base"].mean().item()
    return out


# ================================================================================================
# SPEED HELPERS: the same results at a lower cost (a reader of the method may skip them)
# ================================================================================================
def _row_blocks(z):
    """(start, end, buffer) over blocks of z's rows, the buffer a reused [rows, V] float32 (or
    float64) scratch. What a pass like torch.logsumexp(z / tau) costs is memory: [N, V] float32
    temporaries (fresh pages on a CPU) and five passes over them. Blocks keep the temporary
    bounded, z is read once per pass, bf16 logits are never upcast whole, and on a CPU the block
    stays in the last-level cache. CPU blocks are 16 MiB, half a typical last-level cache: smaller
    ones were no faster on an idle machine and slower on a busy one (every op synchronises the
    threads), 40 MiB ones slower on both. A GPU gets 256 MiB blocks: few kernel launches, a
    bounded temporary. Under torch.compile (--compile) one block of every row: inductor fuses a
    pass into one kernel that reads z once and keeps no temporary, and a loop over a symbolic
    row count would compile again for every count."""
    n, v = z.shape
    dtype = torch.promote_types(z.dtype, torch.float32)
    if torch.compiler.is_compiling():
        yield 0, n, torch.empty(n, v, dtype=dtype, device=z.device)
        return
    rows = _block_rows(v, dtype, z.device.type)
    buf = torch.empty(min(rows, n), v, dtype=dtype, device=z.device)
    for s in range(0, n, rows):
        e = min(s + rows, n)
        yield s, e, buf[: e - s]


def _block_rows(v: int, dtype: torch.dtype, device_type: str) -> int:
    """Rows of a _row_blocks block of v columns (bench/memory.py plans its buffers by them)."""
    return max(1, (16 << 20 if device_type == "cpu" else 256 << 20) // (v * dtype.itemsize))


def _log_sum_exp(z, shift, inv_tau=None):
    """log sum_v exp((z[r, v] - shift[r]) * inv_tau[r]) [N] for z [N, V]; shift [N] is the row
    maximum (from the top-k), inv_tau [N] defaults to 1. Blockwise (_row_blocks); at least
    float32."""
    sums = z.new_empty(z.shape[0], dtype=torch.promote_types(z.dtype, torch.float32))
    for s, e, buf in _row_blocks(z):
        b = torch.sub(z[s:e], shift[s:e, None], out=buf)
        if inv_tau is not None:
            b.mul_(inv_tau[s:e, None])
        torch.sum(b.exp_(), -1, out=sums[s:e])
    return sums.log_()


def _full_entropy(z, z_max):
    """The entropy of softmax(z) over the full vocabulary [N], for the authors' low-entropy rule:
    H = log S - sum_v q_v b_v / S with b = z - z_max, q = exp(b), S = sum_v q_v, blockwise
    (_row_blocks). Every row takes the pass over V: choosing the rows that need it (those whose
    top-k entropy is low) would make a GPU report their count to the host, a sync per chunk."""
    h = z.new_empty(z.shape[0], dtype=torch.promote_types(z.dtype, torch.float32))
    floor = torch.finfo(h.dtype).min
    q_buf = None
    for s, e, buf in _row_blocks(z):
        b = torch.sub(z[s:e], z_max[s:e, None], out=buf).clamp_(min=floor)   # -inf: q = 0, q b = 0
        q_buf = torch.empty_like(buf) if q_buf is None else q_buf
        q = torch.exp(b, out=q_buf[: e - s])
        mass = q.sum(-1)
        if torch.compiler.is_compiling():        # fused: a bmm would need q and b in memory
            q_dot_b = (q * b).sum(-1)
        else:
            q_dot_b = torch.bmm(q.unsqueeze(1), b.unsqueeze(2)).view(-1)     # no [n, V] product
        h[s:e] = mass.log() - q_dot_b / mass
    return h


# The speed helpers below on (True), or the forms of commit 6fbcbf7, which one H200 measured (False:
# one float32 copy of a chunk's bf16 logits, torch.topk over the whole row): bench/forms.py turns
# them off to replay that run, as bench/dryrun.py --against does. The same results either way.
BLOCKWISE = True
TOPK_BLOCK = 32     # _top_k_values: vocabulary entries per block (Qwen's 151,936 and 152,064 divide)


def _top_k_values(z, k):
    """The k largest values of each row of z [N, V], sorted descending: z.topk(k).values, exactly,
    at a fraction of its cost. A top-k over a 152k vocabulary is a multi-pass select per row, the
    teacher side's largest part on a GPU (one H200: ~32 ms a call on 4096 x 151936 float32 logits, ~10x
    a logsumexp pass); this takes one pass over V and a top-k over the rows' candidates only.
    Split each row into blocks of TOPK_BLOCK and let M_k be the k-th largest block maximum: the k
    blocks with the largest maxima hold at least k values >= M_k, so the k-th largest value is
    >= M_k, and every value in the top k lies in a block whose maximum is >= M_k. Those blocks' values
    (k x TOPK_BLOCK candidates) therefore hold the top k; where maxima tie at M_k and a block is left
    out, the values it holds that the top k needs equal M_k and other chosen blocks supply them
    (the top k as values, which is all the entropy needs). Sorted, the values are the full top-k's
    to the bit, whatever order a kernel returns ties in. Rows too short to gain: z.topk itself."""
    n, v = z.shape
    blocks = v // TOPK_BLOCK
    if not BLOCKWISE:
        return z.topk(k, dim=-1, sorted=False).values
    if blocks < 4 * k:
        return z.topk(k, dim=-1).values
    body = z[:, : blocks * TOPK_BLOCK].unfold(1, TOPK_BLOCK, TOPK_BLOCK)         # [N, blocks, b]
    chosen = body.amax(-1).topk(k, dim=-1, sorted=False).indices                 # [N, k]
    candidates = body.gather(1, chosen[..., None].expand(n, k, TOPK_BLOCK)).flatten(1)
    tail = z[:, blocks * TOPK_BLOCK :]                          # < TOPK_BLOCK values: all candidates
    if tail.shape[1]:
        candidates = torch.cat([candidates, tail], dim=1)
    return candidates.topk(k, dim=-1).values


class _LogProb(torch.autograd.Function):
    """student_log_prob of bf16 logits z [N, V] at temperature T, in float32 math without a float32
    copy of z: forward, lse = m + log sum exp(z / T - m) by blocks (_log_sum_exp) and lp = z_y / T
    - lse; backward, d lp / d z = (onehot(y) - p) / T and d lse / d z = p / T with p = softmax(z /
    T), a float32 block at a time, cast to z's dtype. The eager form upcasts z whole (2x its bytes,
    kept for backward) and takes about ten passes over [N, V] between the two; this takes four."""

    @staticmethod
    def forward(ctx, logits, targets, temperature):
        inv_t = 1.0 / temperature
        z_max = _fp32(logits.amax(-1))                                               # [N]
        scale = None if temperature == 1.0 else torch.full_like(z_max, inv_t)
        lse = z_max * inv_t + _log_sum_exp(logits, z_max, scale)
        lp = _fp32(logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)) * inv_t - lse
        ctx.save_for_backward(logits, targets, lse)
        ctx.inv_t = inv_t
        return lp, lse

    @staticmethod
    def backward(ctx, grad_lp, grad_lse):
        logits, targets, lse = ctx.saved_tensors
        inv_t = ctx.inv_t
        grad_lp = torch.zeros_like(lse) if grad_lp is None else grad_lp
        on_p = (-grad_lp if grad_lse is None else grad_lse - grad_lp) * inv_t       # [N]
        grad = torch.empty_like(logits)
        for s, e, buf in _row_blocks(logits):
            p = buf.copy_(logits[s:e])                                       # float32 block
            p = (p if inv_t == 1.0 else p.mul_(inv_t)).sub_(lse[s:e, None]).exp_()   # softmax
            p.mul_(on_p[s:e, None])
            p.scatter_add_(1, targets[s:e, None], grad_lp[s:e, None] * inv_t)
            grad[s:e] = p
        return grad, None, None
