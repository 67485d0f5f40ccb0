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

RL-PLUS's code base is a copy of LUFFY's: the two differ only in `demonstration_loss`. Prefix-RFT
(arXiv:2507.01679) is not here: its repository ships no training configuration (its run script
reads a $TRAIN_CONFIG defined nowhere), so the settings behind its Table 3 row cannot be read
from its code. Per-token tensors below are [n], one chunk of response tokens.
"""
import torch

import data
from plumbing.generation import Sample

HYBRIDS = ("none", "luffy", "rl_plus")

# Where the authors' code is cited: LUFFY at github.com/ElliottYan/LUFFY 01f4ae0, paths under
# luffy/verl/verl/; RL-PLUS at github.com/YihongDong/RL-PLUS eb4aa4d, under rl_plus/verl/verl/.


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
