"""Plumbing for bench/dryrun.py (a reader of the method may skip this file): simulated GPUs on a CPU
build of torch.

Tensors on `cuda` under torch's FakeTensorMode carry shapes, dtypes and devices but no data, so the
project's own training step runs at 7B scale on a CPU in seconds, with torch's memory tracker
counting what a GPU would hold. Three things make a CPU build accept them:
  1. C++ (built once with torch.utils.cpp_extension, cached outside the repository): c10's own
     FakeGuardImpl<CUDA> as the CUDA device guard (autograd aborts in C++ without one: "PyTorch is
     not linked with support for cuda devices"), and CUDA hooks that say CUDA is built, with `gpus`
     devices (backward otherwise fails: "Cannot access accelerator device when none is available").
     The hooks are created once, the first time torch asks for them, so the library is loaded before
     torch is imported (`preload`): the dry run's rank runs in a process of its own.
  2. Python answers for the torch.cuda functions the trainers and FSDP2 call (`install_cuda_shims`).
  3. The fake process group (torch.testing's FakeStore, backend "fake"): collectives return at once,
     one process plays one rank of `world`.
What this cannot run: anything that reads a value (`.item()`, `.tolist()`, a boolean mask,
`nonzero`), object collectives, and I/O of tensor data (checkpoints, the rank-0 weight broadcast).
"""
import ctypes
import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

_SDPA = None      # torch's own scaled_dot_product_attention, once route_attention_like_cuda ran
_VARLEN = None    # plumbing.attention's VARLEN_ATTN (torch's varlen_attn), likewise
GPUS_MAX = 64      # the device count the hooks report; a run uses cuda:0 (LOCAL_RANK 0)
# set in a process that is to preload the library (bench/dryrun.py's rank)
LIB_ENV = "CURIOSFT_SIM_GPU_LIB"

CPP = r"""
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>

namespace {
struct SimulatedCUDAHooks : at::CUDAHooksInterface {
  explicit SimulatedCUDAHooks(at::CUDAHooksArgs) {}
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasCUDA() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return GPUS_MAX; }
  int getNumGPUs() const override { return GPUS_MAX; }
  c10::DeviceIndex current_device() const override { return 0; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  void init() const override {}
};
C10_REGISTER_GUARD_IMPL(CUDA, c10::impl::FakeGuardImpl<c10::DeviceType::CUDA>);
}  // namespace
namespace at {
C10_REGISTER_TYPED_CLASS(CUDAHooksRegistry, "CUDAHooks", SimulatedCUDAHooks);
}
""".replace("GPUS_MAX", str(GPUS_MAX))


def _cache_dir() -> Path:
    base = os.environ.get("CURIOSFT_CACHE") or Path.home() / ".cache" / "curiosft"
    return Path(base) / "sim_gpu"


def library_path(torch_version: str) -> Path:
    key = hashlib.sha256((CPP + torch_version).encode()).hexdigest()[:16]
    return _cache_dir() / key / "sim_gpu.so"


def build() -> Path:
    """The C++ library, compiled on first use (~40 s with g++ and ninja) and cached; needs torch
    imported."""
    import torch
    from torch.utils.cpp_extension import load_inline

    path = library_path(torch.__version__)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        # torch runs `ninja` from PATH; pip's ninja sits beside this Python (a venv's bin/), which
        # may not be on it
        os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent),
                                              os.environ.get("PATH", "")])
        try:
            load_inline("sim_gpu", cpp_sources=CPP, build_directory=str(path.parent),
                        is_python_module=False)
        except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
            raise SystemExit("simulated GPUs: building the C++ shim failed (it needs g++ and "
                             "ninja: pip install ninja): "
                             f"{str(e).splitlines()[0] if str(e) else type(e).__name__}")
    return path


def preload(path: Path) -> None:
    """Load the library before torch is imported: torch's own libraries first (it links against
    them)."""
    if "torch" in sys.modules:
        raise RuntimeError("sim_gpu.preload must run before torch is imported")
    lib = Path(importlib.util.find_spec("torch").origin).parent / "lib"
    for name in ("libc10.so", "libtorch_cpu.so"):
        ctypes.CDLL(str(lib / name), mode=ctypes.RTLD_GLOBAL)
    ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)


