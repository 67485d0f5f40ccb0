"""Plumbing shared by the stage scripts: command line from dataclasses and presets, validation, process group,
FSDP2 model building, one error style. Nothing here is part of the algorithm; a reader learning the method can skip
this file."""
import argparse
import ast
import datetime
import inspect
import math
import os
import re
import runpy
import sys
import types
import typing
from dataclasses import fields
from pathlib import Path

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
    """str -> value for a field type; `X | None` fields take "none"; Literal fields take one of their values."""
    if isinstance(annotation, types.UnionType):
        inner = next(a for a in annotation.__args__ if a is not type(None))
        return lambda v: None if v.lower() == "none" else _converter(inner)(v)
    if typing.get_origin(annotation) is typing.Literal:
        return str
    return annotation


def _type_ok(value, annotation) -> bool:
    """Does a preset's value have the field's type? (runpy gives python values: "False" is a str, 1.5 no int)"""
    if isinstance(annotation, types.UnionType):
        return any(_type_ok(value, a) for a in annotation.__args__)
    if annotation is type(None):
        return value is None
    if typing.get_origin(annotation) is typing.Literal:
        return value in typing.get_args(annotation)
    if isinstance(annotation, types.GenericAlias):             # list[str]
        return isinstance(value, list) and all(_type_ok(v, annotation.__args__[0]) for v in value)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


