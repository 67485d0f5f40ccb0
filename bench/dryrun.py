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
logs; with --gpus 1 rank 0 itself, its weights loaded on the CPU as a real run loads them, its log
written) on torch's fake tensors (shapes, dtypes and devices, no data) on `cuda`, with the fake
process group: what bench/sim_gpu.py sets up. It runs the trainer itself, sft.train or rl.train,
for two optimiser steps of two micro-batches each, on a model directory with the preset's
config.json and a train file of the longest rows the preset admits (the longest sequence, as many
of its tokens trained as --max_response_len allows, one micro-batch padded), read by the trainer's
own data path. The flags are the preset's but for what makes both steps run all of the loop's
schedule (a new data batch each step, so PSFT's old log-probs; the teacher's update and a log
record after each; GRPO: one mini-batch a step) and the run's files (a temporary directory). Where
a rank cannot run the trainer's code on fake tensors, a named seam (SEAMS) stands in: rank 0's
weight broadcast, object collectives, checkpoint writing, host work on real values, the rollout
engine and the reward. Everything else runs as users run it: loading and sharding the models
(FSDP2, bf16 compute over float32 master weights, activation checkpointing, the teacher or base
model), the optimiser, the micro-batch losses and backward, clipping, the all-reduce, the step's
read, the finiteness guard, the optimiser step, the teacher's schedule, the log step and the
stop-signal check. It fails, in one line naming the place, unless:
  sharding   every parameter is a sharded DTensor on cuda in float32, computed in bf16 (the
             preset's), the teacher (or base) sharded alike; the optimiser is the fused AdamW
             with its states on cuda
  float32    the per-token losses' diagnostics (log-probs, entropies, temperatures) are float32
             or wider
  devices    no CPU tensor meets a CUDA tensor in the step
  syncs      no value read back to the host (a GPU sync) in step 2 but the loop's own
             (SYNC_BUDGET: the step's read; GRPO's engine check and log record), each line
             that asks named
  attention  every attention call runs flash or memory-efficient attention, never the math
             fallback
  memory     the step-2 peak of torch's own tracker (FSDPMemTracker) is within 10% of
             bench/memory.py's plan for the same shapes
  fits       both figures fit the GPU (--gpu_gib) with the planner's headroom kept free; if not,
             it names the largest token budget (GRPO: micro-batch; else GPU count) that fits by
             the planner, and confirms it with a second dry run
The step runs in the trainer's form (its --pack: packed micro-batches, varlen attention; --no-pack:
padded rows), or another --form of bench/forms.py (6fbcbf7: the step one H200 measured, a dense
mask, the loss's float32 copy, torch's AdamW on DTensors).
It reports the host reads with the lines that ask for them, FLOPs per step (FlopCounterMode), and
an estimate of the step's time and MFU on the GPU given by --peak_tflops, --hbm_tbs
(bench/roofline.py: each op at its class's efficiency measured on one H200, --calibration; an
estimate, never a measurement), by region (student, teacher forward, logits and loss, optimiser)
and op class, with the costliest ops. What it does not cover is listed in its output: see
NOT_COVERED.

    python bench/dryrun.py --against bench/data/h200-2026-11-27/summary.json [--fit]

dry-runs what a `bash bench/gpu_check.sh` summary measured (bench/sft_step.py's three variants at
its shapes and sequences, in the form it ran, one GPU, and the teacher side), prices it on that
GPU's roofs and prints predicted / measured per figure; --fit refits the calibration from the
profiles beside it first; --form another form predicts that form's steps at the same shapes.
"""
import argparse
import collections
import contextlib
import dataclasses
import functools
import json
import os
import re
import runpy
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from unittest import mock

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
import chunked_logits  # noqa: E402
import curio_loss as cl  # noqa: E402
import forms  # noqa: E402
import memory  # noqa: E402
import roofline  # noqa: E402
from plumbing import models  # noqa: E402
from plumbing.cli import parse_config, split_presets  # noqa: E402

GIB = 2**30
CALIBRATIONS = {"h200-2026-11-27": roofline.H200_2026_11_27, "none": roofline.DATASHEET}
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
    "rank 0's own work: its run-directory checks, gathering and summary of the logged diagnostics, "
    "log.jsonl (the object collectives carry nothing here)",
    "checkpoint writing and resuming (torch.distributed.checkpoint, safetensors)",
    "kernel speed beyond the calibration's classes (measured on one H200 at 1.5B shapes in "
    "6fbcbf7's form: a dense mask, the loss's float32 copy, torch's AdamW on DTensors; causal "
    "and varlen attention at the masked kernel's efficiency, the blockwise loss's and the "
    "blockwise top-k's kernels at their classes' rates, ShardLocalAdamW's host time none: not "
    "measured), time the GPU waits on the host, NCCL and its buffers, the CUDA context and the "
    "allocator's fragmentation",
    "numerics on a GPU (fake tensors hold no values: bf16 rounding, NaN, the loss's values)",
]
NOT_COVERED_OFFLOAD = ("with --offload, the estimated time leaves out the optimiser step on the "
                       "CPU and the copies between host and GPU (their GiB are reported)")
NOT_COVERED_RL = ["vLLM: its memory share, sleep/wake, the weight sync and generation (rollouts "
                  "here are synthetic)",
                  "grading the rollouts (math-verify runs on the host)"]
NOT_COVERED_EVAL = ("--eval_every (run after both steps): vLLM itself (its memory share is the "
                    "planner's, bench/memory.py's sft validation or rl generation phase, in the "
                    "fit), its samples (synthetic) and their grading; the weight sync's gathers "
                    "run (in step 2's window)")


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
    parser.add_argument("--calibration", choices=list(CALIBRATIONS), default="h200-2026-11-27",
                        help="each op class's efficiency for the time estimate (bench/roofline.py):"
                        " measured on one H200, or none (the datasheet's roofs: a lower bound)")
    parser.add_argument("--form", choices=list(forms.FORMS), help="the step's form "
                        "(bench/forms.py): " + "; ".join(f"{k}: {v}" for k, v in forms.FORMS.items())
                        + ". Default: the trainer's own (--pack, its default: packed; --no-pack: "
                        "padded). With --against: another form's predictions at the summary's "
                        "shapes")
    parser.add_argument("--against", metavar="SUMMARY_JSON", help="instead: dry-run what a "
                        "`bash bench/gpu_check.sh` summary.json measured (bench/sft_step.py's "
                        "three variants at its shape and sequences, the teacher side) on that "
                        "GPU's roofs, and print predicted / measured per figure")
    parser.add_argument("--fit", action="store_true", help="with --against: refit the calibration "
                        "from the profile_{sft,curio,curio_self_teacher}.txt beside the summary, "
                        "print it, and predict with it")
    parser.add_argument("--teacher_side", type=int, nargs=2, metavar=("TOKENS", "VOCAB"),
                        help=argparse.SUPPRESS)      # --against's: the teacher side's record too
    parser.add_argument("--sequences", type=int, nargs="+", metavar="TOKENS",
                        help="SFT: train these sequences each step (an eighth of each an untrained "
                        "prompt, as bench/sft_step.py writes its micro-batch) instead of the "
                        "preset's longest rows")
    own, rest = parser.parse_known_args(argv)
    if own.gpus < 1:
        raise SystemExit(f"--gpus {own.gpus}: must be >= 1")
    if own.form in forms.NOT_PRICED:
        raise SystemExit(f"--form {own.form}: {NOT_COMPILED}")
    return own, rest


NOT_COMPILED = ("the dry run prices eager kernels; torch.compile's fused ones are measured on a "
                "GPU (bench/sft_step.py --forms packed compiled)")


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

        trainer = sft
        args, user_cfg = parse_config(sft.Args, cl.LossConfig, argv=argv, prog="bench/dryrun.py")
    else:
        import rl

        trainer, user_cfg = rl, None
        (args,) = parse_config(rl.Args, argv=argv, prog="bench/dryrun.py")
    if args.compile:                                    # a flag or a preset's compile = True
        raise SystemExit(f"--compile: {NOT_COMPILED}")
    return trainer, args, user_cfg


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


def stand_in(func, args, site: str):
    """What a read-back a fake tensor cannot answer (it holds no value) returns instead: a plausible
    value of the right type and shape (1, True, every element nonzero; ANSWERS by the function that
    reads), so that the step runs on and every read is counted."""
    answer = ANSWERS.get(site.rpartition("(")[2].rstrip(")"))
    if answer is not None:
        return answer
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
        site = project_site() if name in HOST_READS else OUTSIDE
        if on_gpu and name in HOST_READS:
            self.reads[site] += 1
        try:
            out = func(*args, **(kwargs or {}))
        except (DataDependentOutputException, DynamicOutputShapeException):
            if name not in HOST_READS:
                raise
            out = stand_in(func, args, site)
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
# The inputs: a model directory and a train file of the longest rows, read by the trainer itself
# ------------------------------------------------------------------------------------------------
FILLER = "x"           # one token each: the tokenizer learns no merges


def synthetic_tokenizer():
    """A byte-level tokenizer without merges (FILLER is one token a character) that holds Table 7's
    prompt around a question as two added tokens: every prompt length from 3 tokens up is then
    reachable exactly, through the trainers' own prompt building and tokenization."""
    import data
    from plumbing.synthetic import build_toy_tokenizer
    from tokenizers import AddedToken

    tokenizer = build_toy_tokenizer([FILLER], vocab_size=0)
    before, after = data.build_prompt("\0", tokenizer).split("\0")
    tokenizer.add_tokens([AddedToken(text, normalized=False) for text in (before, after)])
    return tokenizer


