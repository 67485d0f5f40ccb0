"""Plumbing (a reader of the method may skip this file): the process group. torchrun gives each rank
its environment; a plain `python sft.py` runs as a world of one, so the same FSDP code path runs
either way."""
import datetime
import os
import signal
import sys

import torch
import torch.distributed as dist

from chunked_logits import cat_diags


def setup_distributed(timeout_min: float = 60.0):
    """Returns (rank, world_size, device). nccl for CUDA tensors, gloo for CPU ones.

    timeout_min bounds how long a collective may wait for the slowest rank. In GRPO, ranks that
    finish generating and grading early wait in the next collective for the slowest rollout; NCCL's
    default (10 minutes) can kill a paper-scale step, so the stage scripts default to an hour
    (--dist_timeout_min)."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        # nccl for the model; gloo for small CPU tensors and objects (logs)
        backend = "cpu:gloo,cuda:nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    timeout = datetime.timedelta(minutes=timeout_min)
    if "RANK" in os.environ:
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None,
                                timeout=timeout)
    else:  # a plain `python sft.py`: an in-process store, no ports
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timeout)
    return rank, world, device


def shutdown(exit_code: int = 0):
    """End the run. With FSDP2 on gloo, a rank sometimes aborted in interpreter teardown after all
    work was done (SIGABRT in 3 of 71 probe runs of 2 gloo ranks), which made a finished run look
    failed. So: wait for every rank, destroy the group, flush, and leave without running the
    teardown."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


def print0(*args):
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*args, flush=True)


STOPPED_EXIT = 75  # EX_TEMPFAIL: stopped by a signal after saving; the same command resumes the run


class StopSignal:
    """SIGTERM (what SLURM sends before its SIGKILL) and SIGINT (Ctrl-C) are noted, not obeyed at
    once: the trainer asks `requested` where it can save (the end of a data batch) and every rank
    agrees on the answer (a one-number all-reduce), so all save the same step and leave. A second
    Ctrl-C stops at once."""

    def __init__(self):
        self.name = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._note)

    def _note(self, signum, frame):
        if self.name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.name = signal.Signals(signum).name
        print(f"[rank {dist.get_rank() if dist.is_initialized() else 0}] {self.name}: the run "
              "stops after this step, once it is saved", file=sys.stderr, flush=True)

    def requested(self, device) -> bool:
        flag = torch.full((1,), 0.0 if self.name is None else 1.0, device=device)  # no host copy
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def read_step(loss, grad_norm, diag):
    """The optimiser step's one device-to-host read (a GPU sync): the loss, the gradient norm and
    the per-token diagnostics {name: [N]} (empty when the step logs nothing) in one tensor.
    Returns the two floats and the diagnostics as float32 host tensors."""
    keys = list(diag)
    parts = [torch.stack([loss.double(), grad_norm.double()])]
    parts += [diag[k].double().flatten() for k in keys]
    host = torch.cat(parts).cpu()
    loss, grad_norm = host[:2].tolist()
    values = host[2:].split([diag[k].numel() for k in keys])
    return loss, grad_norm, {k: v.float() for k, v in zip(keys, values)}


def gather_diags(diag):
    """Per-token diagnostics {name: [N]} of every rank, concatenated on rank 0 (host tensors); None
    elsewhere."""
    local = {k: v.float().cpu() for k, v in diag.items()}
    all_ranks = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(local, all_ranks, dst=0)
    return None if all_ranks is None else cat_diags(all_ranks)
