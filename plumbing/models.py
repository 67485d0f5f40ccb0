"""Plumbing (a reader of the method may skip this file): models and optimisers. A --model that names
a Hugging Face hub model (org/name) is downloaded into the hub's cache first; rank 0 loads the real
weights, the other ranks build the same architecture on the meta device, and FSDP2 shards it; the
full weights are gathered one tensor at a time for checkpoints and the generation engine. No remote
code is ever downloaded or run."""
import os
import re
from pathlib import Path

import torch
import torch.distributed as dist

from plumbing import attention
from plumbing.compiling import compile_layer
from plumbing.distributed import print0

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # org/name, as the Hugging Face hub names models
# What a model directory needs from the hub: configs, safetensors weights and their index, tokenizer
# files. No *.py: remote code is never downloaded, and transformers is never asked to trust it.
HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja"]


def resolve_model(path: str, weights: bool = True) -> str:
    """The local directory of a --model. An existing path, or anything not shaped like org/name, is
    returned as it is (check_model_dir then says what is wrong with it). An org/name that is no path
    is a Hugging Face hub model: after a one-line message it is downloaded into the hub's cache
    (HF_HOME), or found there, and its snapshot directory is returned (weights=False: without the
    weights). With HF_HUB_OFFLINE=1 only the cache is looked in. Not found, offline, or the hub
    refusing: a one-line error."""
    if not path or Path(path).exists() or not HUB_ID.fullmatch(path):
        return path
    from huggingface_hub import snapshot_download

    offline = any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE")
                  for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    if not offline:
        print0(f"--model {path}: not a local path; downloading the Hugging Face hub model {path} "
               "into the hub's cache (safetensors and configs only, no code)")
    files = HUB_FILES if weights else [f for f in HUB_FILES if f != "*.safetensors"]
    try:
        return snapshot_download(path, allow_patterns=files, local_files_only=offline)
    except Exception as e:  # offline, DNS, 401, 404, ...: the hub library raises many types
        if offline:
            raise SystemExit(f"--model {path!r}: not a local directory, and not in the Hugging "
                             "Face cache; HF_HUB_OFFLINE=1 forbids downloading it") from None
        first = (str(e).strip().splitlines() or [""])[0]
        raise SystemExit(f"--model {path!r}: no such local directory, and the Hugging Face hub did "
                         f"not give it ({type(e).__name__}: {first})") from None


