"""The GPU check: what one GPU machine can show about this project in one command, inside 9 minutes
on one 80 GB H100/H200 with no network, no vLLM and no model download. A measurement, not a test: it
exits 0 when every part ran, whatever the targets say, and 1 when a part crashed or ran out of its
time.

    bash bench/gpu_check.sh [--out out/gpu_check] [--shape qwen2.5-1.5b] [--layers N]
                            [--peak_tflops X] [--rounds N] [--parts 1 2 3]
    bash bench/gpu_check.sh --smoke   # tiny shapes, two steps, on any device (CPU: gloo, fp32)

--out gets three files, all a lent machine has to send back: summary.md and summary.json, rewritten
after every part (a part that hangs or crashes leaves the figures of those before it), and
logs.tar.gz, every part's log. The rest (toy data, checkpoints) goes to a scratch folder, deleted at
the end. Each part has a time limit; a part that would not end before the check's deadline is
skipped, and says so.

1. SFT steps of sft, curio and curio_self_teacher on random weights with a real model's shapes, one
   micro-batch of 8k-token sequences, bf16, activation checkpointing, the presets' logging, logits
   scaled to a real model's entropy, sft.train's own runs under torchrun (nccl):
   bench/sft_step.py, packed (the default) and the --beside form (compiled: the decoder layers and
   the loss's passes through torch.compile, sft.py --compile), side by side in the same rounds.
   Tokens/s, MFU and HFU, peak memory next to the memory planner's prediction, the CurioSFT / SFT
   step-time ratios, and each variant's step time in the other form over packed's.
2. The teacher side of the loss (curio_loss.teacher_log_prob) against one logsumexp pass over the
   same logits, 4096 x 151936, bf16 on CUDA; its top-k from block maxima beside torch.topk over
   the whole row (the old form); compiled (--compile); on float32 logits (the step's), both ways.
3. The bf16 error of lp, lq and w_t: a bf16 head against a float32 one on the same hidden states,
   4096 x 151936.
4. evaluate.py (HF engine, bf16) on the demo's toy task (demo/toy.py) with a small random model.
5. rl.py's GRPO (bench/rl_step.py: a synthetic reward, so that advantages, ratios and clips all
   run).
evaluate.py and rl.py import math-verify, which the GPU image lacks: bench/gpu_check.sh installs it
from .whl/.
"""
import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch

# bench/, this file's folder; it puts the repository root on sys.path for the next ones
import sft_step

import curio_loss as cl  # noqa: E402
from chunked_logits import no_grad_logits  # noqa: E402
from plumbing.compiling import compiled  # noqa: E402
from plumbing.run_dir import write_atomic  # noqa: E402
from plumbing.synthetic import llm_like_logits, make_model_dir  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
DEADLINE_S = 540                                            # the whole check: 9 minutes
TARGETS = {"mfu": 0.40, "curio": 1.25, "curio_self_teacher": 1.05, "planner": 0.10,
           "teacher_side": 3.0}
# The toy parts' sizes: enough work on a GPU to time, seconds on a CPU.
TOY = {
    "smoke": dict(
        data=["--n_pretrain", "8", "--n_sft", "16", "--n_rl", "8", "--n_test", "4",
              "--vocab_labels", "50", "--vocab_size", "512"],
        model=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1, intermediate_size=128),
        eval=["--n_samples", "2", "--limit", "4", "--max_new_tokens", "16", "--batch_size", "4",
              "--grader_workers", "1"],
        rl=["--steps", "2", "--prompts_per_step", "2", "--rollouts", "4", "--mini_batch", "1",
            "--micro_batch", "4", "--max_response_len", "16", "--gen_batch_size", "2",
            "--grader_workers", "1", "--lr", "1e-2"],
    ),
    "gpu": dict(
        data=["--n_pretrain", "8", "--n_sft", "16", "--n_rl", "256", "--n_test", "64"],
        model=dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=768),
        eval=["--n_samples", "4", "--limit", "64", "--max_new_tokens", "256", "--batch_size", "64",
              "--grader_workers", "4"],
        rl=["--steps", "3", "--prompts_per_step", "16", "--rollouts", "8", "--mini_batch", "4",
            "--micro_batch", "32", "--max_response_len", "256", "--gen_batch_size", "16",
            "--grader_workers", "4", "--grad_ckpt", "--lr", "1e-4"],
    ),
}
GIB = 2**30