class _Stream:
    """torch.cuda.Stream / Event stand-in: work on simulated GPUs is never queued, so there is
    nothing to wait on."""

    def __init__(self, *args, **kwargs):
        self.device = None

    def wait_stream(self, other): pass
    def wait_event(self, event): pass
    def record_event(self, event=None): return event or _Stream()
    def record(self, stream=None): pass
    def synchronize(self): pass
    def query(self): return True
    def is_capturing(self): return False
    def __enter__(self): return self
    def __exit__(self, *exc): return False


def install_cuda_shims(capability=(9, 0)) -> None:
    """torch.cuda's Python functions, answered as one device of an H100-class node (sm_90) would."""
    import torch

    cuda = torch.cuda
    stream = _Stream()
    shims = {
        "is_available": lambda: True, "is_initialized": lambda: True, "_lazy_init": lambda: None,
        "device_count": lambda: GPUS_MAX, "current_device": lambda: 0,
        "set_device": lambda device: None,
        "get_device_capability": lambda device=None: capability,
        "get_device_name": lambda device=None: "simulated GPU",
        "is_bf16_supported": lambda *a, **k: True, "Stream": _Stream, "Event": _Stream,
        "current_stream": lambda device=None: stream, "default_stream": lambda device=None: stream,
        "stream": lambda s=None: stream, "synchronize": lambda device=None: None,
        "empty_cache": lambda: None,
        "get_rng_state": lambda device=None: torch.zeros(16, dtype=torch.uint8),
        "set_rng_state": lambda state, device=None: None, "manual_seed": lambda seed: None,
        "manual_seed_all": lambda seed: None,
    }
    for name, fn in shims.items():
        setattr(cuda, name, fn)
    torch.accelerator.current_stream = lambda device=None: stream
    torch.accelerator.is_available = lambda: True


def fake_pinned_memory() -> None:
    """Pinned host memory (FSDP2's CPU offload pins its shards) as fake tensors: a CPU tensor like
    the input. Pinning changes where the bytes live, not their shape, and the host's memory is not
    what the dry run measures."""
    import torch
    from torch._subclasses import fake_impls
    from torch._subclasses.fake_tensor import in_kernel_invocation_manager

    def pin_memory(fake_mode, func, tensor, device=None):
        with in_kernel_invocation_manager(fake_mode):
            meta = torch.empty_like(tensor, device="meta")
        return fake_mode.fake_tensor_converter.from_meta_and_device(fake_mode, meta, tensor.device)

    # in place of torch's "NYI" for it (fake_impls.py registers one for each op that takes no device
    # argument)
    fake_impls.op_implementations_dict[torch.ops.aten._pin_memory.default] = pin_memory


