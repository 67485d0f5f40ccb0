"""Plumbing (a reader of the method may skip this file): the process group. torchrun gives each rank its
environment; a plain `python sft.py` runs as a world of one, so the same FSDP code path runs either way."""
import datetime
import os
import sys

import torch
import torch.distributed as dist


def setup_distributed(timeout_min: float = 60.0):
    """Returns (rank, world_size, device). nccl for CUDA tensors, gloo for CPU ones.

    timeout_min bounds how long a collective may wait for the slowest rank. In GRPO, ranks that finish
    generating and grading early wait in the next collective for the slowest rollout; NCCL's default (10
    minutes) can kill a paper-scale step, so the stage scripts default to an hour (--dist_timeout_min)."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        backend = "cpu:gloo,cuda:nccl"  # nccl for the model; gloo for small CPU tensors and objects (logs)
    else:
        device, backend = torch.device("cpu"), "gloo"
    timeout = datetime.timedelta(minutes=timeout_min)
    if "RANK" in os.environ:
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None, timeout=timeout)
    else:  # a plain `python sft.py`: an in-process store, no ports
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return rank, world, device


def shutdown(exit_code: int = 0):
    """End the run. With FSDP2 on gloo, a rank sometimes aborted in interpreter teardown after all work
    was done (SIGABRT in 3 of 71 probe runs of 2 gloo ranks), which made a finished run look failed. So: wait for
    every rank, destroy the group, flush, and leave without running the teardown."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


def print0(*args):
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*args, flush=True)
