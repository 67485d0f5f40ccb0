"""rl.py: the GRPO pieces against hand-computed values, weight sync into the engine, a toy reward that a tiny
model learns (and an exact resume), and a whole `python rl.py` run as a subprocess."""
import importlib.util
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import chunked_logits
import curio_loss
import data
import fake_vllm
import rl
from plumbing import checkpoints, generation, models, run_dir
from run_python import run_python

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("one_thread")



def clipped_loss(lp, old, adv, clip_low, clip_high, policy_loss="ppo_clip", clip_ratio_c=None):
    """The policy loss the flags pick (rl.policy_loss_fn), called as rl.policy_update calls it."""
    args = rl.Args(clip_low=clip_low, clip_high=clip_high, policy_loss=policy_loss,
                   clip_ratio_c=clip_ratio_c)
    return rl.policy_loss_fn(args)(lp, old, adv, args)


def fsdp_model(path):
    return models.shard_model(models.load_full_model(str(path), scratch=False, seed=0), torch.device("cpu"),
                              bf16=False, grad_ckpt=False)


# ---------------------------------------------------------------- advantages and the clipped loss
def test_group_advantages_on_known_groups():
    rewards = torch.tensor([[1, 0, 0, 0, 0, 0, 0, 0],          # one correct of 8
                            [0, 0, 0, 0, 0, 0, 0, 0],          # all wrong
                            [1, 1, 1, 1, 1, 1, 1, 1],          # all correct
                            [0.3] * 8,                         # all equal, not 0/1
                            [0, 1, 0, 1, 0, 1, 0, 1]], dtype=torch.float32)
    adv, flat = rl.group_advantages(rewards)
    assert adv[0, 0].item() == pytest.approx(2.474867, abs=1e-6)
    assert adv[0, 1:].tolist() == pytest.approx([-0.353552] * 7, abs=1e-6)
    assert (adv[1:4] == 0).all()
    assert flat.tolist() == [False, True, True, True, False] and int(flat.sum()) == 3
    # half correct: mean 0.5, unbiased std sqrt(8/7)/2, so 0.5 / (0.534522 + 1e-6)
    assert adv[4].tolist() == pytest.approx([-0.935413, 0.935413] * 4, abs=1e-6)


def test_singleton_groups_get_verls_mean_0_std_1():
    """--rollouts 1: no std to take; verl's compute_grpo_outcome_advantage uses mean 0, std 1: A = r / (1 + 1e-6)."""
    adv, no_signal = rl.group_advantages(torch.tensor([[1.0], [0.0], [0.5]]))
    assert not adv.isnan().any()
    assert adv[:, 0].tolist() == pytest.approx([1 / (1 + 1e-6), 0.0, 0.5 / (1 + 1e-6)], abs=1e-7)   # float32
    assert adv[0, 0] != 1.0                                               # the eps is there, as in verl
    assert no_signal.tolist() == [False, True, False]


def test_custom_loss_rl_is_reinforce_below_zero_and_a_two_sided_clip_above():
    """The authors' custom_loss, algo_type="rl": min(-A log pi, -A clip(r, 0.8, 1.2)) (clip 0.2 on both sides)."""
    ratio = torch.tensor([1.5, 0.5, 1.1, 1.5, 0.5, 1.1, 1.5], dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0, 1.0, -2.0, -2.0, -2.0, 0.0], dtype=torch.float64)
    old = torch.tensor([-1.0, -2.0, -0.5, -3.0, -1.0, -0.2, -1.0], dtype=torch.float64)
    lp = (old + ratio.log()).requires_grad_()
    loss, diag = clipped_loss(lp, old, adv, 0.2, 0.2, "custom_loss_rl")
    # A > 0: -A clip(r): -1.2 and -0.8 (clipped above and below), -1.1 inside. A < 0: -A log pi = 2 log pi
    want = [-1.2, -0.8, -1.1] + [2 * v for v in (old[3:6] + ratio[3:6].log()).tolist()] + [0.0]
    assert loss.tolist() == pytest.approx(want, abs=1e-12)
    loss.sum().backward()
    # A > 0: gradient -A r inside the range, none outside on either side; A < 0: -A, whatever the ratio
    assert lp.grad.tolist() == pytest.approx([0.0, 0.0, -1.1, 2.0, 2.0, 2.0, 0.0], abs=1e-12)
    assert diag["clip_high"].tolist() == [1, 0, 0, 0, 0, 0, 0]
    assert diag["clip_low"].tolist() == [0, 1, 0, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="policy_loss 'grpo': expected one of ppo_clip, custom_loss_rl"):
        rl.policy_loss_fn(types.SimpleNamespace(policy_loss="grpo", clip_ratio_c=None))


@pytest.mark.parametrize("flag,value", [("policy_loss", "grpo"), ("loss_agg", "seq_mean"), ("system_prompt", "x"),
                                        ("reward", "oat")])
def test_unknown_recipe_values_stop_before_anything_loads(world_of_one, flag, value):
    with pytest.raises(SystemExit, match=f"--{flag} '{value}': expected one of "):
        rl.train(rl.Args(**{flag: value}, model="/nonexistent"), world_of_one)


def test_dual_clip_is_verls_vanilla_loss_and_only_caps_negative_advantages():
    """--clip_ratio_c against verl's compute_policy_loss_vanilla, as the authors' fork writes it
    (custom_verl/verl/trainer/ppo/core_algos.py lines 858-883), on ratios far off policy on both sides."""
    def verl_vanilla(lp, old, adv, low, high, c):
        ratio = torch.exp((lp - old).clamp(-20.0, 20.0))
        clip_pg_losses1 = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - low, 1 + high))
        clip_pg_losses2 = torch.min(-adv * c, clip_pg_losses1)
        return torch.where(adv < 0, clip_pg_losses2, clip_pg_losses1)

    g = torch.Generator().manual_seed(0)
    old = -torch.rand(4000, generator=g, dtype=torch.float64) * 5
    lp = (old + torch.randn(4000, generator=g, dtype=torch.float64) * 1.5).requires_grad_()
    adv = torch.randn(4000, generator=g, dtype=torch.float64)
    loss, diag = clipped_loss(lp, old, adv, 0.2, 0.28, "ppo_clip", clip_ratio_c=3.0)
    torch.testing.assert_close(loss, verl_vanilla(lp, old, adv, 0.2, 0.28, 3.0), rtol=0, atol=0)
    plain, plain_diag = clipped_loss(lp, old, adv, 0.2, 0.28)
    ratio = (lp - old).exp().detach()
    capped = (adv < 0) & (ratio > 3.0)
    assert capped.sum() > 100 and (loss[capped] == -3.0 * adv[capped]).all() and (loss < plain)[capped].all()
    assert torch.equal(loss[~capped], plain[~capped])                     # the cap changes nothing else
    loss.sum().backward()
    assert (lp.grad[capped] == 0).all()                                    # no gradient beyond the cap
    assert torch.equal(diag["clip_high"], (plain_diag["clip_high"].bool() | capped).float())


