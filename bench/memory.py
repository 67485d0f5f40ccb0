"""Memory planner: the per-GPU peak of an sft.py or rl.py run, by part and by phase, before renting
the GPUs.

    python bench/memory.py config/sft_paper.py --model Qwen2.5-Math-7B --gpus 8 --loss curio
    python bench/memory.py config/rl_paper.py --stage rl --model Qwen2.5-Math-7B --gpus 8 
    python bench/memory.py --model path/to/config.json --stage sft --loss curio --gpus 1 \
        --token_budget 8192 --loss_chunk 4096 --json

config/*.py presets (anywhere on the line) set the run as they set sft.py / rl.py (fields that do
not change memory, such as lr, are ignored); flags win. --model is a named shape (MODELS) or a
Hugging Face config.json (or its directory).
The same from Python: `plan(config_dict, stage="sft", loss="curio", gpus=8, ...)`.

What it counts, per GPU, is what torch.cuda.max_memory_allocated counts: tensors (the CUDA
context, NCCL buffers and the caching allocator's fragmentation are not). A step goes through
moments (the teacher's forward, a logits chunk's forward and backward, each decoder layer's
recompute and backward, the reduce-scatter of the root's gradients, the optimiser step); each
moment is a sum of parts, and a phase's peak is its largest moment (phases: the sft step and, with
--eval_every, sft validation; rl generation and rl training):
  parameters           FSDP2's sharded float32 master weights, 4 P / gpus (0 with offload:
                       CPUOffloadPolicy)
  gathered_parameters  the all-gathered compute-dtype copies: the root (embedding, final norm,
                       lm_head) for the whole step (FSDP2 keeps a root's parameters gathered after
                       forward), one decoder layer (two with more than one GPU: the next one is
                       prefetched)
  gradients            sharded float32 gradients, the unsharded compute-dtype gradients of the
                       layer in backward and of the root (lm_head's from the first logits chunk
                       to the end of backward), and FSDP2's float32 reduce-scatter buffers (one
                       layer's input buffer stays alive until the next layer's reduce-scatter)
  optimiser            AdamW's float32 exp_avg and exp_avg_sq, 8 P / gpus (0 with offload)
  teacher / base       CurioSFT's EMA teacher or the kl loss's frozen base: a second FSDP2
                       model's sharded weights, its gathered root while it is used, its final
                       hidden states [N, H]
  activations          with checkpointing each decoder layer's input [T, H], plus one layer's
                       recomputed activations and its backward; without it every layer's saved
                       tensors; the final norm's, the trained positions' hidden states [N, H]
                       and their gradient
  logits               one chunk of [chunk, V] logits and what the loss functions allocate
                       around it: traced by running the trainer's own functions
                       (sft.micro_batch_loss, rl.policy_update, chunked_logits.token_log_probs)
                       on a 1-wide model with the real vocabulary, so a change to
                       curio_loss.py or baselines.py changes the plan without a change here
                       (a GPU's bf16 logits read blockwise: no float32 copy of the chunk, a
                       float32 block of at most 256 MiB at a time, loss_chunk_bytes)
  vllm                 the colocated engine (RL's rollouts, SFT's --eval_every validation):
                       gpu_memory_utilization x the GPU's memory while it is awake; 0 asleep
  weight_sync          one full float32 parameter and its cast while the weights go into the
                       engine

The model side is a formula: its terms are the tensors that each op of the HF Qwen2 decoder layer
saves for backward (listed in `layer_saved`), checked against measured peaks of real sft.py steps
on CPU by tests/test_memory.py. A micro-batch is the trainers' --pack (their default): its
sequences end to end in one row of token_budget real tokens, attention within each (torch's
varlen flash attention on CUDA, SDPA per sequence on CPU); or --no-pack: right-padded rows,
token_budget counting their padding, SDPA causal by its flag. Neither has an attention mask or
repeats K/V to every head (GQA in the kernel); the kernel keeps its output and logsumexp.

Not counted: FSDP2's padding of each parameter to a multiple of the GPU count, CPU offload's
host-to-device copies of one layer's shards, kernels' internal workspaces (cuBLAS, attention),
what a sleeping vLLM keeps (CUDA graphs), the EMA teacher update's temporaries (one parameter
shard at a time, after the gradients are freed) and checkpoint saving. Gradient accumulation is
planned as FSDP2 reduce-scattering every micro-batch.
"""
import argparse
import contextlib
import gc
import json
import math
import runpy
import sys
import weakref
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import chunked_logits  # noqa: E402
import baselines  # noqa: E402
import curio_loss as cl  # noqa: E402
import data  # noqa: E402
import sft  # noqa: E402
from plumbing.cli import parse_config, split_presets  # noqa: E402

GIB = 2**30

# The real shapes, as in the models' Hugging Face config.json files (Qwen/Qwen2.5-Math-7B,
# Qwen/Qwen2.5-1.5B).
QWEN_1_5B = {"model_type": "qwen2", "hidden_size": 1536, "num_hidden_layers": 28,
             "num_attention_heads": 12, "num_key_value_heads": 2, "intermediate_size": 8960,
             "vocab_size": 151936, "tie_word_embeddings": True}
