"""Table 3's hybrids (hybrid.py, rl.py --hybrid) against their authors' code: the per-token losses,
their gradients and the micro-batch's loss as LUFFY's and RL-PLUS's functions compute them
(transcribed below from their repositories, with file and line), the advantages, the expert's
response as a rollout, and whole rl.py runs that resume exactly after SIGTERM."""
import dataclasses
import json
import math

import numpy as np
import pytest
import torch

import chunked_logits
import curio_loss as cl
import data
import hybrid
import rl
from test_reliability import stop_at, untimed_log

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------------------
# The authors' functions, transcribed. LUFFY: github.com/ElliottYan/LUFFY 01f4ae0, under
# luffy/verl/verl/. RL-PLUS: github.com/YihongDong/RL-PLUS eb4aa4d, under rl_plus/verl/verl/.
# Their settings: loss_remove_clip=True, loss_remove_token_mean=True, no off-policy clips.
# ------------------------------------------------------------------------------------------------
def theirs_policy_loss(old_log_prob, log_prob, advantages, eos_mask, prefix_mask, strategy):
    """LUFFY mix_src/mix_core_alg.py lines 119-123, 149, 165, 174-175, 208, 214-215, 233-234
    (off_policy_reshape "p_div_p_0.1"); RL-PLUS recipe/rlplus_core_alg.py lines 111-116, 132-137,
    165-167, 175-176, 194-195 (off_policy_strategy "RL-PLUS"). Returns (pg_loss, pg_losses)."""
    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    on_pg_losses = -advantages * ratio
    off_ratio = torch.exp(log_prob)
    if strategy == "luffy":
        off_ratio = off_ratio / (off_ratio + 0.1)
        off_pg_losses = -advantages * off_ratio
    else:
        omiga_prob = 0.5 * (torch.exp(old_log_prob) + 1)
        off_ratio = 2 * torch.exp(log_prob) / (torch.exp(old_log_prob) + omiga_prob)
        detached_log_prob = log_prob.detach()
        explosion_based_advantages = advantages * (1 - torch.exp(detached_log_prob)) ** (0.5)
        off_pg_losses = -off_ratio * explosion_based_advantages
    prefix_mask = prefix_mask.float()
    pg_losses = off_pg_losses * prefix_mask + on_pg_losses * (1 - prefix_mask)
    pg_loss = (pg_losses * eos_mask).sum() / eos_mask.shape[-1]
    return pg_loss, pg_losses


def theirs_micro_batch_loss(pg_loss, entropy, eos_mask, entropy_coeff=0.001):
    """LUFFY mix_src/mix_actor.py lines 202, 226, 243 (gradient accumulation 1); masked_mean is
    utils/torch_functional.py lines 107-109."""
    entropy_loss = (entropy * eos_mask).sum() / eos_mask.sum()
    return pg_loss - entropy_loss * entropy_coeff


def theirs_advantages(scores, use_std=False, epsilon=1e-6):
    """trainer/ppo/core_algos.py lines 110-158 (both repositories), one group: mean 0, std 1 for a
    group of one; train.sh line 82 sets grpo_use_std=False."""
    if len(scores) == 1:
        mean, std = torch.tensor(0.0), torch.tensor(1.0)
    else:
        mean, std = torch.mean(scores), torch.std(torch.stack([scores]))
    return (scores - mean) / (std + epsilon) if use_std else scores - mean


# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["luffy", "rl_plus"])
def test_per_token_losses_and_gradients_equal_the_authors(name):
    """4 responses of up to 5 tokens, the first the expert's; ratios and probabilities spread."""
    g = torch.Generator().manual_seed(0)
    eos_mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0.]])
    prefix = torch.zeros(4, 5, dtype=torch.bool)
    prefix[0, :4] = True
    adv = torch.tensor([0.5, 0.5, -0.5, -0.5])[:, None] * eos_mask
    old = -torch.rand(4, 5, generator=g) * 3
    lp_theirs = (old + 0.4 * torch.randn(4, 5, generator=g)).clamp(max=0).requires_grad_()
    pg_loss, pg_losses = theirs_policy_loss(old, lp_theirs, adv, eos_mask, prefix, name)
    pg_loss.backward()

    sel = eos_mask.bool()                      # the project's view: the N response tokens, flat
    lp = lp_theirs.detach()[sel].clone().requires_grad_()
    args = rl.Args(hybrid=name)
    own, diag = rl.policy_loss_fn(args)(lp, old[sel], adv[sel], args)
    loss = torch.where(prefix[sel], hybrid.demonstration_loss(name, lp, old[sel], adv[sel]), own)
    torch.testing.assert_close(loss, pg_losses[sel], rtol=0, atol=0)
    (loss.sum() / eos_mask.shape[-1]).backward()
    torch.testing.assert_close(lp.grad, lp_theirs.grad[sel], rtol=1e-6, atol=0)
    assert diag["clip_low"].sum() == diag["clip_high"].sum() == 0   # nothing is clipped
    p = lp.detach().exp()
    if name == "luffy":           # the shaped gradient: -A 0.1 p / (p + 0.1)^2 on the expert's tokens
        want = -adv[sel] * 0.1 * p / (p + 0.1) ** 2 / 5
    else:                         # -A sqrt(1 - p) p / (0.75 p_old + 0.25)
        want = -adv[sel] * (1 - p).sqrt() * p / (0.75 * old[sel].exp() + 0.25) / 5
    torch.testing.assert_close(lp.grad[prefix[sel]], want[prefix[sel]], rtol=1e-5, atol=1e-7)


