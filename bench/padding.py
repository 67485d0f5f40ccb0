"""Benchmark (not a test): the share of computed tokens that are padding, in the trainers' own
micro-batch plans, for long-tailed lengths like the paper's data.

    python bench/padding.py [--examples 46000] [--mini_batches 100] [--seed 0]

Lengths: prompts of 40-600 tokens; responses log-normal (median 2,000 tokens), cut to 200-8,192, as
reasoning traces are (a few hundred tokens to the 8,192 cap, a long tail). SFT:
data.plan_micro_batches over one epoch with the paper's preset (global batch 256, 8 GPUs,
32,768-token budget). GRPO: rl.micro_batches for one rank's share of a mini-batch (the paper's
preset: 64 prompts x 8 rollouts per mini-batch, micro-batches of 4 sequences), over --mini_batches
mini-batches. Padding share = padded tokens / computed tokens (micro-batch size x its longest
sequence); each plan padded (--no-pack) and packed (the default: no padding by construction,
and fewer, fuller micro-batches).
"""
import argparse
import dataclasses
import random
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root
import data  # noqa: E402
import rl  # noqa: E402
from plumbing.cli import parse_config  # noqa: E402

GPUS = 8


def response_lengths(n: int, rng: random.Random) -> list[int]:
    return [min(8192, max(200, round(rng.lognormvariate(7.6, 0.8)))) for _ in range(n)]


def sft_plan(lengths: list[int], pack: bool) -> tuple[float, float]:
    """Padding share of computed tokens and micro-batches per optimiser step per GPU, over one
    epoch of sft.py's plan at the paper's preset."""
    plan = data.plan_micro_batches(lengths, 256, 32768, GPUS, seed=0, epoch=0, pack=pack)
    mbs = [mb for step in plan for rank in step for mb in rank]
    computed = sum(data._tokens(mb, lengths, pack) for mb in mbs)
    real = sum(lengths[i] for mb in mbs for i in mb)
    return 1 - real / computed, len(mbs) / len(plan) / GPUS


def rl_plan(rng: random.Random, minis: int, pack: bool) -> tuple[float, float]:
    """Padding share of computed tokens and the fullest micro-batch's tokens over the mean, over
    `minis` mini-batches of one rank under rl.py's plan at the paper's preset."""
    argv = ["config/rl_paper.py", "--model", "-", "--train_file", "-"]
    (args,) = parse_config(rl.Args, argv=argv + ["--pack" if pack else "--no-pack"])
    # one rank's prompts, world of one
    args = dataclasses.replace(args, mini_batch=args.mini_batch // GPUS)
    computed = real = 0
    fullest = []
    for _ in range(minis):
        prompts = [[0] * rng.randint(40, 600) for _ in range(args.mini_batch)]
        samples = [[rl.generation.Sample([0] * n, "", None, None, "stop")
                    for n in response_lengths(args.rollouts, rng)] for _ in prompts]
        adv = [[0.0] * args.rollouts for _ in prompts]
        sizes = [mb.batch["input_ids"].numel()
                 for mb in rl.micro_batches(prompts, samples, adv, args, 0, None)[0]]
        fullest.append(max(sizes) / (sum(sizes) / len(sizes)))
        computed += sum(sizes)
        real += sum(len(p) + len(s.token_ids) for p, group in zip(prompts, samples) for s in group)
    return 1 - real / computed, sum(fullest) / len(fullest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=46000)
    parser.add_argument("--mini_batches", type=int, default=100,
                        help="GRPO mini-batches of one rank")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    lengths = [rng.randint(40, 600) + n for n in response_lengths(args.examples, rng)]
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.set_num_threads(1)
    for pack in (False, True):
        layout = "packed" if pack else "padded"
        share, per_gpu = sft_plan(lengths, pack)
        print(f"SFT, {args.examples} examples, one epoch, {layout}: padding {share:.2%} of computed "
              f"tokens, {per_gpu:.2f} micro-batches a step per GPU")
    for pack in (False, True):
        layout = "packed" if pack else "padded"
        share, fullest = rl_plan(random.Random(args.seed + 1), args.mini_batches, pack)
        print(f"GRPO, {args.mini_batches} mini-batches of one rank, {layout}: padding {share:.2%} "
              f"of computed tokens, the fullest micro-batch {fullest:.2f}x the mean")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