class Summary:
    """Rows of (section, figure, value, unit, target, status, note); status PASS / MISS against a
    target, '–' without one, 'n/a' where this device cannot measure it, 'skipped', 'CRASH' or
    'TIMEOUT' for a part that did not run."""

    def __init__(self):
        self.rows, self.crashed = [], []
        self.runs = {}          # what a part ran, for bench/dryrun.py --against: {"sft_step": ...}

    def add(self, section, figure, value, unit="", target="", ok=None, status=None, note=""):
        if status is None:
            status = "n/a" if value is None and target else "–" if ok is None \
                else "PASS" if ok else "MISS"
        self.rows.append(dict(section=section, figure=figure, value=value, unit=unit, target=target,
                              status=status, note=note))

    def fail(self, section, figures, status, note):
        """A part that did not run: its rows say so (a crash or timeout makes the exit status 1)."""
        if status in ("CRASH", "TIMEOUT"):
            self.crashed.append(section)
        for figure, unit in figures:
            self.add(section, figure, None, unit, status=status, note=note)

    def markdown(self, header: list[str]) -> str:
        def fmt(v, unit):
            if v is None:
                return "–"
            return {"%": f"{v:.1%}", "x": f"{v:.2f}x", "GiB": f"{v:.2f} GiB",
                    "tokens/s": f"{v:,.0f} tokens/s", "ms": f"{v:.2f} ms", "s": f"{v:.3f} s",
                    "nats": f"{v:.2e} nats"}.get(unit, f"{v:g} {unit}".strip())

        lines = [*header, "", "| part | figure | value | target | status | note |",
                 "|" + " --- |" * 6]
        lines += [f"| {r['section']} | {r['figure']} | {fmt(r['value'], r['unit'])} | "
                  f"{r['target']} | {r['status']} | {r['note']} |" for r in self.rows]
        return "\n".join(lines) + "\n"


def stage(cmd: list, log: Path, summary: Summary, section: str, figures: list,
          timeout_s: float, env: dict | None = None) -> float | None:
    """Run one command from the repository root (in `env` if given), its output to `log`, killed
    with its whole process group after timeout_s; its wall seconds, or None after recording a crash
    or a timeout."""
    print("$ " + " ".join(map(str, cmd)), flush=True)
    t0 = time.perf_counter()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        proc = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            summary.fail(section, figures, "TIMEOUT",
                         f"killed after {timeout_s:.0f} s; see logs.tar.gz: {log.name}")
            return None
    if rc != 0:
        print(log.read_text()[-3000:], flush=True)
        summary.fail(section, figures, "CRASH", f"exit {rc}; see logs.tar.gz: {log.name}")
        return None
    return time.perf_counter() - t0


# ------------------------------------------------------------------------------------------------
# 1. SFT steps
# ------------------------------------------------------------------------------------------------
SFT_FIGURES = [(f"{v} {what}", unit) for v in sft_step.VARIANTS
               for what, unit in (("step time", "s"), ("tokens/s", "tokens/s"), ("MFU", "%"),
                                  ("HFU", "%"))]
SFT_FIGURES += [("curio / sft step time", "x"), ("curio_self_teacher / sft step time", "x"),
                ("logits' median entropy", "nats")]
SFT_FIGURES += [(f"{v} {what}", unit) for v in sft_step.VARIANTS
                for what, unit in (("peak memory", "GiB"), ("planner prediction", "GiB"),
                                   ("measured / planned", "x"))]
BESIDE_FORMS = [f for f in sft_step.forms.FORMS if f != "packed"]


def sft_figures(beside: str) -> list:
    """The SFT part's rows: SFT_FIGURES (packed, the trainers' default) and those of the form timed
    beside it in the same rounds."""
    return SFT_FIGURES + [(f"{v} {what}", unit) for v in sft_step.VARIANTS
                          for what, unit in ((f"step time, {beside}", "s"), (f"MFU, {beside}", "%"),
                                             (f"{beside} / packed", "x"),
                                             (f"peak memory, {beside}", "GiB"))]