@pytest.mark.parametrize("kw,message", [(dict(clip_ratio_c=1.0), "--clip_ratio_c 1.0: must be > 1"),
                                        (dict(clip_ratio_c=float("nan")), "--clip_ratio_c nan: must be > 1"),
                                        (dict(clip_ratio_c=3.0, policy_loss="custom_loss_rl"),
                                         "--clip_ratio_c 3.0: only --policy_loss ppo_clip has a dual clip")])
def test_bad_dual_clip_settings_are_one_line_errors(kw, message):
    with pytest.raises(SystemExit, match=message):
        rl.Args(**kw)
    assert rl.Args(clip_ratio_c=3.0).clip_ratio_c == 3.0


def test_math_reward_grades_as_its_reward_says():
    """paper: the text after </think>, alone. authors_rl: the authors' reward, with the end token the engine stopped
    on (an unboxed 7/12 just before it reads as 7) and the last \\boxed{} of the whole response."""
    texts = ["<think>x</think> The probability is 7/12", "<think>so \\boxed{7/12}</think> That is all.",
             "<think>x</think> \\boxed{\\frac{7}{12}}", "<think>x</think> \\boxed{7/13}"]
    samples = [generation.Sample([1], t, None, None, "stop", "<|im_end|>") for t in texts]
    examples = [data.Example("q", "\\frac{7}{12}", None, "math", i) for i in range(len(texts))]
    assert rl.math_reward(samples, examples, "paper", workers=2) == ([1.0, 0.0, 1.0, 0.0], 0)
    assert rl.math_reward(samples, examples, "authors_rl", workers=2) == ([0.0, 1.0, 1.0, 0.0], 0)


def test_clipped_loss_values_gradients_and_clip_fractions():
    # eps_low 0.2, eps_high 0.28: the ratio is clipped to [0.8, 1.28]
    ratio = torch.tensor([1.5, 0.5, 1.1, 1.5, 0.5, 1.1, 1.5], dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0, 1.0, -2.0, -2.0, -2.0, 0.0], dtype=torch.float64)
    old = torch.tensor([-1.0, -2.0, -0.5, -3.0, -1.0, -0.2, -1.0], dtype=torch.float64)
    lp = (old + ratio.log()).requires_grad_()
    loss, diag = clipped_loss(lp, old, adv, 0.2, 0.28)
    # A > 0: above 1.28 clipped (-1.28, no gradient); below 0.8 not clipped; inside -A r
    # A < 0: above 1.28 not clipped (-A r = 3.0); below 0.8 clipped (-A * 0.8 = 1.6, no gradient); inside 2.2
    want = [-1.28, -0.5, -1.1, 3.0, 1.6, 2.2, 0.0]
    assert loss.tolist() == pytest.approx(want, abs=1e-12)
    loss.sum().backward()
    # d/dlp of -A r is -A r (dr/dlp = r); 0 where the clipped branch is the max
    assert lp.grad.tolist() == pytest.approx([0.0, -0.5, -1.1, 3.0, 0.0, 2.2, 0.0], abs=1e-12)
    assert diag["clip_high"].tolist() == [1, 0, 0, 0, 0, 0, 0]
    assert diag["clip_low"].tolist() == [0, 0, 0, 0, 1, 0, 0]
    r = ratio
    assert diag["kl"].tolist() == pytest.approx((r - 1 - r.log()).tolist(), abs=1e-12)


def padded_batch(tok, responses):
    prompt = tok.encode("<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    items = [(prompt + r, [0] * len(prompt) + [1] * len(r)) for r in responses]
    return data.collate(items, tok.pad_token_id), items


def test_token_losses_ignore_padding_and_first_update_is_on_policy(checkpoint, world_of_one):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint)
    model = fsdp_model(checkpoint)
    args = rl.Args(loss_chunk=5)                                       # several chunks
    responses = [tok.encode(" 2 plus 3 is 5.", add_special_tokens=False) + [tok.eos_token_id],
                 tok.encode(" 5", add_special_tokens=False)]
    batch, items = padded_batch(tok, responses)
    assert batch["attention_mask"][1].sum() < batch["attention_mask"].shape[1]    # the second row is padded
    n = [len(r) for r in responses]

    # old log-probs equal log_softmax of the full logits at the response tokens; entropy likewise
    old, ent = chunked_logits.token_log_probs(model, batch, args.loss_chunk, args.temperature)
    logits = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    sel = batch["loss_mask"][:, 1:].bool()
    ref = logits.log_softmax(-1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0][sel]
    torch.testing.assert_close(old, ref.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, curio_loss.entropy(logits[sel]).detach(), rtol=1e-5, atol=1e-5)
    # ... at the rollout temperature when it is not 1
    old_t, ent_t = chunked_logits.token_log_probs(model, batch, args.loss_chunk, temperature=0.7)
    ref_t = (logits / 0.7).log_softmax(-1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0][sel]
    torch.testing.assert_close(old_t, ref_t.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent_t, curio_loss.entropy(logits[sel] / 0.7).detach(), rtol=1e-5, atol=1e-5)

    # padding contributes nothing: the padded micro-batch sums exactly the two sequences' losses, whatever the pad id
    adv = torch.cat([torch.full((n[0],), 1.5), torch.full((n[1],), -0.7)])
    shifted = old + torch.linspace(-0.5, 0.5, len(old))                # ratios on both sides of the clip range
    def update(mb, args=args):       # one rl.policy_update, its optimiser only recording the gradient
        capture = GradCapture(model.parameters())
        sums, _ = rl.policy_update(model, capture, [mb], args, torch.device("cpu"))
        return sums, capture

    sums, _ = update(rl.MicroBatch(batch, adv, shifted))          # [loss, clip_low, clip_high, kl, tokens]
    singles = []
    for k, item in enumerate(items):
        one = data.collate([item], tok.pad_token_id)
        part = slice(sum(n[:k]), sum(n[: k + 1]))
        singles.append(update(rl.MicroBatch(one, adv[part], shifted[part]))[0][0])
    torch.testing.assert_close(sums[0], sum(singles), rtol=1e-5, atol=1e-6)
    other_pad = dict(batch, input_ids=batch["input_ids"].masked_fill(batch["attention_mask"] == 0, 7))
    again, _ = update(rl.MicroBatch(other_pad, adv, shifted))
    torch.testing.assert_close(again[0], sums[0], rtol=1e-6, atol=1e-6)
    assert sums[4] == sum(n) and sums[1] + sums[2] > 0

    # the first update of a step is on-policy: ratio 1, loss -sum(A), no clipping, zero KL; its gradient is the
    # policy gradient -sum_t A_t grad log pi(y_t), over the mini-batch's tokens (token_mean, no clipping)
    sums, capture = update(rl.MicroBatch(batch, adv, old), dataclasses.replace(args, grad_clip=1e9))
    torch.testing.assert_close(sums[0], -adv.sum().double(), rtol=1e-5, atol=1e-5)
    assert sums[1] == 0 and sums[2] == 0 and sums[3] < 1e-5
    got = next(g for p, g in zip(capture.params, capture.grads) if p is model.lm_head.weight) * sum(n)
    model.zero_grad()
    lp = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].log_softmax(-1)
    (-(adv * lp.gather(-1, batch["input_ids"][:, 1:, None])[..., 0][sel]).sum()).backward()
    torch.testing.assert_close(got, model.lm_head.weight.grad.full_tensor(), rtol=1e-4, atol=1e-6)


