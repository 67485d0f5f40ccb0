"""The paper's theorems (App. A-C) numerically, and the CurioSFT loss against its token-by-token reference."""
import math

import pytest
import torch

import baselines
import curio_loss as cl
from curio_loss import LossConfig
from plumbing.synthetic import llm_like_logits


def curio(student, targets, teacher=None, cfg=LossConfig()):
    """CurioSFT from both sides' logits, as sft.py composes it: the teacher side (teacher_log_prob, Alg. 1 lines
    6-11), then curio_sft_loss (lines 12-13). teacher None: the student's own logits (the self-teacher)."""
    lq, diag = cl.teacher_log_prob(student if teacher is None else teacher, targets, cfg)
    loss, student_diag = cl.curio_sft_loss(student, targets, lq, cfg)
    return loss, diag | student_diag


V_BIG = 151936  # Qwen2.5 vocabulary


def logits_of_kind(kind: str, n: int, v: int, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, v, generator=g, dtype=dtype)
    if kind == "peaked":
        z[:, 0] += 12.0
    elif kind == "flat":
        z *= 0.05
    elif kind == "heavy_tailed":  # Student-t-like tail: a few very large logits
        z = z / torch.rand(n, v, generator=g, dtype=dtype).clamp_min(1e-3).sqrt()
    return z


def kl(q, p):
    return (q * (q.log() - p.log())).sum(-1)


# ---------------------------------------------------------------- Appendix A
@pytest.mark.parametrize("v", [2, 37, 1000])
def test_appA_negative_entropy_is_kl_to_uniform_minus_log_v(v):
    z = logits_of_kind("random", 16, v, seed=v).requires_grad_()
    p = torch.softmax(z, -1)
    neg_h = -cl.entropy(z).double()
    kl_u = (p * (p.log() + math.log(v))).sum(-1)
    torch.testing.assert_close(neg_h, kl_u - math.log(v), rtol=0, atol=1e-5)
    # ... hence the same gradient: entropy regularisation pulls every token towards uniform
    g_h, = torch.autograd.grad(neg_h.sum(), z, retain_graph=True)
    g_kl, = torch.autograd.grad(kl_u.sum(), z)
    torch.testing.assert_close(g_h, g_kl, rtol=0, atol=1e-5)