def test_advantages_without_std_equal_the_authors():
    for scores in ([1.0, 0, 0, 0, 0, 0, 0, 0], [1.0, 1, 0, 1], [0.0, 0], [1.0]):
        r = torch.tensor(scores)
        ours, zero = rl.group_advantages(r[None], use_std=False)
        torch.testing.assert_close(ours[0], theirs_advantages(r), rtol=0, atol=1e-7)
        assert bool(zero[0]) == bool((theirs_advantages(r) == 0).all())
    with_std, _ = rl.group_advantages(torch.tensor([[1.0, 1, 0, 1]]))
    torch.testing.assert_close(with_std[0], theirs_advantages(torch.tensor([1.0, 1, 0, 1]), True))


@pytest.mark.parametrize("name", ["luffy", "rl_plus"])
def test_a_micro_batch_update_equals_the_authors_loss(name, checkpoint, world_of_one):
    """policy_update on one micro-batch (the expert's response and two samples) with
    --loss_agg rank_sum_over_max_len and --entropy_coef 0.001, as their one GPU with one
    micro-batch would run it: the gradient of their micro-batch loss (token sum / max_response_len
    - 0.001 x the token-mean entropy)."""
    from transformers import AutoTokenizer

    from test_rl import GradCapture, fsdp_model, padded_batch

    tok = AutoTokenizer.from_pretrained(checkpoint)
    model = fsdp_model(checkpoint)
    args = rl.Args(hybrid=name, adv_std=False, loss_agg="rank_sum_over_max_len", loss_agg_ranks=1,
                   entropy_coef=0.001, max_response_len=6, grad_clip=1e9, loss_chunk=4)
    responses = [[11, 12, 13, 14, tok.eos_token_id], [21, 22, 23], [31, 32, 33, 34, 35, 36]]
    batch, _ = padded_batch(tok, responses)
    eos_mask = torch.zeros(3, 6)
    for i, r in enumerate(responses):
        eos_mask[i, : len(r)] = 1
    sel = eos_mask.bool()
    adv = (torch.tensor([1.0, 0.0, -1.0]) - 0.25)[:, None].expand(3, 6)
    prefix = torch.zeros(3, 6, dtype=torch.bool)
    prefix[0] = True
    old, _ = chunked_logits.token_log_probs(model, batch, args.loss_chunk)
    old = old + torch.linspace(-0.3, 0.3, len(old))                # off-policy for the samples
    model.reshard()
    mb = rl.MicroBatch(batch, adv[sel].contiguous(), old, None, prefix[sel].contiguous())
    capture = GradCapture(model.parameters())
    sums, _ = rl.policy_update(model, capture, [mb], args, torch.device("cpu"))

    # theirs, on [responses, max_response_len] tensors from the same model's full forward
    logits = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    keep = batch["loss_mask"][:, 1:].bool()              # the response tokens, as select_targets
    lp_flat = logits.log_softmax(-1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0][keep]
    ent_flat = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)[keep]
    lp, ent = (torch.zeros(3, 6).masked_scatter(sel, x) for x in (lp_flat, ent_flat))
    old_b = torch.zeros(3, 6).masked_scatter(sel, old)
    pg_loss, _ = theirs_policy_loss(old_b, lp, adv * eos_mask, eos_mask, prefix, name)
    theirs_micro_batch_loss(pg_loss, ent, eos_mask).backward()
    want = [p.grad.full_tensor() for p in model.parameters()]
    for got, w in zip(capture.grads, want):
        torch.testing.assert_close(got, w, rtol=1e-4, atol=1e-7)      # float32, other sum orders
    assert sums[4] == int(eos_mask.sum())


def test_the_entropy_bonus_sums_as_many_token_means_as_their_gpus_would(world_of_one):
    """Their GPUs pack micro-batches of up to 32768 tokens, one entropy mean each, as many on each of
    their 8 as the fullest needs: 8 x ceil(tokens / (8 x 32768)) means in all. Ours has its own
    micro-batches; the scale is their count over ours."""
    def mbs(lengths):
        return [rl.MicroBatch(data.collate([([1] * n, [0] + [1] * (n - 1))], 0),
                              torch.zeros(n - 1)) for n in lengths]

    args = rl.Args(entropy_coef=0.001, loss_agg="rank_sum_over_max_len")
    cpu = torch.device("cpu")
    assert hybrid.entropy_bonus_scale(mbs([100, 50]), args, cpu) == 8 / 2     # theirs: 1 on each GPU
    big = [9000] * 40                                   # 360,000 tokens: 2 on each of their 8
    assert hybrid.entropy_bonus_scale(mbs(big), args, cpu) == 16 / 40
    one_gpu = rl.Args(entropy_coef=0.001, loss_agg="rank_sum_over_max_len", loss_agg_ranks=1,
                      entropy_pack_tokens=60)
    assert hybrid.entropy_bonus_scale(mbs([100, 50]), one_gpu, cpu) == 3 / 2  # ceil(150 / 60)
    assert hybrid.entropy_bonus_scale(mbs([100]), rl.Args(), cpu) is None