class GradCapture:
    """An optimiser that only records the gradients it would apply."""

    def __init__(self, params):
        self.params, self.grads = list(params), None

    def step(self):
        self.grads = [None if p.grad is None else p.grad.full_tensor().clone() for p in self.params]

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None


@pytest.mark.parametrize("policy_loss,loss_agg,divisor", [("ppo_clip", "token_mean", 8),
                                                           ("custom_loss_rl", "seq_sum_over_max_len", 3 * 16)])
def test_policy_update_combines_its_micro_batches_as_loss_agg_says(checkpoint, world_of_one, policy_loss, loss_agg,
                                                                    divisor):
    """Micro-batches of 7 and 1 response tokens in 3 sequences. token_mean: each token weighs 1/8 (a mean over
    sequences or micro-batches would not). seq_sum_over_max_len: each weighs 1/(3 sequences x max_response_len 16),
    whatever the sequences' lengths. Padding weighs nothing."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint)
    model = fsdp_model(checkpoint)
    args = rl.Args(loss_chunk=3, grad_clip=1e9, policy_loss=policy_loss, loss_agg=loss_agg, max_response_len=16)
    mbs, reference = [], 0.0
    for responses, a in (([[11, 12, 13, 14, 15, tok.eos_token_id], [21]], 1.0), ([[31]], -2.0)):
        batch, _ = padded_batch(tok, responses)
        adv = torch.full((sum(map(len, responses)),), a)
        old, ent = chunked_logits.token_log_probs(model, batch, args.loss_chunk, args.temperature)
        old = old + torch.linspace(-0.4, 0.4, len(old))                  # off-policy: some tokens clipped
        mbs.append(rl.MicroBatch(batch, adv, old, ent))
        sel = batch["loss_mask"][:, 1:].bool()
        lp = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].log_softmax(-1)
        reference = reference + clipped_loss(lp.gather(-1, batch["input_ids"][:, 1:, None])[..., 0][sel], old, adv,
                                                0.2, 0.28, policy_loss)[0].sum()
    (reference / divisor).backward()
    want = [p.grad.full_tensor().clone() for p in model.parameters()]
    model.zero_grad()
    capture = GradCapture(model.parameters())
    sums, grad_norm = rl.policy_update(model, capture, mbs, args, torch.device("cpu"))
    assert sums[4] == 8 and sums[0].item() == pytest.approx(reference.item(), rel=1e-5)
    for got, w in zip(capture.grads, want):
        torch.testing.assert_close(got, w, rtol=1e-4, atol=1e-7)
    assert grad_norm == pytest.approx(torch.stack([w.norm() for w in want]).norm().item(), rel=1e-4)


@pytest.mark.parametrize("pack", [True, False])
def test_micro_batches_give_every_response_token_its_group_advantage(world_of_one, pack):
    G, n = 4, 3
    prompt_ids = [[1, 2, 3], [1, 2], [4, 5, 6, 7], [1]]
    # response tokens 100 + n*i + j identify their (prompt i, rollout j); lengths vary, to need padding
    samples = [[generation.Sample([100 + n * i + j] * (1 + (i + 2 * j) % 4), "", [], [], "stop") for j in range(n)]
               for i in range(G)]
    adv = torch.arange(G * n, dtype=torch.float32).view(G, n) / 10 - 0.5
    args = rl.Args(mini_batch=2, micro_batch=2, pack=pack)
    minis = rl.micro_batches(prompt_ids, samples, adv, args, pad_id=0, device=torch.device("cpu"))
    assert len(minis) == G // args.mini_batch
    seen = []
    for mbs in minis:
        assert len(mbs) == args.mini_batch * n // args.micro_batch
        for batch, adv_tok in ((mb.batch, mb.adv) for mb in mbs):
            hidden = torch.zeros(*batch["input_ids"].shape, 1)
            _, y = chunked_logits.select_targets(hidden, batch)
            i, j = (y - 100) // n, (y - 100) % n
            assert (y >= 100).all()                                    # prompt tokens and padding are not trained
            assert torch.equal(adv_tok, adv[i, j])
            seen += y.tolist()
    assert sorted(seen) == sorted(t for group in samples for s in group for t in s.token_ids)


def test_each_rank_gets_a_disjoint_shard_in_a_fixed_order_per_epoch():
    args = rl.Args(prompts_per_step=8, seed=3)
    steps = [[rl.step_prompts(20, s, args, r, 4) for r in range(4)] for s in range(5)]    # 2 steps per epoch
    for s, ranks in enumerate(steps):
        flat = [i for mine, _ in ranks for i in mine]
        assert len(flat) == len(set(flat)) == 8 and all(len(mine) == 2 for mine, _ in ranks)
        assert {epoch for _, epoch in ranks} == {s // 2}
    epoch0 = [i for s in (0, 1) for mine, _ in steps[s] for i in mine]
    assert len(set(epoch0)) == 16                                      # no prompt twice within an epoch
    assert steps[2] != steps[0] and steps == [[rl.step_prompts(20, s, args, r, 4) for r in range(4)] for s in range(5)]


def test_rollout_seeds_differ_across_ranks_and_steps():
    args = rl.Args(rollouts=8)                                         # the paper: 16 prompts x 8 per rank on 8 GPUs
    blocks = [rl.rollout_seed(args, step, rank, 8, 16) for step in range(500) for rank in range(8)]
    assert len(set(blocks)) == len(blocks) and all(0 <= b < 2**31 for b in blocks)
    starts = sorted(blocks)
    assert all(b - a >= 16 * 8 for a, b in zip(starts, starts[1:]))   # request seeds never overlap
    assert rl.rollout_seed(rl.Args(rollouts=8, seed=1), 0, 0, 8, 16) not in blocks


# ---------------------------------------------------------------- weight sync
def test_sync_weights_moves_the_trainers_weights_into_the_hf_engine(checkpoint, world_of_one):
    engine, tok = generation.load_engine(str(checkpoint), "hf", "float32")
    model = fsdp_model(checkpoint)
    batch, _ = padded_batch(tok, [[5, 6, 7, tok.eos_token_id]])
    old, _ = chunked_logits.token_log_probs(model, batch, rl.Args().loss_chunk, rl.Args().temperature)
    model.reshard()             # as rl.train: the optimiser must see the sharded parameters, not the gathered
    rl.policy_update(model, torch.optim.AdamW(model.parameters(), lr=1e-2),
                     [rl.MicroBatch(batch, torch.tensor([1.0, -1.0, 2.0, 0.5]), old)], rl.Args(), torch.device("cpu"))
    trainer = {k: v.clone() for k, v in models.full_state_dict(model).items()}
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    assert all(not torch.equal(trainer[k], before[k]) for k in trainer)     # the step moved every tensor
    generation.sync_weights(model, engine)
    after = engine.model.state_dict()
    assert after.keys() == trainer.keys()
    assert all(torch.equal(after[k], trainer[k]) for k in trainer)
    # and the engine now samples from the trained policy: its logits match the trainer's
    with torch.no_grad():
        want = model(batch["input_ids"]).logits
        torch.testing.assert_close(engine.model(batch["input_ids"]).logits, want, rtol=1e-5, atol=1e-5)


def test_sync_weights_casts_to_the_engine_dtype_one_bucket_at_a_time(checkpoint, world_of_one, monkeypatch):
    """Into a (fake) vLLM engine in bf16: every weight once, cast to bf16 before it is gathered, in buckets of at
    least bucket_bytes, all in one in-place reload (a layer split over two would be processed half loaded), then
    the prefix cache reset. An engine parameter left without a weight stops the sync."""
    vllm = fake_vllm.install(monkeypatch)
    engine, _ = generation.load_engine(str(checkpoint), "vllm", "bfloat16", logprobs=False)
    llm = vllm.engines[-1]
    model = fsdp_model(checkpoint)
    for p in model.parameters():                                     # stands in for an optimiser step
        p.data.add_(0.01)
    trainer = models.full_state_dict(model)
    sizes = [sum(t.nbytes for _, t in bucket)
             for bucket in generation.full_weight_buckets(model, torch.bfloat16, 64 << 10)]
    assert len(sizes) >= 3 and min(sizes[:-1]) >= 64 << 10
    assert sum(sizes) == sum(t.nbytes for t in trainer.values()) // 2               # bf16: half of float32
    generation.sync_weights(model, engine, bucket_bytes=64 << 10)
    assert vllm.events == ["LLM", "collective_rpc", "load", "reset_prefix_cache"]
    received = {name: t for load in llm.loads for name, t in load.items()}
    assert received.keys() == trainer.keys()
    assert all(t.dtype == torch.bfloat16 and torch.equal(t, trainer[k].to(torch.bfloat16)) for k, t in received.items())

    llm.skip_on_load = "model.norm.weight"     # after a level-2 sleep it would keep garbage
    with pytest.raises(RuntimeError, match="1 engine parameters got no weight, e.g. 'model.norm.weight'"):
        generation.sync_weights(model, engine)

    hf, _ = generation.load_engine(str(checkpoint), "hf", "bfloat16")   # the HF engine casts the same way
    generation.sync_weights(model, hf)
    assert all(torch.equal(v, trainer[k].to(torch.bfloat16)) for k, v in hf.model.state_dict().items())


def test_weight_buckets_leave_out_a_tied_lm_head(world_of_one):
    """A tied lm_head.weight (small Qwen2.5 models) is the embedding: not sent again, since vLLM 0.32's loader
    raises on a tied alias that comes in a load_weights call without the embedding (_check_skipped_aliases)."""
    import transformers

    cfg = transformers.Qwen2Config(vocab_size=96, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, intermediate_size=128, tie_word_embeddings=True)
    model = models.shard_model(transformers.Qwen2ForCausalLM(cfg), torch.device("cpu"), bf16=False, grad_ckpt=False)
    names = [name for bucket in generation.full_weight_buckets(model, torch.float32, 1) for name, _ in bucket]
    assert "lm_head.weight" in model.state_dict() and names == [n for n in model.state_dict() if n != "lm_head.weight"]


def test_vllm_sleeps_whenever_the_trainer_works(checkpoint, toy_sft_file, world_of_one, tmp_path, monkeypatch):
    """The engine's life in rl.train, with a fake vLLM that records calls (tests/fake_vllm.py): created, put to
    sleep (level 2) before the trainer is built; each step wakes the weights, loads the trainer's, wakes the KV
    cache, generates and sleeps again; old log-probs and optimiser steps run only while it sleeps. A resumed run
    takes the same path with the checkpoint's weights. The default reward grades as --reward says."""
    vllm = fake_vllm.install(monkeypatch)
    monkeypatch.setenv("RANK", "0")                                   # the external_launcher check

    def while_asleep(name, fn):
        def spy(*args, **kwargs):
            assert vllm.engines[-1].asleep == {"weights", "kv_cache"}, f"{name} while the engine is awake"
            vllm.events.append(name)
            return fn(*args, **kwargs)
        return spy

    monkeypatch.setattr(rl, "shard_model", while_asleep("build trainer", rl.shard_model))
    monkeypatch.setattr(rl, "token_log_probs", while_asleep("old log-probs", rl.token_log_probs))
    monkeypatch.setattr(rl, "policy_update", while_asleep("optimiser step", rl.policy_update))
    gradings = []

    def grade(texts, ground_truths, kinds, timeout_s, workers, grading):   # the default reward's grader
        gradings.append(grading)
        return [float(i % 2) for i in range(len(texts))], 0

    monkeypatch.setattr(rl, "grade", grade)
    args = rl.Args(model=str(checkpoint), train_file=str(toy_sft_file), out_dir=str(tmp_path), steps=2,
                   prompts_per_step=2, rollouts=4, mini_batch=1, micro_batch=8, max_prompt_len=512, max_response_len=6,
                   bf16=False, grad_ckpt=False, loss_chunk=512, engine="vllm", save_every=1, seed=0,
                   reward="authors_rl")
    step = ["wake:weights", "collective_rpc", "load", "reset_prefix_cache", "wake:kv_cache", "generate", "sleep:2",
            "old log-probs", "optimiser step"]

    def calls():
        return [e for i, e in enumerate(vllm.events) if i == 0 or vllm.events[i - 1] != e]   # repeats collapsed

    rl.train(args, world_of_one)
    assert calls() == ["LLM", "sleep:2", "build trainer"] + step * 2
    assert gradings == ["authors_rl"] * 2                               # one grading per step, as --reward says
    llm = vllm.engines[-1]
    assert llm.kwargs["enable_sleep_mode"] and llm.kwargs["distributed_executor_backend"] == "external_launcher"
    assert llm.kwargs["logprobs_mode"] == "raw_logprobs" and llm.kwargs["max_model_len"] == 518   # the check's
    assert {p.kwargs["logprobs"] for p in vllm.sampling_params} == {0}     # the sampled tokens' (engine_logp_diff)
    from safetensors.torch import load_file
    for load, weights in zip(llm.loads, [checkpoint, tmp_path / "step_000001"]):   # first sync: the checkpoint
        want = load_file(weights / "model.safetensors")
        assert load.keys() == want.keys() and all(torch.equal(load[k], want[k]) for k in want)

    vllm.events.clear()
    args.steps = 3                                                      # resume from step 2: the same path
    rl.train(args, world_of_one)
    assert calls() == ["LLM", "sleep:2", "build trainer"] + step
    want = load_file(tmp_path / "step_000002/model.safetensors")
    assert all(torch.equal(vllm.engines[-1].loads[0][k], want[k]) for k in want)


