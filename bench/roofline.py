"""A step's time on a GPU, op by op, from the ops a (simulated) step dispatches, each op priced at
its class's efficiency measured on a real GPU. Plumbing for bench/dryrun.py: a reader of the method
may skip it.

`Roofline` (a dispatch mode) records what each op does: its class, FLOPs, bytes moved, output
elements, and the region open when it ran (Roofline.region, Roofline.watch_module: the teacher's
forward, the teacher's head, the optimiser, ...; "student" otherwise, its backward included).
`seconds` prices the record with a GPU's roofs (`GPU`) and a `Calibration`, each op at least the
shortest kernel:
  matmul     FLOPs / (bf16 peak x matmul)         mm, addmm, bmm (float32 ones on the fp32 peak)
  gemv       bytes / gemv (GB/s)                  a matmul with an output dimension of 1 (batched
                                                  dot products: cuBLAS's gemv kernels)
  attention  FLOPs / (bf16 peak x attention[form]), forward and backward apart; the forms:
               dense_mask  a [B, 1, T, T] mask (a right-padded batch): every tile, 4 B H T^2 d
               causal      is_causal, no mask: the tiles above the diagonal skipped, half of it
               varlen      torch's varlen attention over a packed row (torch_attn._varlen_attn
                           and its backward): each sequence its own causal square, 4 H d
                           sum(l_i^2) / 2, the lengths from Roofline.varlen_lengths (a fake
                           tensor's offsets hold no values); backward 2.5x, as torch counts
                           flash attention's
  topk       passes x input bytes / topk (GB/s)   radix selection, a pass per 8 bits of key
  broadcast  output elements / broadcast (G/s)    a pointwise op with a broadcast or strided
                                                  operand: CUDA's non-vectorized kernel, bound by
                                                  elements rather than bytes (bf16 and float32
                                                  alike on the H200)
gemv, topk and broadcast run far below the memory's bandwidth (a tenth or less of it on the H200):
their rates are absolute, the same on a GPU of the same SMs and clocks whatever its memory (an H100
SXM's are an H200's); each is at least its bytes at the bandwidth.
  memory     bytes / (bandwidth x memory)         every other op: vectorized pointwise ops,
                                                  reductions, copies
  optimizer  bytes / (bandwidth x memory) + tensors x optimizer_us   the fused AdamW; tensors
                                                  are those it steps as DTensors (torch's AdamW
                                                  dispatching on FSDP2's parameters): none for
                                                  plumbing.models.ShardLocalAdamW, which steps
                                                  their local tensors
Composite ops are counted by the passes their ATen kernels make, which a dispatch mode cannot see:
logsumexp (ReduceOps.cpp: amax, x - max, exp, sum), softmax and log-softmax and their backward
(three reads and a write each). FLOPs are torch.utils.flop_counter's formulas; bytes every tensor an
op reads and writes (views move none; an op that only allocates, none; copy_, fill_ and zero_
write their destination without reading it; gather and an in-place scatter_add_ move what they
index, not the whole tensor they index into).

The sum over the ops is the device's busy time in eager PyTorch (a kernel per op). Not modelled:
time the GPU waits on the host (after the step's read, a sync, until the next kernels are queued),
NCCL (collectives are costed apart, on the links: FSDP overlaps them), the CPU's work (an
offloaded optimiser step) and host-device copies (their bytes are counted).

Calibrations: DATASHEET (every efficiency 1: the roofs themselves, a lower bound on the time) and
H200_2026_11_27, each constant fitted by `fit` from one H200's profiles (bench/data/, its README)
against the dry run's record of the same steps (FIT_SOURCES names each one's rows). A new GPU run
refits them: its profiles (`python -m torch.distributed.run --standalone --nproc_per_node 1
bench/roofline.py --out DIR`, on the GPU) beside its gpu_check summary.json, then `python
bench/dryrun.py --against DIR/summary.json --fit`.
"""
import collections
import contextlib
import dataclasses
import math
import re

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

MATMULS = {"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm"}
ATTENTION = {"aten._scaled_dot_product_flash_attention",
             "aten._scaled_dot_product_efficient_attention",
             "aten._scaled_dot_product_cudnn_attention", "aten._flash_attention_forward",
             "aten._efficient_attention_forward"}