def test_the_expert_flag_follows_its_tokens_through_the_length_sort(world_of_one):
    """rl.micro_batches sorts sequences by length: each token of the expert's response (ids 900+, the
    shortest in its group here) is flagged, and no sampled token is."""
    from plumbing.generation import Sample

    samples = [[Sample([900 + i] * 2, "", None, None, "stop")]
               + [Sample([100 + i] * (3 + j), "", None, None, "stop") for j in range(3)]
               for i in range(2)]
    adv = torch.arange(8.0).view(2, 4)
    args = rl.Args(hybrid="luffy", rollouts=4, mini_batch=2, micro_batch=3)
    (mbs,) = rl.micro_batches([[1, 2], [3]], samples, adv.tolist(), args, 0, torch.device("cpu"))
    flagged = 0
    for mb in mbs:
        _, y = chunked_logits.select_targets(torch.zeros(*mb.batch["input_ids"].shape, 1), mb.batch)
        assert torch.equal(mb.demo, y >= 900) and torch.equal(mb.adv[mb.demo], adv[y[mb.demo] - 900, 0])
        flagged += int(mb.demo.sum())
    assert flagged == 4


def test_the_experts_response_is_a_rollout_as_sft_trains_it(tiny_model_dir, toy_sft_file):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    examples = data.load_examples(toy_sft_file, require_response=True)[:2]
    full, cut = (hybrid.demonstrations(examples, tok, n) for n in (4096, 5))
    for ex, s, short in zip(examples, full, cut):
        ids, mask = data.tokenize_sft(tok, "", ex.response)
        assert s.token_ids == ids and s.token_ids[-1] == tok.eos_token_id and s.finish_reason == "stop"
        assert "</think>" in s.text and s.stop_text == tok.decode([tok.eos_token_id])
        assert short.token_ids == ids[:5] and short.finish_reason == "length" and short.stop_text == ""
    no_target = data.Example("q", "1", None, "toy", 7, file="train.jsonl")
    with pytest.raises(SystemExit, match="train.jsonl row 7: no expert response"):
        hybrid.demonstrations([no_target], tok, 10)


def test_bad_hybrid_settings_are_one_line_errors():
    with pytest.raises(SystemExit, match="--entropy_coef 0.001: needs --loss_agg rank_sum_over"):
        rl.Args(entropy_coef=0.001)
    with pytest.raises(SystemExit, match="--hybrid luffy: needs --rollouts >= 2"):
        rl.Args(hybrid="luffy", rollouts=1)
    with pytest.raises(SystemExit, match="--hybrid 'bogus': expected one of none, luffy, rl_plus, prefix_rft"):
        rl.Args(hybrid="bogus")
    with pytest.raises(SystemExit, match="--hybrid rl_plus: its own tokens' loss is unclipped"):
        rl.Args(hybrid="rl_plus", clip_ratio_c=3.0)


@pytest.mark.parametrize("preset", ["config/rl_luffy.py", "config/rl_plus.py"])
def test_each_hybrid_runs_end_to_end_and_resumes_exactly_after_sigterm(preset, checkpoint,
                                                                     toy_sft_file, tmp_path):
    """rl.py with the preset's algorithm at tiny size (its 8 GPUs' aggregation kept): the expert's
    response leads each group, is graded right, and a run stopped after step 1 of 3 and rerun
    ends where an uninterrupted one does, byte for byte."""
    flags = [preset, "config/rl_tiny.py", "--model", str(checkpoint), "--train_file", str(toy_sft_file),
             "--steps", "3", "--rollouts", "3", "--max_response_len", "48", "--grader_workers", "1",
             "--micro_batch", "2", "--mini_batch", "2", "--prompts_per_step", "2", "--lr", "1e-3",
             "--system_prompt", "paper", "--log_rollouts", "2"]
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    stop_at(0, "rl.py", whole, *flags, exit_status=0)
    stop_at(1, "rl.py", stopped, *flags)
    stop_at(0, "rl.py", stopped, *flags, exit_status=0)              # the same command resumes
    assert untimed_log(stopped) == untimed_log(whole) and len(untimed_log(whole)) == 3
    groups = [json.loads(line) for line in (whole / "rollouts.jsonl").read_text().splitlines()]
    assert all(g["rewards"][0] == 1.0 and "</think>" in g["responses"][0] and g["expert_first"]
               for g in groups)
    for r in untimed_log(whole):          # the expert's reward, 1, counted once per group of 3
        assert r["reward_mean"] == pytest.approx((1 + 2 * r["own_reward_mean"]) / 3)
    assert any(len(set(g["rewards"])) > 1 for g in groups)            # the updates have a signal
    weights = [(out / "step_000003" / "model.safetensors").read_bytes() for out in (whole, stopped)]
    assert weights[0] == weights[1]


# ------------------------------------------------------------------------------------------------
# Prefix-RFT: its authors' functions, transcribed. github.com/ZeroYuHuang/prefix_rft 5f5d2a1, under
# recipe/prefix_rft/. Their settings here: one continuation per prefix (rollout.n = 1), the off-policy
# clips left to default to the on-policy ones, enable_clip=True, min_prefix_len 0.
# ------------------------------------------------------------------------------------------------
EMPTY = "0000-0000-0000-0000"


