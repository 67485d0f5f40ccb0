"""Plumbing shared by sft.py and rl.py: command line from dataclasses, process group, FSDP2 model building. Nothing here is part of the algorithm; a reader learning the method can skip this file."""
import argparse
import ast
import datetime
import inspect
import os
import runpy
import sys
import types
from dataclasses import fields

import torch
import torch.distributed as dist


# ------------------------------------------------------------------------------------------------
# Command line: nanoGPT-style config files (python files of assignments), then --flags from dataclasses
# ------------------------------------------------------------------------------------------------
def field_docs(cls) -> dict[str, str]:
    """The docstring under each dataclass field (CleanRL's convention), for --help."""
    docs, body = {}, ast.parse(inspect.getsource(cls)).body[0].body  # the class's own source
    for stmt, nxt in zip(body, body[1:]):
        if isinstance(stmt, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[stmt.target.id] = " ".join(str(nxt.value.value).split())
    return docs


def _converter(annotation):
    """str -> value for a field type; `X | None` fields take "none"."""
    if isinstance(annotation, types.UnionType):
        inner = next(a for a in annotation.__args__ if a is not type(None))
        return lambda v: None if v.lower() == "none" else inner(v)
    return annotation


def parse_config(*classes, argv=None, prog=None):
    """Instances of the given dataclasses from `[preset.py ...] [--field value ...]`. Presets (config/*.py)
    are python files of plain assignments, later ones win; flags win over presets. Bool fields are
    --flag / --no-flag, list fields take several values; names may use - or _; unknown names are errors."""
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = {}
    while argv and argv[0].endswith(".py"):
        preset = runpy.run_path(argv.pop(0))
        overrides |= {k: v for k, v in preset.items() if not k.startswith("_")}
    parser = argparse.ArgumentParser(prog=prog, description=sys.modules["__main__"].__doc__,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    names = set()
    for cls in classes:
        docs, defaults = field_docs(cls), cls()
        for f in fields(cls):
            names.add(f.name)
            flags = list(dict.fromkeys([f"--{f.name}", f"--{f.name.replace('_', '-')}"]))
            kw = {"dest": f.name, "default": overrides.get(f.name, getattr(defaults, f.name)), "help": docs.get(f.name, "")}
            if f.type is bool:
                parser.add_argument(*flags, action=argparse.BooleanOptionalAction, **kw)
            elif isinstance(f.type, types.GenericAlias):  # list[str]
                parser.add_argument(*flags, nargs="*", type=f.type.__args__[0], **kw)
            else:
                parser.add_argument(*flags, type=_converter(f.type), **kw)
    if set(overrides) - names:
        raise SystemExit(f"a preset sets unknown fields: {sorted(set(overrides) - names)}")
    ns = vars(parser.parse_args(argv))
    return [cls(**{f.name: ns[f.name] for f in fields(cls)}) for cls in classes]


# ------------------------------------------------------------------------------------------------
# Process group: torchrun, or one process as a world of one (the same FSDP code path either way)
# ------------------------------------------------------------------------------------------------
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
    was done (SIGABRT, 3 of 71 probe runs; DESIGN.md), which made a finished run look failed. So: wait for
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


# ------------------------------------------------------------------------------------------------
# Models: rank 0 holds the real weights, the others start on the meta device; FSDP2 then shards them
# ------------------------------------------------------------------------------------------------
def load_full_model(path: str, scratch: bool, seed: int):
    """Rank 0: the HF model at `path` in float32 (FSDP keeps float32 master weights), or a fresh one
    from its config.json with the given seed. Other ranks: the same architecture on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)  # no trust_remote_code: architectures transformers knows
    if dist.get_rank() != 0:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if scratch:
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def shard_model(model, device, bf16: bool, grad_ckpt: bool, trainable: bool = True, offload: bool = False):
    """FSDP2 per decoder layer and at the root, weights broadcast from rank 0. bf16 compute with float32
    master weights and float32 gradient reduction when bf16. FSDP averages gradients over ranks.
    offload: FSDP2's CPUOffloadPolicy keeps the sharded float32 parameters, their gradients and (since the
    optimiser is built on those parameters) the Adam states in pinned CPU memory; the GPU holds only the
    layers being computed. The optimiser step then runs on the CPU."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    full = model.state_dict() if dist.get_rank() == 0 else {}
    if grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else \
        MixedPrecisionPolicy()
    policy = CPUOffloadPolicy(pin_memory=device.type == "cuda") if offload else OffloadPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp, offload_policy=policy)
    fully_shard(model, mp_policy=mp, offload_policy=policy)
    if dist.get_rank() != 0:
        model.to_empty(device=device)
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    for buf in model.buffers():  # non-persistent buffers (rotary inv_freq) are not in the state dict
        buf.data = buf.data.to(device)
        dist.broadcast(buf, src=0)
    # from_pretrained returns eval mode, where HF skips gradient checkpointing: set the mode explicitly
    model.train(trainable)
    if not trainable:
        model.requires_grad_(False)
    return model


def full_tensors(model, device=None):
    """(name, full tensor) for each entry of the FSDP model's state dict, in the same order on every rank,
    gathered one at a time (`DTensor.full_tensor()` is a collective: every rank must iterate to the end).
    Only one full parameter exists at a time: what the HF checkpoint writer and the engine weight sync need.
    device: where to gather (the compute device; offloaded shards live on the CPU and would gather over gloo)."""
    from torch.distributed.tensor import DTensor

    for name, p in model.state_dict().items():  # state_dict() gives DTensor shards even while the root is gathered
        if isinstance(p, DTensor):
            yield name, (p if device is None or p.device == device else p.to(device)).full_tensor()
        else:
            yield name, p


def full_state_dict(model) -> dict:
    """The whole model's weights on rank 0's CPU (empty dict on other ranks); every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