ATTENTION_BACKWARD = {"aten._scaled_dot_product_flash_attention_backward",
                      "aten._scaled_dot_product_efficient_attention_backward",
                      "aten._scaled_dot_product_cudnn_attention_backward",
                      "aten._flash_attention_backward", "aten._efficient_attention_backward"}
# torch.nn.attention.varlen's custom ops (plumbing/attention.py's attention on CUDA): the pass each is
VARLEN = {"torch_attn._varlen_attn": "fwd", "torch_attn._varlen_attn_backward": "bwd"}
FORMS = ("dense_mask", "causal", "varlen")
COPIES = {"aten._to_copy", "aten.copy_", "aten._copy_from", "aten._copy_from_and_resize"}
WRITE_ONLY = {"aten.copy_", "aten.fill_", "aten.zero_"}     # in place: the destination not read
NO_DATA = {"aten._unsafe_view", "aten.alias", "aten.empty", "aten.empty_like", "aten.empty_strided",
           "aten.new_empty", "aten.new_empty_strided", "aten.detach", "aten.lift_fresh",
           "aten.set_", "aten.resize_", "aten.record_stream"}
# three reads and a write of the input's size (CUDA's softmax kernels for rows longer than 1024:
# the row's max, the sum of exp, the output)
SOFTMAX_LIKE = {"aten._softmax", "aten._log_softmax", "aten._softmax_backward_data",
                "aten._log_softmax_backward_data"}