def theirs_prefix_advantage(token_level_rewards, response_mask, prefix_mask, index, prefix_index,
                            num_rollouts_per_prefix):
    """core_algos.py lines 262-308, compute_dr_grpo_prefix_outcome_advantage."""
    from collections import defaultdict

    scores = token_level_rewards.sum(dim=-1)
    p_scores = torch.zeros_like(scores)
    id2prefix_id2score = defaultdict(lambda: defaultdict(list))
    id2prefix_id2mean = defaultdict(dict)
    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            id2prefix_id2score[index[i]][prefix_index[i]].append(scores[i])
        for idx in id2prefix_id2score:
            prefix_id2score = id2prefix_id2score[idx]
            for prefix_id in prefix_id2score:
                if len(prefix_id2score[prefix_id]) == 1:
                    id2prefix_id2mean[idx][prefix_id] = torch.tensor(0.0)
                else:
                    id2prefix_id2mean[idx][prefix_id] = torch.mean(torch.tensor(prefix_id2score[prefix_id]))
        for i in range(bsz):
            scores[i] = (scores[i] - id2prefix_id2mean[index[i]][prefix_index[i]])
        for i in range(bsz):
            if prefix_index[i] != EMPTY:
                p_scores[i] = scores[i] - id2prefix_id2mean[index[i]][EMPTY]
        scores = scores.unsqueeze(-1) * response_mask
        p_scores = p_scores.unsqueeze(-1) / num_rollouts_per_prefix * prefix_mask
        scores = torch.where(prefix_mask.bool(), p_scores, scores)
    return scores


def theirs_entropy_reshape(adv, prefix_mask, entropy, entropy_mask_ratio):
    """dp_actor.py lines 98-103, 132-157 (the `entropy` reshaper), its mask ratio a constant."""
    prefix_mask = prefix_mask.bool()
    if adv[prefix_mask].numel() == 0:
        return adv
    entropy = entropy[prefix_mask]
    _, indices = torch.sort(entropy)
    split_point = int(len(indices) * entropy_mask_ratio)
    bottom_n_percent_indices = indices[:split_point]
    adv_mask = torch.ones_like(adv, dtype=torch.bool)
    arange_tensor = torch.arange(len(adv[prefix_mask]))
    isin_mask = torch.isin(arange_tensor, bottom_n_percent_indices)
    adv_mask[prefix_mask] &= ~isin_mask
    adv[~adv_mask] = 0
    return adv


def theirs_prefix_policy_loss(old_log_prob, log_prob, advantages, response_mask, prefix_mask,
                              cliprange=0.2, clip_ratio_c=3.0, max_tokens=None):
    """core_algos.py lines 593-644 (compute_policy_loss, enable_clip=True, off-policy clips unset)
    with agg_loss "dr_grpo" (lines 533-536). Returns (pg_loss, pg_losses)."""
    cliprange_low = cliprange_high = cliprange_low_off = cliprange_high_off = cliprange
    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    off_pg_losses = pg_losses1
    off_pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low_off, 1 + cliprange_high_off)
    off_clip_pg_losses1 = torch.maximum(off_pg_losses, off_pg_losses2)
    off_pg_losses3 = -advantages * clip_ratio_c
    off_clip_pg_losses2 = torch.min(off_pg_losses3, off_clip_pg_losses1)
    off_pg_losses = torch.where(advantages < 0, off_clip_pg_losses2, off_clip_pg_losses1)
    # enable_clip: the prefix tokens' off_pg_losses are computed and, as in theirs, never used
    seq_losses = torch.sum(pg_losses * response_mask, dim=-1)
    return torch.sum(seq_losses) / max_tokens, pg_losses


def theirs_bound(kind, init, target, step, n_steps, warmup_ratio):
    """scheduler/global_step.py: ConstController lines 5-14, LinearDecayController 20-50,
    CosineDecayController 148-186."""
    if kind == "const":
        return init
    warmup_steps = int(n_steps * warmup_ratio) if kind == "linear_decay" else int(warmup_ratio * n_steps)
    if step < warmup_steps:
        return (step / warmup_steps) * init
    cur = step - warmup_steps
    if kind == "linear_decay":
        if cur >= n_steps:
            return target
        return target + (1.0 - (cur / n_steps)) * (init - target)
    if cur > n_steps:
        return target
    decay_ratio = 0.5 * (1 + math.cos(math.pi * cur / n_steps))
    if init > target:
        return target + decay_ratio * (init - target)
    return init + (1 - decay_ratio) * (target - init)


def theirs_beta_sample(low, high, out):
    """global_step.py lines 268-275 (BetaSampler.value), with out = np.random.beta(1, 1)."""
    lower, higher = min(low, high), max(low, high)
    return lower + (higher - lower) * out


def theirs_prefix_len(prefix_ratio, demo_len, min_prefix_len=0):
    """rl_dataset.py lines 287-303 (_get_prefix), the length it returns."""
    if prefix_ratio == 0 or demo_len == 0:
        return 0
    prefix_len = int(prefix_ratio * demo_len)
    if prefix_len < min_prefix_len:
        prefix_len = min_prefix_len
    if prefix_len >= demo_len:
        prefix_len = demo_len - 1
    return prefix_len


