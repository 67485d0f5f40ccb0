"""The GPU check: what one GPU machine can show about this project in one command, in under 10 minutes on one 80 GB
H100/H200 with no network, no vLLM and no model download. A measurement, not a test: it exits 0 when every part ran,
whatever the targets say, and 1 when a part crashed (its log is in OUT/logs/).

    bash bench/gpu_check.sh [--out out/gpu_check] [--shape qwen2.5-1.5b] [--layers N] [--peak_tflops X]
    bash bench/gpu_check.sh --smoke     # tiny shapes, a couple of steps, on whatever device there is (CPU: gloo, fp32)

1. SFT steps of sft, curio and curio_self_teacher on random weights with a real model's shapes, 8k-token sequences,
   bf16, activation checkpointing, under torchrun (nccl): bench/sft_step.py. Tokens/s, MFU, peak memory next to the
   memory planner's prediction, and the CurioSFT / SFT step-time ratios.
2. The teacher side of the loss (curio_loss.teacher_log_prob) against one logsumexp pass over the same logits,
   4096 x 151936, bf16 on CUDA.
3. evaluate.py and rl.py (HF engine, bf16) on the demo's toy task (demo/toy.py) with a small random model: they run,
   and how long they take. Both import math-verify, which the GPU image lacks: bench/gpu_check.sh installs it from .whl/.
4. A summary table of every figure with PASS/MISS per target: printed, and written to OUT/summary.md and summary.json.
"""
import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

import sft_step  # bench/, this file's folder; it puts the repository root on sys.path for the next ones

import curio_loss as cl  # noqa: E402
from bench.loss_speed import llm_like_logits  # noqa: E402
from demo import run as demo  # noqa: E402

PY = sys.executable
TARGETS = {"mfu": 0.40, "curio": 1.25, "curio_self_teacher": 1.05, "planner": 0.15, "teacher_side": 3.0}
# The toy part's sizes: enough work on a GPU to time, seconds on a CPU.
TOY = {
    "smoke": dict(
        data=["--n_pretrain", "8", "--n_sft", "16", "--n_rl", "8", "--n_test", "4", "--vocab_labels", "50",
              "--vocab_size", "512"],
        model=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                   intermediate_size=128),
        eval=["--n", "2", "--limit", "4", "--max_new_tokens", "16", "--batch_size", "4", "--grader_workers", "1"],
        rl=["--steps", "2", "--prompts_per_step", "2", "--rollouts", "2", "--mini_batch", "2", "--micro_batch", "4",
            "--max_response_len", "16", "--gen_batch_size", "2", "--grader_workers", "1"],
    ),
    "gpu": dict(
        data=["--n_pretrain", "8", "--n_sft", "16", "--n_rl", "256", "--n_test", "64"],
        model=dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=768),
        eval=["--n", "4", "--limit", "64", "--max_new_tokens", "256", "--batch_size", "64", "--grader_workers", "4"],
        rl=["--steps", "3", "--prompts_per_step", "16", "--rollouts", "8", "--mini_batch", "8", "--micro_batch", "32",
            "--max_response_len", "256", "--gen_batch_size", "16", "--grader_workers", "4", "--grad_ckpt"],
    ),
}
GIB = 2**30


class Summary:
    """Rows of (section, figure, value, unit, target, status, note); status PASS / MISS against a target, '–' without
    one, 'n/a' where this device cannot measure it, 'skipped' or 'CRASH' for a part that did not run."""

    def __init__(self):
        self.rows, self.crashed = [], []

    def add(self, section, figure, value, unit="", target="", ok=None, status=None, note=""):
        if status is None:
            status = "n/a" if value is None and target else "–" if ok is None else "PASS" if ok else "MISS"
        self.rows.append(dict(section=section, figure=figure, value=value, unit=unit, target=target, status=status,
                              note=note))

    def fail(self, section, figures, status, note):
        """A part that did not run: its rows say so (and a crash makes the exit status 1)."""
        if status == "CRASH":
            self.crashed.append(section)
        for figure, unit in figures:
            self.add(section, figure, None, unit, status=status, note=note)

    def markdown(self, header: list[str]) -> str:
        def fmt(v, unit):
            if v is None:
                return "–"
            return {"%": f"{v:.1%}", "x": f"{v:.2f}x", "GiB": f"{v:.2f} GiB", "tokens/s": f"{v:,.0f} tokens/s",
                    "ms": f"{v:.2f} ms", "s": f"{v:.3f} s"}.get(unit, f"{v:g} {unit}".strip())

        lines = [*header, "", "| part | figure | value | target | status | note |", "|" + " --- |" * 6]
        lines += [f"| {r['section']} | {r['figure']} | {fmt(r['value'], r['unit'])} | {r['target']} | {r['status']} "
                  f"| {r['note']} |" for r in self.rows]
        return "\n".join(lines) + "\n"