def test_vllm_settings_a_resume_may_change_change_no_request(checkpoint, toy_sft_file, world_of_one, tmp_path,
                                                             monkeypatch):
    """--vllm_sleep and --gpu_memory_utilization are in rl.py's MAY_CHANGE_ON_RESUME: with either changed the
    (fake) engine gets the same requests, each with its own seed, and the same trainer weights before each
    step's rollouts, so the run ends alike. What vLLM itself does with a smaller KV cache (other batches) is
    not covered here: its per-request seeds keep each sample's draws its own, its batched kernels' rounding
    is vLLM's."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(rl, "grade", lambda texts, *args: ([float(len(t) % 2) for t in texts], 0))
    seen = {}
    for sleep, share in ((True, 0.6), (False, 0.9)):
        vllm = fake_vllm.install(monkeypatch)
        out = tmp_path / f"{sleep}"
        args = rl.Args(model=str(checkpoint), train_file=str(toy_sft_file), out_dir=str(out), steps=2,
                       prompts_per_step=2, rollouts=4, mini_batch=1, micro_batch=8, max_prompt_len=512,
                       max_response_len=6, bf16=False, grad_ckpt=False, loss_chunk=512, engine="vllm",
                       save_every=0, seed=0, vllm_sleep=sleep, gpu_memory_utilization=share, log_rollouts=2)
        rl.train(args, world_of_one)
        llm = vllm.engines[-1]
        assert llm.kwargs["gpu_memory_utilization"] == share and llm.kwargs["enable_sleep_mode"] == sleep
        seen[sleep] = ([(p.kwargs["seed"], p.kwargs["n"]) for p in vllm.sampling_params],
                       (out / "rollouts.jsonl").read_text(), (out / "step_000002" / "model.safetensors").read_bytes(),
                       llm.loads[-1])                  # step 2's sync (one bucket): the weights after step 1
    assert seen[True][:3] == seen[False][:3]
    assert seen[True][3].keys() == seen[False][3].keys()
    assert all(torch.equal(seen[True][3][k], seen[False][3][k]) for k in seen[True][3])


def test_engine_logp_diff_counts_only_the_tokens_the_engine_sampled(world_of_one):
    """Mean and max of |engine - trainer| over the engine's tokens; an expert's (NaN: no engine log-prob) are left
    out; a step without any is (nan, nan), which stops a run as an excess would."""
    def diff(pairs):                                              # [(trainer's, engine's) per micro-batch]
        return generation.engine_logp_diff([torch.tensor(e) for _, e in pairs], [torch.tensor(t) for t, _ in pairs])

    mean, top = diff([([-1.0, -2.0, -3.0], [-1.5, float("nan"), -3.0]), ([-0.1], [-0.4])])
    assert mean == pytest.approx((0.5 + 0.0 + 0.3) / 3) and top == pytest.approx(0.5)
    nothing = diff([([-1.0], [float("nan")])])
    assert all(x != x for x in nothing)


def test_a_tensor_the_sync_leaves_out_stops_the_run_before_the_update(checkpoint, toy_sft_file, world_of_one, tmp_path,
                                                                     monkeypatch):
    """The (fake) engine's model loads every weight but one at the first sync (step 1's: the GPU engine sleeps, its
    weights discarded): the sync's own check (generation._reload_weights, the parameters load_weights never
    reported) stops the run with one line before any update or log record. vLLM itself would only log it and sample
    from whatever the tensor's memory holds.
    tests/test_vllm_cpu.py breaks the real engine's sync in a way no name check sees."""
    vllm = fake_vllm.install(monkeypatch)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(rl, "grade", lambda texts, *a: ([float(i % 2) for i in range(len(texts))], 0))
    updates = []
    monkeypatch.setattr(rl, "policy_update", lambda *a: updates.append(1) or (torch.zeros(5, dtype=torch.float64), 0.0))
    args = rl.Args(model=str(checkpoint), train_file=str(toy_sft_file), out_dir=str(tmp_path), steps=3,
                   prompts_per_step=2, rollouts=2, mini_batch=1, micro_batch=8, max_prompt_len=512, max_response_len=6,
                   bf16=False, grad_ckpt=False, loss_chunk=512, engine="vllm", save_every=0, seed=0)
    real = generation.load_engine

    def engine_that_skips(*a, **kw):
        engine, tok = real(*a, **kw)
        vllm.engines[-1].skip_on_load = "model.layers.1.mlp.down_proj.weight"
        return engine, tok

    monkeypatch.setattr(generation, "load_engine", engine_that_skips)
    with pytest.raises(SystemExit) as stop:
        rl.train(args, world_of_one)
    assert str(stop.value) == ("step 1: weight sync: 1 engine parameters got no weight, e.g. "
                               "'model.layers.1.mlp.down_proj.weight'; nothing after step 0 is saved")
    assert not updates and not (tmp_path / "log.jsonl").read_text()
    run_dir.release()                                # what the process's exit does (the next test's run_dir)