MODELS = {
    "Qwen2.5-Math-7B": {"model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28,
                        "num_attention_heads": 28, "num_key_value_heads": 4,
                        "intermediate_size": 18944, "vocab_size": 152064,
                        "tie_word_embeddings": False},
    "Qwen2.5-1.5B": QWEN_1_5B,
    # Qwen/Qwen2.5-Math-1.5B has the same shapes; its other context length and rope_theta change
    # no tensor
    "Qwen2.5-Math-1.5B": QWEN_1_5B,
}
PARTS = ["parameters", "gathered_parameters", "gradients", "optimiser", "teacher", "base",
         "activations", "logits", "vllm", "weight_sync"]


@dataclass
class Run:
    model: str = "Qwen2.5-Math-7B"
    """a named shape (Qwen2.5-Math-7B, Qwen2.5-1.5B, Qwen2.5-Math-1.5B) or a Hugging Face
    config.json or its folder"""
    stage: str = "sft"
    """sft | rl"""
    loss: str = "curio"
    """SFT loss, as sft.py's --loss (curio: a separate EMA teacher; curio_self_teacher: none; kl: a
    frozen base)"""
    gpus: int = 8
    """GPUs the FSDP2 model is sharded over"""
    token_budget: int = 0
    """tokens per micro-batch per GPU: packed, the sequences' own; padded (--no-pack), rows x the
    longest (0: sft.py's default 16384; RL: micro_batch x the longest sequence)"""
    pack: bool = True
    """the trainers' --pack (their default): a micro-batch's sequences end to end in one row (the
    rotary table spans the row); --no-pack: right-padded rows"""
    seq_len: int = 0
    """the longest sequence in a micro-batch (0: max_prompt_len + max_response_len, at most
    token_budget)"""
    trained_tokens: int = 0
    """trained positions N in a micro-batch (0: all token_budget tokens, the worst case)"""
    micro_batch: int = 4
    """RL: sequences per micro-batch (rl.py's --micro_batch)"""
    max_prompt_len: int = 1024
    """longest prompt in tokens"""
    max_response_len: int = 8192
    """longest response in tokens"""
    loss_chunk: int = 2048
    """tokens per logits chunk, as the trainers' --loss_chunk"""
    bf16: bool = True
    """bf16 compute with float32 master weights (the trainers on CUDA)"""
    grad_ckpt: bool = True
    """activation checkpointing of the decoder layers"""
    offload: bool = False
    """FSDP2 CPUOffloadPolicy: sharded parameters, gradients and optimiser states live on the CPU"""
    global_batch: int = 0
    """SFT: sequences per optimiser step over all GPUs, as sft.py's --global_batch (0: one
    micro-batch per step). With several micro-batches per step FSDP2 reduce-scatters each one, so
    the later ones run next to the earlier ones' sharded float32 gradients"""
    updates_per_batch: int = 1
    """SFT: optimiser steps per data batch, as sft.py's --updates_per_batch (PSFT: 8)"""
    mini_batch: int = 0
    """RL: prompts per optimiser step over all GPUs, as rl.py's --mini_batch (0: one micro-batch per
    step)"""
    rollouts: int = 8
    """RL: responses per prompt"""
    hybrid: str = "none"
    """RL: Table 3's hybrid, as rl.py's --hybrid (luffy, rl_plus: the expert's tokens' loss)"""
    entropy_coef: float = 0.0
    """RL: rl.py's --entropy_coef (the hybrids' 0.001): an entropy bonus with gradient per chunk"""
    eval_every: int = 0
    """SFT: sft.py's --eval_every; validation wakes its vLLM engine (gpu_memory_utilization of the
    GPU) beside the trainer's sharded weights, optimiser states and teacher or base (RL's
    validation is a rollout: the rl generation phase)"""
    log_entropy: bool = True
    """sft.py computes the student's entropy per chunk on logging steps (log_every 1: every step)"""
    gpu_memory_utilization: float | None = None
    """vLLM's share of the GPU's total memory while it is awake, as the trainers'
    --gpu_memory_utilization (none: the stage's trainer's default)"""
    vllm_sleep: bool = True
    """RL: vLLM's sleep mode, as rl.py --vllm_sleep (its default): the engine frees its weights and
    KV cache while the trainer works; --no-vllm_sleep keeps it awake beside the trainer"""
    gpu_gib: float = 79.1
    """the GPU's memory as torch reports it (an 80 GB H100: 79.1 GiB)"""
    headroom: float = 0.1
    """share of the GPU kept free for what max_memory_allocated does not count (CUDA context, NCCL,
    fragmentation)"""
    device: str = "cuda"
    """cuda: fused AdamW (no temporaries) | cpu: the unfused AdamW that sft.py uses on CPU
    (tests)"""
    json: bool = False
    """print the plan as JSON: {"parts": {name: bytes}, "phases": {...}, "total_bytes": int, ...}"""


# ------------------------------------------------------------------------------------------------
# Shapes and parameter counts
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shapes:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool

    @property
    def layer_params(self) -> int:
        """q, k, v (biased in Qwen2), o, gate/up/down, two RMSNorm weights."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        bias = (q + 2 * kv) if self.qkv_bias else 0
        attention = self.hidden * (q + 2 * kv) + bias + q * self.hidden
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @property
    def root_params(self) -> int:
        """What fully_shard(model) owns: the embedding, the final norm and an untied lm_head."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params