def stage(cmd: list, log: Path, summary: Summary, section: str, figures: list) -> float | None:
    """Run one command (demo/run.py's run_stage: echoed, output to `log`, its tail shown on failure); its wall seconds,
    or None after recording a crash."""
    t0 = time.perf_counter()
    try:
        demo.run_stage(cmd, log)
    except SystemExit:
        summary.fail(section, figures, "CRASH", f"see {log}")
        return None
    return time.perf_counter() - t0


# ------------------------------------------------------------------------------------------------
# 1. SFT steps
# ------------------------------------------------------------------------------------------------
SFT_FIGURES = [(f"{v} {what}", unit) for v in sft_step.VARIANTS
               for what, unit in (("step time", "s"), ("tokens/s", "tokens/s"), ("MFU", "%"))]
SFT_FIGURES += [("curio / sft step time", "x"), ("curio_self_teacher / sft step time", "x"),
                ("teacher EMA update", "ms")]
SFT_FIGURES += [(f"{v} {what}", unit) for v in sft_step.VARIANTS
                for what, unit in (("peak memory", "GiB"), ("planner prediction", "GiB"), ("measured / planned", "x"))]


def sft_steps(a, out: Path, summary: Summary):
    result_file = out / "sft_step.json"
    cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "bench/sft_step.py",
           "--shape", a.shape, "--steps", str(a.steps), "--json", result_file]
    cmd += ["--layers", str(a.layers)] if a.layers else []
    cmd += ["--peak_tflops", str(a.peak_tflops)] if a.peak_tflops else []
    if stage(cmd, out / "logs" / "sft_step.log", summary, "SFT step", SFT_FIGURES) is None:
        return
    r = json.loads(result_file.read_text())
    sec = "SFT step"
    for v, m in r["variants"].items():
        summary.add(sec, f"{v} step time", m["step_s"], "s", note=f"median of {r['steps']}")
        summary.add(sec, f"{v} tokens/s", m["tokens_per_s"], "tokens/s")
        target = f">= {TARGETS['mfu']:.0%}" if v == "sft" else ""
        peak = f"{r['peak_tflops']:.3g} TFLOP/s: {r['peak_source']}"
        summary.add(sec, f"{v} MFU", m["mfu"], "%", target, m["mfu"] >= TARGETS["mfu"] if target else None,
                    note=peak if v == "sft" else "the student's model FLOPs (as sft's)")
    for v in ("curio", "curio_self_teacher"):
        ratio = r["variants"][v]["ratio_to_sft"]
        summary.add(sec, f"{v} / sft step time", ratio, "x", f"<= {TARGETS[v]}", ratio <= TARGETS[v],
                    note="separate EMA teacher" if v == "curio" else "the student's own logits")
    summary.add(sec, "teacher EMA update", r["ema_update_s"] * 1e3, "ms",
                note=f"every {sft_step.TEACHER_EVERY} steps, a fifth of it in curio's step time")
    for v, m in r["variants"].items():
        peak, plan, ratio = m["peak_bytes"], m["planner_bytes"], m["measured_over_planned"]
        summary.add(sec, f"{v} peak memory", peak and peak / GIB, "GiB", status=None if peak else "n/a",
                    note="max_memory_allocated" if peak else "CPU: no allocator statistics")
        summary.add(sec, f"{v} planner prediction", plan and plan / GIB, "GiB", note=m["planner_note"])
        summary.add(sec, f"{v} measured / planned", ratio, "x", f"within {TARGETS['planner']:.0%}",
                    None if ratio is None else abs(ratio - 1) <= TARGETS["planner"])


# ------------------------------------------------------------------------------------------------
# 2. The teacher side of the loss against one logsumexp pass
# ------------------------------------------------------------------------------------------------
TEACHER_FIGURES = [("logsumexp pass", "ms"), ("teacher_log_prob (bisection)", "ms"), ("bisection / logsumexp", "x"),
                   ("newton / logsumexp", "x")]