# ------------------------------------------------------------------------------------------------
def random_prefix_groups(g, groups=6, n=8, k=2, length=7):
    """Groups of n rollouts (the last k prefixed, some by a prefix of 0 tokens, i.e. unprefixed, as
    theirs counts them), response lengths 1..length, prefix lengths below them."""
    lengths = torch.randint(1, length + 1, (groups, n), generator=g)
    prefix = torch.zeros(groups, n, dtype=torch.long)
    prefix[:, n - k:] = torch.randint(0, length, (groups, k), generator=g)
    prefix = torch.minimum(prefix, lengths - 1)
    return lengths, prefix


@pytest.mark.parametrize("rewards", ["binary", "real"])
@pytest.mark.parametrize("n", [8, 3])                  # 3: some groups have one unprefixed rollout
def test_prefix_advantages_equal_the_authors(rewards, n):
    g = torch.Generator().manual_seed(1)
    groups, length = 6, 7
    lengths, prefix = random_prefix_groups(g, groups, n)
    lengths[1, -2:], lengths[3, -1] = 5, 5
    prefix[0, -1], prefix[1, -2:], prefix[3, -1] = 0, 3, 2   # a prefixed slot of 0 tokens; real ones
    r = torch.rand(groups, n, generator=g)
    r = (r > 0.5).float() if rewards == "binary" else r
    r[2], r[3] = 0.0, 1.0        # all wrong: no signal; all right: a prefixed continuation's r = 1
    adv, demo_adv, zero = hybrid.prefix_rft_advantages(r, prefix > 0)

    pos = torch.arange(length)
    response_mask = (pos < lengths.view(-1, 1)).float()                 # [groups * n, length]
    prefix_mask = (pos < prefix.view(-1, 1)).long()
    token_rewards = torch.zeros(groups * n, length)
    token_rewards[torch.arange(groups * n), lengths.view(-1) - 1] = r.view(-1)
    index = [f"q{i}" for i in range(groups) for _ in range(n)]
    prefix_index = [f"p{i}" if p > 0 else EMPTY for i, p in enumerate(prefix.view(-1).tolist())]
    want = theirs_prefix_advantage(token_rewards, response_mask, prefix_mask, index, prefix_index, 1)
    ours = torch.where(prefix_mask.bool(), demo_adv.view(-1, 1), adv.view(-1, 1)) * response_mask
    torch.testing.assert_close(ours, want, rtol=0, atol=0)
    assert zero.tolist() == [bool((want[i * n:(i + 1) * n] == 0).all()) for i in range(groups)]
    assert zero[2] and not zero[3] and adv[3, -1] == 1       # their mean of a group of one is 0
    if n == 3:                                               # one unprefixed: its own mean is 0 too
        assert torch.equal(adv[1, 0], r[1, 0]) and torch.equal(demo_adv[1, 1:], r[1, 1:])
    # not the _v2 estimator: a prefix whose continuation is right is pushed up, one that fails down
    right = (prefix > 0) & (r == 1)
    assert (demo_adv[right] >= 0).all() and (demo_adv[(prefix > 0) & (r == 0)] <= 0).all()


@pytest.mark.parametrize("mask_ratio", [0.8, 0.5, 0.0, 1.0])
def test_the_entropy_rule_equals_the_authors_reshaper(mask_ratio, world_of_one):
    """A micro-batch of 5 responses, 3 with prefixes: the advantage of the lowest-entropy share of
    its prefix tokens is zeroed, the rest kept, as their reshaper does on [B, L] tensors. The
    entropies come from logits through the project's path (an lm_head of identity)."""
    g = torch.Generator().manual_seed(2)
    lengths, prefix = random_prefix_groups(g, 1, 5, 3, 9)
    response_mask = torch.arange(9) < lengths.view(-1, 1)
    prefix_mask = (torch.arange(9) < prefix.view(-1, 1)) & response_mask
    logits = torch.randn(5, 9, 11, generator=g) * 3
    adv = torch.randn(5, 1, generator=g).expand(5, 9).clone() * response_mask
    want = theirs_entropy_reshape(adv.clone(), prefix_mask, cl.entropy(logits), mask_ratio)

    args = rl.Args(hybrid="prefix_rft", prefix_entropy_mask=mask_ratio, loss_chunk=4, temperature=1.0)
    mb = rl.MicroBatch(None, adv[response_mask].contiguous(), demo=prefix_mask[response_mask].contiguous())
    got = hybrid.entropy_reshaped_advantages(torch.nn.Identity(), logits[response_mask], mb, args)
    torch.testing.assert_close(got, want[response_mask], rtol=0, atol=0)
    zeroed = int(((got == 0) & mb.demo).sum())
    assert zeroed == int(int(prefix_mask.sum()) * mask_ratio) and torch.equal(got[~mb.demo], mb.adv[~mb.demo])
    no_prefix = rl.MicroBatch(None, mb.adv, demo=torch.zeros_like(mb.demo))   # nothing to reshape
    assert torch.equal(hybrid.entropy_reshaped_advantages(torch.nn.Identity(), logits[response_mask],
                                                          no_prefix, args), mb.adv)