# ---------------------------------------------------------------- the engine check's limit, from the run
def x3_from_the_second_load(monkeypatch):
    """A fault in the sync: layer 0's mlp.down_proj.weight delivered three times too large at every sync, i.e.
    from the engine's second load on (the HF engine's first is from the checkpoint); every parameter still
    loaded, so no name check sees it."""
    buckets = generation.full_weight_buckets

    def scaled(model, dtype, bucket_bytes):
        for bucket in buckets(model, dtype, bucket_bytes):
            yield [(name, t * 3 if name == "model.layers.0.mlp.down_proj.weight" else t) for name, t in bucket]
    monkeypatch.setattr(generation, "full_weight_buckets", scaled)


def engine_check_args(checkpoint, toy_sft_file, out, **kw):
    return dataclasses.replace(rl.Args(), **{
        "model": str(checkpoint), "train_file": str(toy_sft_file), "out_dir": str(out), "steps": 4,
        "prompts_per_step": 4, "rollouts": 4, "mini_batch": 2, "micro_batch": 8, "max_prompt_len": 512,
        "max_response_len": 16, "lr": 1e-3, "bf16": False, "grad_ckpt": False, "loss_chunk": 256, "engine": "hf",
        "save_every": 0, **kw})


def test_the_engine_check_lets_healthy_runs_through(checkpoint, toy_sft_file, world_of_one, tmp_path, capsys):
    """Healthy runs, 3 seeds x top_p 1, 0.95, 0.7 (and one at temperature 0.7, where the trainer's log-probs for
    the check are a second pass at temperature 1, as the engine's raw ones are), 4 steps each: none stops, and
    every step's mean difference stays near step 1's (the floor generation.ENGINE_FLOOR_FACTOR multiplies)."""
    ratios, floors = [], []
    for seed, top_p, temperature in [(s, p, 1.0) for s in range(3) for p in (1.0, 0.95, 0.7)] + [(0, 0.95, 0.7)]:
        args = engine_check_args(checkpoint, toy_sft_file, tmp_path / f"{seed}_{top_p}_{temperature}", seed=seed,
                                 top_p=top_p, temperature=temperature)
        means = [r["engine_logp_diff_mean"] for r in rl.train(args, world_of_one, reward_fn=in_lower_quarter)]
        assert len(means) == 4 and 0 < means[0] < 1e-6, means            # float32: numerics only
        ratios.append(max(means[1:]) / means[0])
        floors.append(means[0])
    with capsys.disabled():
        print(f"\nthe engine check, {len(ratios)} healthy runs: step 1's mean difference {min(floors):.2g} to "
              f"{max(floors):.2g} nats; later steps' / step 1's at most {max(ratios):.2f}")
    assert max(ratios) < generation.ENGINE_FLOOR_FACTOR / 3