def write_inputs(tmp: Path, config, stage: str, args, gpus: int, sequences=None):
    """tmp/model (the preset's config.json, the synthetic tokenizer, no weights: an empty
    model.safetensors, as rank 1 builds the model on the meta device and reads none) and
    tmp/train.jsonl: rows whose prompt and response are the longest the settings admit, a token
    short here and there so that a micro-batch is padded (SFT with `sequences`: those, each rank
    all of them each step). Returns the dry run's settings of the trainer (`run_settings`) and the
    micro-batch shape."""
    import data
    from safetensors.torch import save_file

    model_dir = tmp / "model"
    config.save_pretrained(model_dir)
    tokenizer = synthetic_tokenizer()
    tokenizer.save_pretrained(model_dir)
    save_file({}, model_dir / "model.safetensors")
    # the prompt's tokens besides the question's: an example of one-token question and response
    prompt_overhead = len(data.build_sft_data(
        tokenizer, [data.Example(FILLER, "1", FILLER, "dry run", 0)], 10**6, 10**6)[0][0][0]) - 3
    if stage == "sft" and sequences:
        lengths = sorted(sequences, reverse=True) * gpus
        prompt_lens = [n // 8 for n in lengths]
        responses = [n - p for n, p in zip(lengths, prompt_lens)]     # with its EOS
        n_rows, prompt = len(prompt_lens), min(prompt_lens)
    elif stage == "sft":
        seq = min(args.max_prompt_len + args.max_response_len, args.token_budget)
        prompt = max(prompt_overhead + 1, seq - args.max_response_len)     # most trained tokens
        per_mb = max(1, args.token_budget // seq)
        n_rows = MICRO_BATCHES * per_mb * gpus                   # a data batch an epoch
        # per_mb + 1 rows a token short: packed longest first and dealt in snake order, rank 1's
        # second micro-batch has one of them beside full ones (padded), rank 0 the rest
        short = [per_mb > 1 and i >= n_rows - per_mb - 1 for i in range(n_rows)]
        responses = [seq - prompt - s for s in short]             # with its EOS
        prompt_lens = [prompt] * n_rows
    else:
        prompt = args.max_prompt_len
        prompts = max(1, -(-MICRO_BATCHES * args.micro_batch // args.rollouts))  # per rank, step
        n_rows = prompts * gpus
        responses = [args.max_response_len] * n_rows              # the hybrids' expert's too
        prompt_lens = [prompt] * n_rows
    if max(prompt_lens) > args.max_prompt_len or prompt <= prompt_overhead:
        raise SystemExit(f"--max_prompt_len {args.max_prompt_len}: the dry run's prompts need "
                         f"{prompt_overhead + 1} to {max(prompt_lens)} tokens (--sequences: an "
                         f"eighth of the shortest is {prompt})")
    rows = [{"data_source": "dry run", "reward_model": {"ground_truth": "1"},
             "prompt": [{"role": "user", "content": FILLER * (p - prompt_overhead)}],
             "target": [{"role": "assistant", "content": FILLER * (n - 1)}]}
            for p, n in zip(prompt_lens, responses)]
    train_file = data.write_jsonl(rows, tmp / "train.jsonl")
    common = dict(model=str(model_dir), train_file=str(train_file), out_dir=str(tmp / "out"),
                  save_every=0, loggers=[], system_prompt="paper")     # (the same shapes)
    # --eval_every: the trainer validates after both steps, on a block of prompts per rank as long
    # as the training's
    validating = args.eval_every > 0
    question = {k: v for k, v in rows[0].items() if k != "target"}
    val_rows = [question] * (gpus * args.gen_batch_size) if validating else []
    common |= dict(eval_every=1 if validating else 0, eval_file=str(
        data.write_jsonl(val_rows, tmp / "val.jsonl")) if validating else "")
    if stage == "sft":
        # the schedule's flags set so that both steps run all of it: a new data batch each step
        # (PSFT's old log-probs), the teacher's update after each, a log record each
        run_args = dataclasses.replace(
            args, **common, global_batch=n_rows, updates_per_batch=1,
            epochs=STEPS, max_steps=-1, teacher_every=1, log_every=1)
        lengths = [p + n for p, n in zip(prompt_lens, responses)]
        return run_args, sft_shape(run_args, lengths, prompt_lens, gpus)
    run_args = dataclasses.replace(args, **common, steps=STEPS, prompts_per_step=prompts * gpus,
                                   mini_batch=prompts * gpus, log_rollouts=0)
    sequences = prompts * args.rollouts
    seq = prompt + args.max_response_len
    return run_args, {"sequences": args.micro_batch, "seq_len": seq,
                      "tokens": args.micro_batch * seq,      # packed: within a token a sequence
                      "trained": args.micro_batch * args.max_response_len,
                      "micro_batches": -(-sequences // args.micro_batch),
                      "tokens_per_step": sequences * (prompt + args.max_response_len)
                      - min(args.micro_batch - 1, sequences)}


def sft_shape(args, lengths: list[int], prompts: list[int], gpus: int) -> dict:
    """The micro-batches rank 1 trains in step 2, from sft.py's own plan of the rows; the largest,
    by the tokens it computes (packed: its sequences'; padded: its longest x its count)."""
    import sft

    rank = 1 if gpus > 1 else 0
    *_, batch, step_mbs = list(sft.plan_steps(lengths, gpus, args, 0, 0))[STEPS - 1]
    mine = [batch[rank][k] for k in step_mbs]

    def computed(mb):
        mb_lengths = [lengths[i] for i in mb]
        return sum(mb_lengths) if args.pack else max(mb_lengths) * len(mb)

    widest = max(mine, key=computed)
    return {"sequences": len(widest), "seq_len": max(lengths), "tokens": computed(widest),
            "trained": sum(lengths[i] - prompts[i] for i in widest), "micro_batches": len(mine),
            "lengths": [lengths[i] for i in widest],
            "tokens_per_step": sum(lengths[i] for mb in mine for i in mb)}


# ------------------------------------------------------------------------------------------------
# The seams: where one rank cannot run the trainers' own code on fake tensors, and why
# ------------------------------------------------------------------------------------------------
SEAMS = {
    "rank 0's weights": "plumbing.models.broadcast_weights: rank 0's weights into every rank's "
                        "shards; tensors without data have none to send (the shards stay "
                        "allocated as shard_model leaves them); rank 0 (one GPU) builds its "
                        "model from config.json as --scratch does, reading no weights",
    "object collectives": "torch.distributed.gather_object, broadcast_object_list: the fake "
                          "process group moves no objects and fake tensors cannot be pickled; "
                          "rank 1's objects go nowhere, rank 0's answer is the list as rank 1 "
                          "passed it ([None]: run_dir.claim's 'no error'); on one GPU, rank 0 "
                          "gathers its own object (its log record's diagnostics)",
    "checkpoint writing": "plumbing.checkpoints.save: torch.distributed.checkpoint cannot pickle "
                          "fake tensors; the call is recorded, nothing is written",
    "host work": "sft.load_sft_data, sft.plan_steps, sft.token_weights, rl.step_prompts run "
                 "outside fake mode, on real values: the data's tensors and the CPU generators "
                 "of the data order are the host's (rl.py's other host tensors are fake, their "
                 "reads answered by stand-ins)",
    "rollout engine": "plumbing.generation.rollout_engine, wake, generate, sleep (GRPO): vLLM "
                      "cannot run on fake tensors; generate returns the longest responses, a "
                      "token short here and there",
    "reward": "rl.train's reward_fn (GRPO): rewards 0, 1, 0, 1, ... (the grader reads text)",
    "log summary": "curio_loss.summarize on rank 0 (one GPU: the rank the dry run plays): the "
                   "gathered diagnostics are fake host tensors whose values a quantile's mask "
                   "needs; it runs on real zeros of their shapes, outside fake mode",
    "validation": "--eval_every (run after both steps): the engine a stand-in, whose wake "
                  "gathers the trainer's weights in sync buckets and loads them nowhere; the "
                  "samples the longest, graded 0; all_gather_object gives rank 1's block",
    "stop signal's value": "plumbing.distributed.StopSignal.requested runs (all-reduce, read); "
                           "the read, which a fake tensor cannot answer, answers 'no signal'",
}
# function of the read: the value a fake tensor stands in for (the engine check: no difference)
ANSWERS = {"requested": 0, "engine_logp_diff": 0}


class Seams:
    """The SEAMS installed (put back on close), and what the trainer built: its student, the other
    model, its optimiser (`built`); `on_step` is called where each step of the loop begins."""

    def __init__(self, trainer, stage: str, args, shape: dict, offload: bool, on_step):
        import torch.distributed as dist

        from plumbing import checkpoints, generation

        self.stack, self.built, self.saved, self.validations = contextlib.ExitStack(), {}, [], 0
        self.on_step, self.validating = on_step, False
        patch = self.patch
        patch(models, "broadcast_weights", allocate_shards(offload))
        patch(trainer, "load_full_model", lambda path, scratch=False, seed=0:
              models.load_full_model(path, True, seed))
        patch(dist, "gather_object", gather_object)
        patch(dist, "broadcast_object_list", lambda object_list, src=0, group=None: None)
        patch(checkpoints, "save", lambda out_dir, step, *a, **k: self.saved.append(step)
              or Path(out_dir) / f"step_{step:06d}")
        shard_model, make_optimizer = trainer.shard_model, trainer.make_optimizer

        def sharded(model, device, bf16, grad_ckpt, trainable=True, **options):
            out = shard_model(model, device, bf16, grad_ckpt, trainable, **options)
            self.built.setdefault("student" if trainable else "other", out)
            return out

        def optimizer(*a, **k):
            self.built["optimizer"] = make_optimizer(*a, **k)
            return self.built["optimizer"]

        patch(trainer, "shard_model", sharded)
        patch(trainer, "make_optimizer", optimizer)
        # the colocated engine (GRPO's rollouts, --eval_every's validation): vLLM cannot run here
        patch(generation, "rollout_engine",
              lambda *a, **k: (generation.Engine("dry run", None, logprobs=False), None))
        patch(generation, "wake", self.wake)
        patch(generation, "sleep", lambda engine: None)
        if args.eval_every:
            self.validation()
        if stage == "sft":
            plan_steps = trainer.plan_steps
            for name in ("load_sft_data", "token_weights"):
                patch(trainer, name, on_host(getattr(trainer, name)))

            def marked_steps(*a, **k):                  # each step begins with its next()
                planned = plan_steps(*a, **k)
                while (planned_step := on_host(next)(planned, None)) is not None:
                    on_step()
                    yield planned_step

            patch(trainer, "plan_steps", marked_steps)
            patch(cl, "summarize", on_host(lambda diag, *a: cl_summarize(
                {k: torch.zeros(v.shape, dtype=v.dtype) for k, v in diag.items()}, *a)))
            read_step = trainer.read_step

            def checked_read(loss, grad_norm, diag):
                check_float32([diag])
                return read_step(loss, grad_norm, diag)

            patch(trainer, "read_step", checked_read)
        else:
            patch(trainer, "step_prompts", on_host(trainer.step_prompts))
            self.rollouts(generation, args)

    def patch(self, owner, name, value):
        self.stack.enter_context(mock.patch.object(owner, name, value))

    def wake(self, engine, model, bucket_bytes):
        """generation.wake's stand-in. In validation (measure.validate): the sync's all-gathers,
        bucket by bucket as the sync gathers (every rank), loaded into no engine. Else GRPO's
        rollouts: each step begins here (their sync is not covered)."""
        from plumbing import generation

        if self.validating:
            for _ in generation.full_weight_buckets(model, torch.bfloat16, bucket_bytes):
                pass
            self.validations += 1
        else:
            self.on_step()

    def rollouts(self, generation, args):
        def generate(engine, tokenizer, prompts, n, temperature, top_p, max_new_tokens, seed,
                     **k):
            (x,) = tokenizer.encode(FILLER, add_special_tokens=False)
            lengths = [max_new_tokens - (i < args.micro_batch - 1) for i in range(len(prompts) * n)]
            flat = [generation.Sample([x] * m, FILLER * m, None, None, "length") for m in lengths]
            return [flat[i * n : (i + 1) * n] for i in range(len(prompts))]

        self.patch(generation, "generate", generate)

    def validation(self):
        """--eval_every (the engine's stand-in: __init__'s, wake: self.wake): the samples are the
        longest, their grades 0; all_gather_object gives rank 1's block."""
        import torch.distributed as dist

        import measure

        validate = measure.validate

        def validating(*a, **k):
            self.validating = True
            try:
                return validate(*a, **k)
            finally:
                self.validating = False

        def all_gather_object(object_list, obj, group=None):
            object_list[:] = [obj] * len(object_list)

        self.patch(measure, "validate", validating)
        self.patch(dist, "all_gather_object", all_gather_object)
        self.patch(measure, "generate", longest_samples)
        self.patch(measure, "grade", lambda texts, *a, **k: ([0.0] * len(texts), 0))

    def close(self):
        self.stack.close()


def longest_samples(engine, tokenizer, prompts, n, temperature, top_p, max_new_tokens, seed, *a,
                    logprobs=True, **k):
    """generate's stand-in in validation: the longest responses, every other one a token short,
    with an entropy per token when asked for (validation's metric)."""
    from plumbing import generation

    (x,) = tokenizer.encode(FILLER, add_special_tokens=False)
    lengths = [max_new_tokens - i % 2 for i in range(len(prompts) * n)]
    flat = [generation.Sample([x] * m, FILLER * m, None, [0.0] * m if logprobs else None, "length")
            for m in lengths]
    return [flat[i * n : (i + 1) * n] for i in range(len(prompts))]


cl_summarize = cl.summarize


def gather_object(obj, object_gather_list=None, dst=0, group=None):
    """dist.gather_object's stand-in: the destination's list holds this rank's object for every
    rank (the one rank's, on one GPU); elsewhere nothing moves."""
    if object_gather_list is not None:
        object_gather_list[:] = [obj] * len(object_gather_list)


def on_host(fn):
    """fn run outside fake mode: host work on real values."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    def host(*args, **kwargs):
        with unset_fake_temporarily():
            return fn(*args, **kwargs)
    return host


def reward_fn(samples, examples):
    return [float(i % 2) for i in range(len(samples))], 0


def allocate_shards(offload: bool):
    """plumbing.models.broadcast_weights' stand-in: nothing on ranks other than 0, whose shards
    shard_model allocated; on rank 0 (one GPU) the shards where its loaded weights would be, the
    buffers on the GPU as broadcast_weights puts them."""
    def broadcast_weights(model, full, device):
        if any(p.device.type == "meta" for p in model.parameters()):
            model.to_empty(device="cpu" if offload else device)
            for buf in model.buffers():
                buf.data = buf.data.to(device)
    return broadcast_weights


class StepWindows:
    """What watches each step of the trainer's loop: `begin` (where a step begins) closes the last
    step's watchers and opens the next step's, `windows[k]()` giving step k's context managers;
    `close` at the end of the run. Watchers are dispatch modes: opened and closed in stack
    order."""

    def __init__(self, first, windows):
        self.first, self.windows, self.count = first, windows, 0
        self.run, self.step = contextlib.ExitStack(), None

    def begin(self):
        if self.count == 0:
            for cm in self.first():                  # once the trainer has built its models
                self.run.enter_context(cm)
        if self.step is not None:
            self.step.close()
        self.step = None
        if self.count < len(self.windows):
            self.step = contextlib.ExitStack()
            for cm in self.windows[self.count]():
                self.step.enter_context(cm)
        self.count += 1

    def close(self):
        if self.step is not None:
            self.step.close()
        self.run.close()


# ------------------------------------------------------------------------------------------------
# One rank's run
# ------------------------------------------------------------------------------------------------
def simulate(argv) -> dict:
    own, rest = parse(argv)
    import rl
    import sft

    presets, rest = split_presets(rest, [sft.Args, rl.Args, cl.LossConfig])
    stage = stage_of(presets, own.stage)
    model_name, config = model_config(own.model, presets)
    trainer, args, user_cfg = stage_settings(stage, presets, rest, model_name)
    if own.form:                       # (its code paths: rank_main's forms.code_paths)
        args = dataclasses.replace(args, pack=forms.packs(own.form))
    trainer.check_world(args, own.gpus)

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    kernels = collections.Counter()
    sim_gpu.install_cuda_shims()
    sim_gpu.mesh_outside_fake_mode()
    sim_gpu.fsdp_moves_fake_tensors()
    sim_gpu.fake_pinned_memory()
    sim_gpu.route_attention_like_cuda(kernels)
    sim_gpu.fake_process_group(own.gpus, rank=1 if own.gpus > 1 else 0)
    device = torch.device("cuda", 0)
    config._attn_implementation = "sdpa"
    gpu = roofline.GPU(bf16_tflops=own.peak_tflops, hbm_tbs=own.hbm_tbs, link_gbs=own.link_gbs)
    roof = roofline.Roofline()
    first, watch = HostWatch(), HostWatch()
    flops = FlopCounterMode(display=False, custom_mapping=varlen_flop_formulas(roof))
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        args, shape = write_inputs(Path(tmp), config, stage, args, own.gpus, own.sequences)
        found = {}

        def started():
            """The models are built: check them, charge the roofline's regions to them."""
            model, other = seams.built["student"], seams.built.get("other")
            label = baselines.second_model(args.loss) if stage == "sft" else None
            found.update(model=model, optimizer=seams.built["optimizer"],
                         others={label: other} if other is not None else {})
            check_sharding(model, found["others"], args.bf16, "cpu" if args.offload else "cuda")
            others = found["others"]
            return [charged_regions(roof, trainer, found["optimizer"], others.get("teacher"),
                                    others.get("base"))]

        def step_2():
            found["tracker"] = step_peak_tracker(found["model"], found["optimizer"])
            return [found["tracker"], watch, roof]

        # step 1: FLOPs (FlopCounterMode's module hooks keep what activation checkpointing frees:
        # not under the tracker); step 2: memory (the tracker's own step 1 reports a bogus peak),
        # host reads and the roofline (AdamW's states made, as in every later step)
        windows = StepWindows(started, [lambda: [first, flops], step_2])
        seams = Seams(trainer, stage, args, shape, args.offload, windows.begin)
        try:
            with FakeTensorMode(allow_non_fake_inputs=True):
                try:
                    if stage == "sft":
                        trainer.train(args, user_cfg, device)
                    else:
                        trainer.train(args, device, reward_fn)
                finally:
                    windows.close()
        except SystemExit as e:
            raise DryRunFailure(f"the trainer stopped: {e}") from e
        except Exception as e:               # what made a mismatch of devices, if a move did
            moves = first.moves + watch.moves
            if moves:
                raise DryRunFailure(f"devices: a tensor moved to the host in the step "
                                    f"({next(iter(moves))}), then {type(e).__name__}") from e
            raise
        finally:
            seams.close()
        if windows.count != STEPS:
            raise DryRunFailure(f"the trainer ran {windows.count} steps, not {STEPS}")
        model, optimizer, others = found["model"], found["optimizer"], found["others"]
        peak_snapshot = found["tracker"].get_tracker_snapshot("peak")[device]
        resident_others = sum(gpu_shard_bytes(m) for m in others.values())
        check_optimizer(optimizer, "cpu" if args.offload else "cuda")
        weights = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)
    if not kernels or kernels["math"]:
        raise DryRunFailure(f"attention: {dict(kernels) or 'no SDPA call'}: the math fallback "
                            f"keeps [B, H, T, T] scores (eager attention, or inputs no fused "
                            f"kernel takes)")
    measured = peak_snapshot["Total"] + resident_others
    result = {"stage": stage, "model": model_name, "gpus": own.gpus, "presets": presets,
              "loss": (args.loss if stage == "sft"
                       else args.policy_loss if args.hybrid == "none" else args.hybrid),
              "form": own.form or ("packed" if args.pack else "padded"), "micro_batch": shape,
              "micro_batches_per_step": shape["micro_batches"], "steps_run": STEPS,
              "checkpoints_written": seams.saved, "validations": seams.validations,
              "seams": SEAMS}
    result |= memory_result(config, stage, args, shape, own, measured, peak_snapshot)
    result["attention_kernel"], result["attention_calls"] = "+".join(sorted(kernels)), dict(kernels)
    result |= speed_result(roof, gpu, CALIBRATIONS[own.calibration], flops.get_total_flops(),
                           weights, shape, config, watch)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["not_covered"] = NOT_COVERED + (NOT_COVERED_RL if stage == "rl" else []) + (
        [NOT_COVERED_OFFLOAD] if args.offload else []) + (
        [NOT_COVERED_EVAL] if seams.validations else [])
    if not result["fits"]:
        result["fitting"] = largest_fitting(config, stage, args, shape, own,
                                            max(1.0, result["ratio"]))
    failed = [check(result) for check in (check_memory, check_syncs)]
    if any(failed):
        result["failed"] = next(f for f in failed if f)
    return result


def varlen_flop_formulas(roof) -> dict:
    """FlopCounterMode's formulas for torch's varlen attention (forward, backward): torch's own read
    the offsets' values, which fake tensors lack; these take the packed micro-batch's lengths from
    roof.varlen_lengths (charged_regions sets them) and count every square whole, as torch's
    formulas count causal attention."""
    def formula(pass_):
        def count(*args, out_val=None, **kwargs):
            query = args[0] if pass_ == "fwd" else args[1]
            return roofline.varlen_flops(query.shape, roof.varlen_lengths, pass_)
        count._get_raw = True             # FlopCounterMode passes the tensors, not their shapes
        return count

    import torch.nn.attention.varlen  # noqa: F401  (registers the torch_attn ops)

    return {torch.ops.torch_attn._varlen_attn: formula("fwd"),
            torch.ops.torch_attn._varlen_attn_backward: formula("bwd")}


@contextlib.contextmanager
def charged_regions(roof, trainer, optimizer, teacher, base):
    """The roofline's regions: the teacher's (or the base model's) forward and head, the
    optimiser's step, the old log-probs, the teacher's update; and the packed micro-batch's
    sequence lengths, which its varlen attention is priced by (roof.varlen_lengths, set where
    chunked_logits.packed_sequences passes them to the model). The functions are put back on
    exit."""
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
    old_lp_of = [m for m in (trainer, baselines) if hasattr(m, "token_log_probs")]  # PSFT's too
    saved = [(cl, "teacher_log_prob"), (optimizer, "step"), (trainer, "update_teacher"),
             (chunked_logits, "packed_sequences")]
    saved += [(m, "no_grad_logits") for m in heads_of] + [(m, "token_log_probs") for m in old_lp_of]
    saved = [(owner, name, getattr(owner, name)) for owner, name in saved if hasattr(owner, name)]
    cl.teacher_log_prob = charged(cl.teacher_log_prob, "teacher loss")
    packed_sequences = chunked_logits.packed_sequences

    def packed(model, batch):
        roof.varlen_lengths = list(batch["seq_lens"]) if "cu_seq_lens" in batch else None
        return packed_sequences(model, batch)

    chunked_logits.packed_sequences = packed
    optimizer.step = charged(optimizer.step, "optimizer")
    for owner in old_lp_of:
        owner.token_log_probs = charged(owner.token_log_probs, "old log-probs")
    if hasattr(trainer, "update_teacher"):
        trainer.update_teacher = charged(trainer.update_teacher, "teacher update")
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


def speed_result(roof, gpu, cal, flops: int, weights: int, shape: dict, config, watch) -> dict:
    """Host syncs, FLOPs and the roofline's estimate of the step (per rank), its regions, op
    classes and costliest ops; `work` is the record the estimate prices (roofline.compact), for
    bench/roofline.py's fit."""
    record = roofline.compact(roof.work)
    parts = roofline.seconds(record, gpu, cal)
    compute = sum(parts.values())
    comm = roof.comm_bytes / (gpu.link_gbs * 1e9)
    est = max(compute, comm)                            # FSDP overlaps the collectives with compute
    model_flops = 6 * weights * shape["tokens_per_step"]   # 6ND: forward and backward of the tokens
    teacher = sum(parts[r] for r in ("teacher forward", "teacher logits", "teacher loss"))
    # one bf16 logsumexp over the step's [N, V] logits: a single read of them, at the memory's
    # bandwidth
    lse = shape["trained"] * shape["micro_batches"] * config.vocab_size * 2 / (gpu.hbm_tbs * 1e12)
    return {"syncs_per_step": sum(watch.reads.values()), "sync_sites": dict(watch.reads),
            "flops_per_step": flops, "est_ms_per_step": round(est * 1e3, 2),
            "est_ms_parts": {r: round(s * 1e3, 2) for r, s in parts.most_common()},
            "est_ms_by_class": {c: round(s * 1e3, 2) for c, s in
                                roofline.seconds(record, gpu, cal, by="cls").most_common()},
            "comm_ms_est": round(comm * 1e3, 2),
            "host_copy_gib": round(roof.host_copy_bytes / GIB, 2),
            "mfu_est": round(model_flops / (est * gpu.bf16_tflops * 1e12), 3),
            "teacher_share": round(teacher / compute, 4),
            "teacher_loss_per_lse": round(parts["teacher loss"] / lse, 2),
            "costliest_ops_ms": {r: roofline.top_ops(record, gpu, cal, r) for r in parts},
            "gpu_roofs": dataclasses.asdict(gpu), "calibration": cal.name, "work": record}


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


# the host reads a step of the loop may make, by the function that makes them: the optimiser
# step's own, and GRPO's log record (the step's sums over ranks; here a GRPO step has one
# optimiser step)
SYNC_BUDGET = {"read_step": 1, "policy_update": 1, "step_record": 1, "engine_logp_diff": 1}


def check_syncs(r: dict) -> str | None:
    """The host reads of step 2 are the loop's own (SYNC_BUDGET), at most as many, and none from
    anywhere else: a read elsewhere is named by its line."""
    by_function = collections.Counter()
    for site, n in r["sync_sites"].items():
        by_function[site.rpartition("(")[2].rstrip(")")] += n
    over = {f for f, n in by_function.items() if n > SYNC_BUDGET.get(f, 0)}
    if over:
        sites = ", ".join(f"{n}x {site}" for site, n in r["sync_sites"].items()
                          if site.rpartition("(")[2].rstrip(")") in over)
        allowed = ", ".join(f"{f} {n}" for f, n in SYNC_BUDGET.items())
        return (f"syncs: {r['syncs_per_step']} host reads in one step of the loop (allowed: "
                f"{allowed}): {sites}")
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
        smaller = dict(shape, sequences=k, tokens=k * seq, trained=k * trained)
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
    run = dict(stage=stage, gpus=own.gpus, token_budget=shape["tokens"], pack=args.pack,
               seq_len=shape["seq_len"], trained_tokens=shape["trained"],
               loss_chunk=args.loss_chunk,
               bf16=args.bf16, grad_ckpt=args.grad_ckpt, offload=args.offload, gpu_gib=own.gpu_gib,
               max_prompt_len=args.max_prompt_len, max_response_len=args.max_response_len)
    if stage == "sft":
        run |= dict(loss=args.loss, updates_per_batch=args.updates_per_batch,
                    global_batch=(shape["micro_batches"] * shape["sequences"] * own.gpus
                                  * args.updates_per_batch),
                    eval_every=args.eval_every, gpu_memory_utilization=args.gpu_memory_utilization)
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
             f"{r['micro_batches_per_step']} micro-batches of up to {mb['sequences']} sequences, "
             f"{mb['tokens']} tokens computed ({mb['trained']} trained), form {r['form']}, "
             f"{r['seconds']} s",
             f"  peak per GPU, step 2: measured {r['peak_gib_measured']:.2f} GiB (torch's "
             f"FSDPMemTracker), planned {r['peak_gib_planned']:.2f} GiB (bench/memory.py): "
             f"ratio {r['ratio']:.3f}",
             f"  fits: {'yes' if r['fits'] else 'NO'}, margin {r['margin_gib']:+.2f} GiB below "
             f"{1 - memory.Run.headroom:.0%} of the GPU"
             + (f" (the planner's generation phase: {r['peak_gib_planned_all_phases']:.1f} GiB)"
                if r["stage"] == "rl" else "")
             + (f" (the planner's validation phase, its engine awake: "
                f"{r['peak_gib_planned_all_phases']:.1f} GiB)"
                if r["stage"] == "sft" and r["validations"] else ""),
             f"  attention: {r['attention_kernel']} ({sum(r['attention_calls'].values())} calls)",
             f"  host reads (GPU syncs) in step 2: {r['syncs_per_step'] or 'none'}"]
    lines += [f"    {n}x {site}" for site, n in r["sync_sites"].items()]
    parts = ", ".join(f"{region} {ms:.0f}" for region, ms in r["est_ms_parts"].items())
    lines += [f"  FLOPs per step: {r['flops_per_step'] / 1e12:.1f} TFLOP (torch's FlopCounterMode)",
              f"  estimated step time: {r['est_ms_per_step'] / 1e3:.2f} s, MFU {r['mfu_est']:.0%} "
              f"(a roofline estimate on {r['gpu_roofs']['bf16_tflops']:g} TFLOP/s, "
              f"{r['gpu_roofs']['hbm_tbs']:g} TB/s, {r['calibration']}; not a measurement)",
              f"    ms: {parts}; collectives {r['comm_ms_est']:.0f} (overlapped)"
              + (f"; host <-> GPU copies {r['host_copy_gib']:.1f} GiB (not in the estimate)"
                 if r["host_copy_gib"] else ""),
              "    by op class, ms: " + ", ".join(f"{c} {ms:.0f}"
                                                 for c, ms in r["est_ms_by_class"].items())]
    if r.get("validations"):
        lines.append(f"  validation (--eval_every): {r['validations']} evaluations, through the "
                     f"'validation' seam")
    lines.append("  not covered: " + "; ".join(r["not_covered"]))
    if r.get("failed"):
        lines.append(f"FAILED {r['failed']}")
    return "\n".join(lines)


def rank_main(argv) -> int:
    """The rank's process (the C++ shim already loaded): simulate, print, write --json; 1 on a
    failed check."""
    own, _ = parse(argv)
    try:
        # the form's code paths (6fbcbf7's: the dense mask, the float32 copy, torch's AdamW), for
        # the step and the teacher side alike
        with forms.code_paths(own.form) if own.form else contextlib.nullcontext():
            result = simulate(argv)
            if own.teacher_side:
                result["teacher_side"] = teacher_side_work(*own.teacher_side)
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
    if own.against:
        return against(own, env)
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
    flags += ["--calibration", own.calibration] + (["--form", own.form] if own.form else [])
    flags += ["--stage", own.stage] if own.stage else []
    flags += ["--sequences", *map(str, own.sequences)] if own.sequences else []
    return flags + (["--model", own.model] if own.model else [])


def ratios(r: dict, other: dict) -> dict:
    """This run's FLOPs, estimated time and peak memory over another's."""
    return {"flops_ratio": round(r["flops_per_step"] / other["flops_per_step"], 3),
            "est_ms_ratio": round(r["est_ms_per_step"] / other["est_ms_per_step"], 3),
            "peak_ratio": round(r["peak_gib_measured"] / other["peak_gib_measured"], 3),
            "other": {k: other[k] for k in ("flops_per_step", "est_ms_per_step", "mfu_est",
                                            "peak_gib_measured", "est_ms_parts")}}


# ------------------------------------------------------------------------------------------------
# Against a GPU run: bench/gpu_check.sh's figures, predicted
# ------------------------------------------------------------------------------------------------
# datasheet memory bandwidth (TB/s) and the memory torch reports (GiB), by device name; first match
GPUS = [(("H200",), 4.8, 139.8), (("H100", "PCIe"), 2.0, 79.1), (("H100",), 3.35, 79.1)]
VARIANTS = ["sft", "curio", "curio_self_teacher"]


def teacher_side_work(tokens: int, vocab: int) -> dict:
    """The roofline's record of gpu_check's teacher-side figures on fake CUDA logits [tokens,
    vocab] bf16: one torch.logsumexp pass, and curio_loss.teacher_log_prob (bisection)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    out = {}
    with FakeTensorMode(allow_non_fake_inputs=True):
        z = torch.empty(tokens, vocab, dtype=torch.bfloat16, device="cuda")
        y = torch.zeros(tokens, dtype=torch.long, device="cuda")
        runs = {"logsumexp": lambda: torch.logsumexp(z, -1),
                "bisection": lambda: cl.teacher_log_prob(z, y, cl.LossConfig())}
        for name, fn in runs.items():
            roof = roofline.Roofline()
            with roof:
                fn()
            out[name] = roofline.compact(roof.work)
    return out


# what bench/sft_step.py ran at 6fbcbf7 (the H200 run's commit) besides what its summary names,
# in bench/forms.py's form "6fbcbf7"; a summary that records its run ({"sft_step": {"form": ...,
# "lengths": ..., "loss_chunk": ..., ...}}, as bench/gpu_check.py writes it now) says
SFT_STEP_6FBCBF7 = {"loss_chunk": 4096, "grad_ckpt": True, "teacher_every": 5, "form": forms.OLD}


def bench_run(summary: dict) -> dict:
    """What bench/sft_step.py ran for a gpu_check summary: its shape, the micro-batch's sequences
    (the summary's own record, else the entropy row's note that names them), the loss chunk,
    checkpointing, the teacher's schedule and the step's form (SFT_STEP_6FBCBF7's unless the
    summary records them), and the teacher side's logits."""
    import sft_step

    rows = {r["figure"]: r for r in summary["rows"]}
    run = dict(summary.get("sft_step") or {})
    if "lengths" not in run:
        note = rows["logits' median entropy"]["note"]
        run["lengths"] = json.loads(note[note.index("["):note.index("]") + 1])
    tokens, vocab = map(int, re.search(r"(\d+) x (\d+)", rows["logsumexp pass"]["note"]).groups())
    return {"shape": sft_step.SHAPES[summary["shape"]], **SFT_STEP_6FBCBF7,
            "teacher_side": (tokens, vocab), **run}


def against(own, env) -> int:
    """Dry runs of the summary's configurations (in parallel, one process each), priced on its
    GPU's roofs with --calibration (or, --fit, the one fitted from the profiles beside it), and
    the figures predicted over measured."""
    import sft_step

    path = Path(own.against)
    summary = json.loads(path.read_text())
    device = summary["device"]
    found = next(((bw, gib) for words, bw, gib in GPUS if all(w in device for w in words)), None)
    if found is None:
        raise SystemExit(f"{path}: no bandwidth known for {device!r} (dryrun.GPUS)")
    gpu = roofline.GPU(bf16_tflops=sft_step.datasheet_peak_tflops(device), hbm_tbs=found[0])
    need = [f"{v} step time" for v in VARIANTS] + ["logsumexp pass", "bisection / logsumexp",
                                                    "teacher_log_prob (bisection)",
                                                    "logits' median entropy"]
    missing = [f for f in need if f not in {r["figure"] for r in summary.get("rows", [])}]
    if missing:
        raise SystemExit(f"{path}: no {', '.join(repr(f) for f in missing)} row (a part of "
                         f"gpu_check that did not run?)")
    profiles = [path.parent / f"profile_{v}.txt" for v in VARIANTS]
    if own.fit and not all(f.is_file() for f in profiles):
        raise SystemExit(f"--fit: {', '.join(str(f) for f in profiles if not f.is_file())} not "
                         f"found beside {path} (python bench/roofline.py --out DIR on the GPU)")
    run = bench_run(summary)
    if run["form"] not in forms.FORMS:
        raise SystemExit(f"{path}: form {run['form']!r} is none of bench/forms.py's "
                         f"({', '.join(forms.FORMS)})")
    what_if = own.form not in (None, run["form"])
    if what_if:                         # the same steps in another form: predictions
        run["form"] = own.form
    old_form = forms.OLD
    if own.fit and run["form"] != old_form:
        raise SystemExit(f"--fit: the fit's classes (a dense mask's attention, AdamW on DTensors) "
                         f"are read from profiles of form {old_form} (bench/roofline.py --out DIR "
                         f"--forms {old_form}), not {run['form']}: add --form {old_form}")
    seq, lengths = max(run["lengths"]), run["lengths"]
    measured = {r["figure"]: r["value"] for r in summary["rows"]}
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        sft_step.qwen2_config(run["shape"], seq).save_pretrained(model)
        flags = ["--stage", "sft", "--model", str(model), "--gpus", "1", "--gpu_gib",
                 str(found[1]), "--peak_tflops", str(gpu.bf16_tflops), "--hbm_tbs",
                 str(gpu.hbm_tbs), "--token_budget", str(len(lengths) * seq), "--max_prompt_len",
                 str(seq), "--max_response_len", str(seq), "--loss_chunk", str(run["loss_chunk"]),
                 "--grad_ckpt" if run["grad_ckpt"] else "--no-grad_ckpt", "--calibration",
                 own.calibration, "--form", run["form"], "--sequences",
                 *map(str, lengths)]
        procs = {}
        for v in VARIANTS:
            side = ["--teacher_side", *map(str, run["teacher_side"])] if v == "sft" else []
            procs[v] = subprocess.Popen([sys.executable, __file__, *flags, "--loss", v, *side,
                                         "--json", str(Path(tmp) / v)], env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        results = {}
        for v, proc in procs.items():
            out = proc.communicate()[0]
            results[v] = json.loads((Path(tmp) / v).read_text()) if (Path(tmp) / v).is_file() \
                else {}
            if "work" not in results[v]:
                print(out[-3000:], file=sys.stderr)
                raise SystemExit(f"--against: the {v} dry run failed: "
                                 f"{results[v].get('failed', 'no result')}")
    cal = CALIBRATIONS[own.calibration]
    if own.fit:
        profiles = {v: roofline.read_profile(f.read_text()) for v, f in zip(VARIANTS, profiles)}
        cal = roofline.fit({v: roofline.totals(results[v]["work"]) for v in VARIANTS}, profiles,
                           run["teacher_every"] + 1, gpu, name=f"fitted to {path}")
        print("fitted: " + ", ".join(f"{k} {v}" for k, v in dataclasses.asdict(cal).items()
                                     if k not in ("name", "sources")))
    print(f"{device}: {summary['shape']}, sequences {lengths} in one micro-batch, loss chunk "
          f"{run['loss_chunk']}, checkpointing {'on' if run['grad_ckpt'] else 'off'}, form "
          f"{run['form']}; roofs {gpu.bf16_tflops:g} TFLOP/s, {gpu.hbm_tbs:g} TB/s; "
          f"{cal.name}")
    ratios, predicted, mfu = {}, {}, {}
    # MFU as bench/sft_step.py counts it: the model FLOPs of the sequences' real tokens
    model_flops = sft_step.model_flops(run["shape"], lengths,
                                       results["sft"]["micro_batch"]["trained"])["total"]
    for v in VARIANTS:
        parts = roofline.seconds(results[v]["work"], gpu, cal)
        # the dry run updates the teacher every step, the bench every teacher_every steps
        step = sum(parts.values()) - parts["teacher update"] * (1 - 1 / run["teacher_every"])
        real = measured[f"{v} step time"]
        ratios[v] = step / real
        mfu[v] = model_flops / (step * gpu.bf16_tflops * 1e12)
        classes = roofline.seconds(results[v]["work"], gpu, cal, by="cls")
        print(f"{v:20s} step: predicted {step:.3f} s (MFU {mfu[v]:.1%}), "
              + (f"{step / predicted['sft']:.2f}x SFT's, not measured" if what_if and v != "sft"
                 else "not measured" if what_if
                 else f"measured {real:.3f} s, predicted/measured {ratios[v]:.2f}")
              + "  (" + ", ".join(f"{c} {s * 1e3:.0f}" for c, s in classes.most_common())
              + f" ms); peak memory: dry run {results[v]['peak_gib_measured']:.2f} GiB"
              + ("" if what_if else
                 f", GPU {measured.get(f'{v} peak memory', float('nan')):.2f} GiB"))
        predicted[v] = step
    if what_if:
        if own.json:
            Path(own.json).write_text(json.dumps({
                "predicted_s": predicted, "mfu": mfu, "device": device, "calibration": cal.name,
                "form": run["form"], "peak_gib": {v: results[v]["peak_gib_measured"]
                                                  for v in VARIANTS}}, indent=1) + "\n")
        return 0
    side = {k: sum(roofline.seconds(w, gpu, cal).values())
            for k, w in results["sft"]["teacher_side"].items()}
    for name, figure in (("logsumexp", "logsumexp pass"),
                         ("bisection", "teacher_log_prob (bisection)")):
        print(f"{figure:20s}: predicted {side[name] * 1e3:.2f} ms, measured "
              f"{measured[figure]:.2f} ms, predicted/measured "
              f"{side[name] * 1e3 / measured[figure]:.2f}")
    ratios["teacher_side"] = side["bisection"] / side["logsumexp"] / measured[
        "bisection / logsumexp"]
    print(f"bisection / logsumexp: predicted {side['bisection'] / side['logsumexp']:.2f}x, "
          f"measured {measured['bisection / logsumexp']:.2f}x")
    print("predicted/measured: " + ", ".join(f"{k} {r:.2f}" for k, r in ratios.items()))
    if own.json:
        peaks = {v: [results[v]["peak_gib_measured"], measured[f"{v} peak memory"]]
                 for v in VARIANTS}
        Path(own.json).write_text(json.dumps({"ratios": ratios, "predicted_s": predicted,
                                              "mfu": mfu,
                                              "peak_gib": peaks,
                                              "calibration": dataclasses.asdict(cal),
                                              "device": device,
                                              "run": {k: v for k, v in run.items()
                                                      if k != "shape"}}, indent=1) + "\n")
    return 0 if all(0.85 <= r <= 1.15 for r in ratios.values()) else 1


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
    status = main()
    if os.environ.get(sim_gpu.LIB_ENV):     # a rank's process, its result written: torch may abort at
        sys.stdout.flush()                   # interpreter exit (a joinable thread destroyed; seen in the
        sys.stderr.flush()                   # CPU suite), which would turn a finished run into a crash
        os._exit(status)
    sys.exit(status)