def sft_steps(a, scratch: Path, summary: Summary, timeout_s: float):
    result_file = scratch / "sft_step.json"
    cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
           "bench/sft_step.py", "--shape", a.shape, "--rounds", str(a.rounds), "--json",
           result_file, "--forms", "packed", a.beside]
    cmd += ["--layers", str(a.layers)] if a.layers else []
    cmd += ["--peak_tflops", str(a.peak_tflops)] if a.peak_tflops else []
    # smoke: one thread, as this process takes (tiny models on a shared CPU: more only spin-wait)
    env = {**os.environ, "OMP_NUM_THREADS": "1"} if a.smoke else None
    if stage(cmd, scratch / "logs" / "sft_step.log", summary, "SFT step", sft_figures(a.beside),
             timeout_s, env) is None:
        return
    r = json.loads(result_file.read_text())
    sec = "SFT step"
    # the headline rows' run, in bench/forms.py's name of its form: packed, the trainers' default
    summary.runs["sft_step"] = {"form": "packed", "lengths": r["lengths"],
                                **{k: r[k] for k in ("loss_chunk", "grad_ckpt", "teacher_every")}}
    headline = r["forms"]["packed"]["variants"]
    for v, m in headline.items():
        summary.add(sec, f"{v} step time", m["step_s"], "s",
                    note=f"median of {r['rounds']} sft.train runs' means of "
                         f"{r['teacher_every']} steps" + (", the EMA update among them"
                                                         if v == "curio" else ""))
        summary.add(sec, f"{v} tokens/s", m["tokens_per_s"], "tokens/s")
        target = f">= {TARGETS['mfu']:.0%}" if v == "sft" else ""
        peak = f"{r['peak_tflops']:.3g} TFLOP/s: {r['peak_source']}"
        ok = m["mfu"] >= TARGETS["mfu"] if target else None
        summary.add(sec, f"{v} MFU", m["mfu"], "%", target, ok,
                    note=peak if v == "sft" else "the student's model FLOPs (as sft's)")
        summary.add(sec, f"{v} HFU", m["hfu"], "%",
                    note="with recompute (and curio's teacher forward)")
    for v in ("curio", "curio_self_teacher"):
        ratio = headline[v]["ratio_to_sft"]
        summary.add(sec, f"{v} / sft step time", ratio, "x", f"<= {TARGETS[v]}",
                    ratio <= TARGETS[v],
                    note="separate EMA teacher" if v == "curio" else "the student's own logits")
    lg = r["logits"]
    summary.add(sec, "logits' median entropy", lg["median_entropy"], "nats",
                note=f"{lg['share_at_most_0.03']:.0%} of positions <= 0.03 nats; sequences "
                     f"{r['lengths']}")
    for v, m in headline.items():
        peak, plan, ratio = m["peak_bytes"], m["planner_bytes"], m["measured_over_planned"]
        summary.add(sec, f"{v} peak memory", peak and peak / GIB, "GiB",
                    status=None if peak else "n/a",
                    note="max_memory_allocated during its sft.train runs" if peak
                    else "CPU: no allocator statistics")
        summary.add(sec, f"{v} planner prediction", plan and plan / GIB, "GiB",
                    note=m["planner_note"])
        summary.add(sec, f"{v} measured / planned", ratio, "x", f"within {TARGETS['planner']:.0%}",
                    None if ratio is None else abs(ratio - 1) <= TARGETS["planner"])
    beside = r["forms"][a.beside]["variants"]
    for v, m in beside.items():
        summary.add(sec, f"{v} step time, {a.beside}", m["step_s"], "s",
                    note=sft_step.forms.FORMS[a.beside] + "; timed in the same rounds")
        summary.add(sec, f"{v} MFU, {a.beside}", m["mfu"], "%")
        summary.add(sec, f"{v} {a.beside} / packed", m["ratio_to_first_form"], "x",
                    note="step time, the same sequences")
        summary.add(sec, f"{v} peak memory, {a.beside}", m["peak_bytes"] and m["peak_bytes"] / GIB,
                    "GiB", status=None if m["peak_bytes"] else "n/a")


