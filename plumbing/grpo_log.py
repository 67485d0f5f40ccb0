"""Plumbing (a reader of the method may skip this file): what rl.py logs of each GRPO step, the
record of log.jsonl (docs/metrics.md says what each field means) and the groups rollouts.jsonl
keeps."""
import itertools

import torch
import torch.distributed as dist


def rollout_records(step, prompts: list, samples, rewards, adv, groups: int,
                    mix) -> list[dict]:
    """The first `groups` of this rank's GRPO groups at `step`, as rollouts.jsonl keeps them (what
    verl's rollout_data_dir and TRL's log_completions keep): each group's prompt, its responses with
    their rewards, advantages, finish reasons and lengths in tokens; under --hybrid luffy and
    rl_plus "expert_first": true says the first response is the expert's; under --hybrid prefix_rft
    "prefix_lengths" says how many of each response's first tokens are the expert's (mix: the
    hybrid's hook)."""
    mark = {"expert_first": True} if mix.expert_first else {}
    records = []
    for i, (p, group) in enumerate(zip(prompts[:groups], samples)):
        records.append({"step": step, "data_source": p.example.data_source, "prompt": p.text,
                        **mark, "ground_truth": p.example.ground_truth,
                        "responses": [s.text for s in group], "rewards": rewards[i].tolist(),
                        "advantages": adv[i].tolist(), **mix.group_record(group),
                        "finish_reasons": [s.finish_reason for s in group],
                        "lengths": [len(s.token_ids) for s in group]})
    return records


def step_record(step, epoch, rewards, own, zero_std, samples, minis, stats, grad_norms, failures,
                times, logp_diff, args, device):
    """The step's log record: sums over ranks, then means. Under --hybrid the rollout fields count
    the expert's response too; own_reward_mean and own_accuracy are the model's samples alone
    (own: the columns of rewards that are theirs)."""
    flat = list(itertools.chain.from_iterable(samples))
    entropy = torch.cat([mb.entropy for mb in itertools.chain.from_iterable(minis)])   # [tokens]
    local = {"reward": rewards.sum().item(), "correct": (rewards == 1).sum().item(),
             "rollouts": rewards.numel(), "zero_std": zero_std.sum().item(), "groups": len(samples),
             "length": sum(len(s.token_ids) for s in flat),
             "truncated": sum(s.finish_reason == "length" for s in flat),
             "failures": failures,
             "own_reward": own.sum().item(), "own_correct": (own == 1).sum().item(),
             "own_rollouts": own.numel(),
             **dict(zip(["loss", "clip_low", "clip_high", "kl", "tokens"], stats.tolist()))}
    # on the device, with the entropy's sum (there already): the record's one host read, below
    summed = torch.cat([torch.tensor(list(local.values()), dtype=torch.float64).to(device),
                        entropy.double().sum().view(1)])
    dist.all_reduce(summed)
    g = dict(zip([*local, "entropy"], summed.cpu().tolist()))
    t0, t_sync, t_gen, t_reward, t_train = times
    hybrid_fields = {}
    if args.hybrid != "none":
        hybrid_fields = {"own_reward_mean": g["own_reward"] / g["own_rollouts"],
                         "own_accuracy": g["own_correct"] / g["own_rollouts"]}
    return {"step": step, "epoch": epoch, "reward_mean": g["reward"] / g["rollouts"],
            **hybrid_fields,
            "accuracy": g["correct"] / g["rollouts"],     # reward 1: reward_mean for 0/1 rewards
            "zero_std_groups": int(g["zero_std"]), "zero_std_frac": g["zero_std"] / g["groups"],
            "response_length": g["length"] / g["rollouts"],
            "truncated_frac": g["truncated"] / g["rollouts"],
            "entropy": g["entropy"] / g["tokens"], "loss": g["loss"] / g["tokens"],
            "clip_frac_low": g["clip_low"] / g["tokens"],
            "clip_frac_high": g["clip_high"] / g["tokens"],
            "approx_kl": g["kl"] / g["tokens"], "grad_norm": sum(grad_norms) / len(grad_norms),
            "engine_logp_diff_mean": logp_diff[0], "engine_logp_diff_max": logp_diff[1],
            "grader_failures": int(g["failures"]), "lr": args.lr, "sync_s": t_sync - t0,
            "gen_s": t_gen - t_sync, "reward_s": t_reward - t_gen, "train_s": t_train - t_reward}