@pytest.mark.parametrize("top_p", [1.0, 0.95])
def test_the_engine_check_stops_a_stale_weight_at_the_step_it_first_shows(top_p, checkpoint, toy_sft_file,
                                                                         world_of_one, tmp_path, monkeypatch):
    """The x3 fault: step 2's rollouts, the first from a sync, differ from the trainer's by hundredths of a nat
    (some 1e5 times step 1's), under the fixed --engine_logp_tol: the run stops there with one line, before the
    update, nothing of step 2 logged. top_p adds nothing: both sides' log-probs are the model's before it."""
    x3_from_the_second_load(monkeypatch)
    args = engine_check_args(checkpoint, toy_sft_file, tmp_path, top_p=top_p)
    with pytest.raises(SystemExit) as stop:
        rl.train(args, world_of_one, reward_fn=in_lower_quarter)
    said = str(stop.value)
    assert said.startswith("step 2: the engine's log-probs of its samples differ from the trainer's by ") and \
        "a weight the sync missed or left stale; stopped before the update; nothing after step 0 is saved" in said
    mean = float(said.split(" by ")[1].split(" nats")[0])
    assert 1e-3 < mean < args.engine_logp_tol and "\n" not in said, said
    assert [json.loads(line)["step"] for line in (tmp_path / "log.jsonl").read_text().splitlines()] == [1]
    run_dir.release()


def test_a_resumed_run_keeps_the_engine_floor_of_its_step_1(checkpoint, toy_sft_file, world_of_one, tmp_path,
                                                           monkeypatch):
    """The floor is step 1's, saved in every checkpoint (state.json): a run resumed at step 2 whose first sync
    goes wrong stops at step 3, where a floor measured at the resumed run's own first step would have taken the
    fault for numerics."""
    args = engine_check_args(checkpoint, toy_sft_file, tmp_path, steps=2)
    first = rl.train(args, world_of_one, reward_fn=in_lower_quarter)
    state = json.loads((tmp_path / "step_000002" / "state.json").read_text())
    assert state == {"step": 2, "engine_logp_floor": first[0]["engine_logp_diff_mean"]}
    x3_from_the_second_load(monkeypatch)          # the resumed engine's first load is the checkpoint's: a sync
    args.steps = 4
    with pytest.raises(SystemExit, match=r"^step 3: the engine's log-probs .* step 1's "
                                         rf"{first[0]['engine_logp_diff_mean']:.3g}, "):
        rl.train(args, world_of_one, reward_fn=in_lower_quarter)
    run_dir.release()