def shapes_of(config: dict, source: str = "config") -> Shapes:
    """Shapes from a Hugging Face config dict (Qwen2 / Llama-style decoders)."""
    need = ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "vocab_size"]
    missing = [k for k in need if k not in config]
    if missing:
        raise ValueError(f"{source}: missing field(s) {missing} (a Qwen2/Llama-style config.json "
                         f"is expected)")
    heads = config["num_attention_heads"]
    return Shapes(hidden=config["hidden_size"], layers=config["num_hidden_layers"], heads=heads,
                  kv_heads=config.get("num_key_value_heads") or heads,
                  head_dim=config.get("head_dim") or config["hidden_size"] // heads,
                  intermediate=config["intermediate_size"], vocab=config["vocab_size"],
                  tied=bool(config.get("tie_word_embeddings", False)),
                  qkv_bias=(config.get("model_type") == "qwen2"
                            or bool(config.get("attention_bias", False))))


def load_model_config(name: str) -> dict:
    """A named shape, or a config.json file / directory."""
    if name in MODELS:
        return MODELS[name]
    path = Path(name)
    path = path / "config.json" if path.is_dir() else path
    if not path.is_file():
        raise SystemExit(f"--model {name}: neither a named shape ({', '.join(MODELS)}) nor a "
                         f"config.json file")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SystemExit(f"--model {path}: not JSON ({e})") from None


# ------------------------------------------------------------------------------------------------
# Activations of one HF Qwen2 decoder layer (modeling_qwen2.py), in bytes, for `tok` tokens
# ------------------------------------------------------------------------------------------------
def layer_saved(s: Shapes, tok: int, c: int) -> int:
    """What one decoder layer keeps for backward when it runs with grad (no checkpointing, or its
    recompute)."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    # RMSNorm: float32 input, normalised x, rsqrt
    norms = 2 * (4 * tok * s.hidden + c * tok * s.hidden + 4 * tok)
    # the norms' outputs: inputs of q/k/v and of gate/up
    proj_inputs = 2 * c * tok * s.hidden
    # q after rotary; k, v as the attention gets them (no mask: the kernel's GQA, no repeat_kv)
    qkv = c * tok * q + 2 * c * tok * kv
    attention = c * tok * q + 4 * tok * s.heads        # output, logsumexp
    mlp = 4 * c * tok * s.intermediate                 # gate, silu(gate), up, silu(gate) * up
    return norms + proj_inputs + qkv + attention + mlp


def layer_forward_transient(s: Shapes, tok: int, c: int) -> int:
    """Peak of a layer's forward when nothing is saved (no grad, or a checkpointed forward), beyond
    its input."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    attn = c * tok * (s.hidden + 2 * q + 2 * kv)
    # residual, norm out, silu(gate), up, product
    mlp = 2 * c * tok * s.hidden + 3 * c * tok * s.intermediate
    norm = 8 * tok * s.hidden                                      # float32 copies inside RMSNorm
    return max(attn, mlp, norm) + c * tok * s.hidden               # + the layer's output


def layer_backward_extra(s: Shapes, tok: int, c: int) -> int:
    """Beyond the layer's saved tensors, at the peak of its backward (the MLP's): the incoming and
    the residual gradient [tok, H], and the gradients of silu(gate) * up's three [tok, I] tensors
    less the freed product."""
    return 2 * c * tok * s.hidden + 2 * c * tok * s.intermediate


def shared_activations(s: Shapes, row: int, c: int) -> int:
    """Tensors every layer reads: rotary cos/sin [1, row, d] (row: the packed row's tokens, or the
    padded rows' length), alive during a forward, and through backward when checkpointing keeps
    them for the recomputes."""
    return 2 * c * row * s.head_dim


def final_norm_saved(s: Shapes, tok: int, c: int) -> int:
    return 4 * tok * s.hidden + c * tok * s.hidden + 4 * tok