# ------------------------------------------------------------------------------------------------
# 2. The teacher side of the loss against one logsumexp pass
# ------------------------------------------------------------------------------------------------
TEACHER_FIGURES = [("logsumexp pass", "ms"), ("teacher_log_prob (bisection)", "ms"),
                   ("bisection / logsumexp", "x"), ("newton / logsumexp", "x"),
                   ("top-k from block maxima", "ms"), ("torch.topk, whole row (old)", "ms"),
                   ("bisection with torch.topk (old) / logsumexp", "x"),
                   ("teacher_log_prob, float32 logits", "ms")]
COMPILED_TEACHER_FIGURES = [("teacher_log_prob compiled", "ms"), ("compiled / logsumexp", "x"),
                            ("teacher_log_prob compiled, float32 logits", "ms")]
TEACHER_FIGURES += COMPILED_TEACHER_FIGURES


def teacher_side(tokens: int, vocab: int, reps: int, device, summary: Summary, compile_it: bool):
    """teacher_log_prob (bisection, and Newton; compiled where compile_it) and torch.logsumexp on
    the same logits, timed interleaved."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    logits = llm_like_logits(tokens, vocab, seed=1).to(device, dtype)          # [N, V]
    targets = torch.distributions.Categorical(logits=logits.float()).sample()      # [N]
    # float32: the step's teacher logits on CUDA (chunked_logits.no_grad_logits); --compile's form
    logits32, cfg, fast = logits.float(), cl.LossConfig(), compiled(cl.teacher_log_prob)
    runs = {"logsumexp": lambda: torch.logsumexp(logits, -1),
            "bisection": lambda: cl.teacher_log_prob(logits, targets, cl.LossConfig()),
            "newton": lambda: cl.teacher_log_prob(logits, targets, cl.LossConfig(solver="newton")),
            "top_k": lambda: cl._top_k_values(logits, cl.LossConfig().top_k),
            "topk_old": lambda: logits.topk(cl.LossConfig().top_k, dim=-1, sorted=False),
            "bisection_old": lambda: old_top_k(cl.teacher_log_prob, logits, targets),
            "bisection_f32": lambda: cl.teacher_log_prob(logits32, targets, cfg)}
    if compile_it:                                                            # round 0 compiles
        runs |= {"compiled": lambda: fast(logits, targets, cfg),
                 "compiled_f32": lambda: fast(logits32, targets, cfg)}
    t = sft_step.median_times(runs, reps, device)
    sec = "teacher side"
    shape = f"{tokens} x {vocab} {str(dtype).split('.')[-1]} logits, median of {reps}"
    summary.add(sec, "logsumexp pass", t["logsumexp"] * 1e3, "ms", note=shape)
    summary.add(sec, "teacher_log_prob (bisection)", t["bisection"] * 1e3, "ms")
    ratio = t["bisection"] / t["logsumexp"]
    summary.add(sec, "bisection / logsumexp", ratio, "x", f"<= {TARGETS['teacher_side']:g}x (GPU)",
                ratio <= TARGETS["teacher_side"])
    summary.add(sec, "newton / logsumexp", t["newton"] / t["logsumexp"], "x",
                note="--solver newton")
    summary.add(sec, "top-k from block maxima", t["top_k"] * 1e3, "ms",
                note="curio_loss._top_k_values, the teacher side's top 512")
    summary.add(sec, "torch.topk, whole row (old)", t["topk_old"] * 1e3, "ms")
    summary.add(sec, "bisection with torch.topk (old) / logsumexp",
                t["bisection_old"] / t["logsumexp"], "x", note="the teacher side at 6fbcbf7")
    summary.add(sec, "teacher_log_prob, float32 logits", t["bisection_f32"] * 1e3, "ms",
                note="the step's teacher logits on CUDA (float32 out of the bf16 head)")
    if not compile_it:
        summary.fail(sec, COMPILED_TEACHER_FIGURES, "n/a",
                     "smoke: compiling takes minutes on a CPU")
        return
    summary.add(sec, "teacher_log_prob compiled", t["compiled"] * 1e3, "ms",
                note="torch.compile(teacher_log_prob), as sft.py --compile runs it")
    ratio = t["compiled"] / t["logsumexp"]
    summary.add(sec, "compiled / logsumexp", ratio, "x", f"<= {TARGETS['teacher_side']:g}x (GPU)",
                ratio <= TARGETS["teacher_side"])
    summary.add(sec, "teacher_log_prob compiled, float32 logits", t["compiled_f32"] * 1e3, "ms")


def old_top_k(fn, logits, targets):
    """fn with the teacher side's top-k as it was at 6fbcbf7: torch.topk over the whole row."""
    def whole_row(z, k):
        return z.topk(k, dim=-1, sorted=False).values

    with mock.patch.object(cl, "_top_k_values", whole_row):
        return fn(logits, targets, cl.LossConfig())