def test_the_prefix_schedule_and_lengths_equal_the_authors():
    args = rl.Args(hybrid="prefix_rft", steps=20)
    cases = [("const", 0.3, 0.0), ("linear_decay", 0.9, 0.1), ("cosine_decay", 0.95, 0.05),
             ("cosine_decay", 0.1, 0.8)]
    for kind, init, target in cases:
        for warmup in (0.0, 0.1):
            for step in range(0, 26):
                assert hybrid.prefix_bound(kind, init, target, step, 20, warmup) == \
                    theirs_bound(kind, init, target, step, 20, warmup), (kind, warmup, step)
    draws = np.random.default_rng(0).beta(1.0, 1.0, size=7)
    wide = dataclasses.replace(args, prefix_low_start=0.2, prefix_low_end=0.1)   # low below high
    for step in (0, 7, 19, 30):
        low = theirs_bound("cosine_decay", 0.2, 0.1, step, 20, 0.0)
        high = theirs_bound("cosine_decay", 0.95, 0.05, step, 20, 0.0)
        want = [theirs_beta_sample(low, high, d) for d in draws]
        assert hybrid.prefix_ratio(wide, step, draws).tolist() == want
    assert hybrid.prefix_ratio(args, 0, draws).tolist() == [0.95] * 7     # the preset: no width
    for ratio in (0.0, 0.01, 0.33, 0.5, 0.999, 1.0):
        for demo_len in (1, 2, 3, 10, 777):
            assert hybrid.prefix_length(ratio, demo_len, 10 ** 6) == theirs_prefix_len(ratio, demo_len)
    assert hybrid.prefix_length(1.0, 777, 100) == 99            # here: a token left to generate


def test_dual_clip_per_token_losses_equal_the_authors():
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(4, 6, generator=g) * 3 - 2
    lp = (old + 0.6 * torch.randn(4, 6, generator=g)).clamp(max=0)
    lp[1, :2] = old[1, :2] + 1.5                                   # ratio 4.5 where A < 0
    lp = lp.requires_grad_()
    adv = torch.tensor([[1.5], [-2.0], [0.7], [-1.0]]).expand(4, 6)
    mask = (torch.arange(6) < torch.tensor([[6], [4], [2], [5]])).float()
    prefix = (torch.arange(6) < torch.tensor([[3], [0], [1], [0]])) & mask.bool()
    pg_loss, pg_losses = theirs_prefix_policy_loss(old, lp, adv, mask, prefix, max_tokens=6)
    pg_loss.backward()
    sel = mask.bool()
    ours_lp = lp.detach()[sel].clone().requires_grad_()
    args = rl.Args(hybrid="prefix_rft", clip_low=0.2, clip_high=0.2, clip_ratio_c=3.0)
    loss, diag = rl.policy_loss_fn(args)(ours_lp, old[sel], adv[sel], args)
    torch.testing.assert_close(loss, pg_losses[sel], rtol=0, atol=0)
    (loss.sum() / 6).backward()
    torch.testing.assert_close(ours_lp.grad, lp.grad[sel], rtol=0, atol=0)
    ratio = (ours_lp - old[sel]).exp()
    assert ((adv[sel] < 0) & (ratio > 3)).any() and diag["clip_high"].sum() > 0   # the dual clip binds


def test_a_prefix_rft_update_equals_the_authors_loss(checkpoint, world_of_one):
    """policy_update on a mini-batch of 3 sequences, one per micro-batch (--micro_batch 1), two with
    prefixes, --loss_agg seq_sum_over_max_len: the gradient of theirs with one sequence per
    micro-batch (gradient accumulation 3): each entropy-reshaped, dual-clipped, aggregated by
    agg_loss "dr_grpo" over max_response_len, divided by 3."""
    from transformers import AutoTokenizer

    from test_rl import GradCapture, fsdp_model, padded_batch

    tok = AutoTokenizer.from_pretrained(checkpoint)
    model = fsdp_model(checkpoint)
    args = rl.Args(hybrid="prefix_rft", adv_std=False, loss_agg="seq_sum_over_max_len", clip_high=0.2,
                   clip_ratio_c=3.0, max_response_len=8, grad_clip=1e9, loss_chunk=3, micro_batch=1,
                   prefix_entropy_mask=0.5)
    responses = [[11, 12, 13, 14, 15, 16, tok.eos_token_id], [21, 22, 23], [31, 32, 33, 34, 35, 36]]
    prefix_lens, advs, demo_advs = [5, 0, 4], [1.0, -0.5, 0.25], [0.5, 0.0, -0.75]
    mbs, theirs_loss = [], 0
    for r, p, a, da in zip(responses, prefix_lens, advs, demo_advs):
        batch, _ = padded_batch(tok, [r])
        demo = torch.arange(len(r)) < p
        adv = torch.where(demo, da, a)
        old, _ = chunked_logits.token_log_probs(model, batch, args.loss_chunk)
        old = old + torch.linspace(-1.5, 1.5, len(old))              # off-policy: clips bind
        mbs.append(rl.MicroBatch(batch, adv, old, None, demo))
    model.reshard()
    capture = GradCapture(model.parameters())
    sums, _ = rl.policy_update(model, capture, mbs, args, torch.device("cpu"))

    for mb in mbs:                       # theirs: [1, len] tensors from the same model's forward
        logits = model(mb.batch["input_ids"], attention_mask=mb.batch["attention_mask"]).logits[:, :-1]
        keep = mb.batch["loss_mask"][:, 1:].bool()
        lp = logits.log_softmax(-1).gather(-1, mb.batch["input_ids"][:, 1:, None])[..., 0][keep][None]
        ent = cl.entropy(logits)[keep][None].detach()
        adv = theirs_entropy_reshape(mb.adv[None].clone(), mb.demo[None], ent, 0.5)
        ones = torch.ones_like(lp)
        pg_loss, _ = theirs_prefix_policy_loss(mb.old_lp[None], lp, adv, ones, mb.demo[None], max_tokens=8)
        theirs_loss = theirs_loss + pg_loss / 3                          # gradient accumulation 3
    theirs_loss.backward()
    want = [p.grad.full_tensor() for p in model.parameters()]
    for got, w in zip(capture.grads, want):
        torch.testing.assert_close(got, w, rtol=1e-4, atol=1e-7)
    assert sums[2] > 0                                                   # a clip bound


