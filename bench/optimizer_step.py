"""Benchmark (not a test): the optimiser step of FSDP2's sharded parameters, torch's AdamW on the
DTensor parameters against plumbing.models.ShardLocalAdamW (the same update, bit for bit, on the
shards' local tensors), over as many parameter tensors as a model has (Qwen2.5-1.5B: 338). With
small tensors the step is its host time, DTensor's dispatch per parameter, which a GPU waits on:
one H200 spent 82 ms in the step of the 1.5B model, where the fused kernels move its states in
~10 ms.

    python bench/optimizer_step.py [--tensors 338] [--width 64] [--steps 20] [--fused]

One process (a world of one), the CPU, or the GPU when there is one; the two alternate, step by
step, and the medians are printed with their ratio, and each one's growth of the process's
resident memory over its steps (torch 2.11's fused AdamW on DTensors leaked host memory a step:
pytorch/pytorch#188174).
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root
from plumbing import models  # noqa: E402
from plumbing.distributed import setup_distributed, shutdown  # noqa: E402


def resident_bytes() -> int:
    """The process's resident set (Linux), in bytes."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096


def sharded(tensors: int, width: int, device):
    """A model of `tensors` parameter tensors of width x width values, fully_shard'ed as the
    trainers do (per block, then the root), with a gradient on each."""
    from torch.distributed.fsdp import fully_shard

    blocks = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False)
                                   for _ in range(tensors)]).to(device)
    for block in blocks:
        fully_shard(block)
    fully_shard(blocks)
    for p in blocks.parameters():
        p.grad = torch.ones_like(p)
    return blocks


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tensors", type=int, default=338)
    parser.add_argument("--width", type=int, default=64, help="each tensor: width x width")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--fused", action=argparse.BooleanOptionalAction, default=None,
                        help="fused kernels (default: on CUDA, as the trainers)")
    a = parser.parse_args()
    _, _, device = setup_distributed()
    fused = device.type == "cuda" if a.fused is None else a.fused
    kinds = {"torch AdamW on DTensors": torch.optim.AdamW,
             "ShardLocalAdamW": models.ShardLocalAdamW}
    optimizers = {name: cls(sharded(a.tensors, a.width, device).parameters(), lr=1e-3,
                            fused=fused) for name, cls in kinds.items()}
    times, grown = {name: [] for name in kinds}, {name: 0 for name in kinds}
    for step in range(a.steps + 1):                        # step 0 makes the states: not timed
        for name, opt in optimizers.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            rss, t0 = resident_bytes(), time.perf_counter()
            opt.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if step:
                times[name].append(time.perf_counter() - t0)
                grown[name] += resident_bytes() - rss
    median = {name: statistics.median(t) for name, t in times.items()}
    print(f"{device.type}, {a.tensors} parameter tensors of {a.width}^2 values, fused {fused}, "
          f"median of {a.steps} steps, world of {dist.get_world_size()}:")
    for name, t in median.items():
        print(f"  {name:24s} {t * 1e3:8.2f} ms a step, resident memory "
              f"{grown[name] / a.steps / 2**10:+.1f} KiB a step")
    print(f"ShardLocalAdamW / AdamW on DTensors: "
          f"{median['ShardLocalAdamW'] / median['torch AdamW on DTensors']:.3f}")
    shutdown()


if __name__ == "__main__":
    main()
