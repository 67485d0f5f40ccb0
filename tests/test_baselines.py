"""baselines.py: Table 2's baselines against hand computations, and every --loss name through the registry (zero
tokens, NaN and -inf inputs)."""
import math

import pytest
import torch

import baselines
import curio_loss as cl
from curio_loss import LossConfig
from plumbing.synthetic import llm_like_logits


def loss_by_name(name, z, y, lq, base_logits, old_logp):
    """Each --loss as a call of its function (curio_loss.py's or baselines.py's) with the input it needs (sft.micro_batch_loss
    dispatches the same way; tests/test_sft.py runs every loss through it)."""
    cfg = baselines.config_for(name, LossConfig())
    if name in baselines.CURIO_LOSSES:
        return cl.curio_sft_loss(z, y, lq, cfg)
    if name == "kl":
        return baselines.kl_to_base_loss(z, y, base_logits, cfg)
    if name == "psft":
        return baselines.psft_loss(z, y, old_logp, cfg=cfg)
    if name == "entropy_top20":
        return baselines.entropy_reg_loss(z, y, cfg, bonus_mask=baselines.top_entropy_mask(cl.entropy(z.detach())))
    return baselines.VARIANT_LOSSES[name](z, y, {}, cfg)


def test_every_loss_name_has_one_loss():
    assert set(baselines.LOSSES) == {"curio", "curio_fixed_tau", *baselines.VARIANT_LOSSES}
    assert len(baselines.LOSSES) == 10 and baselines.second_model("curio_self_teacher") is None
    assert [baselines.second_model(n) for n in ("curio", "curio_fixed_tau", "kl", "sft")] == ["teacher", "teacher", "base",
                                                                                       None]


@pytest.mark.parametrize("name", sorted(baselines.LOSSES))
def test_every_loss_handles_zero_tokens(name):
    z = torch.zeros(0, 50, requires_grad=True)
    y = torch.zeros(0, dtype=torch.long)
    loss, diag = loss_by_name(name, z, y, torch.zeros(0), torch.zeros(0, 50), torch.zeros(0))
    assert loss.shape == (0,)
    loss.sum().backward()  # a micro-batch without response tokens still runs backward (FSDP needs it)
    assert z.grad is not None and z.grad.shape == (0, 50)


def test_nan_input_raises_a_clear_error():
    z = torch.randn(4, 50)
    z[2, 3] = float("nan")
    y = torch.zeros(4, dtype=torch.long)
    lq = cl.teacher_log_prob(torch.randn(4, 50), y)[0]
    with pytest.raises(FloatingPointError, match="student logits contain NaN"):
        cl.check_finite(cl.curio_sft_loss(z, y, lq)[0], z, y, lq)
    clean, lq_nan = torch.randn(4, 50), cl.teacher_log_prob(z, y)[0]
    with pytest.raises(FloatingPointError, match="teacher"):
        cl.check_finite(cl.curio_sft_loss(clean, y, lq_nan)[0], clean, y, lq_nan)
    cl.check_finite(cl.curio_sft_loss(clean, y, lq)[0], clean, y, lq)      # finite: no error


def test_neg_inf_vocabulary_entries_keep_every_loss_finite():
    z = torch.randn(6, 100)
    z[:, 50:] = float("-inf")
    z.requires_grad_()
    targets = torch.randint(0, 50, (6,))
    lq = cl.teacher_log_prob(z.detach() + 0.1, targets)[0]
    for name in baselines.LOSSES:
        loss, _ = loss_by_name(name, z, targets, lq, z.detach(), torch.full((6,), -3.0))
        g, = torch.autograd.grad(loss.sum(), z)
        assert torch.isfinite(loss).all() and torch.isfinite(g).all(), name