# ------------------------------------------------------------------------------------------------
# 3. The bf16 error of lp, lq and w_t
# ------------------------------------------------------------------------------------------------
BF16_FIGURES = [("lp error, bf16 logits: max", "nats"), ("lp error, bf16 logits: median", "nats"),
                ("lq error, bf16 logits: max", "nats"),
                ("lq error, float32-output logits: max", "nats"),
                ("w_t error, as sft.py computes it: max", "nats"),
                ("w_t error, as sft.py computes it: median", "nats")]


@torch.no_grad()
def bf16_head_errors(tokens: int, vocab: int, hidden: int, device, seed: int = 0) -> dict:
    """lp, lq and w_t = 1 - (lp - lq) from a bf16 lm_head against a float32 one on the same bf16
    hidden states. The head's weight is scaled so that the median entropy of the logits is a trained
    model's (0.2 nats). The student's logits are the head's bf16 output (as the trained forward
    makes them); the teacher's come from chunked_logits.no_grad_logits (float32 output from bf16
    inputs on CUDA). Maximum and median absolute errors."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, hidden, generator=g)
    h = torch.nn.functional.normalize(h, dim=-1).to(device) * hidden**0.5
    w = torch.randn(vocab, hidden, generator=g).to(device) / hidden**0.5
    z32 = h[:512] @ w.t()                                                         # [512, V] float32
    lo, hi = 0.01, 100.0
    for _ in range(30):                                                  # scale to 0.2 nats' median
        mid = (lo * hi) ** 0.5
        lo, hi = (lo, mid) if cl.entropy(z32 * mid).median() < 0.2 else (mid, hi)
    head = torch.nn.Linear(hidden, vocab, bias=False, device=device, dtype=torch.bfloat16)
    head.weight.copy_(w * hi)
    h16 = h.to(device, torch.bfloat16)
    exact = h16.float() @ head.weight.float().t()                # the bf16 inputs, in float32
    y = torch.distributions.Categorical(logits=exact).sample()   # as a model would write
    cfg = cl.LossConfig()
    lp_ref, lq_ref = cl.student_log_prob(exact, y)[0], cl.teacher_log_prob(exact, y, cfg)[0]
    student = head(h16)                                                           # bf16 logits
    lp16, lq16 = cl.student_log_prob(student, y)[0], cl.teacher_log_prob(student, y, cfg)[0]
    lq_out32 = cl.teacher_log_prob(no_grad_logits(head, h16), y, cfg)[0]
    w_ref, w_trained = 1 - (lp_ref - lq_ref), 1 - (lp16 - lq_out32)

    def stats(err):
        err = err.abs()
        return err.max().item(), err.median().item()

    return {"lp": stats(lp16 - lp_ref), "lq_bf16": stats(lq16 - lq_ref),
            "lq_out32": stats(lq_out32 - lq_ref), "w": stats(w_trained - w_ref),
            "out32": device.type == "cuda"}


def bf16_errors(tokens: int, vocab: int, hidden: int, device, summary: Summary):
    e, sec = bf16_head_errors(tokens, vocab, hidden, device), "bf16 error"
    shape = f"{tokens} x {vocab}, hidden {hidden}, against float32"
    summary.add(sec, "lp error, bf16 logits: max", e["lp"][0], "nats", note=shape)
    summary.add(sec, "lp error, bf16 logits: median", e["lp"][1], "nats")
    summary.add(sec, "lq error, bf16 logits: max", e["lq_bf16"][0], "nats")
    summary.add(sec, "lq error, float32-output logits: max", e["lq_out32"][0], "nats",
                note="torch.mm out_dtype" if e["out32"]
                else "CPU: the head as it is (float32 here)")
    summary.add(sec, "w_t error, as sft.py computes it: max", e["w"][0], "nats",
                note="bf16 student logits, the teacher's from no_grad_logits")
    summary.add(sec, "w_t error, as sft.py computes it: median", e["w"][1], "nats")


# ------------------------------------------------------------------------------------------------
# 4, 5. evaluate.py and rl.py on the toy task
# ------------------------------------------------------------------------------------------------
EVAL_FIGURES = [("evaluate.py wall time", "s"), ("evaluate.py generated tokens", "tokens"),
                ("evaluate.py generated tokens/s", "tokens/s")]
RL_FIGURES = [("rl.py wall time", "s"), ("rl.py step time", "s"), ("rl.py generation", "s"),
              ("rl.py reward", "s"), ("rl.py training", "s"), ("rl.py weight sync", "s"),
              ("rl.py clipped tokens", "%"), ("rl.py approx KL", "nats")]


def toy_model(world: Path, model_kwargs: dict) -> Path:
    """demo/run.py's config and tokenizer, and random weights: what evaluate.py and rl.py load."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_dir = make_model_dir(world, model_kwargs)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    model.save_pretrained(model_dir)
    return model_dir


