"""Benchmark (not a test): rl.py's GRPO steps with a synthetic reward, so that a random model trains
as a real one would: rewards vary within groups, advantages are not zero, and from the second
mini-batch on the ratios move off 1 and the clips bind. A random model's responses never box a right
answer, and math_reward would give every group all zeros (nothing after the reward would run).

    torchrun --standalone --nproc_per_node 1 bench/rl_step.py config/rl_tiny.py \\
        --model DIR --train_file FILE ...

Every rl.py flag applies; the reward is 1 for a response whose token ids sum to an even number, else
0: a coin flip per response (its length would not do: truncated responses all have the same).
rl.py's log.jsonl in --out_dir holds each step's figures (timings, clip fractions, approx_kl).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root
import rl  # noqa: E402
from plumbing.cli import parse_config, run_script  # noqa: E402
from plumbing.distributed import setup_distributed, shutdown  # noqa: E402


def even_sum_reward(samples, examples):
    """rl.py's reward hook: (samples, examples) -> (rewards, grader failures)."""
    return [float(sum(s.token_ids) % 2 == 0) for s in samples], 0


def main():
    (args,) = parse_config(rl.Args, prog="bench/rl_step.py")
    _, _, device = setup_distributed(args.dist_timeout_min)
    rl.train(args, device, reward_fn=even_sum_reward)
    shutdown()


if __name__ == "__main__":
    run_script(main)