# ---------------------------------------------------------------- baselines
def test_baselines_against_hand_computation():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(5, 7, generator=g, dtype=torch.float64)
    y = torch.tensor([0, 3, 6, 2, 2])
    logp = torch.log_softmax(z, -1)
    lp = logp[torch.arange(5), y]
    p = lp.exp()
    cfg = LossConfig()
    torch.testing.assert_close(baselines.ce_loss(z, y)[0].double(), -lp)
    torch.testing.assert_close(baselines.dft_loss(z, y)[0].double(), -p * lp)
    # entropy regularisation, all tokens and the top-20% (1 of 5 here)
    h = -(logp.exp() * logp).sum(-1)
    torch.testing.assert_close(baselines.entropy_reg_loss(z, y, cfg)[0].double(), -lp - 0.06 * h, rtol=1e-6, atol=1e-6)
    top = baselines.entropy_reg_loss(z, y, cfg, bonus_mask=baselines.top_entropy_mask(h))[0].double()
    bonus = torch.where(h == h.max(), h, 0.0)
    torch.testing.assert_close(top, -lp - 0.06 * bonus, rtol=1e-6, atol=1e-6)
    # KL to base
    zb = torch.randn(5, 7, generator=g, dtype=torch.float64)
    kl_hand = (logp.exp() * (logp - torch.log_softmax(zb, -1))).sum(-1)
    torch.testing.assert_close(baselines.kl_to_base_loss(z, y, zb)[0].double(), -lp + 0.1 * kl_hand, rtol=1e-6, atol=1e-6)
    assert baselines.kl_to_base_loss(z, y, z)[1]["kl_to_base"].abs().max() < 1e-6
    # GEM, written as the double sum
    gem = torch.zeros(5, dtype=torch.float64)
    for i in range(5):
        q = torch.softmax(z[i] / 0.7, -1)
        for v in range(7):
            w = torch.sigmoid(0.01 * (z[i, v] - z[i, y[i]]))
            gem[i] -= q[v] * w * (lp[i] - logp[i, v])
    torch.testing.assert_close(baselines.gem_loss(z, y)[0].double(), gem, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_entropy_shortcuts_keep_the_bits(dtype):
    """cl.entropy at tau = 1 skips x / 1, and GEM and kl give the logged entropy from their own log-probs: the same
    values (and gradient) as the pass they replace, bit for bit, -inf logits included."""
    z = llm_like_logits(16, 500, seed=4).to(dtype)
    z[2, 40:90] = float("-inf")
    y = torch.randint(0, 40, (16,), generator=torch.Generator().manual_seed(0))
    zt = z.clone().requires_grad_(True)
    zs = z.clone().requires_grad_(True)
    h_tensor_tau, h_skip = cl.entropy(zt, torch.tensor(1.0)), cl.entropy(zs)
    (h_tensor_tau * torch.arange(16)).sum().backward()
    (h_skip * torch.arange(16)).sum().backward()
    assert torch.equal(h_skip, h_tensor_tau) and torch.equal(zs.grad, zt.grad)
    assert torch.isfinite(h_skip).all() and torch.isfinite(zs.grad).all()
    base = llm_like_logits(16, 500, seed=5).to(dtype)
    for loss, diag in (baselines.gem_loss(z, y, with_entropy=True),
                       baselines.kl_to_base_loss(z, y, base, with_entropy=True)):
        assert torch.equal(diag["student_entropy"], h_skip.detach()) and torch.isfinite(loss).all()
    assert "student_entropy" not in baselines.gem_loss(z, y)[1]
    assert "student_entropy" not in baselines.kl_to_base_loss(z, y, base)[1]


def test_psft_clip_on_both_sides():
    z = torch.zeros(3, 4, requires_grad=True)                 # lp = log(1/4) for every token
    y = torch.zeros(3, dtype=torch.long)
    lp0 = math.log(0.25)
    old = torch.tensor([lp0, lp0 - math.log(2.0), lp0 + math.log(2.0)])   # ratios 1, 2, 0.5
    loss, diag = baselines.psft_loss(z, y, old)
    torch.testing.assert_close(loss, torch.tensor([-1.0, -1.28, -0.5]))
    assert diag["clipped"].tolist() == [0.0, 1.0, 0.0]
    loss.sum().backward()
    # clipped above 1.28: no gradient; below 0.8 with A > 0 the unclipped term is the max: gradient flows
    assert z.grad[1].abs().max() == 0
    assert z.grad[0].abs().max() > 0 and z.grad[2].abs().max() > 0
    # with old = now PSFT is CE: same gradient
    z2 = torch.randn(3, 4, requires_grad=True)
    g_psft, = torch.autograd.grad(baselines.psft_loss(z2, y)[0].sum(), z2)
    g_ce, = torch.autograd.grad(baselines.ce_loss(z2, y)[0].sum(), z2)
    torch.testing.assert_close(g_psft, g_ce)


def test_loss_names_and_the_fixed_temperature_ablation():
    with pytest.raises(ValueError, match="unknown loss 'ce'"):
        baselines.second_model("ce")
    with pytest.raises(ValueError, match="unknown loss 'ce'"):
        baselines.config_for("ce", LossConfig())
    z = llm_like_logits(8, 2000, seed=2)
    y = torch.randint(0, 2000, (8,))
    assert baselines.config_for("curio_fixed_tau", LossConfig()).fixed_tau == 1.3
    assert baselines.config_for("curio", LossConfig()).fixed_tau is None
    top, _ = baselines.entropy_reg_loss(z, y, bonus_mask=baselines.top_entropy_mask(cl.entropy(z)))
    every, _ = baselines.entropy_reg_loss(z, y)
    assert (top > every).sum() == 6 and torch.isclose(top, every).sum() == 2   # the bonus on 2 of 8 tokens only


def test_top_entropy_mask_is_the_80_20_papers_topk():
    h = torch.tensor([0.1, 2.0, 0.3, 1.5, 0.2, 0.9, 3.0, 0.0, 0.4, 0.5, 0.6])
    assert baselines.top_entropy_mask(h).nonzero().squeeze(-1).tolist() == [1, 3, 6]   # ceil(0.2 * 11) = 3
    assert baselines.top_entropy_mask(h[:5]).sum() == 1 and baselines.top_entropy_mask(h[:10]).sum() == 2
    assert baselines.top_entropy_mask(torch.zeros(0)).shape == (0,)


def test_dft_gradient_is_cross_entropy_scaled_by_the_detached_probability():
    z = torch.randn(6, 9, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 9, (6,))
    g_dft, = torch.autograd.grad(baselines.dft_loss(z, y)[0].sum(), z)
    g_ce, = torch.autograd.grad(baselines.ce_loss(z, y)[0].sum(), z)
    p = torch.softmax(z.detach(), -1)[torch.arange(6), y]
    torch.testing.assert_close(g_dft, p[:, None] * g_ce)