def math_verify_status() -> tuple[bool, str]:
    """Whether evaluate.py's grader imports, and from where (.whl/ puts it on PYTHONPATH)."""
    try:
        import math_verify
    except ImportError as e:
        return False, f"math-verify is not installed ({e})"
    version = importlib.metadata.version("math-verify")
    return True, f"math-verify {version} from {Path(math_verify.__file__).parent}"


def toy_world(size: dict, scratch: Path, summary: Summary, timeout_s: float) -> Path | None:
    """The toy data and a random model for parts 4 and 5; None (both parts' rows say why) when they
    cannot run."""
    available, status = math_verify_status()
    if not available:
        note = (f"{status}: evaluate.py and rl.py import it. On a machine with PyPI: bash "
                "bench/gpu_check.sh --fetch_wheels, then carry .whl/")
        summary.fail("evaluate.py", EVAL_FIGURES, "skipped", note)
        summary.fail("rl.py", RL_FIGURES, "skipped", note)
        return None
    world = scratch / "toy"
    if stage([PY, "demo/toy.py", "--out", world, *size["data"]], scratch / "logs" / "toy_data.log",
             summary, "evaluate.py", EVAL_FIGURES, timeout_s) is None:
        summary.fail("rl.py", RL_FIGURES, "skipped", "the toy data could not be built")
        return None
    toy_model(world, size["model"])
    return world


def evaluate_part(size: dict, world: Path, scratch: Path, summary: Summary, timeout_s: float):
    out = scratch / "eval"
    wall = stage([PY, "evaluate.py", "--model", world / "model", "--data", world / "test.jsonl",
                  "--out", out, "--engine", "hf", "--system_prompt", "row", *size["eval"]],
                 scratch / "logs" / "evaluate.log", summary, "evaluate.py", EVAL_FIGURES, timeout_s)
    if wall is None:
        return
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    generated = sum(s["length"] for s in samples)
    summary.add("evaluate.py", "evaluate.py wall time", wall, "s",
                note=f"{len(samples)} samples, model load, generation and grading")
    summary.add("evaluate.py", "evaluate.py generated tokens", generated, "tokens")
    summary.add("evaluate.py", "evaluate.py generated tokens/s", generated / wall, "tokens/s",
                note="over the wall time")