@dataclasses.dataclass(frozen=True)
class GPU:
    """The roofs: dense bf16 (and fp16) tensor-core FLOP/s, float32 FLOP/s without TF32 (torch's
    default for matmuls), memory and per-GPU link bandwidth. H100 SXM by default."""
    bf16_tflops: float = 989.0
    fp32_tflops: float = 67.0
    hbm_tbs: float = 3.35
    link_gbs: float = 450.0           # NVLink 4, one direction


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What each op class achieves: matmul, attention and memory as a share of their roof; gemv
    and topk in GB/s, broadcast in G output elements/s (DATASHEET's inf: the roof); optimizer_us
    per parameter tensor stepped as a DTensor, beyond the fused AdamW's bytes; kernel_us the
    shortest kernel. `sources` names where each was measured (FIT_SOURCES for a fitted one)."""
    name: str
    matmul: float = 1.0
    gemv: float = math.inf
    attention: dict = dataclasses.field(default_factory=lambda: {f: (1.0, 1.0) for f in FORMS})
    memory: float = 1.0
    broadcast: float = math.inf
    topk: float = math.inf
    optimizer_us: float = 0.0
    kernel_us: float = 2.0
    sources: dict = dataclasses.field(default_factory=dict)


DATASHEET = Calibration("the datasheet's roofs (an ideal GPU: a lower bound on the time)")
# Fitted by `fit` (python bench/dryrun.py --against bench/data/h200-2026-11-27/summary.json --fit)
# from one H200's torch.profiler tables of bench/sft_step.py's variants at commit 6fbcbf7
# (bench/data/h200-2026-11-27/profile_*.txt: 6 steps each, Qwen2.5-1.5B shapes, 4 sequences of
# 8192-5120 tokens padded to 8192, bf16, checkpointing) against the dry run's record of one step of
# the same; each constant's source is in FIT_SOURCES.
FIT_SOURCES = {
    "matmul": "profile_sft: aten::mm + aten::addmm over the dry run's matmul FLOPs (800 TFLOP/s)",
    "attention dense_mask": "profile_sft: aten::_cudnn_attention_forward, _backward (cuDNN flash "
                            "with a [B, 1, T, T] mask) over the FLOPs of every tile (355 and 291 "
                            "TFLOP/s)",
    "attention causal, varlen": "not measured: dense_mask's share of the peak, on the FLOPs each "
                                "computes (an assumption the next GPU run tests: cuDNN's masked "
                                "kernel measured, not flash's causal or varlen one)",
    "memory": "profile_sft: the exp_kernel_cuda rows and aten::silu over their bytes (logsumexp's "
              "own exp included)",
    "broadcast": "profile_sft: every elementwise_kernel<...> row (CUDA's non-vectorized kernel) "
                 "over the dry run's broadcast pointwise output elements",
    "topk": "profile_curio (float32 logits) and profile_curio_self_teacher (bf16): aten::topk's "
            "device total over its radix passes' bytes",
    "gemv": "profile_curio_self_teacher: gemv2T_kernel over the batched dot products' bytes "
            "(curio_loss._full_entropy)",
    "optimizer_us": "the least Optimizer.step#AdamW.step range of the three profiles (their first "
                    "step creates AdamW's states: an upper bound), less the fused AdamW's bytes "
                    "at `memory`, per parameter tensor (torch's AdamW on DTensors; "
                    "ShardLocalAdamW's step on local tensors is priced by its bytes alone: not "
                    "measured)",
    "kernel_us": "not measured: a kernel's launch latency (assumed, 2 us)"}
H200_2026_11_27 = Calibration(
    "calibrated on one H200 (2026-11-27, 6fbcbf7)",
    matmul=0.809, gemv=1110.0, memory=0.856, broadcast=372.9, topk=292.0, optimizer_us=48.6,
    attention={"dense_mask": (0.359, 0.294), "causal": (0.359, 0.294), "varlen": (0.359, 0.294)},
    sources=FIT_SOURCES)


# ------------------------------------------------------------------------------------------------
# What an op does
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Work:
    """One kernel's work (a composite op gives several)."""
    region: str
    cls: str           # matmul, gemv, attention, topk, broadcast, memory, optimizer
    key: str           # the op (or the composite's part); attention: "fwd FORM" / "bwd FORM"
    flops: int = 0
    bytes: int = 0
    # broadcast: output elements; topk: radix passes x input bytes; optimizer: parameter tensors
    elements: int = 0
    fp32: bool = False  # float32 inputs (a matmul's roof)


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


def _arg(func, args, kwargs, *names):
    """A kernel call's argument by any of its schema names (positional or keyword), else None."""
    kwargs = kwargs or {}
    schema = [a.name for a in func._schema.arguments]
    for name in names:
        if name in kwargs:
            return kwargs[name]
        if name in schema and len(args) > schema.index(name):
            return args[schema.index(name)]
    return None


def varlen_flops(query_shape, lengths: list[int] | None, pass_: str) -> int:
    """FLOPs of varlen attention over a packed row (query [T, Hq, d]) of sequences of `lengths`,
    every square whole (torch's count; causal kernels compute half): forward 4 Hq d sum(l_i^2),
    QK^T and PV; backward ("bwd") 2.5x, as torch counts flash attention's."""
    total, heads, dim = query_shape
    if lengths is None or sum(lengths) != total:
        raise ValueError(f"varlen attention over {total} tokens, sequence lengths {lengths}: "
                         f"Roofline.varlen_lengths must name the packed micro-batch's (a fake "
                         f"tensor's offsets hold no values)")
    forward = 4 * heads * dim * sum(n * n for n in lengths)
    return forward if pass_ == "fwd" else forward * 5 // 2


def _broadcast(func, args, out) -> bool:
    """A pointwise op that CUDA runs in its non-vectorized kernel: an operand broadcast (another
    shape, a 0-d tensor) or not contiguous."""
    outs = _tensors(out)
    if torch.Tag.pointwise not in func.tags or not outs:
        return False
    shape = outs[0].shape
    return any(t.shape != shape or not t.is_contiguous() for t in _tensors(args)
               if t is not outs[0] and not (t.device.type == "cpu" and t.dim() == 0))


# ------------------------------------------------------------------------------------------------
# The record: a dispatch mode
# ------------------------------------------------------------------------------------------------
class Roofline(TorchDispatchMode):
    """Records each op's work (`work`) by region; `seconds(gpu, calibration)` prices it.
    varlen_lengths: the sequence lengths of the packed micro-batch whose varlen attention runs
    (set by whoever runs it, e.g. around chunked_logits.packed_sequences: bench/dryrun.py)."""

    def __init__(self, varlen_lengths: list[int] | None = None):
        super().__init__()
        self.regions = ["student"]
        self.work: list[Work] = []
        self.comm_bytes = self.host_copy_bytes = 0
        self.varlen_lengths = varlen_lengths

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

    def op_work(self, func, args, kwargs, out) -> list[Work]:
        name = str(func.overloadpacket)
        region = self.regions[-1]
        if func.is_view or name in NO_DATA:
            return []
        if not _tensors(out):          # sizes, prim.device, profiler marks; in-place ops write args
            if not func._schema.is_mutable:
                return []
            out = [a for a, arg in zip(args, func._schema.arguments)
                   if arg.alias_info and arg.alias_info.is_write]
        inputs = {k: v for k, v in (kwargs or {}).items() if k != "out"}    # out= is the output
        ins, outs = _tensors((args, inputs)), _tensors(out)
        moved = sum(_bytes(t) for t in ins + outs)
        if name in VARLEN:              # (before flop_registry: its formula reads the offsets)
            flops = varlen_flops(_arg(func, args, kwargs, "query").shape, self.varlen_lengths,
                                 VARLEN[name])
            causal = bool(_arg(func, args, kwargs, "is_causal"))
            return [Work(region, "attention", f"{VARLEN[name]} varlen",
                         flops // 2 if causal else flops, moved)]
        if name in WRITE_ONLY:
            moved -= _bytes(args[0])
        if name == "aten.gather":       # reads what it gathers: the output's size
            moved = 2 * _bytes(outs[0]) + _bytes(args[2])
        if name == "aten.scatter_add_":     # in place: reads and writes the indexed elements
            moved = _bytes(args[2]) + 3 * _bytes(args[3])
        flops = 0
        if func.overloadpacket in flop_registry:
            flops = flop_registry[func.overloadpacket](*args, **(kwargs or {}), out_val=out)
        if name in ATTENTION or name in ATTENTION_BACKWARD:
            return [self.attention_work(func, args, kwargs, region, flops, moved,
                                        "bwd" if name in ATTENTION_BACKWARD else "fwd")]
        if name in MATMULS:
            unit = 1 in outs[0].shape[-2:]
            return [Work(region, "gemv" if unit else "matmul", name, flops, moved,
                         fp32=ins[0].dtype == torch.float32)]
        if name == "aten.topk":
            passes = ins[0].element_size()                 # radix selection: 8 bits a pass
            return [Work(region, "topk", name, 0, moved, passes * _bytes(ins[0]))]
        if name == "aten.logsumexp":                       # ReduceOps.cpp logsumexp_out_impl
            x, n = _bytes(ins[0]), ins[0].numel()
            return [Work(region, "memory", "logsumexp: amax", 0, x),
                    Work(region, "broadcast", "logsumexp: x - max", 0, 2 * x, n),
                    Work(region, "memory", "logsumexp: exp", 0, 2 * x),
                    Work(region, "memory", "logsumexp: sum", 0, x + _bytes(outs[0]))]
        if name in SOFTMAX_LIKE:
            return [Work(region, "memory", name, 0, 4 * _bytes(outs[0]))]
        if name == "aten._fused_adamw_":          # tensors dispatched as DTensors (torch's AdamW)
            dtensors = sum(isinstance(t, DTensor) for t in args[0])
            return [Work(region, "optimizer", name + (" on DTensors" if dtensors else ""), 0,
                         moved, dtensors)]
        if _broadcast(func, args, out):
            return [Work(region, "broadcast", name, 0, moved, outs[0].numel())]
        return [Work(region, "memory", name, 0, moved)]

    def attention_work(self, func, args, kwargs, region, flops, moved, pass_) -> Work:
        """SDPA's kernels by form: a mask computes every tile; is_causal half of each square."""
        causal = bool(_arg(func, args, kwargs, "is_causal"))
        mask = _arg(func, args, kwargs, "attn_bias", "attn_mask")
        form = "dense_mask" if isinstance(mask, torch.Tensor) or not causal else "causal"
        if causal:
            flops //= 2                                     # the kernels skip the masked half
        return Work(region, "attention", f"{pass_} {form}", flops, moved)

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
        self.work += self.op_work(func, args, kwargs, out)
        return out


# ------------------------------------------------------------------------------------------------
# Pricing
# ------------------------------------------------------------------------------------------------
def work_seconds(w: Work, gpu: GPU, cal: Calibration) -> float:
    """One kernel's time: its class's cost, at least the shortest kernel."""
    bw = gpu.hbm_tbs * 1e12
    if w.cls == "matmul":
        peak = (gpu.fp32_tflops if w.fp32 else gpu.bf16_tflops) * 1e12
        t = max(w.flops / (peak * cal.matmul), w.bytes / (bw * cal.memory))
    elif w.cls == "gemv":
        t = max(w.bytes / bw, w.bytes / (cal.gemv * 1e9))
    elif w.cls == "attention":
        pass_, form = w.key.split()
        eff = cal.attention[form][0 if pass_ == "fwd" else 1]
        t = max(w.flops / (gpu.bf16_tflops * 1e12 * eff), w.bytes / (bw * cal.memory))
    elif w.cls == "topk":
        t = max(w.elements / bw, w.elements / (cal.topk * 1e9))
    elif w.cls == "broadcast":
        t = max(w.elements / (cal.broadcast * 1e9), w.bytes / (bw * cal.memory))
    elif w.cls == "optimizer":
        t = w.bytes / (bw * cal.memory) + w.elements * cal.optimizer_us * 1e-6
    else:
        t = w.bytes / (bw * cal.memory)
    return max(t, cal.kernel_us * 1e-6)


def compact(work: list[Work]) -> list[list]:
    """The record as [count, Work fields...] rows, one per distinct kernel (a step repeats the same
    few thousand): what the dry run writes to its JSON, priced alike by `seconds`."""
    counts = collections.Counter(dataclasses.astuple(w) for w in work)
    return [[n, *fields] for fields, n in counts.items()]


def _rows_of(record: list[list]):
    return ((row[0], Work(*row[1:])) for row in record)


def seconds(record: list[list], gpu: GPU, cal: Calibration,
            by: str = "region") -> collections.Counter:
    """Seconds of a compact record, by region (or by "cls", or by "key")."""
    out = collections.Counter()
    for n, w in _rows_of(record):
        out[getattr(w, by)] += n * work_seconds(w, gpu, cal)
    return out


def top_ops(record: list[list], gpu: GPU, cal: Calibration, region: str, n: int = 5) -> dict:
    """The region's n costliest ops: {op: estimated ms}."""
    ops = collections.Counter()
    for k, w in _rows_of(record):
        if w.region == region:
            ops[w.key] += k * work_seconds(w, gpu, cal)
    return {op: round(s * 1e3, 3) for op, s in ops.most_common(n)}


def totals(record: list[list]) -> dict:
    """What the fit reads: {(class, key): [kernels, FLOPs, bytes, elements]} summed."""
    out = collections.defaultdict(lambda: [0, 0, 0, 0])
    for n, w in _rows_of(record):
        t = out[w.cls, w.key]
        t[0] += n
        t[1] += n * w.flops
        t[2] += n * w.bytes
        t[3] += n * w.elements
    return out


# ------------------------------------------------------------------------------------------------
# The fit: a GPU run's profile against the dry run's record of the same steps
# ------------------------------------------------------------------------------------------------
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def read_profile(text: str) -> dict:
    """torch.profiler's key_averages().table(...) as {name: [self device seconds, device total
    seconds, calls]} (names as printed; rows whose cut names coincide, summed)."""
    rows = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for line in text.splitlines():
        parts = line[80:].split()
        if len(parts) != 10 or not parts[-1].isdigit():
            continue
        times = [re.fullmatch(r"([\d.]+)(s|ms|us)", p) for p in (parts[5], parts[7])]
        if all(times):
            row = rows[line[:80].strip()]
            row[0] += float(times[0][1]) * _UNITS[times[0][2]]
            row[1] += float(times[1][1]) * _UNITS[times[1][2]]
            row[2] += int(parts[-1])
    return dict(rows)


def _rows(profile: dict, pattern: str, total: bool = False) -> float:
    """Device seconds of the rows whose name matches `pattern` (self time, or total)."""
    return sum(v[1 if total else 0] for k, v in profile.items() if re.search(pattern, k))


def fit(records: dict, profiles: dict, steps: int, gpu: GPU, kernel_us: float = 2.0,
        name: str = "fitted") -> Calibration:
    """A Calibration from a GPU run: profiles {variant: read_profile(...)} of `steps` optimiser
    steps each (sft, curio, curio_self_teacher) and the dry run's totals(work) of one step of each
    (records). Each constant is one class's work over the time the profile gives that class."""
    bw, peak = gpu.hbm_tbs * 1e12, gpu.bf16_tflops * 1e12

    def work(variant, cls, keys=None, field=1):
        return sum(v[field] for (c, k), v in records[variant].items()
                   if c == cls and (keys is None or any(re.search(p, k) for p in keys)))

    sft, curio, self_t = (profiles[v] for v in ("sft", "curio", "curio_self_teacher"))
    per_step = 1 / steps
    matmul = work("sft", "matmul") / (peak * _rows(sft, r"^aten::(mm|addmm)$") * per_step)
    # the attention kernels' rows (cuDNN, flash, memory-efficient), in the form the step ran; the
    # forms it did not run take its values (the same share of the peak on the FLOPs computed)
    (form,) = {k.split()[1] for c, k in records["sft"] if c == "attention"}
    attention = r"^aten::_(scaled_dot_product_)?(cudnn|flash|efficient)_attention"
    fwd = work("sft", "attention", [f"fwd {form}"]) / (
        peak * _rows(sft, attention + r"(_forward)?$") * per_step)
    bwd = work("sft", "attention", [f"bwd {form}"]) / (
        peak * _rows(sft, attention + r"_backward$") * per_step)
    # vectorized pointwise kernels: exp (its own and logsumexp's) and SiLU, float32 and bf16
    vec = work("sft", "memory", [r"^aten\.exp", r"logsumexp: exp", r"^aten\.silu$"], 2)
    memory = vec / (bw * (_rows(sft, r"exp_kernel_cuda") + _rows(sft, r"^aten::silu$"))
                    * per_step)
    # CUDA's non-vectorized kernels (elementwise_kernel<...>): elements per second
    broadcast = work("sft", "broadcast", field=3) / (
        _rows(sft, r"^void at::native::elementwise_kernel<") * per_step) / 1e9
    topk = (work("curio", "topk", field=3) + work("curio_self_teacher", "topk", field=3)) / (
        1e9 * (_rows(curio, r"^aten::topk$", True) + _rows(self_t, r"^aten::topk$", True))
        * per_step)
    gemv = work("curio_self_teacher", "gemv", field=2) / (
        1e9 * _rows(self_t, r"gemv2T_kernel") * per_step)
    # the range around AdamW's step, at its least (each profile's first step creates the states)
    opt_s = min(_rows(p, r"^Optimizer\.step#") for p in profiles.values()) * per_step
    adamw_bytes, tensors = (work("sft", "optimizer", field=f) for f in (2, 3))
    # (AdamW on DTensors has a cost per tensor; ShardLocalAdamW's run has none to fit)
    optimizer_us = ((opt_s - adamw_bytes / (bw * memory)) / tensors * 1e6 if tensors
                    else H200_2026_11_27.optimizer_us)
    return Calibration(name, matmul=round(matmul, 3), memory=round(memory, 3),
                       gemv=round(gemv, -1), topk=round(topk, 1), broadcast=round(broadcast, 1),
                       optimizer_us=round(optimizer_us, 1), kernel_us=kernel_us,
                       attention={f: (round(fwd, 3), round(bwd, 3)) for f in FORMS},
                       sources=FIT_SOURCES)


# ------------------------------------------------------------------------------------------------
# The profiles a fit reads, on a GPU
# ------------------------------------------------------------------------------------------------
def profile_main(argv=None):
    """bench/sft_step.py (one round of its three variants, its flags) with torch.profiler around
    each variant's sft.train run: OUT/profile_{variant}.txt for the first of --forms (the others:
    profile_{form}_{variant}.txt), every op and kernel by device time, as `fit` reads them beside
    gpu_check's summary.json.
        python -m torch.distributed.run --standalone --nproc_per_node 1 bench/roofline.py \\
            --out OUT/gpu_check [sft_step.py's flags]"""
    import argparse
    import sys
    from pathlib import Path

    from torch.profiler import ProfilerActivity, profile

    parser = argparse.ArgumentParser(prog="bench/roofline.py", description=profile_main.__doc__)
    parser.add_argument("--out", required=True, help="where profile_{variant}.txt go")
    own, rest = parser.parse_known_args(argv)
    out = Path(own.out)
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import sft_step

    train_once, first_form = sft_step.train_once, []

    def profiled(args, form, device):
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                               else [])
        with profile(activities=activities) as p:
            result = train_once(args, form, device)
        table = p.key_averages().table(sort_by="self_device_time_total", row_limit=-1,
                                       max_name_column_width=80)
        first_form[:] = first_form or [form]   # the first form's profiles are those `fit` reads
        name = args.loss if form == first_form[0] else f"{form}_{args.loss}"
        (out / f"profile_{name}.txt").write_text(table)
        return result

    sft_step.train_once = profiled
    sys.argv = ["bench/sft_step.py", "--rounds", "1", *rest]
    sft_step.main()


if __name__ == "__main__":
    profile_main()