def check_model_dir(path: str, weights: bool = True) -> None:
    """A one-line error unless `path` is a local model directory: config.json, tokenizer files and
    (unless weights=False) safetensors weights. A hub id is resolved to one first
    (resolve_model)."""
    p = Path(path)
    if not path or not p.is_dir():
        raise SystemExit(f"--model {path!r}: no such directory (a local Hugging Face model "
                         "directory, or a hub model's org/name)")
    if not (p / "config.json").is_file():
        raise SystemExit(f"--model {path}: no config.json, not a model directory")
    if not any((p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise SystemExit(f"--model {path}: no tokenizer files (tokenizer.json / "
                         "tokenizer_config.json)")
    if weights and not any(p.glob("*.safetensors")):
        raise SystemExit(f"--model {path}: no *.safetensors weights (only safetensors are loaded)")


def load_tokenizer(path: str):
    """The model directory's tokenizer, checked against its config: every token id must have an
    embedding row."""
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    vocab = AutoConfig.from_pretrained(path).vocab_size
    if len(tokenizer) > vocab:
        raise SystemExit(f"--model {path}: the tokenizer has {len(tokenizer)} tokens but "
                         f"config.json's vocab_size is {vocab}: ids past {vocab - 1} would have no "
                         "embedding")
    return tokenizer


def load_full_model(path: str, scratch: bool, seed: int):
    """Rank 0: the HF model at `path` in float32 (FSDP keeps float32 master weights), or a fresh one
    from its config.json with the given seed. Other ranks: the same architecture on the meta
    device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    check_model_dir(path, weights=not scratch)
    # no trust_remote_code: architectures transformers knows. The attention that keeps a packed
    # micro-batch's sequences apart (transformers' SDPA otherwise)
    config = AutoConfig.from_pretrained(path)
    kwargs = {"dtype": torch.float32, "attn_implementation": attention.ATTENTION}
    if dist.get_rank() != 0:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, **kwargs)
    if scratch:
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, **kwargs)
    return AutoModelForCausalLM.from_pretrained(path, use_safetensors=True, **kwargs)


def shard_model(model, device, bf16: bool, grad_ckpt: bool, trainable: bool = True,
                offload: bool = False, compile_layers: bool = False):
    """FSDP2 per decoder layer and at the root, weights broadcast from rank 0. bf16 compute with
    float32 master weights and float32 gradient reduction when bf16. FSDP averages gradients over
    ranks. offload: FSDP2's CPUOffloadPolicy keeps the sharded float32 parameters, their gradients
    and (since the optimiser is built on those parameters) the Adam states in pinned CPU memory; the
    GPU holds only the layers being computed. The optimiser step then runs on the CPU.
    compile_layers: each decoder layer's forward through torch.compile (plumbing/compiling.py)."""
    from torch.distributed.fsdp import (CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy,
                                        fully_shard)

    full = model.state_dict() if dist.get_rank() == 0 else {}
    if grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else \
        MixedPrecisionPolicy()
    policy = CPUOffloadPolicy(pin_memory=device.type == "cuda") if offload else OffloadPolicy()
    for layer in model.model.layers:
        if compile_layers:
            compile_layer(layer)
        fully_shard(layer, mp_policy=mp, offload_policy=policy)
    fully_shard(model, mp_policy=mp, offload_policy=policy)
    if dist.get_rank() != 0:
        # where rank 0's shards are: on the CPU when offloaded (FSDP2 requires it, and the broadcast
        # then runs on one backend, gloo)
        model.to_empty(device="cpu" if offload else device)
    broadcast_weights(model, full, device)
    # from_pretrained returns eval mode, where HF skips gradient checkpointing: set it explicitly
    model.train(trainable)
    if not trainable:
        model.requires_grad_(False)
    return model


def broadcast_weights(model, full: dict, device) -> None:
    """Rank 0's full weights into every rank's shards, and the buffers the state dict leaves out
    (rotary inv_freq). Its own function: the one step of sharding that moves tensor data between
    ranks, which bench/dryrun.py's simulated GPUs cannot run (they hold no data)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full, options=options)
    # non-persistent buffers (rotary inv_freq) are not in the state dict
    for buf in model.buffers():
        buf.data = buf.data.to(device)
        dist.broadcast(buf, src=0)


def full_tensors(model, dtype=None, skip=()):
    """(name, full tensor) for each entry of the FSDP model's state dict but `skip`, in the same
    order on every rank, gathered one at a time (`DTensor.full_tensor()` is a collective: every rank
    must iterate to the end). Only one full parameter exists at a time: what the HF checkpoint
    writer and the engine weight sync need. Shards are gathered on the GPU when there is one
    (offloaded shards live on the CPU and would gather over gloo); dtype: floating tensors are cast
    before the all-gather, so it moves bf16 bytes rather than float32's."""
    from torch.distributed.tensor import DTensor

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else None

    # state_dict() gives DTensor shards even while the root is gathered
    for name, p in model.state_dict().items():
        if name in skip:
            continue
        if device is not None and p.device != device:
            p = p.to(device)
        if dtype is not None and p.is_floating_point():
            p = p.to(dtype)
        yield name, p.full_tensor() if isinstance(p, DTensor) else p


def full_state_dict(model) -> dict:
    """The whole model's weights on rank 0's CPU (empty dict on other ranks); every rank must call
    it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def make_optimizer(model, lr: float, weight_decay: float, beta2: float, device, offload: bool):
    """AdamW, betas (0.9, beta2), on the model's sharded float32 parameters (ShardLocalAdamW): fused
    on CUDA, and on the CPU where the states are offloaded there (torch's fused CPU kernel; a
    CPU-only run keeps the default one)."""
    return ShardLocalAdamW(model.parameters(), lr=lr, weight_decay=weight_decay,
                           betas=(0.9, beta2), fused=device.type == "cuda" or offload)


class ShardLocalAdamW(torch.optim.AdamW):
    """torch's AdamW whose update runs on the shards' local tensors. Its state and state dict are
    AdamW's (DTensors, as checkpoints save them); only the arithmetic skips DTensor's dispatch,
    host time per parameter per step that a GPU waits on: one H200 spent 82 ms in the step of a
    1.5B model's 338 parameters, where the fused kernels move the states in ~10 ms (torch 2.11's
    fused path also leaked a DTensorSpec per parameter per step, pytorch/pytorch#188174). The same
    kernels on the same local tensors: the same update, bit for bit (tests/test_models.py)."""

    @torch.no_grad()
    def step(self, closure=None):
        from torch.distributed.tensor import DTensor
        from torch.optim.adam import adam

        if closure is not None:
            raise ValueError("ShardLocalAdamW.step takes no closure")
        for group in self.param_groups:
            lists = [], [], [], [], [], []   # params, grads, exp_avgs, exp_avg_sqs, max_sqs, steps
            has_complex = self._init_group(group, *lists)
            local = [[t._local_tensor if isinstance(t, DTensor) else t for t in ts] for ts in lists]
            adam(*local, amsgrad=group["amsgrad"], has_complex=has_complex,
                 beta1=group["betas"][0], beta2=group["betas"][1], lr=group["lr"],
                 weight_decay=group["weight_decay"], eps=group["eps"], maximize=group["maximize"],
                 foreach=group["foreach"], capturable=group["capturable"],
                 differentiable=group["differentiable"], fused=group["fused"],
                 decoupled_weight_decay=group["decoupled_weight_decay"])


def cpu_threads_per_rank() -> int:
    """This process's CPUs shared among the node's ranks. torchrun gives each rank one thread when
    it starts several, which leaves the offloaded gradient adds and AdamW step on one core."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cpus // int(os.environ.get("LOCAL_WORLD_SIZE", 1)))


def clip_grad_norm(model, max_norm: float) -> torch.Tensor:
    """Clip the gradient to a global norm of max_norm (over every rank's shards) and return the norm
    before, a 0-d tensor on the device: reading it is the caller's host sync."""
    from torch.distributed.tensor import DTensor

    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm
