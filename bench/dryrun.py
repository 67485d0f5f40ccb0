"""The dry run: sft.py's or rl.py's own training steps on simulated GPUs, at paper scale, on a CPU
in about a minute; and a preflight before renting GPUs (will these settings fit, how long will a
step take).

    python bench/dryrun.py config/sft_paper.py --gpus 8 --json out/dryrun/sft_curio.json
    python bench/dryrun.py config/sft_paper.py --gpus 8 --compare_losses sft
    python bench/dryrun.py config/rl_paper.py --gpus 8
    python bench/dryrun.py config/sft_paper.py config/sft_small.py --gpus 1 --gpu_gib 39.4

Presets and flags are sft.py's or rl.py's (the stage comes from the presets, or --stage); --model
takes a local model directory or a hub id whose shapes the project knows (Qwen/Qwen2.5-Math-7B,
Qwen/Qwen2.5-Math-1.5B; no weights are read, nothing is downloaded), and defaults to the preset's
model: 7B, or 1.5B with the small presets.

One process plays one rank (rank 1 of --gpus; rank 0 only adds reading the weights and writing
logs) on torch's fake tensors (shapes, dtypes and devices, no data) on `cuda`, with the fake
process group: what bench/sim_gpu.py sets up. It runs what that rank runs, with the trainers' own
functions: the model built from its config.json and sharded by sft.shard_models /
plumbing.models.shard_model (FSDP2, bf16 compute over float32 master weights, activation
checkpointing, the teacher or base model), the optimiser from plumbing.models.make_optimizer,
then two optimiser steps of two micro-batches each (the longest sequences the preset admits, every
response token trained, one micro-batch padded), each a logging step: for SFT the loop's
micro-batch losses, sft.micro_batch_backward, clipping (PSFT's old log-probs first),
sft.read_step, optimizer.step and sft.update_teacher; for GRPO rl.micro_batches, the old
log-probs (chunked_logits.token_log_probs) and rl.policy_update. It fails, in one line naming the
place, unless:
  sharding   every parameter is a sharded DTensor on cuda in float32, computed in bf16 (the
             preset's), the teacher (or base) sharded alike; the optimiser is the fused AdamW
             with its states on cuda
  float32    the per-token losses' diagnostics (log-probs, entropies, temperatures) are float32
             or wider
  devices    no CPU tensor meets a CUDA tensor in the step
  syncs      at most one value read back to the host (a GPU sync) per optimiser step: the
             step's own
  attention  every attention call runs flash or memory-efficient attention, never the math
             fallback
  memory     the step-2 peak of torch's own tracker (FSDPMemTracker) is within 10% of
             bench/memory.py's plan for the same shapes
  fits       both figures fit the GPU (--gpu_gib) with the planner's headroom kept free; if not,
             it names the largest token budget (GRPO: micro-batch; else GPU count) that fits by
             the planner, and confirms it with a second dry run
It reports the host reads with the lines that ask for them, FLOPs per step (FlopCounterMode), and
a roofline estimate of the step's time and MFU on the GPU given by --peak_tflops, --hbm_tbs
(bench/roofline.py: a lower bound on the time, never a measurement), by region (student, teacher
forward, logits and loss, optimiser) with the costliest ops. What it does not cover is listed in
its output: see NOT_COVERED.
"""
import argparse
import collections
import contextlib
import dataclasses
import functools
import json
import os
import runpy
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
import sim_gpu  # noqa: E402

# the rank's process: the C++ shim before torch
if __name__ == "__main__" and os.environ.get(sim_gpu.LIB_ENV):
    sim_gpu.preload(Path(os.environ[sim_gpu.LIB_ENV]))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

import baselines  # noqa: E402
import curio_loss as cl  # noqa: E402
import memory  # noqa: E402
import roofline  # noqa: E402
from plumbing import models  # noqa: E402
from plumbing.cli import parse_config, split_presets  # noqa: E402

GIB = 2**30
# optimiser steps, micro-batches each: the tracker's step 2 is the figure
STEPS, MICRO_BATCHES = 2, 2
TOLERANCE = 0.10                       # |measured / planned - 1| allowed
# hub ids whose config.json shapes bench/memory.py ships (the 16k-context 7B of the authors'
# scripts has the 7B's)
KNOWN_MODELS = {"Qwen/Qwen2.5-Math-7B": "Qwen2.5-Math-7B",
                "Hao0oWang/Qwen2.5-Math-7B-16k-think": "Qwen2.5-Math-7B",
                "Qwen/Qwen2.5-Math-1.5B": "Qwen2.5-Math-1.5B"}
SMALL_PRESETS = ("sft_small.py", "rl_small.py")       # layered on a paper preset: the 1.5B model
NOT_COVERED = [
    "rank 0's reading of the weights and their broadcast to the shards "
    "(plumbing.models.broadcast_weights)",
    "the stop-signal check (an all-reduce and a read at the end of each data batch)",
    "rank 0's gathering and summary of the logged diagnostics (gather_object, .item())",
    "checkpoint writing and resuming (torch.distributed.checkpoint, safetensors)",
    "kernel speed, NCCL and its buffers, the CUDA context and the allocator's fragmentation",
    "numerics on a GPU (fake tensors hold no values: bf16 rounding, NaN, the loss's values)",
]
NOT_COVERED_OFFLOAD = ("with --offload, the estimated time leaves out the optimiser step on the "
                       "CPU and the copies between host and GPU (their GiB are reported)")
NOT_COVERED_RL = ["vLLM: its memory share, sleep/wake, the weight sync and generation (rollouts "
                  "here are synthetic)",
                  "grading the rollouts (math-verify runs on the host)"]


class DryRunFailure(Exception):
    """A check that failed: its name and one line."""


# ------------------------------------------------------------------------------------------------
# Settings: the dry run's own flags, the stage's (sft.Args / rl.Args with the presets), the model's
# shapes
# ------------------------------------------------------------------------------------------------
def parse(argv):
    parser = argparse.ArgumentParser(prog="bench/dryrun.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=8, help="GPUs (ranks) the run is sharded over")
    parser.add_argument("--gpu_gib", type=float, default=79.1, help="each GPU's memory as torch "
                        "reports it (H100 80 GB: 79.1 GiB)")
    parser.add_argument("--stage", choices=["sft", "rl"], help="default: from the presets (rl if "
                        "one sets GRPO's fields)")
    parser.add_argument("--model", help="a local model directory, or " + ", ".join(KNOWN_MODELS))
    parser.add_argument("--json", help="write the result here")
    roofs = roofline.GPU()
    parser.add_argument("--peak_tflops", type=float, default=roofs.bf16_tflops,
                        help="the GPU's dense bf16 TFLOP/s, for the roofline estimate (H100 SXM)")
    parser.add_argument("--hbm_tbs", type=float, default=roofs.hbm_tbs,
                        help="its memory bandwidth, TB/s")
    parser.add_argument("--link_gbs", type=float, default=roofs.link_gbs,
                        help="its bandwidth to the other GPUs, GB/s each way (NVLink 4)")
    parser.add_argument("--compare_losses", nargs="+", default=[], metavar="LOSS",
                        help="SFT: dry runs of these --loss values too, with the same presets and "
                        "flags, and this run's ratios to them")
    parser.add_argument("--no_confirm", action="store_true", help="when the settings do not fit: "
                        "name the largest that does by the planner, without the dry run that "
                        "confirms it")
    own, rest = parser.parse_known_args(argv)
    if own.gpus < 1:
        raise SystemExit(f"--gpus {own.gpus}: must be >= 1")
    return own, rest


def stage_of(presets: list[str], given: str | None) -> str:
    """rl when a preset sets a field only rl.py has; sft otherwise."""
    if given:
        return given
    import rl
    import sft

    rl_only = ({f.name for f in dataclasses.fields(rl.Args)}
               - {f.name for f in dataclasses.fields(sft.Args)})
    for path in presets:
        if not Path(path).is_file():
            raise SystemExit(f"{path}: no such preset")
        if rl_only & set(runpy.run_path(path)):
            return "rl"
    return "sft"


def model_config(name: str | None, presets: list[str]):
    """The transformers config of --model (or the presets' model): a known hub id's shipped
    shapes, or a local directory's config.json (no remote code)."""
    from transformers import AutoConfig, Qwen2Config

    if name is None:
        small = any(Path(p).name in SMALL_PRESETS for p in presets)
        name = "Qwen/Qwen2.5-Math-1.5B" if small else "Qwen/Qwen2.5-Math-7B"
    if name in KNOWN_MODELS:
        shape = dict(memory.MODELS[KNOWN_MODELS[name]])
        shape.pop("model_type")
        return name, Qwen2Config(**shape, max_position_embeddings=16384)
    path = Path(name)
    if not (path / "config.json").is_file():
        raise SystemExit(f"--model {name}: neither a model directory with a config.json nor one of "
                         f"{', '.join(KNOWN_MODELS)}")
    return name, AutoConfig.from_pretrained(path)


def stage_settings(stage: str, presets: list[str], rest: list[str], model: str):
    """sft.py's or rl.py's settings from the presets and flags, with their own errors. train_file
    and model are placeholders: the dry run reads neither."""
    argv = presets + ["--train_file", "(dry run)", "--model", model] + rest
    if stage == "sft":
        import sft

        args, user_cfg = parse_config(sft.Args, cl.LossConfig, argv=argv, prog="bench/dryrun.py")
        return sft, args, baselines.config_for(args.loss, user_cfg)
    import rl

    (args,) = parse_config(rl.Args, argv=argv, prog="bench/dryrun.py")
    return rl, args, None


# ------------------------------------------------------------------------------------------------
# Watching the step: values read back to the host, tensors moved to it
# ------------------------------------------------------------------------------------------------
HOST_READS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.item.default",
              "aten.is_nonzero.default", "aten.equal.default"}
OUTSIDE = "outside the project"
COPIES = {"aten._to_copy.default", "aten.copy_.default", "aten._copy_from.default",
          "aten._copy_from_and_resize.default"}


def project_site() -> str:
    """The innermost frame of the project's own code (not bench/, not torch's): file:line
    (function)."""
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename).resolve()
        if (ROOT in path.parents and path.is_file()
                and "bench" not in path.relative_to(ROOT).parts[:1] and ".venv" not in path.parts):
            return f"{path.relative_to(ROOT)}:{frame.lineno} ({frame.name})"
    return OUTSIDE


def stand_in(func, args):
    """What a read-back a fake tensor cannot answer (it holds no value) returns instead: a plausible
    value of the right type and shape (1, True, every element nonzero), so that the step runs on and
    every read is counted."""
    if str(func) == "aten.nonzero.default":
        return torch.empty(args[0].numel(), args[0].dim(), dtype=torch.long, device=args[0].device)
    dtype = args[0].dtype
    return True if dtype == torch.bool else 1.0 if dtype.is_floating_point else 1


class HostWatch(TorchDispatchMode):
    """Every read of a CUDA value by the host (a sync on a GPU: .item(), .tolist(), a boolean mask,
    .cpu(), ...), with the project's line that asked for it; `moves` are those that make a CPU
    tensor of a CUDA one."""

    def __init__(self):
        super().__init__()
        self.reads, self.moves = collections.Counter(), collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch._subclasses.fake_tensor import (DataDependentOutputException,
                                                   DynamicOutputShapeException)

        name = str(func)
        watched = name in HOST_READS or name in COPIES
        on_gpu = watched and any(isinstance(t, torch.Tensor) and t.device.type == "cuda"
                                 for t in tree_flatten((args, kwargs))[0])
        if on_gpu and name in HOST_READS:
            self.reads[project_site()] += 1
        try:
            out = func(*args, **(kwargs or {}))
        except (DataDependentOutputException, DynamicOutputShapeException):
            if name not in HOST_READS:
                raise
            out = stand_in(func, args)
        if on_gpu and name in COPIES and any(isinstance(t, torch.Tensor) and t.device.type == "cpu"
                                             for t in tree_flatten((out, args[:1]))[0]):
            site = project_site()
            if site != OUTSIDE:               # (FSDP2's CPU offload moves gradients by design)
                self.moves[site] += 1
                self.reads[site] += 1
        return out


# ------------------------------------------------------------------------------------------------
# The checks
# ------------------------------------------------------------------------------------------------
def check_sharding(model, others, bf16: bool, home: str) -> None:
    """home: where the float32 shards live, cuda (or cpu with FSDP2's CPU offload)."""
    from torch.distributed.tensor import DTensor

    def fail(message):
        raise DryRunFailure(f"sharding: {message}")

    for name, p in model.named_parameters():
        if not isinstance(p, DTensor):
            fail(f"student parameter {name} is not a sharded DTensor")
        if p.device.type != home or p.dtype != torch.float32:
            fail(f"student parameter {name} is {p.dtype} on {p.device}, not float32 on {home}")
    want = torch.bfloat16 if bf16 else None
    policy = model._get_fsdp_state()._mp_policy
    if policy.param_dtype != want:
        fail(f"the student computes in {policy.param_dtype}, the preset asks {want or 'float32'}")
    student = dict(model.named_parameters())
    for label, other in others.items():
        for name, p in other.named_parameters():
            s = student[name]
            if not isinstance(p, DTensor) or p.placements != s.placements or p.to_local().shape != \
                    s.to_local().shape or p.device != s.device or p.dtype != s.dtype:
                fail(f"the {label}'s {name} is not sharded as the student's")
        if other._get_fsdp_state()._mp_policy.param_dtype != want:
            fail(f"the {label} computes in {other._get_fsdp_state()._mp_policy.param_dtype}, "
                 f"not {want}")


def check_optimizer(optimizer, home: str) -> None:
    """After a step, when AdamW has made its states."""
    if not optimizer.defaults.get("fused"):
        raise DryRunFailure("sharding: the optimiser is not the fused AdamW")
    for state in optimizer.state.values():
        for key, t in state.items():
            if isinstance(t, torch.Tensor) and t.dim() and t.device.type != home:
                raise DryRunFailure(f"sharding: an optimiser state ({key}) is on {t.device}")


def check_float32(diags) -> None:
    for diag in diags:
        for key, t in diag.items():
            if t.is_floating_point() and t.dtype not in (torch.float32, torch.float64):
                raise DryRunFailure(f"float32: the per-token {key} is {t.dtype}, not float32")