def test_prefix_tokens_and_their_advantage_follow_the_length_sort(world_of_one):
    """rl.micro_batches under --hybrid prefix_rft: exactly each prefixed sample's first prefix_len
    tokens are flagged the expert's and take the prefix advantage, the rest their own."""
    samples = [[hybrid.PrefixedSample([100 + i] * (3 + j), "", None, None, "stop") for j in range(3)]
               + [hybrid.PrefixedSample([900 + i] * 2 + [500 + i] * 3, "", None, None, "stop", "", 2)]
               for i in range(2)]
    adv = torch.arange(8.0).view(2, 4)
    demo_adv = -torch.arange(8.0).view(2, 4) - 1
    args = rl.Args(hybrid="prefix_rft", rollouts=4, mini_batch=2, micro_batch=3)
    (mbs,) = rl.micro_batches([[1, 2], [3]], samples, adv.tolist(), args, 0, torch.device("cpu"),
                              demo_adv.tolist())
    flagged = 0
    for mb in mbs:
        _, y = chunked_logits.select_targets(torch.zeros(*mb.batch["input_ids"].shape, 1), mb.batch)
        assert torch.equal(mb.demo, y >= 900)
        assert torch.equal(mb.adv[mb.demo], demo_adv[y[mb.demo] - 900, 3])
        own = (y >= 500) & (y < 900)
        assert torch.equal(mb.adv[own], adv[y[own] - 500, 3])
        flagged += int(mb.demo.sum())
    assert flagged == 4


def test_the_engine_continues_prompt_and_prefix_ids(checkpoint, toy_sft_file, world_of_one, monkeypatch):
    """hybrid.sample_prefixed_groups: the engine (HF, then a fake vLLM) is given each prompt's ids, then for
    the prefixed slots the prompt's ids followed by the expert's first prefix_len token ids; the
    response is prefix + continuation, cut to max_response_len."""
    import fake_vllm
    from plumbing import generation

    examples = data.load_examples(toy_sft_file, require_response=True)[:3]
    args = rl.Args(hybrid="prefix_rft", rollouts=3, prefix_rollouts=2, steps=4, max_response_len=24,
                   prefix_low_start=0.9, prefix_low_end=0.1, prefix_high_start=0.5, prefix_high_end=0.05)
    for kind in ("hf", "vllm"):
        if kind == "vllm":
            vllm = fake_vllm.install(monkeypatch)
        engine, tok = generation.load_engine(str(checkpoint), kind, "float32", logprobs=True)   # as rl.py's
        prompt_ids = [tok.encode(f"Question {i}?", add_special_tokens=False) for i in range(3)]
        seen = []
        real = generation.generate

        def spy(engine, tokenizer, prompts, *a, **kw):
            seen.extend(prompts)
            return real(engine, tokenizer, prompts, *a, **kw)

        monkeypatch.setattr(generation, "generate", spy)
        groups = hybrid.sample_prefixed_groups(engine, tok, prompt_ids, examples, args, 1, seed=5)
        monkeypatch.setattr(generation, "generate", real)
        if kind == "vllm":
            assert vllm.events[-1] == "generate"
        assert [len(gr) for gr in groups] == [3, 3, 3] and len(seen) == 9
        for i, (ex, group) in enumerate(zip(examples, groups)):
            demo = data.tokenize_sft(tok, "", ex.response)[0][:-1]
            assert group[0].prefix_len == 0 and seen[3 * i] == prompt_ids[i]
            for j, s in enumerate(group):
                n = s.prefix_len
                assert seen[3 * i + j] == prompt_ids[i] + demo[:n]
                assert s.token_ids[:n] == demo[:n] and len(s.token_ids) <= 24
                # the engine's log-probs for the engine check (generation.engine_logp_diff): none for the prefix
                assert len(s.logprobs) == len(s.token_ids) and all(math.isnan(x) for x in s.logprobs[:n])
                assert all(x <= 0 for x in s.logprobs[n:])
                stopped = s.finish_reason == "stop"
                assert s.text == tok.decode(s.token_ids[:-1] if stopped else s.token_ids)
            assert all(0 < s.prefix_len < 24 for s in group[1:])
        assert len({s.prefix_len for gr in groups for s in gr[1:]}) > 1       # Beta draws spread