# ------------------------------------------------------------------------------------------------
# Live tensor bytes (used to trace the loss functions here, and by the tests to measure whole steps)
# ------------------------------------------------------------------------------------------------
class LiveTensorBytes(TorchDispatchMode):
    """Bytes of the tensor storages created while active and still alive, and their peak (overall,
    and per phase named with set_phase). Every op's outputs are tracked by storage (a DTensor by
    its local tensor); a weakref finalizer subtracts a storage when it dies; storage resizes are
    followed (FSDP2 frees and re-allocates unsharded parameters with UntypedStorage.resize_).
    aten.logsumexp writes exp(x - max) into a temporary the size of its input (ATen ReduceOps.cpp,
    logsumexp_out_impl, on CPU and CUDA alike) that a dispatch mode cannot see: it is counted for
    the op's duration. resident: also every tensor alive when it starts (found by the garbage
    collector, uncollected reference cycles included), as torch.cuda's allocator statistics count
    every allocation of the process."""

    def __init__(self, resident: bool = False):
        super().__init__()
        self.sizes, self.live, self.peak, self.phase, self.phase_peak = {}, 0, 0, None, {}
        self.resident = resident

    def track_resident(self):
        """Every CPU tensor the garbage collector knows of (a parameter, a DTensor's shard...)."""
        for obj in gc.get_objects():
            if issubclass(type(obj), torch.Tensor):        # not isinstance: a dead weakproxy raises
                with contextlib.suppress(RuntimeError, NotImplementedError):    # no storage
                    self._track(obj)
        self._bump()

    def set_phase(self, name):
        self.phase = name
        self.phase_peak[name] = max(self.phase_peak.get(name, 0), self.live)

    def reset_peak(self):
        self.peak, self.phase_peak = self.live, {}

    def _bump(self, extra=0):
        now = self.live + extra
        self.peak = max(self.peak, now)
        if self.phase is not None:
            self.phase_peak[self.phase] = max(self.phase_peak.get(self.phase, 0), now)

    def _track(self, t):
        if is_traceable_wrapper_subclass(t):
            for inner in (getattr(t, name) for name in t.__tensor_flatten__()[0]):
                if isinstance(inner, torch.Tensor):           # a DTensor also lists its device mesh
                    self._track(inner)
            return
        # no memory behind it: a meta tensor, or a fake one that torch.compile's caches keep (its
        # size may be symbolic)
        if t.device.type == "meta" or isinstance(t, FakeTensor):
            return
        storage = t.untyped_storage()
        key, n = storage._cdata, storage.nbytes()
        if key not in self.sizes:
            self.sizes[key] = 0
            # storages keep their Python object while alive
            weakref.finalize(storage, self._free, key)
        self.live += n - self.sizes[key]
        self.sizes[key] = n

    def _free(self, key):
        self.live -= self.sizes.pop(key, 0)

    def _resized(self, storage):
        if storage._cdata in self.sizes:
            self.live += storage.nbytes() - self.sizes[storage._cdata]
            self.sizes[storage._cdata] = storage.nbytes()
            self._bump()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.logsumexp.default:
            self._bump(args[0].nbytes)
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t)
        self._bump()
        return out

    def __enter__(self):
        self._resize = resize = torch.UntypedStorage.resize_

        def resize_(storage, n):
            out = resize(storage, n)
            self._resized(storage)
            return out

        torch.UntypedStorage.resize_ = resize_
        if self.resident:
            self.track_resident()
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._resize
        return super().__exit__(*exc)


@contextlib.contextmanager
def allocated_peak(device):
    """{"bytes": the peak allocated while the block ran, beyond what was allocated when it began;
    "collected_bytes": what the garbage collection before it freed}, as torch.cuda's allocator
    counts: every tensor of the process, not only the block's (CPU: LiveTensorBytes with the
    resident tensors). The garbage is collected first: an earlier in-process run's FSDP2 models sit
    in reference cycles until Python's cycle collector runs, and in the H200 run's CUDA tests an
    SFT test's student and base (2.65 GiB) were still allocated in the GRPO test after it."""
    result = {}
    if device.type == "cuda":
        held = torch.cuda.memory_allocated(device)
        gc.collect()
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        result["collected_bytes"] = held - before
        yield result
        result["bytes"] = torch.cuda.max_memory_allocated(device) - before
        return
    tracker = LiveTensorBytes(resident=True)
    with tracker:
        held = tracker.live
        gc.collect()
        tracker.reset_peak()
        before = tracker.live
        result["collected_bytes"] = held - before
        yield result
        result["bytes"] = tracker.peak - before


# ------------------------------------------------------------------------------------------------
# The loss side, traced: per-token bytes of one logits chunk, by phase
# ------------------------------------------------------------------------------------------------
# one chunk of this many tokens; [n, V] and [n, k] terms keep their ratio, so bytes scale with n,
# but for curio_loss's float32 block buffers, [rows, V] whatever the chunk: traced with blocks of
# TRACE_ROWS rows and of twice that, the difference is their bytes per row
TRACE_TOKENS, TRACE_ROWS = 16, 4


class OneWideLM(torch.nn.Module):
    """A causal LM with the real vocabulary and hidden size 1, to trace the loss functions: its
    forward returns fixed hidden states through `model.norm`, as chunked_logits.normed_hidden
    expects; lm_head makes [n, V] logits."""

    def __init__(self, vocab, dtype, seq, seed, trainable=True):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.model = torch.nn.Module()
        self.model.norm = torch.nn.Identity()
        self.lm_head = torch.nn.Linear(1, vocab, bias=False, dtype=dtype)
        with torch.no_grad():
            # entropies well below log V
            self.lm_head.weight.copy_(4 * torch.randn(vocab, 1, generator=g))
        self.hidden = torch.nn.Parameter(torch.randn(1, seq, 1, generator=g).to(dtype))
        self.requires_grad_(trainable)

    def forward(self, input_ids, attention_mask, logits_to_keep, use_cache=False):
        return self.model.norm(self.hidden * 1)

    def reshard(self):                             # FSDP2's method, which the trainers call
        pass


class NoStep:
    """An optimiser that changes nothing: the trace measures the update's forward and backward."""

    def step(self):
        pass

    def zero_grad(self, set_to_none=True):
        pass