_NUMBER = re.compile(r"-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|-inf|-nan")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the usage examples of a script's docstring as written, and shows each flag's default."""


def parse_config(*classes, argv=None, prog=None):
    """Instances of the given dataclasses from `[preset.py ...] [--field value ...]`. Presets (config/*.py)
    are python files of plain assignments, later ones win; flags win over presets. Bool fields are
    --flag / --no-flag, list fields take several values, Literal fields list their choices; names may use - or _.
    Unknown names, values of the wrong type and missing required flags (a class's REQUIRED) are one-line errors;
    each class's __post_init__ checks ranges (check_settings)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides, origin = {}, {}
    while argv and argv[0].endswith(".py"):
        path = argv.pop(0)
        if not Path(path).is_file():
            raise SystemExit(f"preset {path}: no such file")
        preset = {k: v for k, v in runpy.run_path(path).items() if not k.startswith("_")}
        overrides |= preset
        origin |= dict.fromkeys(preset, path)
    # argparse reads "-1e-3" as a flag (only "-1" and "-.5" pass as numbers): glue such values to their flag
    for i in range(len(argv) - 1, 0, -1):
        if _NUMBER.fullmatch(argv[i]) and argv[i - 1].startswith("--") and "=" not in argv[i - 1]:
            argv[i - 1 : i + 1] = [f"{argv[i - 1]}={argv[i]}"]
    prog = prog or Path(sys.argv[0]).name
    parser = argparse.ArgumentParser(prog=prog, description=sys.modules["__main__"].__doc__,
                                     usage=f"{prog} [config/PRESET.py ...] [--flag value ...]",
                                     formatter_class=_HelpFormatter)
    names, required = {}, []
    for cls in classes:
        docs, defaults = field_docs(cls), cls()
        doc = (cls.__doc__ or "").strip()                       # a dataclass without one gets its signature
        group = parser.add_argument_group(cls.__name__ if doc.startswith(cls.__name__ + "(") else doc.splitlines()[0])
        for f in fields(cls):
            names[f.name] = f.type
            flags = list(dict.fromkeys([f"--{f.name}", f"--{f.name.replace('_', '-')}"]))
            need = f.name in getattr(cls, "REQUIRED", ()) and f.name not in overrides
            required += [f.name] if need else []
            kw = {"dest": f.name, "default": overrides.get(f.name, getattr(defaults, f.name)),
                  "help": ("(required) " if need else "") + docs.get(f.name, "")}
            if f.type is bool:
                group.add_argument(*flags, action=argparse.BooleanOptionalAction, **kw)
            elif isinstance(f.type, types.GenericAlias):  # list[str]
                group.add_argument(*flags, nargs="*", type=_converter(f.type.__args__[0]), **kw)
            else:
                choices = typing.get_args(f.type) if typing.get_origin(f.type) is typing.Literal else None
                group.add_argument(*flags, type=_converter(f.type), choices=choices, **kw)
    for k, v in overrides.items():
        if k not in names:
            raise SystemExit(f"preset {origin[k]}: unknown setting {k!r}")
        if not _type_ok(v, names[k]):
            kind = getattr(names[k], "__name__", names[k])
            raise SystemExit(f"preset {origin[k]}: {k} = {v!r} is not of type {kind}")
    ns = vars(parser.parse_args(argv))
    missing = [f"--{k}" for k in required if ns[k] in ("", None, [])]
    if missing:
        parser.error(f"required: {', '.join(missing)}")
    return [cls(**{f.name: ns[f.name] for f in fields(cls)}) for cls in classes]


def check_settings(config, positive=(), non_negative=(), fraction=(), at_least_one=()) -> None:
    """For a settings dataclass's __post_init__: a one-line SystemExit naming the flag when a Literal field is not
    one of its choices or a setting is out of range (NaN fails every range)."""
    def fail(name, rule):
        raise SystemExit(f"--{name} {getattr(config, name)!r}: {rule}")
    for f in fields(config):
        choices = typing.get_args(f.type) if typing.get_origin(f.type) is typing.Literal else ()
        if choices and getattr(config, f.name) not in choices:
            fail(f.name, f"expected one of {', '.join(map(str, choices))}")
    for name in positive:
        v = getattr(config, name)
        if v is not None and not (math.isfinite(v) and v > 0):
            fail(name, "must be a finite number > 0")
    for name in non_negative:
        v = getattr(config, name)
        if v is not None and not (math.isfinite(v) and v >= 0):
            fail(name, "must be a finite number >= 0")
    for name in fraction:
        v = getattr(config, name)
        if v is not None and not 0 <= v <= 1:
            fail(name, "must be in [0, 1]")
    for name in at_least_one:
        if not getattr(config, name) >= 1:
            fail(name, "must be >= 1")


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
    was done (SIGABRT in 3 of 71 probe runs of 2 gloo ranks), which made a finished run look failed. So: wait for
    every rank, destroy the group, flush, and leave without running the teardown."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


def run_script(main) -> None:
    """Run a stage script's main() with one error style: a user error (a SystemExit with a message, or a
    FileNotFoundError / ValueError, which the loaders raise naming the file, row or field) prints one line and
    exits 1. Bugs keep their traceback; CURIOSFT_DEBUG=1 shows it for user errors too."""
    try:
        main()
    except (FileNotFoundError, ValueError) as e:
        if os.environ.get("CURIOSFT_DEBUG") == "1":
            raise
        rank = f"[rank {dist.get_rank()}] " if dist.is_initialized() and dist.get_world_size() > 1 else ""
        print(f"{rank}{Path(sys.argv[0]).name}: error: {e}", file=sys.stderr, flush=True)
        os._exit(1)        # no teardown: other ranks may be blocked in a collective (see shutdown)


def print0(*args):
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*args, flush=True)


# ------------------------------------------------------------------------------------------------
# Models: rank 0 holds the real weights, the others start on the meta device; FSDP2 then shards them
# ------------------------------------------------------------------------------------------------
def check_model_dir(path: str, weights: bool = True) -> None:
    """A one-line error unless `path` is a local model directory: config.json, tokenizer files and (unless
    weights=False) safetensors weights. Nothing is ever looked up on a hub: a missing directory is an error,
    not a repository name."""
    p = Path(path)
    if not path or not p.is_dir():
        raise SystemExit(f"--model {path!r}: no such directory (a local Hugging Face model directory; "
                         f"`python data.py download` fetches the paper's)")
    if not (p / "config.json").is_file():
        raise SystemExit(f"--model {path}: no config.json, not a model directory")
    if not any((p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise SystemExit(f"--model {path}: no tokenizer files (tokenizer.json / tokenizer_config.json)")
    if weights and not any(p.glob("*.safetensors")):
        raise SystemExit(f"--model {path}: no *.safetensors weights (only safetensors are loaded)")


def load_tokenizer(path: str):
    """The model directory's tokenizer, checked against its config: every token id must have an embedding row."""
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    vocab = AutoConfig.from_pretrained(path).vocab_size
    if len(tokenizer) > vocab:
        raise SystemExit(f"--model {path}: the tokenizer has {len(tokenizer)} tokens but config.json's vocab_size is "
                         f"{vocab}: ids past {vocab - 1} would have no embedding")
    return tokenizer


def load_full_model(path: str, scratch: bool, seed: int):
    """Rank 0: the HF model at `path` in float32 (FSDP keeps float32 master weights), or a fresh one
    from its config.json with the given seed. Other ranks: the same architecture on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    check_model_dir(path, weights=not scratch)
    config = AutoConfig.from_pretrained(path)  # no trust_remote_code: architectures transformers knows
    if dist.get_rank() != 0:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if scratch:
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, use_safetensors=True)


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


def full_tensors(model, dtype=None, skip=()):
    """(name, full tensor) for each entry of the FSDP model's state dict but `skip`, in the same order on every
    rank, gathered one at a time (`DTensor.full_tensor()` is a collective: every rank must iterate to the end).
    Only one full parameter exists at a time: what the HF checkpoint writer and the engine weight sync need.
    Shards are gathered on the GPU when there is one (offloaded shards live on the CPU and would gather over
    gloo); dtype: floating tensors are cast before the all-gather, so it moves bf16 bytes rather than float32's."""
    from torch.distributed.tensor import DTensor

    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None

    for name, p in model.state_dict().items():  # state_dict() gives DTensor shards even while the root is gathered
        if name in skip:
            continue
        if device is not None and p.device != device:
            p = p.to(device)
        if dtype is not None and p.is_floating_point():
            p = p.to(dtype)
        yield name, p.full_tensor() if isinstance(p, DTensor) else p


def full_state_dict(model) -> dict:
    """The whole model's weights on rank 0's CPU (empty dict on other ranks); every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
