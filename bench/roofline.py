"""A roofline estimate of a step's time on a GPU, op by op, from the ops a (simulated) step
dispatches. Plumbing for bench/dryrun.py: a reader of the method may skip it.

Each op the step dispatches costs max(FLOPs / peak, bytes / bandwidth, the shortest kernel): its
FLOPs from the formulas torch.utils.flop_counter.FlopCounterMode uses (matmuls and attention; a
causal attention does half the work of the full one that FlopCounterMode counts), its bytes every
tensor it reads and writes (views move none; an op that allocates without writing, none). Eager
PyTorch launches one kernel per op, so the sum over the ops is the step's compute time on an ideal
GPU: a lower bound, since no kernel reaches the roof. Collectives (FSDP's all-gathers and
reduce-scatters) are costed apart, on the links: FSDP overlaps them with compute. Work on the CPU
(an offloaded optimiser step) and copies between host and GPU are left out; the copies' bytes are
counted. Each op is charged to the region open when it ran (Roofline.region, Roofline.watch_module):
the teacher's forward, the teacher's head, the optimiser, ...; "student" otherwise (its backward
included).
"""
import collections
import contextlib
import dataclasses

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

MATMULS = {"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm"}
ATTENTION = {"aten._scaled_dot_product_flash_attention",
             "aten._scaled_dot_product_efficient_attention",
             "aten._scaled_dot_product_flash_attention_backward",
             "aten._scaled_dot_product_efficient_attention_backward"}
COPIES = {"aten._to_copy", "aten.copy_", "aten._copy_from", "aten._copy_from_and_resize"}
NO_DATA = {"aten._unsafe_view", "aten.alias", "aten.empty", "aten.empty_like", "aten.empty_strided",
           "aten.new_empty", "aten.new_empty_strided", "aten.detach", "aten.lift_fresh",
           "aten.set_", "aten.resize_", "aten.record_stream"}


@dataclasses.dataclass(frozen=True)
class GPU:
    """The roofs: dense bf16 (and fp16) tensor-core FLOP/s, float32 FLOP/s without TF32 (torch's
    default for matmuls), memory and per-GPU link bandwidth, the shortest kernel. H100 SXM by
    default."""
    bf16_tflops: float = 989.0
    fp32_tflops: float = 67.0
    hbm_tbs: float = 3.35
    link_gbs: float = 450.0           # NVLink 4, one direction
    kernel_us: float = 2.0


def _tensors(tree):
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _bytes(t: torch.Tensor) -> int:
    """What a kernel moves for t: its elements, or its storage when it is broadcast (stride 0); of a
    DTensor (sharded parameters, their gradients and optimiser states), this rank's shard."""
    t = getattr(t, "_local_tensor", t)
    try:
        return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return t.numel() * t.element_size()


class Roofline(TorchDispatchMode):
    """Estimated seconds, FLOPs and bytes per region of what runs under it; `ops` keeps the
    costliest ops."""

    def __init__(self, gpu: GPU = GPU()):
        super().__init__()
        self.gpu = gpu
        self.regions = ["student"]
        self.seconds = collections.Counter()
        self.flops = collections.Counter()
        self.bytes = collections.Counter()
        self.by_op = collections.Counter()              # (region, op): seconds
        self.comm_bytes = self.host_copy_bytes = 0

    @contextlib.contextmanager
    def region(self, label: str):
        self.regions.append(label)
        try:
            yield
        finally:
            self.regions.pop()

    def watch_module(self, module: torch.nn.Module, label: str) -> None:
        """Charge the module's forwards to `label` (no backward runs: a teacher, a frozen model)."""
        def enter(*_):
            self.regions.append(label)

        def leave(*_):
            self.regions.pop()

        module.register_forward_pre_hook(enter)
        module.register_forward_hook(leave)

    def op_cost(self, func, args, kwargs, out) -> tuple[float, int, int]:
        """(seconds, FLOPs, bytes) of one op on the roofs."""
        name = str(func.overloadpacket)
        if func.is_view or name in NO_DATA:
            return 0.0, 0, 0
        if not _tensors(out):          # sizes, prim.device, profiler marks; in-place ops write args
            if not func._schema.is_mutable:
                return 0.0, 0, 0
            out = [a for a, arg in zip(args, func._schema.arguments)
                   if arg.alias_info and arg.alias_info.is_write]
        flops = 0
        if func.overloadpacket in flop_registry:
            flops = flop_registry[func.overloadpacket](*args, **(kwargs or {}), out_val=out)
            if name in ATTENTION and _is_causal(func, args, kwargs):
                flops //= 2                                 # the kernels skip the masked half
        inputs = {k: v for k, v in (kwargs or {}).items() if k != "out"}    # out= is the output
        moved = sum(_bytes(t) for t in _tensors((args, inputs)) + _tensors(out))
        first = _tensors(args)[:1]
        low = first and first[0].dtype in (torch.bfloat16, torch.float16)
        peak = (self.gpu.bf16_tflops if low or name in ATTENTION else self.gpu.fp32_tflops) * 1e12
        seconds = max(flops / peak, moved / (self.gpu.hbm_tbs * 1e12), self.gpu.kernel_us * 1e-6)
        return seconds, flops, moved

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace in ("c10d", "_c10d_functional"):           # a collective: on the links
            self.comm_bytes += sum(_bytes(t) for t in _tensors(out) or _tensors(args))
            return out
        devices = {t.device.type for t in _tensors((args, kwargs)) + _tensors(out)}
        if "cuda" not in devices:      # the CPU's work (an offloaded optimiser step): not the GPU's
            return out
        # host <-> GPU: over PCIe, costed apart
        if "cpu" in devices and str(func.overloadpacket) in COPIES:
            self.host_copy_bytes += sum(_bytes(t) for t in _tensors(out) or _tensors(args))
            return out
        seconds, flops, moved = self.op_cost(func, args, kwargs, out)
        if seconds:
            region = self.regions[-1]
            self.seconds[region] += seconds
            self.flops[region] += flops
            self.bytes[region] += moved
            self.by_op[region, str(func.overloadpacket)] += seconds
        return out

    def comm_seconds(self) -> float:
        return self.comm_bytes / (self.gpu.link_gbs * 1e9)

    def top_ops(self, region: str, n: int = 5) -> dict[str, float]:
        """The region's n costliest ops: {op: estimated ms}."""
        ops = [(op, s) for (r, op), s in self.by_op.items() if r == region]
        return {op: round(s * 1e3, 3) for op, s in sorted(ops, key=lambda x: -x[1])[:n]}


def _is_causal(func, args, kwargs) -> bool:
    """The is_causal argument of an SDPA kernel call (positional or keyword)."""
    kwargs = kwargs or {}
    if "is_causal" in kwargs:
        return bool(kwargs["is_causal"])
    names = [a.name for a in func._schema.arguments]
    return "is_causal" in names and len(args) > names.index("is_causal") \
        and bool(args[names.index("is_causal")])