@contextlib.contextmanager
def one_rank_world():
    """A process group of one rank (gloo) unless one exists: rl.policy_update all-reduces,
    sft.micro_batch_backward asks the world size."""
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def loss_chunk_bytes(stage: str, loss: str, vocab: int, bf16: bool, log_entropy: bool,
                     entropy_coef: float = 0.0, chunk: int = TRACE_TOKENS,
                     device: str = "cuda") -> dict:
    """Peak bytes per token of a logits chunk of `chunk` tokens on `device`, by phase: 'teacher'
    (the teacher side under no grad), 'forward' (the chunk's checkpointed forward), 'backward'
    (its recompute and backward down to the hidden states), 'old_logp' (RL's no-grad log-probs).
    What grows with the tokens, and curio_loss's block buffers (blocks of at most 256 MiB on a GPU,
    16 MiB on a CPU: a 4096-token chunk of a 152k vocabulary holds 441 float32 rows, not 4096)
    apart, from two traces (loss_trace)."""
    few, more = (loss_trace(stage, loss, vocab, bf16, log_entropy, entropy_coef, rows)
                 for rows in (TRACE_ROWS, 2 * TRACE_ROWS))
    rows = min(chunk, cl._block_rows(vocab, torch.float32, device))
    out = {}
    for phase, peak in few.items():
        per_row = (more[phase] - peak) / TRACE_ROWS
        per_token = (peak - TRACE_ROWS * per_row) / TRACE_TOKENS
        out[phase] = per_token + per_row * rows / chunk
    return out


@lru_cache(maxsize=None)
def loss_trace(stage: str, loss: str, vocab: int, bf16: bool, log_entropy: bool,
               entropy_coef: float, block_rows: int) -> dict:
    """Peak bytes of a logits chunk of TRACE_TOKENS tokens, by phase (loss_chunk_bytes), measured
    with LiveTensorBytes over the trainers' own loss functions, curio_loss's blocks of
    `block_rows` rows."""
    dtype, n = (torch.bfloat16 if bf16 else torch.float32), TRACE_TOKENS
    g = torch.Generator().manual_seed(0)
    batch = data.collate([(torch.randint(0, vocab, (n + 1,), generator=g).tolist(),
                           [0] + [1] * n)], 0)
    model = OneWideLM(vocab, dtype, n + 1, seed=1)
    tracker = LiveTensorBytes()
    old_logp = stage == "rl" or loss == "psft"        # RL, and PSFT's batch of old log-probs
    in_backward, no_grad_phase = False, "old_logp" if old_logp else "teacher"

    # the student's lm_head; without grad: RL's old log-probs, or the self-teacher
    def on_head(module, args):
        if tracker.phase is not None and not in_backward:
            tracker.set_phase("forward" if torch.is_grad_enabled() else no_grad_phase)

    model.lm_head.register_forward_pre_hook(on_head)
    blocks = mock.patch.object(cl, "_block_rows", lambda *a: block_rows)
    if stage == "rl":
        # imported here: rl.py needs math-verify, which a GPU image planning SFT may lack
        import rl

        # loss: "rl", or a hybrid's name (its expert tokens: every other one here)
        hybrid = "none" if loss == "rl" else loss
        args = rl.Args(loss_chunk=n, hybrid=hybrid, entropy_coef=entropy_coef,
                       loss_agg="rank_sum_over_max_len" if entropy_coef else "token_mean")
        mb = rl.MicroBatch(batch, torch.randn(n, generator=g))
        if hybrid != "none":
            mb.demo = torch.arange(n) % 2 == 0
        with blocks, tracker, torch.no_grad():
            tracker.set_phase("old_logp")
            mb.old_lp, _ = chunked_logits.token_log_probs(model, batch, n, args.temperature)
        real_backward = torch.Tensor.backward

        def backward(loss, *a, **kw):                # policy_update's backward: the phase changes
            nonlocal in_backward
            in_backward = True
            tracker.set_phase("backward")
            return real_backward(loss, *a, **kw)

        with blocks, tracker, one_rank_world(), mock.patch.object(torch.Tensor, "backward",
                                                                  backward):
            tracker.set_phase("forward")
            rl.policy_update(model, NoStep(), [mb], args, torch.device("cpu"))
    else:
        args, cfg, second = (sft.Args(loss=loss, loss_chunk=n), cl.LossConfig(),
                             baselines.second_model(loss))
        other = OneWideLM(vocab, dtype, n + 1, seed=2, trainable=False)
        teacher = other if second == "teacher" else None
        base = other if second == "base" else None
        if teacher is not None:
            teacher.lm_head.register_forward_pre_hook(lambda m, a: tracker.set_phase("teacher"))
        with blocks, tracker, one_rank_world():
            if old_logp:
                tracker.set_phase("old_logp")
            old_lp = chunked_logits.token_log_probs(model, batch, n)[0] if old_logp else None
            tracker.set_phase("forward")
            total, _ = sft.micro_batch_loss(model, teacher, base, batch, old_lp, args, cfg,
                                            log_entropy)
            in_backward = True
            tracker.set_phase("backward")
            sft.micro_batch_backward(total, base)
    return dict(tracker.phase_peak)