VLLM_SYNC_SCRIPT = r"""
import sys, torch
sys.path.insert(0, {repo!r})
import rl
from plumbing import distributed, generation, models
rank, world, device = distributed.setup_distributed()
engine, tok = generation.load_engine({ckpt!r}, "vllm", dtype="bfloat16", seed=rank, tensor_parallel_size=1,
                                   distributed_executor_backend="external_launcher", gpu_memory_utilization=0.2,
                                   max_model_len=1024)
model = models.shard_model(models.load_full_model({ckpt!r}, scratch=False, seed=0), device, bf16=True, grad_ckpt=False)
for p in model.parameters():                                        # stands in for an optimiser step
    p.data.add_(0.01)
generation.sync_weights(model, engine)
full = {{k: v.to(device, torch.bfloat16) for k, v in models.full_state_dict(model).items()}}
got = engine.model.apply_model(lambda m: {{k: v.detach().clone() for k, v in m.named_parameters()}})[0]
for i in range(model.config.num_hidden_layers):
    a = f"model.layers.{{i}}.self_attn."
    assert torch.equal(got[a + "qkv_proj.weight"], torch.cat([full[a + x + "_proj.weight"] for x in "qkv"]))
    assert torch.equal(got[a + "o_proj.weight"], full[a + "o_proj.weight"])
    m = f"model.layers.{{i}}.mlp."
    gate_up = torch.cat([full[m + x + "_proj.weight"] for x in ("gate", "up")])
    assert torch.equal(got[m + "gate_up_proj.weight"], gate_up)
for k in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
    assert torch.equal(got[k][: len(full[k])], full[k]), k   # vLLM pads the vocabulary to a multiple of 64
print("VLLM SYNC OK")
distributed.shutdown()
"""


@pytest.mark.gpu
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None or not torch.cuda.is_available(),
                    reason="needs vllm and CUDA")
def test_sync_weights_moves_the_trainers_weights_into_vllm(checkpoint, tmp_path):
    script = tmp_path / "vllm_sync.py"
    script.write_text(VLLM_SYNC_SCRIPT.format(repo=str(REPO), ckpt=str(checkpoint)))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", str(script)],
                          cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0 and "VLLM SYNC OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


STEP_SCRIPT = r"""
import json, sys, torch
sys.path.insert(0, {repo!r})
import chunked_logits, data, rl
from plumbing import distributed, generation, models
from safetensors.torch import save_file
rank, world, device = distributed.setup_distributed()
ckpt, out = sys.argv[1], sys.argv[2]
model = models.shard_model(models.load_full_model(ckpt, scratch=False, seed=0), device, bf16=False, grad_ckpt=False)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
args = rl.Args(micro_batch=2, loss_chunk=4)
g = torch.Generator().manual_seed(0)
seqs = []                                          # 8 sequences of varied lengths, the same in every run
for i in range(8):
    prompt = torch.randint(3, 300, (5 + i,), generator=g).tolist()
    response = torch.randint(3, 300, (2 + (5 * i) % 7,), generator=g).tolist()
    seqs.append((prompt + response, [0] * len(prompt) + [1] * len(response), 0.3 * i - 1.0))
mine = seqs[rank * 8 // world : (rank + 1) * 8 // world]  # this rank's share
mbs = []
for k in range(0, len(mine), args.micro_batch):
    part = mine[k : k + args.micro_batch]
    batch = data.collate([(ids, mask) for ids, mask, _ in part], 0)
    adv = torch.tensor([a for _, mask, a in part for _ in range(sum(mask))])
    old, ent = chunked_logits.token_log_probs(model, batch, args.loss_chunk, args.temperature)
    mbs.append(rl.MicroBatch(batch, adv, old + torch.linspace(-0.4, 0.4, len(old)), ent))   # both sides of the clip
model.reshard()
sums, grad_norm = rl.policy_update(model, optimizer, mbs, args, device)
torch.distributed.all_reduce(sums)
full = models.full_state_dict(model)
engine, _ = generation.load_engine(ckpt, "hf", "float32")     # each rank's own engine, synced from the shards
generation.sync_weights(model, engine)
everyone = {{k: v.full_tensor() for k, v in model.state_dict().items()}}
assert all(torch.equal(engine.model.state_dict()[k], v) for k, v in everyone.items()), rank
if rank == 0:
    save_file({{k: v.contiguous() for k, v in full.items()}}, out + "/weights.safetensors")
    open(out + "/step.json", "w").write(json.dumps({{"sums": sums.tolist(), "grad_norm": grad_norm}}))
distributed.shutdown()
"""


def test_an_optimiser_step_on_two_ranks_equals_one_process(checkpoint, tmp_path):
    """The same 8 sequences in one process, or 4 per rank on 2 gloo ranks with FSDP2: the same token-mean loss,
    clip counts, gradient norm and updated weights; each rank's engine receives the full weights."""
    from safetensors.torch import load_file

    script = tmp_path / "step.py"
    script.write_text(STEP_SCRIPT.format(repo=str(REPO)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    results = []
    for nproc in (1, 2):
        out = tmp_path / f"n{nproc}"
        out.mkdir()
        launch = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
        launch = launch if nproc == 2 else []
        proc = run_python([*launch, script, checkpoint, out], env=env, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        results.append((json.loads((out / "step.json").read_text()), load_file(out / "weights.safetensors")))
    (one, w1), (two, w2) = results
    assert one["sums"][4] == two["sums"][4] > 0                                   # the same response tokens
    assert one["sums"][1] + one["sums"][2] > 0                                    # some tokens were clipped
    assert one["sums"][1:3] == two["sums"][1:3]
    assert two["sums"][0] == pytest.approx(one["sums"][0], rel=1e-5, abs=1e-6)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-5, atol=1e-6)


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- the loop: a learnable toy reward, resume
def in_lower_quarter(samples, examples):
    """Toy reward: the fraction of response tokens whose id is a multiple of 4 (about 1/4 at random init)."""
    return [sum(t % 4 == 0 for t in s.token_ids) / len(s.token_ids) for s in samples], 0


def toy_reward_of(path):
    """Mean toy reward of 128 samples (16 prompts x 8) from a checkpoint, fixed seed."""
    engine, tok = generation.load_engine(str(path), "hf", "float32")
    prompts = [data.build_prompt(f"What is {i}+{2 * i}?", tok) for i in range(16)]
    out = generation.generate(engine, tok, prompts, 8, 1.0, 1.0, 8, seed=123, batch_size=16)
    return sum(in_lower_quarter([s for g in out for s in g], None)[0]) / 128


def test_grpo_raises_a_toy_reward_and_resumes_exactly(checkpoint, toy_sft_file, world_of_one, tmp_path, capsys):
    args = rl.Args(model=str(checkpoint), train_file=str(toy_sft_file), out_dir=str(tmp_path / "a"), steps=6,
                   prompts_per_step=2, rollouts=8, mini_batch=1, micro_batch=16, max_prompt_len=512,
                   max_response_len=8, lr=3e-2, top_p=1.0, bf16=False, grad_ckpt=False, loss_chunk=512,
                   engine="hf", save_every=4, seed=0)
    records = rl.train(args, world_of_one, reward_fn=in_lower_quarter)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    rewards = [r["reward_mean"] for r in records]
    assert sum(rewards[-2:]) / 2 > sum(rewards[:2]) / 2 + 0.1, rewards
    before, after = toy_reward_of(checkpoint), toy_reward_of(tmp_path / "a" / "step_000006")
    assert after > before + 0.15, (before, after)
    for r in records:          # the logged diagnostics exist and are sane
        assert 0 <= r["clip_frac_low"] <= 1 and 0 <= r["clip_frac_high"] <= 1 and r["approx_kl"] >= 0
        assert r["entropy"] > 0 and r["response_length"] <= 8 and r["zero_std_frac"] == 0.0
    assert any(r["clip_frac_low"] + r["clip_frac_high"] > 0 for r in records)
    logged = [json.loads(line) for line in (tmp_path / "a" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [1, 2, 3, 4, 5, 6]
    # rollouts.jsonl keeps --log_rollouts 2 groups a step: here all of them, so they add up to the step's record
    kept = [json.loads(line) for line in (tmp_path / "a" / "rollouts.jsonl").read_text().splitlines()]
    assert [g["step"] for g in kept] == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6]
    for record, groups in zip(records, zip(kept[::2], kept[1::2])):
        rewards = torch.tensor([g["rewards"] for g in groups])
        assert rewards.mean().item() == pytest.approx(record["reward_mean"])
        assert torch.equal(torch.tensor([g["advantages"] for g in groups]), rl.group_advantages(rewards)[0])
        for g in groups:
            assert len(g["responses"]) == len(g["finish_reasons"]) == len(g["lengths"]) == 8
            assert "<|im_start|>assistant" in g["prompt"] and set(g["finish_reasons"]) <= {"stop", "length"}

    # resume from the step-4 checkpoint: steps 5 and 6 repeat exactly (same prompts, samples, updates), and
    # rollouts.jsonl is cut back to step 4 before they are written again
    (tmp_path / "b").mkdir()
    shutil.copytree(tmp_path / "a" / "step_000004", tmp_path / "b" / "step_000004")
    shutil.copy(tmp_path / "a" / "rollouts.jsonl", tmp_path / "b" / "rollouts.jsonl")
    args.out_dir = str(tmp_path / "b")
    resumed = rl.train(args, world_of_one, reward_fn=in_lower_quarter)
    assert [r["step"] for r in resumed] == [5, 6]
    assert (tmp_path / "b" / "rollouts.jsonl").read_text() == (tmp_path / "a" / "rollouts.jsonl").read_text()
    for a, b in zip(records[4:], resumed):
        untimed = [{k: v for k, v in r.items() if not k.endswith("_s")} for r in (a, b)]
        assert untimed[0] == untimed[1]
    from safetensors.torch import load_file
    wa, wb = (load_file(tmp_path / d / "step_000006" / "model.safetensors") for d in "ab")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # run again, finished: it says so from its record, loads nothing and writes nothing
    log, _ = (tmp_path / "b" / "log.jsonl").read_text(), capsys.readouterr()
    assert rl.train(args, world_of_one, reward_fn=in_lower_quarter) == []
    said = capsys.readouterr().out
    assert "complete at step 6 of 6; nothing to train" in said and "resumed from" not in said, said
    assert (tmp_path / "b" / "log.jsonl").read_text() == log and json.loads(
        (tmp_path / "b" / "complete.json").read_text()) == {"step": 6}


# ---------------------------------------------------------------- the command line
def test_command_line_run_writes_its_log_and_an_hf_checkpoint(checkpoint, toy_sft_file, tmp_path):
    out = tmp_path / "out"
    proc = run_python(["rl.py", "config/rl_tiny.py", "--model", checkpoint, "--train_file", toy_sft_file,
                       "--out_dir", out, "--steps", "2", "--rollouts", "2", "--max_response_len", "12",
                       "--grader_workers", "1", "--log_rollouts", "1"],
                      env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2]
    assert [json.loads(line)["step"] for line in (out / "rollouts.jsonl").read_text().splitlines()] == [1, 2]
    for key in ("reward_mean", "accuracy", "zero_std_frac", "response_length", "entropy", "clip_frac_low",
                "clip_frac_high", "approx_kl", "grad_norm", "gen_s", "train_s"):
        assert key in log[0], key
    assert json.loads((out / "run_config.json").read_text())["prompts_per_step"] == 8       # from config/rl_tiny.py
    from transformers import AutoModelForCausalLM, AutoTokenizer
    ckpt = checkpoints.latest(out)
    assert ckpt.name == "step_000002" and json.loads((ckpt / "state.json").read_text()).keys() == {
        "step", "engine_logp_floor"} and json.loads((ckpt / "state.json").read_text())["step"] == 2
    AutoModelForCausalLM.from_pretrained(ckpt)
    AutoTokenizer.from_pretrained(ckpt)