def rl_part(size: dict, world: Path, scratch: Path, summary: Summary, timeout_s: float):
    out = scratch / "rl"
    wall = stage([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
                  "bench/rl_step.py", "config/rl_tiny.py", "--model", world / "model",
                  "--train_file", world / "train_rl.jsonl", "--out_dir", out, "--engine", "hf",
                  "--bf16", "--system_prompt", "row", *size["rl"]],
                 scratch / "logs" / "rl.log", summary, "rl.py", RL_FIGURES, timeout_s)
    if wall is None:
        return
    steps = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    timed = steps[1:] or steps                                             # the first step warms up
    note = f"mean of steps 2-{len(steps)}" if len(steps) > 1 else "step 1"

    def mean(key):
        return statistics.mean(s[key] for s in timed)

    sec = "rl.py"
    summary.add(sec, "rl.py wall time", wall, "s",
                note=f"{len(steps)} steps, start-up and checkpoint included")
    step_time = sum(mean(k) for k in ("sync_s", "gen_s", "reward_s", "train_s"))
    summary.add(sec, "rl.py step time", step_time, "s", note=note)
    for figure, key in (("generation", "gen_s"), ("reward", "reward_s"), ("training", "train_s"),
                        ("weight sync", "sync_s")):
        summary.add(sec, f"rl.py {figure}", mean(key), "s", note=note)
    clipped = statistics.mean(s["clip_frac_low"] + s["clip_frac_high"] for s in steps)
    summary.add(sec, "rl.py clipped tokens", clipped, "%",
                note="a synthetic reward (bench/rl_step.py), all steps")
    summary.add(sec, "rl.py approx KL", statistics.mean(s["approx_kl"] for s in steps), "nats")