# ------------------------------------------------------------------------------------------------
# The plan
# ------------------------------------------------------------------------------------------------
def _resolve(config: dict, run: dict) -> tuple[Shapes, Run, int]:
    """The shapes, the run with its defaults filled in, and the micro-batches per optimiser step."""
    unknown = set(run) - {f.name for f in fields(Run)}
    if unknown:
        raise TypeError(f"plan(): unknown run option(s) {sorted(unknown)}")
    r = Run(**run)
    if r.stage not in ("sft", "rl"):
        raise ValueError(f"stage must be sft or rl, got {r.stage!r}")
    if r.stage == "sft" and r.loss not in baselines.LOSSES:
        raise ValueError(f"unknown loss {r.loss!r}; choose one of {sorted(baselines.LOSSES)}")
    if r.gpu_memory_utilization is None and r.stage == "sft":
        r.gpu_memory_utilization = sft.Args().gpu_memory_utilization
    if r.gpu_memory_utilization is None:
        import rl  # here: rl.py needs math-verify, which a GPU image planning SFT may lack

        r.gpu_memory_utilization = rl.Args().gpu_memory_utilization
    if r.device not in ("cuda", "cpu"):
        raise ValueError(f"device must be cuda or cpu, got {r.device!r}")
    longest = r.max_prompt_len + r.max_response_len
    if not r.token_budget:
        r.token_budget = r.micro_batch * (r.seq_len or longest) if r.stage == "rl" else 16384
    r.seq_len = min(r.seq_len or longest, r.token_budget)
    r.trained_tokens = min(r.trained_tokens or r.token_budget, r.token_budget)
    per_step = (r.global_batch / r.updates_per_batch if r.stage == "sft"
                else r.mini_batch * r.rollouts)
    # per GPU
    micro_batches = max(1, math.ceil(per_step / r.gpus / max(1, r.token_budget // r.seq_len)))
    return shapes_of(config, r.model), r, micro_batches


def _sum(parts: dict) -> int:
    return int(sum(parts.values()))


def _kept(s: Shapes, r: Run) -> dict:
    """What each GPU keeps throughout: FSDP2's sharded float32 weights and AdamW's two float32
    states (none with offload)."""
    on_gpu = 0 if r.offload else 1
    return {"parameters": on_gpu * 4 * s.params / r.gpus,
            "optimiser": on_gpu * 8 * s.params / r.gpus}


def _step_moments(s: Shapes, r: Run, micro_batches: int, loss_bytes: dict, second: str | None):
    """The moments of one micro-batch (forward, loss, backward) and of the optimiser step, as
    (name, parts)."""
    c, f, g = (2 if r.bf16 else 4), 4, r.gpus
    tok, N, L = r.token_budget, r.trained_tokens, s.layers
    row = tok if r.pack else r.seq_len             # the rotary table's length
    # the largest chunk, the number of chunks
    n, chunks = min(r.loss_chunk, N), math.ceil(N / r.loss_chunk)
    on_gpu = 0 if r.offload else 1
    static = _kept(s, r)
    all_grads = on_gpu * 4 * s.params / g      # sharded float32 gradients of the whole model
    earlier = all_grads if micro_batches > 1 else 0           # what the earlier micro-batches left
    second_static = static["parameters"]       # the teacher's / base's sharded weights
    root, layer_gathered = c * s.root_params, c * s.layer_params * (2 if g > 1 else 1)
    head_grad = c * s.vocab * s.hidden         # lm_head's (or the tied embedding's) unsharded grad
    per_layer = c * tok * s.hidden if r.grad_ckpt else layer_saved(s, tok, c)
    saved = L * per_layer + shared_activations(s, row, c)
    top = saved + final_norm_saved(s, tok, c) + c * N * s.hidden   # + h [N, H], the chunks' input
    h_second = c * N * s.hidden                                    # the teacher's / base's h [N, H]
    # kl: the base's root stays gathered from its forward to the end of backward (its lm_head runs
    # in each chunk)
    with_second = {second: second_static} if second else {}
    during_loss = ({second: second_static + h_second + (root if second == "base" else 0)}
                   if second else {})
    in_backward = ({second: second_static + (root + h_second if second == "base" else 0)}
                   if second else {})
    moments = []
    # FSDP2 keeps the root's flat all-gather buffer until layer 0's copy-out
    if second is not None and g > 1:
        moments.append((f"{second} all-gather", {**static, "gathered_parameters": root,
                        "gradients": earlier, second: second_static + 2 * root + c * s.layer_params,
                        "activations": top + c * tok * s.hidden}))
    # its forward under no grad, the student's saved tensors and gathered root alive
    if second is not None:
        moments.append((f"{second} forward", {**static,
                        "gathered_parameters": root + layer_gathered,
                        "gradients": earlier, second: second_static + root,
                        "activations": top + c * tok * s.hidden
                        + layer_forward_transient(s, tok, c)
                        + shared_activations(s, row, c)}))
    # (the self-teacher's side runs inside each chunk's forward, traced there)
    if second == "teacher":
        moments.append(("teacher side", {**static, "gathered_parameters": root,
                        "gradients": earlier, "teacher": second_static + root + h_second,
                        "activations": top, "logits": n * loss_bytes["teacher"]}))
    moments.append(("loss forward", {**static, "gathered_parameters": root, "gradients": earlier,
                    **during_loss, "activations": top + 4 * N,
                    "logits": n * loss_bytes["forward"]}))
    done = head_grad if chunks > 1 else 0          # lm_head's grad from the chunks already done
    moments.append(("loss backward", {**static, "gathered_parameters": root, **in_backward,
                    "gradients": earlier + done, "activations": top + 2 * c * N * s.hidden,
                    "logits": n * loss_bytes["backward"]}))
    moments.append(("lm_head backward", {**static, "gathered_parameters": root, **in_backward,
                    "gradients": earlier + done + head_grad, "logits": c * n * s.vocab,
                    "activations": top + 2 * c * N * s.hidden + c * n * s.hidden}))
    # layer i's recompute and backward; the layers above are reduce-scattered
    for i in reversed(range(L)):
        sharded = earlier or on_gpu * 4 * s.layer_params * (L - 1 - i) / g
        # the layer above's reduce-scatter input, still alive
        rs_buffer = f * s.layer_params if i < L - 1 else 0
        recompute = layer_saved(s, tok, c) if r.grad_ckpt else 0
        moments.append((f"layer {i} backward", {**static,
                        "gathered_parameters": root + layer_gathered, **in_backward,
                        "gradients": sharded + c * s.layer_params + rs_buffer + head_grad,
                        "activations": (i + 1) * per_layer
                        + shared_activations(s, row, c)
                        + recompute + layer_backward_extra(s, tok, c)}))
    # the root's post-backward: its parameters resharded, its gradients copied into a float32
    # reduce-scatter input (then freed); the output becomes (or is added to) the sharded gradient
    sharded = earlier or on_gpu * 4 * s.layer_params * L / g
    moments.append(("root reduce-scatter", {**static, **in_backward, "gradients": sharded
                    + max(c * s.root_params + f * s.root_params, f * s.root_params * (1 + 1 / g))}))
    # unfused AdamW: sqrt, / bias corr.
    step_temps = 0 if r.device == "cuda" else 2 * 4 * s.vocab * s.hidden / g
    moments.append(("optimiser step", {**static, **with_second,
                    "gradients": all_grads + step_temps}))
    return moments


def _old_logp_moments(s: Shapes, r: Run, loss_bytes: dict):
    """Old log-probs (RL's, PSFT's): a no-grad forward (layer by layer), then chunks of
    log-probs."""
    c, g = (2 if r.bf16 else 4), r.gpus
    tok, N = r.token_budget, r.trained_tokens
    row = tok if r.pack else r.seq_len
    static = _kept(s, r)
    root, layer_gathered = c * s.root_params, c * s.layer_params * (2 if g > 1 else 1)
    return [("old log-probs forward", {**static, "gathered_parameters": root + layer_gathered,
             "activations": c * tok * s.hidden + layer_forward_transient(s, tok, c)
             + shared_activations(s, row, c)}),
            ("old log-probs chunks", {**static, "gathered_parameters": root,
             "activations": c * N * s.hidden,
             "logits": min(r.loss_chunk, N) * loss_bytes["old_logp"]})]


def _engine_moments(s: Shapes, r: Run, trainer: dict, awake: float, asleep: bool):
    """The colocated vLLM engine's moments (GRPO's rollouts, SFT's validation) beside what the
    trainer keeps between steps: the weight sync, with the engine's weights awake (its KV cache
    still asleep with sleep mode) and one full float32 parameter (at most the [V, H] embedding)
    gathered and cast at a time; then sampling, the engine's whole share awake."""
    c_engine = 2 if r.bf16 else 4
    sync = {**trainer, "vllm": c_engine * s.params if asleep else awake,
            "weight_sync": (4 + c_engine) * s.vocab * s.hidden}
    return [("weight sync", sync), ("sampling", {**trainer, "vllm": awake})]


def plan(config: dict, **run) -> dict:
    """The per-GPU peak of a run. config: a Hugging Face config dict; run: Run's fields (stage,
    loss, gpus, token_budget, loss_chunk, bf16, grad_ckpt, offload, ...). Returns
    {"parts": {part: bytes} at the peak,
    "phases": {phase: {"total_bytes", "moment", "parts", "moments": {moment: bytes}}},
    "total_bytes", "peak_phase", "gpu_bytes", "fits", "params", "micro_batches",
    "loss_chunk_bytes_per_token", "run"}."""
    s, r, micro_batches = _resolve(config, run)
    gpu = r.gpu_gib * GIB
    # between steps the trainer keeps its sharded weights and optimiser states (zero_grad's
    # set_to_none freed the gradients) and, for SFT, its teacher's or base's sharded weights
    trainer = _kept(s, r)
    awake = r.gpu_memory_utilization * gpu
    chunk = max(1, min(r.loss_chunk, r.trained_tokens))          # the largest logits chunk
    if r.stage == "sft":
        second = baselines.second_model(r.loss)
        lb = loss_chunk_bytes("sft", r.loss, s.vocab, r.bf16, r.log_entropy, chunk=chunk,
                              device=r.device)
        # PSFT, before its updates
        old_logp = _old_logp_moments(s, r, lb) if r.loss == "psft" else []
        phases = {"sft step": old_logp + _step_moments(s, r, micro_batches, lb, second)}
        if r.eval_every:           # sft.py's validation engine, asleep during the steps (sleep=True)
            beside = {second: trainer["parameters"]} if second else {}
            phases["sft validation"] = _engine_moments(s, r, {**trainer, **beside}, awake,
                                                       asleep=True)
    else:
        lb = loss_chunk_bytes("rl", "rl" if r.hybrid == "none" else r.hybrid, s.vocab, r.bf16,
                              False, r.entropy_coef, chunk, r.device)
        training = _old_logp_moments(s, r, lb) + _step_moments(s, r, micro_batches, lb, None)
        for _, parts in training:
            parts["vllm"] = 0 if r.vllm_sleep else awake
        phases = {"rl generation": _engine_moments(s, r, trainer, awake, r.vllm_sleep),
                  "rl training": training}
    out = {}
    for phase, moments in phases.items():
        name, parts = max(moments, key=lambda m: _sum(m[1]))
        out[phase] = {"total_bytes": _sum(parts), "moment": name,
                      "parts": {p: int(parts.get(p, 0)) for p in PARTS},
                      "moments": {m: _sum(p) for m, p in moments}}
    peak_phase = max(out, key=lambda p: out[p]["total_bytes"])
    total = out[peak_phase]["total_bytes"]
    return {"parts": out[peak_phase]["parts"], "phases": out, "total_bytes": total,
            "peak_phase": peak_phase,
            "gpu_bytes": int(gpu), "fits": total <= (1 - r.headroom) * gpu, "params": s.params,
            "micro_batches": micro_batches, "loss_chunk_bytes_per_token": lb,
            "run": {k: v for k, v in asdict(r).items() if k != "json"}}


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------
RL_ONLY = {"micro_batch", "mini_batch", "vllm_sleep", "rollouts",
           "engine", "hybrid", "entropy_coef"}


def preset_flags(paths: list[str], stage_given: str | None) -> list[str]:
    """config/*.py presets as --flags (later presets win), keeping the fields that Run knows."""
    known, flags, values = {f.name: f for f in fields(Run)}, [], {}
    for p in paths:
        values |= {k: v for k, v in runpy.run_path(p).items() if not k.startswith("_")}
        rl_fields = sorted(RL_ONLY & set(values))
        if rl_fields and stage_given != "rl":
            raise SystemExit(f"{p} sets RL fields ({', '.join(rl_fields)}): add --stage rl")
    for k, v in values.items():
        if k not in known or k in ("json", "stage"):
            continue
        if known[k].type is bool:
            flags.append(f"--{k}" if v else f"--no-{k}")
        else:
            flags += [f"--{k}", str(v)]
    return flags


def _gib(b):
    return f"{b / GIB:6.1f} GiB"


def describe(result: dict) -> str:
    r = result["run"]
    lines = [f"{r['model']}, {r['stage']}"
             + (f" --loss {r['loss']}" if r["stage"] == "sft" else "")
             + f", {r['gpus']} GPUs, {r['token_budget']} tokens per micro-batch "
             f"({'packed' if r['pack'] else 'padded rows'}, sequences of up to {r['seq_len']}, "
             f"{r['trained_tokens']} trained; {result['micro_batches']} per optimiser step), "
             f"loss_chunk {r['loss_chunk']}, "
             f"{'bf16' if r['bf16'] else 'float32'}, "
             f"checkpointing {'on' if r['grad_ckpt'] else 'off'}, "
             f"offload {'on' if r['offload'] else 'off'}"
             + (f", vLLM {r['gpu_memory_utilization']} of the GPU, "
                f"sleep mode {'on' if r['vllm_sleep'] else 'off'}" if r["stage"] == "rl" else "")
             + (f", validation every {r['eval_every']} steps (vLLM "
                f"{r['gpu_memory_utilization']} of the GPU)" if r["stage"] == "sft"
                and r["eval_every"] else "")
             + f"; {result['params'] / 1e9:.2f}B parameters"]
    for phase, ph in result["phases"].items():
        lines.append(f"{phase}: peak {_gib(ph['total_bytes'])} at '{ph['moment']}'")
        lines += [f"  {p:20s} {_gib(b)}" for p, b in ph["parts"].items() if b]
    gpu = result["gpu_bytes"]
    verdict = "fits" if result["fits"] else "does NOT fit"
    lines.append(f"per-GPU peak {_gib(result['total_bytes'])} = "
                 f"{result['total_bytes'] / gpu:.0%} of {_gib(gpu)}: "
                 f"{verdict} (keeping {r['headroom']:.0%} free)")
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    presets, argv = split_presets(argv, [Run])
    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--stage")
    stage_given = probe.parse_known_args(argv)[0].stage
    (r,) = parse_config(Run, argv=preset_flags(presets, stage_given) + argv, prog="bench/memory.py")
    run = {k: v for k, v in asdict(r).items() if k != "json"}
    try:
        result = plan(load_model_config(r.model), **run)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    print(json.dumps(result, indent=1) if r.json else describe(result))


if __name__ == "__main__":
    main()