# ---------------------------------------------------------------- Appendix B
@pytest.mark.parametrize("kind", ["random", "peaked", "flat", "heavy_tailed"])
@pytest.mark.parametrize("v", [5, 512, V_BIG])
def test_appB_dH_dtau_is_variance_over_tau_cubed(kind, v):
    z = logits_of_kind(kind, 3, v, seed=7)
    for tau0 in (0.7, 1.0, 1.3, 2.0):
        tau = torch.full((3,), tau0, dtype=torch.float64, requires_grad=True)
        logp = torch.log_softmax(z / tau[:, None], -1)
        h = -(logp.exp() * logp).sum(-1)
        dh, = torch.autograd.grad(h.sum(), tau)
        p = logp.exp().detach()
        var = (p * z**2).sum(-1) - (p * z).sum(-1) ** 2
        torch.testing.assert_close(dh, var / tau0**3, rtol=1e-6, atol=1e-12)
        assert (dh >= 0).all()
        # the solver's helper computes the same H and Var: to 1e-9 in float64; in float32 (what the solver runs on
        # the top-512) to 1e-4, or 1e-3 over 152k entries, where CPU float32 sums drift (2e-4 seen with AVX2)
        h64, var64 = cl._entropy_and_variance(z, tau.detach())
        torch.testing.assert_close(h64, h.detach(), rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(var64, var, rtol=1e-9, atol=1e-9)
        h32, var32 = cl._entropy_and_variance(z.float(), tau.detach().float())
        tol = 1e-4 if v <= 512 else 1e-3
        torch.testing.assert_close(h32.double(), h.detach(), rtol=tol, atol=tol)
        torch.testing.assert_close(var32.double(), var, rtol=1e-3, atol=1e-4)


def test_appB_entropy_is_monotone_in_temperature():
    z = llm_like_logits(8, 4096, seed=3).double()
    taus = torch.linspace(0.5, 3.0, 60, dtype=torch.float64)
    h = torch.stack([cl.entropy(z, t) for t in taus])            # [60, 8]
    assert (h.diff(dim=0) >= -1e-6).all()


# ---------------------------------------------------------------- Appendix C
def temperature_for_entropy(z, target):
    """float64 bisection on a wide bracket: the tau with H(softmax(z / tau)) = target."""
    lo, hi = 1.0, 200.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cl.entropy(z, mid).item() < target else (lo, mid)
    return (lo + hi) / 2


def make_feasible(q, target):
    """Mix q with the uniform distribution until H >= target (entropy is concave, so this is monotone)."""
    u = torch.full_like(q, 1 / q.numel())
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if cl.entropy(((1 - mid) * q + mid * u).log()) >= target else (mid, hi)
    return (1 - hi) * q + hi * u


@pytest.mark.parametrize("seed", range(4))
def test_appC_temperature_scaling_is_the_kl_closest_higher_entropy_teacher(seed):
    g = torch.Generator().manual_seed(seed)
    v = 12
    z = 2.0 * torch.randn(v, generator=g, dtype=torch.float64)
    pi = torch.softmax(z, -1)
    delta = 0.05 + 0.4 * torch.rand(1, generator=g).item()
    target = cl.entropy(z).item() + delta
    tau_star = temperature_for_entropy(z, target)
    q_star = torch.softmax(z / tau_star, -1)
    assert tau_star > 1
    assert abs(cl.entropy(q_star.log()).item() - target) < 1e-9          # the constraint holds with equality
    kl_star = kl(q_star, pi).item()

    # every other feasible q is strictly farther from pi
    for _ in range(200):
        q = torch.softmax(q_star.log() + 0.5 * torch.randn(v, generator=g, dtype=torch.float64), -1)
        q = make_feasible(q, target)
        assert cl.entropy(q.log()).item() >= target - 1e-9
        assert kl(q, pi).item() > kl_star

    # a constrained optimisation started elsewhere converges to q_star (quadratic penalty, growing weight)
    w = torch.randn(v, generator=g, dtype=torch.float64).requires_grad_()
    for rho in (1e1, 1e2, 1e3, 1e4, 1e5):
        opt = torch.optim.LBFGS([w], max_iter=500, tolerance_grad=1e-12, tolerance_change=1e-15,
                                line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            q = torch.softmax(w, -1)
            obj = kl(q, pi) + rho * torch.relu(target - cl.entropy(w)) ** 2
            obj.backward()
            return obj

        opt.step(closure)
    q_opt = torch.softmax(w.detach(), -1)
    assert (q_opt - q_star).abs().max().item() < 1e-3
    assert abs(cl.entropy(w.detach()).item() - target) < 1e-3


# ---------------------------------------------------------------- reference vs vectorized
def mixed_logits(n, v, seed):
    """Rows of every regime: near one-hot (rule fires), low and high entropy, uniform, -inf entries."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, v, generator=g) * torch.linspace(0.2, 4.0, n)[:, None]
    z[: n // 4, 0] += 25.0                      # near one-hot: entropy below 0.03
    z[n // 4: n // 2, 1] += 6.0                 # low entropy
    z[-1] = 0.0                                 # uniform
    z[-2, : v // 2] = float("-inf")             # half the vocabulary masked
    return z


@pytest.mark.parametrize("cfg", [
    LossConfig(),
    LossConfig(low_entropy_threshold=None),
    LossConfig(fixed_tau=1.3),
    LossConfig(solver="newton"),
    LossConfig(h_pivot=0.4, delta_max=1.0, alpha=0.5),
], ids=["default", "paper_rule", "fixed_tau", "newton", "other_hparams"])
def test_vectorized_matches_reference_when_k_is_the_vocabulary(cfg):
    n, v = 48, 300
    cfg = LossConfig(**{**cfg.__dict__, "top_k": v})
    teacher = mixed_logits(n, v, seed=1)
    student = (teacher + torch.randn(n, v)).masked_fill(torch.isneginf(teacher), float("-inf")).requires_grad_()
    targets = torch.distributions.Categorical(logits=teacher).sample()
    ref = cl.curio_loss_reference(student, teacher, targets, cfg)
    vec, diag = curio(student, targets, teacher, cfg)
    torch.testing.assert_close(vec, ref, rtol=1e-5, atol=1e-5)
    g_ref, = torch.autograd.grad(ref.sum(), student)
    g_vec, = torch.autograd.grad(vec.sum(), student)
    torch.testing.assert_close(g_vec, g_ref, rtol=1e-5, atol=1e-6)
    if cfg.fixed_tau is None and cfg.delta_max == 0.5:  # every regime of the search is exercised
        assert diag["clamped_low"].any() and diag["clamped_high"].any()
        assert ((diag["tau"] > cfg.tau_min) & (diag["tau"] < cfg.tau_max)).any()
    if cfg.low_entropy_threshold is not None and cfg.fixed_tau is None:
        assert diag["forced_tau_min"][: n // 4].all()


def test_self_teacher_ablation_matches_reference_with_detached_student():
    n, v = 32, 200
    cfg = LossConfig(top_k=v)
    student = mixed_logits(n, v, seed=2).requires_grad_()
    targets = torch.distributions.Categorical(logits=student.detach()).sample()
    vec, _ = curio(student, targets, None, cfg)
    ref = cl.curio_loss_reference(student, student.detach(), targets, cfg)
    torch.testing.assert_close(vec, ref, rtol=1e-5, atol=1e-5)
    # the teacher is detached: the gradient is CE's times w_t, no path through the teacher's log-prob
    g, = torch.autograd.grad(vec.sum(), student)
    lp = torch.log_softmax(student.detach(), -1).gather(-1, targets[:, None]).squeeze(-1)
    w = 1 - cfg.alpha * (lp - cl.teacher_log_prob(student.detach(), targets, cfg)[0])
    g_ce, = torch.autograd.grad(baselines.ce_loss(student, targets)[0].sum(), student)
    torch.testing.assert_close(g, w[:, None] * g_ce, rtol=1e-5, atol=1e-6)


def test_top512_approximation_on_llm_like_logits():
    """At k=512, V=151936 the search sees the renormalised top-512 only (App. D); lq is still exact at the
    chosen temperature. Stated tolerance against the full-vocabulary reference, per token: loss equal (1e-6,
    relative) for half the tokens (both clamp at tau_min), within 2% for 90% and 25% for all; the gradient's
    weight w_t within 0.01 for half and 0.25 for 90%; tau within 0.01 for half. The outliers are tokens whose
    150k-token bulk, small at tau=1, grows faster with tau than the top-512 does, so the full-vocabulary search
    picks a lower tau. In float64, so that this measures App. D's approximation: in float32 on a CPU, sums over
    152k logits alone put the median at 0.2% (AVX2) or 0.1% (AVX-512)."""
    n = 48
    teacher = llm_like_logits(n, V_BIG, seed=5).double()
    student = (teacher + 0.3 * torch.randn(n, V_BIG, dtype=torch.float64)).requires_grad_()
    targets = torch.distributions.Categorical(logits=teacher).sample()
    vec, diag = curio(student, targets, teacher)
    ref = cl.curio_loss_reference(student, teacher, targets)
    rel = ((vec - ref).abs() / ref.abs()).detach()
    assert rel.median() < 1e-6 and rel.quantile(0.9) < 2e-2 and rel.max() < 0.25
    # gradients are w_t times CE's, so they differ by |delta w_t| = alpha |delta lq_t| times CE's gradient
    g_ref, = torch.autograd.grad(ref.sum(), student)
    g_vec, = torch.autograd.grad(vec.sum(), student)
    g_ce, = torch.autograd.grad(baselines.ce_loss(student, targets)[0].sum(), student)
    dw = (g_vec - g_ref).norm(dim=-1) / g_ce.norm(dim=-1)
    assert dw.median() < 0.01 and dw.quantile(0.9) < 0.25
    _, full_diag = curio(student, targets, teacher, LossConfig(top_k=V_BIG))
    assert (diag["tau"] - full_diag["tau"]).abs().median() < 0.01


def test_newton_matches_bisection_to_1e4():
    top = llm_like_logits(512, V_BIG, seed=9).topk(512, -1).values
    target = cl.entropy(top) + cl.entropy_increment(cl.entropy(top), LossConfig())
    tau_b, lo_b, hi_b = cl.solve_temperature(top, target, LossConfig())
    tau_n, lo_n, hi_n = cl.solve_temperature(top, target, LossConfig(solver="newton"))
    inside = ~(lo_b | hi_b)
    assert inside.sum() > 50
    assert (tau_b - tau_n).abs().max() < 1e-4
    assert torch.equal(lo_b, lo_n) and torch.equal(hi_b, hi_n)


# ---------------------------------------------------------------- the gradient identity
@pytest.mark.parametrize("alpha", [1.0, 0.3])
def test_gradient_is_weighted_cross_entropy_and_teacher_gets_none(alpha):
    n, v = 40, 1000
    teacher = llm_like_logits(n, v, seed=11).requires_grad_()
    student = (teacher.detach() + torch.randn(n, v)).requires_grad_()
    # half the expert tokens are the teacher's likely ones, half are unfamiliar
    targets = torch.where(torch.arange(n) % 2 == 0, teacher.detach().argmax(-1), torch.randint(0, v, (n,)))
    cfg = LossConfig(alpha=alpha)
    loss, diag = curio(student, targets, teacher, cfg)
    loss.sum().backward()
    g_ce, = torch.autograd.grad(baselines.ce_loss(student, targets)[0].sum(), student)
    w = 1 - alpha * (diag["lp"] - diag["lq"])
    torch.testing.assert_close(student.grad, w[:, None] * g_ce, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(diag["weight"], w)
    assert teacher.grad is None
    assert (w > 1).any() and (w < 1).any()   # both regimes occur: unfamiliar tokens up-weighted, confident ones down


def test_bf16_inputs_are_computed_in_float32():
    z = llm_like_logits(16, 4096, seed=4)
    targets = torch.randint(0, 4096, (16,))
    loss16, diag16 = curio(z.bfloat16(), targets, z.bfloat16())
    loss32, diag32 = curio(z.bfloat16().float(), targets, z.bfloat16().float())
    assert loss16.dtype == torch.float32
    torch.testing.assert_close(loss16, loss32)
    # the teacher's top-k is taken on the bf16 logits themselves (no float32 copy of [N, V]): the same tau
    assert torch.equal(diag16["tau"], diag32["tau"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_log_sum_exp_blockwise_is_logsumexp(dtype):
    """Several blocks of rows (27 float32 rows of 152k logits per block), a partial last block, per-row
    temperatures and -inf entries."""
    z = llm_like_logits(40, V_BIG, seed=8).to(dtype)
    z[3, 100:] = float("-inf")
    inv_tau = 1 / (1.1 + 0.4 * torch.rand(40, dtype=torch.float64))
    shift = z.double().amax(-1)
    want = torch.logsumexp((z.double() - shift[:, None]) * inv_tau[:, None], -1)
    low = torch.promote_types(dtype, torch.float32)
    got_all = cl._log_sum_exp(z, shift.to(low), inv_tau.to(low))
    got_tau1 = cl._log_sum_exp(z, shift.to(low))
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert got_all.dtype == low
    torch.testing.assert_close(got_all.double(), want, rtol=0, atol=tol)
    torch.testing.assert_close(got_tau1.double(), torch.logsumexp(z.double() - shift[:, None], -1), rtol=0, atol=tol)


def authors_compute_tau(logits, tau_min=1.1, tau_max=1.5, topk=512, iters=20):
    """The authors' compute_tau_from_logits (custom_verl/recipe/curio_sft/dp_actor.py), line for line."""
    n, v = logits.shape
    k = min(topk, v)

    def entropy_topk(z_, tau_):
        vals, _ = torch.topk(z_, k=k, dim=-1)
        logp_k = torch.log_softmax(vals / tau_, dim=-1)
        p_k = logp_k.exp()
        return -(p_k * logp_k).sum(dim=-1)

    h_now = entropy_topk(logits, torch.ones(n, 1))
    h_star = h_now + torch.sigmoid((h_now - 1.2) * 2.0) * 0.5
    tau_lo, tau_hi = torch.full((n, 1), tau_min), torch.full((n, 1), tau_max)
    h_lo, h_hi = entropy_topk(logits, tau_lo), entropy_topk(logits, tau_hi)
    tau = torch.where(h_star <= h_lo, tau_lo.squeeze(-1),
                      torch.where(h_star >= h_hi, tau_hi.squeeze(-1), (tau_lo.squeeze(-1) + tau_hi.squeeze(-1)) / 2))
    tau = tau.unsqueeze(-1)
    for _ in range(iters):
        go_hi = (entropy_topk(logits, tau) < h_star).unsqueeze(-1)
        tau_lo = torch.where(go_hi, tau, tau_lo)
        tau_hi = torch.where(go_hi, tau_hi, tau)
        tau = (tau_lo + tau_hi) / 2
    return tau.squeeze(-1)


def test_bisection_is_the_authors_search_bit_for_bit():
    """Default config, Qwen-sized vocabulary: the same tau_hat as the authors' code to the last bit, with their
    low-entropy rule (full-vocabulary entropy at tau=1 <= 0.03 forces tau_min) and without it."""
    z = llm_like_logits(48, V_BIG, seed=12)
    z[:16] = z[:16].scatter_add(1, z[:16].argmax(-1, keepdim=True), torch.full((16, 1), 12.0))  # near one-hot
    y = torch.zeros(48, dtype=torch.long)
    want = authors_compute_tau(z)
    _, diag = cl.teacher_log_prob(z, y, LossConfig(low_entropy_threshold=None))
    inside = (want > 1.1) & (want < 1.5)
    assert inside.sum() > 10 and (want == 1.5).any()
    assert torch.equal(diag["tau"], want)
    forced = cl.entropy(z.double()) <= 0.03
    _, diag = cl.teacher_log_prob(z, y)
    assert forced.sum() > 5 and torch.equal(diag["tau"], torch.where(forced, 1.1, want))


# ---------------------------------------------------------------- edge cases
def test_uniform_logits():
    v = 1000
    z = torch.zeros(4, v, requires_grad=True)
    targets = torch.tensor([0, 1, 2, 3])
    loss, diag = curio(z, targets, z.detach() + 0)
    # H(tau) is flat, so any target above log V clamps to tau_max; every tau gives the same uniform teacher
    assert torch.equal(diag["clamped_high"], torch.ones(4))
    torch.testing.assert_close(diag["lq"], torch.full((4,), -math.log(v)))
    torch.testing.assert_close(loss, torch.full((4,), math.log(v)))
    loss.sum().backward()
    assert torch.isfinite(z.grad).all()


def test_near_one_hot_is_forced_to_tau_min_only_with_the_authors_rule():
    z = torch.full((2, 5000), -30.0)
    z[:, 7] = 0.0
    targets = torch.tensor([7, 3])
    _, diag = curio(z, targets, z)
    assert torch.equal(diag["tau"], torch.full((2,), 1.1))
    assert torch.equal(diag["forced_tau_min"], torch.ones(2))
    assert not diag["clamped_high"].any() and not diag["clamped_low"].any()  # forced, so not counted as clamped
    _, diag_paper = curio(z, targets, z, LossConfig(low_entropy_threshold=None))
    assert "forced_tau_min" not in diag_paper
    assert torch.equal(diag_paper["clamped_high"], torch.ones(2))  # H(1.5) is still below H + Delta


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_full_entropy_blockwise_is_the_entropy(dtype):
    """The low-entropy rule's pass at tau=1: several blocks of rows, a partial last block, -inf entries and
    a row with a single finite logit (entropy 0)."""
    z = llm_like_logits(40, V_BIG, seed=9).to(dtype)
    z[3, 100:] = float("-inf")
    z[5, 1:] = float("-inf")
    got = cl._full_entropy(z, z.float().amax(-1))
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    want = cl.entropy(z.double())
    # float32 sums over 152k terms: within 5e-4 nats (the float32 log_softmax entropy is within 1e-4 here)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=5e-4)
    assert got[5] == 0


def rule_rows(n=64, v=20000, k=512):
    """Rows that sweep the full-vocabulary entropy through 0.03 in ways a test of it on the top-k would get
    wrong, [4 * n, v]: (1) one dominant token over logits all tied at the top-k's minimum, a heavy tail:
    H_top <= 0.03 < H_full on some rows; (2) two tokens and nothing else (the rest at -60): H_top ~ H_full on
    both sides; (3) a tail of 5000 tokens one nat below the top-k's minimum; (4) fewer than k finite logits
    (the rest -inf)."""
    d = torch.linspace(6.0, 20.0, n)[:, None]
    tied = torch.zeros(n, v)
    tied[:, :1] = d
    rival = torch.full((n, v), -60.0)
    rival[:, 0] = 0.0
    rival[:, 1] = -torch.linspace(3.0, 9.0, n)
    straddle = torch.full((n, v), -40.0)
    straddle[:, :k] = 0.0
    straddle[:, k : k + 5000] = -1.0
    straddle[:, 0] = torch.linspace(13.6, 14.4, n)
    masked = torch.full((n, v), float("-inf"))
    masked[:, : k // 2] = 0.0
    masked[:, 0] = torch.linspace(8.0, 14.0, n)
    return torch.cat([tied, rival, straddle, masked])


@pytest.mark.parametrize("v", [V_BIG, 152064, V_BIG + 7, 4096])
def test_top_k_values_are_torch_topks_to_the_bit(v):
    """The top-k from block maxima (the teacher side's App. D entropy reads it) against torch.topk over the whole
    row: LLM-like rows, rows of integer logits (ties across blocks at the k-th value), an all-equal row, -inf
    entries, a vocabulary with a tail block, one too small for the blocks."""
    z = llm_like_logits(40, v, seed=5)
    z[:12] = (z[:12] * 2).round()
    z[12] = 0.0
    z[13, : v // 2] = float("-inf")
    for k in (1, 64, 512):
        assert torch.equal(cl._top_k_values(z, k), z.topk(k, dim=-1).values)
        assert torch.equal(cl._top_k_values(z.bfloat16(), k), z.bfloat16().topk(k, dim=-1).values)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_bf16_log_probs_and_gradient_are_the_float32_copys_without_one(temperature):
    """student_log_prob of bf16 logits (a GPU's head) reads them in float32 blocks (_LogProb) instead of one float32
    copy: lp, the log-partition and the gradient are the copy's (to float32 rounding), -inf logits included, and
    backward keeps nothing larger than the bf16 logits themselves."""
    z = (3 * llm_like_logits(64, 5000, seed=4)).bfloat16()
    z[5, :100] = float("-inf")
    y = torch.distributions.Categorical(logits=z.float()).sample()
    g = torch.randn(64)
    saved = []
    half = z.clone().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.nbytes) or t, lambda t: t):
        lp, lse = cl.student_log_prob(half, y, temperature)
    (g * lp + lse.sin()).sum().backward()
    full = z.float().requires_grad_()
    lp32, lse32 = cl.student_log_prob(full, y, temperature)
    (g * lp32 + lse32.sin()).sum().backward()
    torch.testing.assert_close(lp, lp32, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, lse32, rtol=1e-5, atol=1e-5)
    assert half.grad.dtype == torch.bfloat16
    torch.testing.assert_close(half.grad.float(), full.grad.bfloat16().float(), rtol=1e-2, atol=1e-6)
    assert max(saved) <= z.nbytes
    x = torch.randn(5, 40, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: cl._LogProb.apply(x, y[:5] % 40, temperature), (x,))
    # the logged entropy of bf16 logits, blockwise: the float32 copy's
    torch.testing.assert_close(cl.entropy(z), cl.entropy(z.float()), rtol=1e-5, atol=1e-5)


def test_low_entropy_rule_is_exact():
    """The forced-tau_min decision equals the exact float64 H_full <= 0.03 on rule_rows, on both sides of the
    threshold, including rows whose top-k entropy is low while the full one is not."""
    z = rule_rows()
    n, v = z.shape
    h_top = cl.entropy(z.topk(512, -1, sorted=False).values)
    want = cl.entropy(z.double()) <= 0.03
    _, diag = cl.teacher_log_prob(z, torch.zeros(n, dtype=torch.long))
    assert torch.equal(diag["forced_tau_min"].bool(), want)
    assert (diag["tau"][want] == 1.1).all()
    assert want.any() and (~want).any() and ((h_top <= 0.03) & ~want).any()   # H_top low, H_full high


def test_solver_clamps_targets_outside_the_bracket():
    top = llm_like_logits(3, 512, seed=1)
    h_lo, _ = cl._entropy_and_variance(top, torch.full((3,), 1.1))
    h_hi, _ = cl._entropy_and_variance(top, torch.full((3,), 1.5))
    target = torch.stack([h_lo[0] - 0.1, h_hi[1] + 0.1, (h_lo[2] + h_hi[2]) / 2])
    for solver in ("bisect", "newton"):
        tau, low, high = cl.solve_temperature(top, target, LossConfig(solver=solver))
        assert tau[0] == 1.1 and tau[1] == 1.5 and 1.1 < tau[2] < 1.5
        assert low.tolist() == [True, False, False] and high.tolist() == [False, True, False]
        h_mid, _ = cl._entropy_and_variance(top[2:], tau[2:])
        assert abs(h_mid.item() - target[2].item()) < 1e-4


def test_summarize_reports_the_logged_statistics():
    z = llm_like_logits(200, 3000, seed=6)
    y = torch.distributions.Categorical(logits=z).sample()
    _, diag = curio(z + 0.5 * torch.randn_like(z), y, z)
    diag["student_entropy"] = cl.entropy(z)
    s = cl.summarize(diag)
    for key in ("ce", "distill", "tau_mean", "tau_min", "tau_max", "frac_clamped_low", "frac_clamped_high",
                "frac_forced_tau_min", "w_mean", "w_frac_neg", "w_frac_above_1", "w_top20", "w_bottom80",
                "student_entropy_top20", "student_entropy_bottom80"):
        assert key in s and math.isfinite(s[key]), key
    assert 1.1 <= s["tau_min"] <= s["tau_mean"] <= s["tau_max"] <= 1.5
    assert s["student_entropy_top20"] > s["student_entropy_bottom80"]
    h = diag["student_entropy"]
    top, bottom = cl.split_entropy(h)
    assert top == pytest.approx(h.sort().values[-40:].mean().item(), rel=1e-5)
    assert bottom == pytest.approx(h.sort().values[:160].mean().item(), rel=1e-5)
    # w_t split by the teacher's entropy H_t: the weights at the 40 highest-H_t positions, and the others
    order = diag["teacher_entropy"].argsort()
    assert s["w_top20"] == pytest.approx(diag["weight"][order[-40:]].mean().item(), rel=1e-5)
    assert s["w_bottom80"] == pytest.approx(diag["weight"][order[:160]].mean().item(), rel=1e-5)


def test_entropy_increment_is_eq7_with_the_papers_constants():
    h = torch.tensor([0.0, 1.2, 2.0, 50.0])
    want = 0.5 / (1 + torch.exp(-2.0 * (h - 1.2)))
    torch.testing.assert_close(cl.entropy_increment(h, LossConfig()), want)
    assert cl.entropy_increment(torch.tensor(1.2), LossConfig()).item() == pytest.approx(0.25)   # half at the pivot


def test_one_token_by_hand():
    """A 3-token vocabulary, everything computed here independently: H, Eq. 7, tau by a fine grid, lq, loss."""
    z = torch.tensor([[2.0, 1.0, 0.0]], dtype=torch.float64)
    y = torch.tensor([1])
    p = torch.softmax(z[0], -1)
    h = -(p * p.log()).sum().item()
    target = h + 0.5 / (1 + math.exp(-2.0 * (h - 1.2)))
    grid = torch.linspace(1.1, 1.5, 400001, dtype=torch.float64)
    q = torch.softmax(z[0] / grid[:, None], -1)
    h_grid = -(q * q.log()).sum(-1)
    tau = grid[(h_grid - target).abs().argmin()].item()
    lq = torch.log_softmax(z[0] / tau, -1)[1].item()
    lp = math.log(p[1].item())
    loss, diag = curio(z, y, z, LossConfig(top_k=3))
    assert diag["tau"].item() == pytest.approx(tau, abs=2e-6)
    assert loss.item() == pytest.approx(-lp + 0.5 * (lp - lq) ** 2, abs=1e-9)