def teacher_side(tokens: int, vocab: int, reps: int, device, summary: Summary):
    """teacher_log_prob (bisection, and Newton) and torch.logsumexp on the same logits, timed interleaved."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    logits = llm_like_logits(tokens, vocab, seed=1).to(device, dtype)          # [N, V]
    targets = torch.distributions.Categorical(logits=logits.float()).sample()      # [N]
    runs = {"logsumexp": lambda: torch.logsumexp(logits, -1),
            "bisection": lambda: cl.teacher_log_prob(logits, targets, cl.LossConfig()),
            "newton": lambda: cl.teacher_log_prob(logits, targets, cl.LossConfig(solver="newton"))}
    times = {k: [] for k in runs}
    for i in range(reps + 1):                                                     # round 0 warms up
        for k, fn in runs.items():
            sft_step.sync(device)
            t0 = time.perf_counter()
            fn()
            sft_step.sync(device)
            if i:
                times[k].append(time.perf_counter() - t0)
    t = {k: statistics.median(v) for k, v in times.items()}
    sec, shape = "teacher side", f"{tokens} x {vocab} {str(dtype).split('.')[-1]} logits, median of {reps}"
    summary.add(sec, "logsumexp pass", t["logsumexp"] * 1e3, "ms", note=shape)
    summary.add(sec, "teacher_log_prob (bisection)", t["bisection"] * 1e3, "ms")
    ratio = t["bisection"] / t["logsumexp"]
    summary.add(sec, "bisection / logsumexp", ratio, "x", f"<= {TARGETS['teacher_side']:g}x (GPU)",
                ratio <= TARGETS["teacher_side"])
    summary.add(sec, "newton / logsumexp", t["newton"] / t["logsumexp"], "x", note="--solver newton")


# ------------------------------------------------------------------------------------------------
# 3. evaluate.py and rl.py on the toy task
# ------------------------------------------------------------------------------------------------
EVAL_FIGURES = [("evaluate.py wall time", "s"), ("evaluate.py generated tokens", "tokens"),
                ("evaluate.py generated tokens/s", "tokens/s")]
RL_FIGURES = [("rl.py wall time", "s"), ("rl.py step time", "s"), ("rl.py generation", "s"), ("rl.py reward", "s"),
              ("rl.py training", "s"), ("rl.py weight sync", "s")]


def toy_model(world: Path, model_kwargs: dict) -> Path:
    """demo.make_model_dir's config and tokenizer, and random weights: what evaluate.py and rl.py load."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_dir = demo.make_model_dir(world, model_kwargs)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir)).save_pretrained(model_dir)
    return model_dir


def math_verify_status() -> tuple[bool, str]:
    """Whether evaluate.py's grader can be imported, and from where (.whl/ puts it on PYTHONPATH)."""
    try:
        import math_verify
    except ImportError as e:
        return False, f"math-verify is not installed ({e})"
    return True, f"math-verify {importlib.metadata.version('math-verify')} from {Path(math_verify.__file__).parent}"


def toy_stages(size: dict, out: Path, summary: Summary):
    available, status = math_verify_status()
    if not available:
        note = (f"{status}: evaluate.py imports it at module level and rl.py imports evaluate.py. On a machine "
                "with PyPI: bash bench/gpu_check.sh --fetch_wheels, then carry .whl/")
        summary.fail("evaluate.py", EVAL_FIGURES, "skipped", note)
        summary.fail("rl.py", RL_FIGURES, "skipped", note)
        return
    world, logs = out / "toy", out / "logs"
    if stage([PY, "demo/toy.py", "--out", world, *size["data"]], logs / "toy_data.log", summary, "evaluate.py",
             EVAL_FIGURES) is None:
        summary.fail("rl.py", RL_FIGURES, "skipped", "the toy data could not be built")
        return
    model_dir = toy_model(world, size["model"])

    wall = stage([PY, "evaluate.py", "--model", model_dir, "--data", world / "test.jsonl", "--out", out / "eval",
                  "--engine", "hf", "--system_prompt", "row", *size["eval"]], logs / "evaluate.log", summary,
                 "evaluate.py", EVAL_FIGURES)
    if wall is not None:
        samples = [json.loads(line) for line in (out / "eval" / "samples.jsonl").read_text().splitlines()]
        generated = sum(s["length"] for s in samples)
        summary.add("evaluate.py", "evaluate.py wall time", wall, "s",
                    note=f"{len(samples)} samples, model load, generation and grading")
        summary.add("evaluate.py", "evaluate.py generated tokens", generated, "tokens")
        summary.add("evaluate.py", "evaluate.py generated tokens/s", generated / wall, "tokens/s",
                    note="over the wall time")

    wall = stage([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "rl.py",
                  "config/rl_tiny.py", "--model", model_dir, "--train_file", world / "train_rl.jsonl",
                  "--out_dir", out / "rl", "--engine", "hf", "--bf16", "--system_prompt", "row", *size["rl"]],
                 logs / "rl.log", summary, "rl.py", RL_FIGURES)
    if wall is not None:
        steps = [json.loads(line) for line in (out / "rl" / "log.jsonl").read_text().splitlines()]
        timed = steps[1:] or steps                                                # the first step warms up
        note = f"mean of steps 2-{len(steps)}" if len(steps) > 1 else "step 1"

        def mean(key):
            return statistics.mean(s[key] for s in timed)

        summary.add("rl.py", "rl.py wall time", wall, "s", note=f"{len(steps)} steps, start-up and checkpoint included")
        summary.add("rl.py", "rl.py step time", sum(mean(k) for k in ("sync_s", "gen_s", "reward_s", "train_s")), "s",
                    note=note)
        for figure, key in (("generation", "gen_s"), ("reward", "reward_s"), ("training", "train_s"),
                            ("weight sync", "sync_s")):
            summary.add("rl.py", f"rl.py {figure}", mean(key), "s", note=note)