def test_bad_prefix_settings_are_one_line_errors():
    with pytest.raises(SystemExit, match="--prefix_rollouts 8: must be >= 1 and leave one of --rollouts 8"):
        rl.Args(hybrid="prefix_rft", prefix_rollouts=8)
    with pytest.raises(SystemExit, match="--prefix_schedule linear_decay: --prefix_low_start 0.1 must be above"):
        rl.Args(hybrid="prefix_rft", prefix_schedule="linear_decay", prefix_low_start=0.1, prefix_low_end=0.5)
    with pytest.raises(SystemExit, match="--prefix_schedule cosine_decay: --prefix_high_start 0.5 must differ"):
        rl.Args(hybrid="prefix_rft", prefix_high_start=0.5, prefix_high_end=0.5)
    with pytest.raises(SystemExit, match="--prefix_high_end 1.5: must be in"):
        rl.Args(hybrid="prefix_rft", prefix_high_end=1.5)
    rl.Args(hybrid="prefix_rft", clip_ratio_c=3.0)                # its own tokens keep the dual clip


def test_prefix_rft_runs_end_to_end_and_resumes_exactly_after_sigterm(checkpoint, tmp_path):
    """config/rl_prefix_rft.py at tiny size: each group's last rollout continues a prefix of the
    expert's response (rollouts.jsonl: its prefix_lengths), and a run stopped after step 1 of 3 and
    rerun ends where an uninterrupted one does, byte for byte. The toy responses end in " ok" after
    the answer, so that the longest prefix, all but the last token, holds the answer."""
    from conftest import toy_rows

    rows = toy_rows(40, seed=1)
    for r in rows:
        r["target"][0]["content"] += " ok"
    toy_sft_file = tmp_path / "train.jsonl"
    toy_sft_file.write_text("\n".join(json.dumps(r) for r in rows))
    flags = ["config/rl_paper.py", "config/rl_prefix_rft.py", "config/rl_tiny.py", "--model", str(checkpoint),
             "--train_file", str(toy_sft_file), "--steps", "3", "--rollouts", "3", "--max_response_len", "28",
             "--grader_workers", "1", "--micro_batch", "1", "--mini_batch", "2", "--prompts_per_step", "2",
             "--lr", "1e-3", "--system_prompt", "paper", "--log_rollouts", "2", "--engine", "hf",
             "--prefix_low_start", "1", "--prefix_high_start", "1"]  # step 1: the longest prefix
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    stop_at(0, "rl.py", whole, *flags, exit_status=0)
    stop_at(1, "rl.py", stopped, *flags)
    stop_at(0, "rl.py", stopped, *flags, exit_status=0)
    assert untimed_log(stopped) == untimed_log(whole) and len(untimed_log(whole)) == 3
    groups = [json.loads(line) for line in (whole / "rollouts.jsonl").read_text().splitlines()]
    assert all(g["prefix_lengths"][:2] == [0, 0] and g["prefix_lengths"][2] > 0 for g in groups)
    assert all(g["lengths"][2] > g["prefix_lengths"][2] for g in groups)
    first, last = ([g["prefix_lengths"][2] for g in groups if g["step"] == s] for s in (1, 3))
    assert min(first) > max(last)                                 # the cosine decay shortens them
    assert all(g["rewards"][2] == 1 for g in groups if g["step"] == 1)    # the answer is in the prefix
    assert any(len(set(g["rewards"])) > 1 for g in groups)            # the updates have a signal
    weights = [(out / "step_000003" / "model.safetensors").read_bytes() for out in (whole, stopped)]
    assert weights[0] == weights[1]


def test_the_prefix_rft_preset_says_where_each_value_comes_from():
    """config/rl_prefix_rft.py: every value names its source class (code, paper, chosen here), and
    it sets the same run whether or not config/rl_paper.py comes first (what rl_paper.py sets and the
    method needs otherwise, top_p 0.95, clip-higher 0.28, no dual clip, is overridden)."""
    from dataclasses import fields
    from pathlib import Path

    from plumbing import cli

    preset = Path(rl.__file__).parent / "config" / "rl_prefix_rft.py"
    for line in preset.read_text().splitlines():
        if line and not line.startswith(("#", " ")):
            assert any(f"# {c}" in line for c in ("code", "paper", "chosen here")), line
    runs = [cli.parse_config(rl.Args, argv=[*first, str(preset), "--train_file", "x"])[0]
            for first in ([], [str(preset.parent / "rl_paper.py")])]
    alone, after_paper = ({f.name: getattr(a, f.name) for f in fields(a)} for a in runs)
    # the same training (rl_paper.py also names a validation file: not part of what is trained)
    trained = set(alone) - rl.MAY_CHANGE_ON_RESUME
    assert {k: alone[k] for k in trained} == {k: after_paper[k] for k in trained}
    assert {k: alone[k] for k in ("hybrid", "clip_low", "clip_high", "clip_ratio_c", "loss_agg", "top_p",
                                  "prefix_rollouts", "prefix_schedule", "prefix_high_start", "prefix_high_end",
                                  "prefix_entropy_mask", "micro_batch", "entropy_coef")} == dict(
        hybrid="prefix_rft", clip_low=0.2, clip_high=0.2, clip_ratio_c=3.0, loss_agg="seq_sum_over_max_len",
        top_p=1.0, prefix_rollouts=1, prefix_schedule="cosine_decay", prefix_high_start=0.95,
        prefix_high_end=0.05, prefix_entropy_mask=0.8, micro_batch=1, entropy_coef=0.0)