def step_peak_tracker(model, optimizer):
    """torch's FSDPMemTracker, its per-module statistics dropped at each forward of the root: it
    refuses a second root forward in one step (the micro-batches), and the peak, what the dry run
    reads, does not need them."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    class StepPeakTracker(FSDPMemTracker):
        def _fsdp_state_pre_forward(self, fsdp_mod, orig):
            inner = super()._fsdp_state_pre_forward(fsdp_mod, orig)
            if fsdp_mod is not self._root_mod:
                return inner

            def pre_forward(*args, **kwargs):
                if not self._mod_tracker.is_bw:
                    self.memory_tracking.clear()
                return inner(*args, **kwargs)
            return pre_forward

    return StepPeakTracker(model, optimizer)


def gpu_shard_bytes(module) -> int:
    """Bytes of a module's sharded parameters on this rank's GPU (allocated before the tracker
    started; none when they are offloaded to the CPU)."""
    return sum(p.to_local().nbytes for p in module.parameters() if p.device.type == "cuda")


# ------------------------------------------------------------------------------------------------
# One rank's steps
# ------------------------------------------------------------------------------------------------
def sft_steps(sft, model, teacher, base, optimizer, args, cfg, device, roof):
    """What sft.py's loop runs for STEPS optimiser steps of MICRO_BATCHES micro-batches each, at
    the longest sequences the preset admits, each step a logging step. Yields the micro-batches'
    shape after each step."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    seq = min(args.max_prompt_len + args.max_response_len, args.token_budget)
    per_mb = max(1, args.token_budget // seq)
    n = per_mb * MICRO_BATCHES
    lengths = [seq - (i == n - 1 and per_mb > 1) for i in range(n)]  # the last micro-batch padded
    items = [(list(range(length)), [0] + [1] * (length - 1)) for length in lengths]
    n_targets = [length - 1 for length in lengths]
    micro = [list(range(k * per_mb, (k + 1) * per_mb)) for k in range(MICRO_BATCHES)]
    shape = {"sequences": per_mb, "seq_len": seq, "trained": per_mb * (seq - 1),
             "micro_batches": MICRO_BATCHES, "tokens_per_step": sum(lengths)}
    for step in range(STEPS):
        batches = [sft.collate_on(ids, items, 0, device) for ids in micro]
        old_logp = [None] * len(batches)
        # at the start of a data batch in sft.py: here every step
        if args.loss == "psft":
            with roof.region("old log-probs"):
                old_logp = [sft.token_log_probs(model, b, args.loss_chunk)[0] for b in batches]
        with unset_fake_temporarily():                  # host work in sft.py too (a CPU generator)
            weight = sft.token_weights(list(range(len(items))), n_targets, args, step)
        weights = [sft.per_token(weight, ids, n_targets, device) for ids in micro]
        # sft.py's loop, Alg. 1 lines 4-13: its micro-batch losses, backward, clipping, all-reduce
        loss, diags = torch.zeros((), dtype=torch.float64, device=device), []
        for batch, w, old in zip(batches, weights, old_logp):
            total, diag = sft.micro_batch_loss(model, teacher, base, batch, old, args, cfg, True, w)
            sft.micro_batch_backward(total, base)
            loss += total.detach()
            diags.append(diag)
        grad_norm = models.clip_grad_norm(model, args.grad_clip)
        torch.distributed.all_reduce(loss)
        check_float32(diags)
        sft.read_step(loss, grad_norm, sft.cat_diags(diags))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if teacher is not None:         # every teacher_every steps in sft.py: here every step
            with roof.region("teacher update"):
                sft.update_teacher(teacher, model, args.teacher_mu)
        yield shape


def rl_steps(rl, model, optimizer, args, device, gpus, roof):
    """What rl.py's loop runs after generation, for STEPS optimiser steps of MICRO_BATCHES
    micro-batches each: synthetic rollouts of the longest responses, their old log-probs, the
    clipped update."""
    from chunked_logits import token_log_probs
    from plumbing.generation import Sample

    prompts = max(1, -(-MICRO_BATCHES * args.micro_batch // args.rollouts))  # per rank, per step
    args = dataclasses.replace(args, mini_batch=prompts * gpus)              # one mini-batch a step
    prompt_ids = [list(range(args.max_prompt_len))] * prompts
    # the longest responses, micro_batch - 1 of them a token shorter: the last micro-batch is padded
    lengths = [[args.max_response_len - (i * args.rollouts + j < args.micro_batch - 1)
                for j in range(args.rollouts)] for i in range(prompts)]
    samples = [[Sample(list(range(n)), "", None, None, "length") for n in row] for row in lengths]
    adv = [[(j % 2) * 2.0 - 1 for j in range(args.rollouts)]] * prompts   # host floats, as rl.py's
    shape = {"sequences": args.micro_batch, "seq_len": args.max_prompt_len + args.max_response_len,
             "trained": args.micro_batch * args.max_response_len,
             "tokens_per_step": sum(args.max_prompt_len + n for row in lengths for n in row)}
    for step in range(STEPS):
        (mbs,) = rl.micro_batches(prompt_ids, samples, adv, args, 0, device)
        with roof.region("old log-probs"):
            for mb in mbs:
                mb.old_lp, mb.entropy = token_log_probs(model, mb.batch, args.loss_chunk,
                                                        args.temperature)
        model.reshard()
        rl.policy_update(model, optimizer, mbs, args, device)
        yield shape | {"micro_batches": len(mbs)}


def allocate_shards(offload: bool):
    """The one seam: plumbing.models.broadcast_weights, rank 0's weights into every rank's shards,
    cannot run on tensors without data. In its place: nothing on ranks other than 0, whose shards
    shard_model allocated; on rank 0 (one GPU) the shards where its loaded weights would be, the
    buffers on the GPU as broadcast_weights puts them."""
    def broadcast_weights(model, full, device):
        if any(p.device.type == "meta" for p in model.parameters()):
            model.to_empty(device="cpu" if offload else device)
            for buf in model.buffers():
                buf.data = buf.data.to(device)
    return broadcast_weights


def simulate(argv) -> dict:
    own, rest = parse(argv)
    import rl
    import sft

    presets, rest = split_presets(rest, [sft.Args, rl.Args, cl.LossConfig])
    stage = stage_of(presets, own.stage)
    model_name, config = model_config(own.model, presets)
    trainer, args, cfg = stage_settings(stage, presets, rest, model_name)
    trainer.check_world(args, own.gpus)

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM

    kernels = collections.Counter()
    sim_gpu.install_cuda_shims()
    sim_gpu.mesh_outside_fake_mode()
    sim_gpu.fake_pinned_memory()
    sim_gpu.route_attention_like_cuda(kernels)
    sim_gpu.fake_process_group(own.gpus, rank=1 if own.gpus > 1 else 0)
    models.broadcast_weights = allocate_shards(args.offload)
    device = torch.device("cuda", 0)
    bf16 = args.bf16
    config._attn_implementation = "sdpa"
    roof = roofline.Roofline(roofline.GPU(bf16_tflops=own.peak_tflops, hbm_tbs=own.hbm_tbs,
                                          link_gbs=own.link_gbs))
    first, watch, flops = HostWatch(), HostWatch(), FlopCounterMode(display=False)
    t0 = time.perf_counter()
    with FakeTensorMode(allow_non_fake_inputs=True):
        with torch.device("meta"):           # what load_full_model gives every rank but rank 0
            student = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        if stage == "sft":
            model, teacher, base = trainer.shard_models(student, args, device, bf16)
        else:
            model = models.shard_model(student, device, bf16, args.grad_ckpt, offload=args.offload)
            teacher = base = None
        others = {k: v for k, v in (("teacher", teacher), ("base", base)) if v is not None}
        home = "cpu" if args.offload else "cuda"
        check_sharding(model, others, bf16, home)
        optimizer = models.make_optimizer(model, args.lr, args.weight_decay,
                                          getattr(args, "adam_beta2", 0.999), device, args.offload)
        steps = (sft_steps(trainer, model, teacher, base, optimizer, args, cfg, device, roof)
                 if stage == "sft"
                 else rl_steps(trainer, model, optimizer, args, device, own.gpus, roof))
        tracker = step_peak_tracker(model, optimizer)
        try:
            with charged_regions(roof, trainer, optimizer, teacher, base):
                # step 1: FLOPs and the roofline (FlopCounterMode's module hooks keep what
                # activation checkpointing frees: not under the tracker); step 2: memory (the
                # tracker's own step 1 reports a bogus peak) and host reads
                with first, flops, roof:
                    next(steps)
                with tracker, watch:
                    shape = next(steps)
        except Exception as e:               # what made a mismatch of devices, if a move did
            moves = first.moves + watch.moves
            if moves:
                raise DryRunFailure(f"devices: a tensor moved to the host in the step "
                                    f"({next(iter(moves))}), then {type(e).__name__}") from e
            raise
        peak_snapshot = tracker.get_tracker_snapshot("peak")[device]
        resident_others = sum(gpu_shard_bytes(m) for m in others.values())
        check_optimizer(optimizer, home)
        weights = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)
    if not kernels or kernels["math"]:
        raise DryRunFailure(f"attention: {dict(kernels) or 'no SDPA call'}: the math fallback "
                            f"keeps [B, H, T, T] scores (eager attention, or inputs no fused "
                            f"kernel takes)")
    measured = peak_snapshot["Total"] + resident_others
    result = {"stage": stage, "model": model_name, "gpus": own.gpus, "presets": presets,
              "loss": (args.loss if stage == "sft"
                       else args.policy_loss if args.hybrid == "none" else args.hybrid),
              "micro_batch": shape,
              "micro_batches_per_step": shape["micro_batches"], "steps_run": STEPS}
    result |= memory_result(config, stage, args, shape, own, measured, peak_snapshot)
    result["attention_kernel"], result["attention_calls"] = "+".join(sorted(kernels)), dict(kernels)
    result |= speed_result(roof, flops.get_total_flops(), weights, shape, config, watch)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["not_covered"] = NOT_COVERED + (NOT_COVERED_RL if stage == "rl" else []) + (
        [NOT_COVERED_OFFLOAD] if args.offload else [])
    if not result["fits"]:
        result["fitting"] = largest_fitting(config, stage, args, shape, own,
                                            max(1.0, result["ratio"]))
    failed = [check(result) for check in (check_memory, check_syncs)]
    if any(failed):
        result["failed"] = next(f for f in failed if f)
    return result


@contextlib.contextmanager
def charged_regions(roof, trainer, optimizer, teacher, base):
    """The roofline's regions: the teacher's (or the base model's) forward and head, the
    optimiser's step; the functions are put back on exit."""
    def charged(fn, label):
        def wrapper(*args, **kwargs):
            with roof.region(label):
                return fn(*args, **kwargs)
        return wrapper

    heads = {id(m.lm_head): label
             for m, label in ((teacher, "teacher logits"), (base, "base model")) if m}
    for m, label in ((teacher, "teacher forward"), (base, "base model")):
        if m is not None:
            roof.watch_module(m, label)
    heads_of = [m for m in (trainer, baselines) if hasattr(m, "no_grad_logits")]  # sft.py's too
    saved = [(cl, "teacher_log_prob"), (optimizer, "step")]
    saved = [(owner, name, getattr(owner, name))
             for owner, name in saved + [(m, "no_grad_logits") for m in heads_of]]
    cl.teacher_log_prob = charged(cl.teacher_log_prob, "teacher loss")
    optimizer.step = charged(optimizer.step, "optimizer")
    for owner in heads_of:
        owner.no_grad_logits = functools.partial(
            lambda fn, head, h: charged(fn, heads.get(id(head), "student"))(head, h),
            owner.no_grad_logits)
    try:
        yield
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def memory_result(config, stage, args, shape, own, measured, peak_snapshot) -> dict:
    """The memory figures: the tracker's peak (measured) against bench/memory.py's plan, and the
    fit."""
    plan = planned(config, stage, args, shape, own)
    training = plan["phases"]["rl training" if stage == "rl" else "sft step"]
    planned_bytes = training["total_bytes"] - training["parts"].get("vllm", 0)
    limit = (1 - memory.Run.headroom) * own.gpu_gib * GIB
    need = max(measured, plan["total_bytes"])
    return {"peak_gib_measured": round(measured / GIB, 3),
            "peak_gib_planned": round(planned_bytes / GIB, 3),
            "ratio": round(measured / planned_bytes, 4), "gpu_gib": own.gpu_gib,
            "peak_gib_planned_all_phases": round(plan["total_bytes"] / GIB, 3),
            "margin_gib": round((limit - need) / GIB, 2), "fits": need <= limit,
            "peak_parts_gib": {str(k): round(v / GIB, 3) for k, v in peak_snapshot.items() if v}}


def speed_result(roof, flops: int, weights: int, shape: dict, config, watch) -> dict:
    """Host syncs, FLOPs and the roofline's estimate of the step (per rank), its regions and
    costliest ops."""
    compute = sum(roof.seconds.values())
    # FSDP overlaps the collectives with compute
    est = max(compute, roof.comm_seconds())
    model_flops = 6 * weights * shape["tokens_per_step"]   # 6ND: forward and backward of the tokens
    teacher = sum(roof.seconds[r] for r in ("teacher forward", "teacher logits", "teacher loss"))
    # one bf16 logsumexp over the step's [N, V] logits: a single read of them, at the memory's
    # bandwidth
    lse = (shape["trained"] * shape["micro_batches"] * config.vocab_size * 2
           / (roof.gpu.hbm_tbs * 1e12))
    return {"syncs_per_step": sum(watch.reads.values()), "sync_sites": dict(watch.reads),
            "flops_per_step": flops, "est_ms_per_step": round(est * 1e3, 2),
            "est_ms_parts": {r: round(s * 1e3, 2) for r, s in roof.seconds.most_common()},
            "comm_ms_est": round(roof.comm_seconds() * 1e3, 2),
            "host_copy_gib": round(roof.host_copy_bytes / GIB, 2),
            "mfu_est": round(model_flops / (est * roof.gpu.bf16_tflops * 1e12), 3),
            "teacher_share": round(teacher / compute, 4),
            "teacher_loss_per_lse": round(roof.seconds["teacher loss"] / lse, 2),
            "costliest_ops_ms": {r: roof.top_ops(r) for r in roof.seconds},
            "gpu_roofs": dataclasses.asdict(roof.gpu)}


def check_memory(r: dict) -> str | None:
    if abs(r["ratio"] - 1) > TOLERANCE:
        return (f"memory: the tracker's peak {r['peak_gib_measured']} GiB is {r['ratio']:.3f}x "
                f"the planner's {r['peak_gib_planned']} GiB (allowed: within {TOLERANCE:.0%}); "
                f"bench/memory.py or the trainer is wrong")
    if not r["fits"]:
        return (f"fits: {max(r['peak_gib_measured'], r['peak_gib_planned_all_phases']):.2f} GiB "
                f"per GPU (measured {r['peak_gib_measured']}, "
                f"planned {r['peak_gib_planned_all_phases']}) does not fit "
                f"{r['gpu_gib']} GiB with {memory.Run.headroom:.0%} kept free")
    return None


def check_syncs(r: dict) -> str | None:
    """At most one host read per optimiser step: the step's own (sft.read_step,
    rl.policy_update)."""
    if r["syncs_per_step"] > 1:
        sites = ", ".join(f"{n}x {site}" for site, n in r["sync_sites"].items())
        return f"syncs: {r['syncs_per_step']} host reads in one optimiser step (at most 1): {sites}"
    return None


def largest_fitting(config, stage, args, shape, own, ratio: float) -> dict | None:
    """When the settings do not fit: the largest SFT token budget (whole sequences of the longest
    length) or GRPO micro-batch that does by the planner, its figure scaled by the measured/planned
    ratio when above 1; failing that, the fewest GPUs (a power of two, at most 64) that fit. None if
    neither does."""
    limit = (1 - memory.Run.headroom) * own.gpu_gib * GIB
    seq = shape["seq_len"]
    trained = shape["trained"] // shape["sequences"]
    for k in range(shape["sequences"] - 1, 0, -1):
        smaller = dict(shape, sequences=k, trained=k * trained)
        new_args = dataclasses.replace(args, micro_batch=k) if stage == "rl" else args
        need = planned(config, stage, new_args, smaller, own)["total_bytes"] * ratio
        if need <= limit:
            flag, value = ("--micro_batch", k) if stage == "rl" else ("--token_budget", k * seq)
            return {"flag": flag, "value": value, "peak_gib_planned": round(need / GIB, 2)}
    gpus = own.gpus * 2
    while gpus <= 64:
        more = argparse.Namespace(**{**vars(own), "gpus": gpus})
        need = planned(config, stage, args, shape, more)["total_bytes"] * ratio
        if need <= limit:
            return {"flag": "--gpus", "value": gpus, "peak_gib_planned": round(need / GIB, 2)}
        gpus *= 2
    return None


def planned(config, stage, args, shape, own) -> dict:
    """bench/memory.py's plan for the shapes the dry run ran: its micro-batch and micro-batches per
    step."""
    run = dict(stage=stage, gpus=own.gpus, token_budget=shape["sequences"] * shape["seq_len"],
               seq_len=shape["seq_len"], trained_tokens=shape["trained"],
               loss_chunk=args.loss_chunk,
               bf16=args.bf16, grad_ckpt=args.grad_ckpt, offload=args.offload, gpu_gib=own.gpu_gib,
               max_prompt_len=args.max_prompt_len, max_response_len=args.max_response_len)
    if stage == "sft":
        run |= dict(loss=args.loss, updates_per_batch=args.updates_per_batch,
                    global_batch=(MICRO_BATCHES * shape["sequences"] * own.gpus
                                  * args.updates_per_batch))
    else:
        run |= dict(micro_batch=args.micro_batch, rollouts=args.rollouts,
                    mini_batch=(shape["micro_batches"] * args.micro_batch * own.gpus
                                // args.rollouts),
                    gpu_memory_utilization=args.gpu_memory_utilization, vllm_sleep=args.vllm_sleep,
                    hybrid=args.hybrid, entropy_coef=args.entropy_coef)
    return memory.plan(config.to_dict(), **run)


# ------------------------------------------------------------------------------------------------
# Report, and the two processes
# ------------------------------------------------------------------------------------------------
def describe(r: dict) -> str:
    mb = r["micro_batch"]
    lines = [f"dry run: {r['stage']} {r['loss']}, {r['model']}, {r['gpus']} simulated GPUs of "
             f"{r['gpu_gib']} GiB; {r['steps_run']} optimiser steps of "
             f"{r['micro_batches_per_step']} micro-batches of {mb['sequences']} x "
             f"{mb['seq_len']} tokens ({mb['trained']} trained), {r['seconds']} s",
             f"  peak per GPU, step 2: measured {r['peak_gib_measured']:.2f} GiB (torch's "
             f"FSDPMemTracker), planned {r['peak_gib_planned']:.2f} GiB (bench/memory.py): "
             f"ratio {r['ratio']:.3f}",
             f"  fits: {'yes' if r['fits'] else 'NO'}, margin {r['margin_gib']:+.2f} GiB below "
             f"{1 - memory.Run.headroom:.0%} of the GPU"
             + (f" (the planner's generation phase: {r['peak_gib_planned_all_phases']:.1f} GiB)"
                if r["stage"] == "rl" else ""),
             f"  attention: {r['attention_kernel']} ({sum(r['attention_calls'].values())} calls)",
             f"  host reads (GPU syncs) in step 2: {r['syncs_per_step'] or 'none'}"]
    lines += [f"    {n}x {site}" for site, n in r["sync_sites"].items()]
    parts = ", ".join(f"{region} {ms:.0f}" for region, ms in r["est_ms_parts"].items())
    lines += [f"  FLOPs per step: {r['flops_per_step'] / 1e12:.1f} TFLOP (torch's FlopCounterMode)",
              f"  estimated step time: {r['est_ms_per_step'] / 1e3:.2f} s, MFU {r['mfu_est']:.0%} "
              f"(a roofline estimate on {r['gpu_roofs']['bf16_tflops']:g} TFLOP/s, "
              f"{r['gpu_roofs']['hbm_tbs']:g} TB/s: a lower bound on the time, not a measurement)",
              f"    ms: {parts}; collectives {r['comm_ms_est']:.0f} (overlapped)"
              + (f"; host <-> GPU copies {r['host_copy_gib']:.1f} GiB (not in the estimate)"
                 if r["host_copy_gib"] else "")]
    lines.append("  not covered: " + "; ".join(r["not_covered"]))
    if r.get("failed"):
        lines.append(f"FAILED {r['failed']}")
    return "\n".join(lines)


def rank_main(argv) -> int:
    """The rank's process (the C++ shim already loaded): simulate, print, write --json; 1 on a
    failed check."""
    own, _ = parse(argv)
    try:
        result = simulate(argv)
    except DryRunFailure as e:
        result = {"failed": str(e)}
    except Exception as e:
        # a device mismatch, a host read the fake tensors cannot answer, a wrong dtype...
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        result = {"failed": f"the step raised {type(e).__name__} at {failure_site(e)}: "
                            f"{first[:300]}"}
    if own.json:
        Path(own.json).parent.mkdir(parents=True, exist_ok=True)
        Path(own.json).write_text(json.dumps(result, indent=1) + "\n")
    if "stage" in result:
        print(describe(result), flush=True)
    else:
        print(f"dry run FAILED {result['failed']}", file=sys.stderr, flush=True)
    return 1 if result.get("failed") else 0


def failure_site(e: BaseException) -> str:
    """The innermost frame of the project's code in the exception's traceback."""
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if ROOT in Path(f.filename).resolve().parents
              and ".venv" not in Path(f.filename).parts]
    inner = [f for f in frames if Path(f.filename).resolve().parent != ROOT / "bench"] or frames
    if not inner:
        return "torch"
    f = inner[-1]
    return f"{Path(f.filename).resolve().relative_to(ROOT)}:{f.lineno} ({f.name})"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if os.environ.get(sim_gpu.LIB_ENV):
        return rank_main(argv)
    own, rest = parse(argv)                              # --help and the dry run's own errors, here
    library = sim_gpu.build()
    env = dict(os.environ, **{sim_gpu.LIB_ENV: str(library)})
    with tempfile.TemporaryDirectory() as tmp:
        def run(extra: list[str], name: str) -> tuple[int, dict]:
            path = Path(own.json) if name == "main" and own.json else Path(tmp) / name
            flags = rank_flags(own) + ["--json", str(path)]
            code = subprocess.run([sys.executable, __file__, *rest, *extra, *flags],
                                  env=env).returncode
            return code, json.loads(path.read_text()) if path.is_file() else {}

        code, result = run([], "main")
        if not result.get("stage"):
            return code
        for loss in own.compare_losses:
            print(f"\n-- compared with --loss {loss} (the same presets and flags):", flush=True)
            other_code, other = run(["--loss", loss], loss)
            if not other.get("stage"):
                return other_code or 1
            result.setdefault("compare", {})[loss] = ratios(result, other)
        fitting = result.get("fitting")
        if fitting and not own.no_confirm:
            print(f"\n-- the largest setting that fits by the planner, {fitting['flag']} "
                  f"{fitting['value']}, confirmed by a dry run:", flush=True)
            _, confirmed = run([fitting["flag"], str(fitting["value"])], "confirm")
            fitting["confirmed"] = {k: confirmed.get(k)
                                    for k in ("fits", "peak_gib_measured", "margin_gib",
                                              "est_ms_per_step", "failed")}
        print(summary(result), flush=True)
        if own.json:
            Path(own.json).write_text(json.dumps(result, indent=1) + "\n")
    return code


def rank_flags(own) -> list[str]:
    """The dry run's own flags for a rank's process (not --json, --compare_losses, --no_confirm)."""
    flags = ["--gpus", str(own.gpus), "--gpu_gib", str(own.gpu_gib),
             "--peak_tflops", str(own.peak_tflops),
             "--hbm_tbs", str(own.hbm_tbs), "--link_gbs", str(own.link_gbs)]
    flags += ["--stage", own.stage] if own.stage else []
    return flags + (["--model", own.model] if own.model else [])


def ratios(r: dict, other: dict) -> dict:
    """This run's FLOPs, estimated time and peak memory over another's."""
    return {"flops_ratio": round(r["flops_per_step"] / other["flops_per_step"], 3),
            "est_ms_ratio": round(r["est_ms_per_step"] / other["est_ms_per_step"], 3),
            "peak_ratio": round(r["peak_gib_measured"] / other["peak_gib_measured"], 3),
            "other": {k: other[k] for k in ("flops_per_step", "est_ms_per_step", "mfu_est",
                                            "peak_gib_measured", "est_ms_parts")}}


# Table 2's "Speed" column: seconds per SFT step measured by the paper (8 H800, the authors' verl),
# with its row labels
PAPER_SPEED_S = {"sft": ("Vanilla SFT", 43.2), "entropy": ("SFT with Entropy", 44.6),
                 "kl": ("SFT with KL", 50.2), "gem": ("GEM", 44.5), "dft": ("DFT", 43.7),
                 "psft": ("PSFT", 45.2), "curio": ("CurioSFT", 53.9),
                 "curio_fixed_tau": ("w/o Adaptive Temp.", 51.9),
                 "curio_self_teacher": ("w/o Separate Teacher", 45.5)}


def speed_table(r: dict) -> list[str]:
    """With --loss sft and --compare_losses: each loss's estimated step time over SFT's beside the
    paper's measured ratio (Table 2). Rebased: verl computes old log-probs, a no-grad forward and
    head, in every loss's step, which the paper's times include and these do not; the teacher's
    forward and logits (a no-grad forward and head of the same tokens, from the curio run) added
    to both times count the steps as the paper's were."""
    if r["loss"] != "sft" or not r.get("compare"):
        return []
    curio = r["compare"].get("curio", {}).get("other", {}).get("est_ms_parts", {})
    fwd = curio.get("teacher forward", 0) + curio.get("teacher logits", 0)
    sft_ms, sft_s = r["est_ms_per_step"], PAPER_SPEED_S["sft"][1]
    lines = ["", f"Table 2's speed: estimated time over SFT's ({sft_ms / 1e3:.2f} s) against the "
             f"paper's (8 H800, {sft_s} s)"
             + (f"; rebased: + {fwd / 1e3:.2f} s of old log-probs in both" if fwd else ""),
             "| --loss | paper's row | est. s | / SFT | rebased | paper's s | paper / SFT |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for loss, c in r["compare"].items():
        ms = c["other"]["est_ms_per_step"]
        label, paper_s = PAPER_SPEED_S.get(loss, ("–", None))
        rebased = f"{(ms + fwd) / (sft_ms + fwd):.3f}" if fwd else "–"
        paper = (f"{paper_s} | {paper_s / sft_s:.3f}" if paper_s else "– | –")
        lines.append(f"| {loss} | {label} | {ms / 1e3:.2f} | {ms / sft_ms:.3f} | {rebased} | "
                     f"{paper} |")
    return lines


def summary(r: dict) -> str:
    """The comparison's ratios and the fitting setting, after the runs' own reports."""
    lines = []
    for loss, c in r.get("compare", {}).items():
        lines.append(f"{r['loss']} / {loss}: FLOPs {c['flops_ratio']:.3f}x, "
                     f"estimated time {c['est_ms_ratio']:.3f}x, "
                     f"peak memory {c['peak_ratio']:.3f}x; "
                     f"teacher side {r['teacher_share']:.0%} of the step")
    fitting = r.get("fitting")
    if not r["fits"]:
        if fitting is None:
            lines.append("does not fit, and no smaller micro-batch or more GPUs (up to 64) would "
                         "by the planner: try --offload or shorter --max_response_len")
        else:
            done = fitting.get("confirmed") or {}
            verdict = ("confirmed: fits, margin " + f"{done['margin_gib']:+.2f} GiB"
                       if done.get("fits")
                       else f"not confirmed: {done.get('failed')}" if done
                       else "not confirmed (--no_confirm)")
            lines.append(f"does not fit; {fitting['flag']} {fitting['value']} does by the planner "
                         f"({fitting['peak_gib_planned']} GiB), {verdict}")
    return "\n".join(lines + speed_table(r))


if __name__ == "__main__":
    sys.exit(main())