# ------------------------------------------------------------------------------------------------
def write_results(out: Path, scratch: Path, summary: Summary, header: list[str], meta: dict):
    """OUT's three files, each written whole (a kill leaves the previous version)."""
    write_atomic(out / "summary.md", summary.markdown(header))
    write_atomic(out / "summary.json",
                 json.dumps({**meta, **summary.runs, "rows": summary.rows,
                             "crashed": summary.crashed}, indent=1))
    tmp = out / ".logs.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(scratch / "logs", arcname="logs")
    os.replace(tmp, out / "logs.tar.gz")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes and a couple of steps (the CPU test)")
    parser.add_argument("--out", default="out/gpu_check",
                        help="summary.md, summary.json and logs.tar.gz go here")
    parser.add_argument("--scratch", default="",
                        help="toy data and runs (default: a temporary folder, deleted)")
    parser.add_argument("--shape", default="", choices=["", *sft_step.SHAPES],
                        help="SFT step model shape (default qwen2.5-1.5b; smoke with --smoke)")
    parser.add_argument("--layers", type=int, default=0, help="override the shape's layer count")
    parser.add_argument("--rounds", type=int, default=0,
                        help="rounds of sft.train runs per SFT variant and form (default 1: the "
                        "part's limit holds one round of both forms)")
    parser.add_argument("--peak_tflops", type=float, default=0.0,
                        help="the device's dense bf16 peak for MFU")
    parser.add_argument("--beside", default="", choices=["", *BESIDE_FORMS],
                        help="the SFT step's form timed beside packed (bench/forms.py; default "
                        "compiled, with --smoke 6fbcbf7: compiling takes minutes on a CPU)")
    parser.add_argument("--parts", type=int, nargs="+", choices=range(1, 6), default=range(1, 6),
                        metavar="N", help="run only these parts (1-5, the list above; default all)")
    a = parser.parse_args()
    a.shape = a.shape or ("smoke" if a.smoke else "qwen2.5-1.5b")
    a.beside = a.beside or (sft_step.forms.OLD if a.smoke else "compiled")
    a.rounds = a.rounds or 1       # a round: each variant in both forms (the part's limit: one)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(a.scratch or tempfile.mkdtemp(prefix="gpu_check."))
    shutil.rmtree(scratch / "logs", ignore_errors=True)
    (scratch / "logs").mkdir(parents=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if a.smoke:  # one thread for tiny models on a shared CPU: more only spin-wait
        torch.set_num_threads(1)  # (tests/test_rl.py measured ~20x)
    t0, summary = time.perf_counter(), Summary()

    import transformers

    cpu = f"CPU ({platform.machine()}, {os.cpu_count()} cores)"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu
    smoke = " (smoke: tiny shapes, the targets are meant for the GPU run)" if a.smoke else ""
    header = [f"# GPU check{smoke}", "",
              f"device: {name}; torch {torch.__version__}, CUDA {torch.version.cuda}, transformers "
              f"{transformers.__version__}, Python {platform.python_version()}; grader: "
              f"{math_verify_status()[1]}",
              f"SFT shape: {a.shape}{f' with {a.layers} layers' if a.layers else ''}; command: "
              f"bash bench/gpu_check.sh {' '.join(sys.argv[1:])}".rstrip()]
    meta = {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda,
            "transformers": transformers.__version__, "smoke": a.smoke, "shape": a.shape}
    tokens, vocab, hidden, reps = (64, 32768, 256, 2) if a.smoke else (4096, 151936, 1536, 5)
    toy, world = TOY["smoke" if a.smoke else "gpu"], {}

    def evaluate_with_its_world(limit):
        world["path"] = toy_world(toy, scratch, summary, limit)
        if world["path"] is not None:
            evaluate_part(toy, world["path"], scratch, summary, limit)

    def rl_with_the_world(limit):
        if world.get("path") is not None:
            rl_part(toy, world["path"], scratch, summary, limit)
        elif not any(r["section"] == "rl.py" for r in summary.rows):
            summary.fail("rl.py", RL_FIGURES, "skipped", "part 4 did not build the toy world")

    # (section, figures, title, time limit in seconds, the part)
    # (the SFT part times two forms, bench/sft_step.py --forms: twice the sft.train runs of one;
    # the compiled form's first step compiles, about a minute or two of the host's CPU)
    parts = [("SFT step", sft_figures(a.beside), "1. SFT steps (bench/sft_step.py)", 420,
              lambda limit: sft_steps(a, scratch, summary, limit)),
             ("teacher side", TEACHER_FIGURES,
              "2. the teacher side of the loss against one logsumexp pass", 90,
              lambda limit: teacher_side(tokens, vocab, reps, device, summary, not a.smoke)),
             ("bf16 error", BF16_FIGURES, "3. the bf16 error of lp, lq and w_t", 60,
              lambda limit: bf16_errors(tokens, vocab, hidden, device, summary)),
             ("evaluate.py", EVAL_FIGURES, "4. evaluate.py on the toy task (HF engine)", 100,
              evaluate_with_its_world),
             ("rl.py", RL_FIGURES, "5. rl.py's GRPO with a synthetic reward (bench/rl_step.py)",
              110, rl_with_the_world)]
    for number, (section, figures, title, limit, run_part) in enumerate(parts, 1):
        left = DEADLINE_S - (time.perf_counter() - t0)
        if number not in a.parts:
            summary.fail(section, figures, "skipped", f"not asked for (--parts "
                         f"{' '.join(map(str, a.parts))})")
        elif not a.smoke and left < limit:
            summary.fail(section, figures, "skipped",
                         f"{left:.0f} s left of the check's {DEADLINE_S} s, the part may take "
                         f"{limit} s")
        else:
            print(f"== {title}", flush=True)
            try:
                run_part(limit)
            except Exception as e:  # noqa: BLE001
                # reported in the table and the exit status; the other parts still run
                summary.fail(section, figures, "CRASH", f"{type(e).__name__}: {e}")
            # cached blocks of this process, before a subprocess needs them
            torch.cuda.empty_cache()
        write_results(out, scratch, summary, header, meta)
    summary.add("check", "gpu_check wall time", time.perf_counter() - t0, "s",
                f"< {DEADLINE_S} s (GPU)",
                None if a.smoke else time.perf_counter() - t0 < DEADLINE_S)
    write_results(out, scratch, summary, header, meta)
    if not a.scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    print("\n" + summary.markdown(header)
          + f"\n(written to {out}: summary.md, summary.json, logs.tar.gz)")
    if summary.crashed:
        print(f"crashed or timed out: {', '.join(summary.crashed)} (their logs are in logs.tar.gz)")
    sys.exit(1 if summary.crashed else 0)


if __name__ == "__main__":
    main()
