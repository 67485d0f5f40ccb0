"""Table 3's hybrids (hybrid.py, rl.py --hybrid) against their authors' code: the per-token losses,
their gradients and the micro-batch's loss as LUFFY's and RL-PLUS's functions compute them
(transcribed below from their repositories, with file and line), the advantages, the expert's
response as a rollout, and whole rl.py runs that resume exactly after SIGTERM."""
import json

import pytest
import torch

import chunked_logits
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
    assert rl.entropy_bonus_scale(mbs([100, 50]), args, cpu) == 8 / 2     # theirs: 1 on each GPU
    big = [9000] * 40                                   # 360,000 tokens: 2 on each of their 8
    assert rl.entropy_bonus_scale(mbs(big), args, cpu) == 16 / 40
    one_gpu = rl.Args(entropy_coef=0.001, loss_agg="rank_sum_over_max_len", loss_agg_ranks=1,
                      entropy_pack_tokens=60)
    assert rl.entropy_bonus_scale(mbs([100, 50]), one_gpu, cpu) == 3 / 2  # ceil(150 / 60)
    assert rl.entropy_bonus_scale(mbs([100]), rl.Args(), cpu) is None


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
    with pytest.raises(SystemExit, match="--hybrid 'prefix_rft': expected one of none, luffy, rl_plus"):
        rl.Args(hybrid="prefix_rft")
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