# ------------------------------------------------------------------------------------------------
def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and a couple of steps (the CPU test)")
    parser.add_argument("--out", default="out/gpu_check", help="summary.md, summary.json, logs/ and the runs' files")
    parser.add_argument("--shape", default="", choices=["", *sft_step.SHAPES],
                        help="SFT step model shape (default qwen2.5-1.5b; smoke with --smoke)")
    parser.add_argument("--layers", type=int, default=0, help="override the shape's layer count")
    parser.add_argument("--steps", type=int, default=0, help="timed SFT steps per variant (default 5; 2 with --smoke)")
    parser.add_argument("--peak_tflops", type=float, default=0.0, help="the device's dense bf16 peak for MFU")
    a = parser.parse_args()
    a.shape = a.shape or ("smoke" if a.smoke else "qwen2.5-1.5b")
    a.steps = a.steps or (2 if a.smoke else 5)
    out = Path(a.out)
    for part in ("toy", "eval", "rl", "logs"):                  # rl.py would resume from an earlier run's checkpoint
        shutil.rmtree(out / part, ignore_errors=True)
    (out / "logs").mkdir(parents=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if a.smoke:  # one thread for tiny models on a shared CPU: more only spin-wait (tests/test_rl.py measured ~20x)
        demo.THREADS = "1"
        torch.set_num_threads(1)
    t0, summary = time.perf_counter(), Summary()

    tokens, vocab, reps = (64, 32768, 2) if a.smoke else (4096, 151936, 5)
    parts = [("SFT step", SFT_FIGURES, "1. SFT steps (bench/sft_step.py)", lambda: sft_steps(a, out, summary)),
             ("teacher side", TEACHER_FIGURES, "2. the teacher side of the loss against one logsumexp pass",
              lambda: teacher_side(tokens, vocab, reps, device, summary)),
             ("toy task", [("evaluate.py and rl.py", "s")], "3. evaluate.py and rl.py on the toy task (HF engine)",
              lambda: toy_stages(TOY["smoke" if a.smoke else "gpu"], out, summary))]
    for section, figures, title, run_part in parts:
        print(f"== {title}", flush=True)
        try:
            run_part()
        except Exception as e:  # noqa: BLE001 - reported in the table and the exit status; the other parts still run
            summary.fail(section, figures, "CRASH", f"{type(e).__name__}: {e}")
        torch.cuda.empty_cache()                        # cached blocks of this process, before a subprocess needs them
    summary.add("check", "gpu_check wall time", time.perf_counter() - t0, "s", "< 600 s (GPU)",
                None if a.smoke else time.perf_counter() - t0 < 600)

    import transformers

    cpu = f"CPU ({platform.machine()}, {os.cpu_count()} cores)"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu
    header = [f"# GPU check{' (smoke: tiny shapes, the targets are meant for the GPU run)' if a.smoke else ''}", "",
              f"device: {name}; torch {torch.__version__}, CUDA {torch.version.cuda}, transformers "
              f"{transformers.__version__}, Python {platform.python_version()}; grader: {math_verify_status()[1]}",
              f"SFT shape: {a.shape}{f' with {a.layers} layers' if a.layers else ''}; command: "
              f"bash bench/gpu_check.sh {' '.join(sys.argv[1:])}".rstrip()]
    text = summary.markdown(header)
    (out / "summary.md").write_text(text)
    (out / "summary.json").write_text(json.dumps(
        {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda,
         "transformers": transformers.__version__, "smoke": a.smoke, "shape": a.shape, "rows": summary.rows,
         "crashed": summary.crashed}, indent=1))
    print("\n" + text + f"\n(written to {out / 'summary.md'} and summary.json)")
    if summary.crashed:
        print(f"crashed: {', '.join(summary.crashed)} (logs in {out / 'logs'})")
    sys.exit(1 if summary.crashed else 0)


if __name__ == "__main__":
    main()