def mesh_outside_fake_mode() -> None:
    """FSDP2 builds its default device mesh from a tensor it reads back (`tolist`): build it with
    real tensors."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.fsdp._fully_shard import _fsdp_init

    build_mesh = _fsdp_init.init_device_mesh
    if getattr(build_mesh, "outside_fake_mode", False):
        return

    def init_device_mesh(*args, **kwargs):
        with unset_fake_temporarily():
            return build_mesh(*args, **kwargs)

    init_device_mesh.outside_fake_mode = True
    _fsdp_init.init_device_mesh = init_device_mesh


def fsdp_moves_fake_tensors() -> None:
    """fully_shard moves a module's CPU parameters to the GPU with `param.data = param.to(device)`
    (_fsdp_init._move_states_to_device): on a real tensor that moves it, on a fake one it swaps the
    data but leaves the device the fake tensor reports (FakeTensor.fake_device), and FSDP then
    refuses the parameter ("Expects the parameter to already be moved to device cuda:0 but got
    cpu"). Rank 0 of one GPU meets it: its weights are loaded on the CPU, where a real run moves
    them exactly so. The device is set after the move, as the real move leaves it."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.distributed.fsdp._fully_shard import _fsdp_init

    move = _fsdp_init._move_states_to_device
    if getattr(move, "sets_fake_device", False):
        return

    def move_states_to_device(params, buffers, device):
        move(params, buffers, device)
        for t in [*params, *buffers]:
            if isinstance(t, FakeTensor) and t.device.type not in ("meta", device.type):
                t.fake_device = device

    move_states_to_device.sets_fake_device = True
    _fsdp_init._move_states_to_device = move_states_to_device


def route_attention_like_cuda(kernels) -> None:
    """Scaled dot-product attention as a CUDA build would run it on an sm80+ GPU. On a CPU build
    SDPA takes the math path for CUDA tensors (it has no CUDA kernel choice compiled in), which
    keeps [B, H, T, T] scores: 44.0 GiB at 7B x 8192 tokens instead of 30.7. So each call picks its
    kernel by the rules of torch's CUDA selector
    (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, in the order flash, memory-efficient,
    math) and calls that kernel's own aten op, whose fake implementation allocates what the kernel
    allocates. The backends that torch.backends.cuda (or torch.nn.attention.sdpa_kernel) turns off
    are not chosen. `kernels` (a Counter) counts each call's kernel: the dry run fails on "math",
    the path a GPU would also take for inputs that no fused kernel accepts.
    A packed micro-batch's attention (plumbing/attention.py: torch's varlen_attn, whose custom op
    torch_attn._varlen_attn has a fake implementation that allocates what the flash kernel does)
    runs as it is, counted as "varlen"; inputs its flash kernel refuses raise, as on a GPU."""
    import torch
    import torch.nn.functional as F

    from plumbing import attention

    def choose(q, k, v, attn_mask, enable_gqa):
        d, same = q.shape[-1], q.dtype == k.dtype == v.dtype
        equal_heads = q.shape[-3] == k.shape[-3] == v.shape[-3]
        if not (same and q.dim() == 4 and d % 8 == 0):
            return "math"
        if torch.backends.cuda.flash_sdp_enabled() and q.dtype in (torch.float16, torch.bfloat16) \
                and attn_mask is None and d <= 256 and (equal_heads or enable_gqa):
            return "flash"             # GQA natively, with enable_gqa; no mask: causal by flag only
        if torch.backends.cuda.mem_efficient_sdp_enabled() and equal_heads \
                and q.dtype in (torch.float16, torch.bfloat16, torch.float32):
            return "efficient"           # an additive mask, but no GQA: K, V repeated to every head
        return "math"

    global _SDPA
    # the original, however often this is called
    _SDPA = sdpa = _SDPA or F.scaled_dot_product_attention

    def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
                                     scale=None, enable_gqa=False):
        kernel = choose(q, k, v, attn_mask, enable_gqa)
        kernels[kernel] += 1
        if kernel == "flash":
            return torch.ops.aten._scaled_dot_product_flash_attention(
                q, k, v, dropout_p, is_causal, scale=scale)[0]
        if kernel == "efficient":
            # SDPA's convert_boolean_attn_mask
            if attn_mask is not None and attn_mask.dtype == torch.bool:
                zero = torch.zeros((), dtype=q.dtype, device=q.device)
                attn_mask = torch.where(attn_mask.logical_not(), float("-inf"), zero)
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                q, k, v, attn_mask, torch.is_grad_enabled(), dropout_p, is_causal, scale=scale)[0]
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                    scale=scale, enable_gqa=enable_gqa)

    F.scaled_dot_product_attention = scaled_dot_product_attention

    global _VARLEN
    _VARLEN = varlen = _VARLEN or attention.VARLEN_ATTN
    if varlen is None:          # a torch without it: packed attention runs SDPA per sequence
        return

    def varlen_attn(q, k, v, *args, **kwargs):
        d = q.shape[-1]
        if not (q.dtype == k.dtype == v.dtype and q.dtype in (torch.float16, torch.bfloat16)
                and d <= 256 and d % 8 == 0):
            raise RuntimeError(f"varlen attention: its flash kernel takes float16 or bfloat16 "
                               f"inputs of head dimension <= 256, a multiple of 8, not {q.dtype} "
                               f"of {d}")
        kernels["varlen"] += 1
        return varlen(q, k, v, *args, **kwargs)

    attention.VARLEN_ATTN = varlen_attn


def fake_process_group(world: int, rank: int) -> None:
    """One process playing `rank` of `world` on the fake backend (collectives return at once, no
    data moves)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0",
                      LOCAL_WORLD_SIZE=str(world))
    if dist.is_initialized():                           # a second dry run in the same process
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
