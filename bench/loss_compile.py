"""Benchmark (not a test): the loss's passes over [tokens, vocab] logits, eager against
torch.compile'd as sft.py --compile runs them, on logits like an LLM's (4096 x 151936), each pair
timed interleaved in one run, with the largest difference between the two forms' results:
- the teacher side, curio_loss.teacher_log_prob, on bf16 logits and on float32 ones (the step's on
  CUDA: chunked_logits.no_grad_logits), and torch.logsumexp on the bf16 ones (the ratio the issue's
  target is stated in);
- the student side, curio_loss.curio_sft_loss on bf16 logits, forward and backward;
- the logged entropy, curio_loss.entropy.
The first call of a compiled function compiles it (its time is printed). Its predecessor,
bench/teacher_compile.py at 6c962d0, timed the teacher side alone on one H200
(bench/data/h200-2026-11-28/teacher_compile.log).

    python bench/loss_compile.py               # CUDA
    python bench/loss_compile.py --smoke       # small logits, any device (a check that it runs)
"""
import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import curio_loss as cl  # noqa: E402
from plumbing.compiling import compiled  # noqa: E402
from plumbing.synthetic import llm_like_logits  # noqa: E402
from sft_step import median_times, sync  # noqa: E402  (bench/, this file's folder)


def student_side(loss_fn, logits, targets, lq, cfg):
    """Eq. 6 and its gradient w.r.t. the logits, as a step's chunk takes them."""
    z = logits.detach().requires_grad_()
    loss, _ = loss_fn(z, targets, lq, cfg)
    loss.sum().backward()
    return loss, z.grad


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="256 x 4096 logits, 2 repetitions")
    parser.add_argument("--reps", type=int, default=10)
    a = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not a.smoke:
        raise SystemExit("bench/loss_compile.py times a GPU's kernels: run it with CUDA, or "
                         "--smoke")
    n, v, reps = (256, 4096, 2) if a.smoke else (4096, 151936, a.reps)
    z16 = llm_like_logits(n, v, seed=0).to(device, torch.bfloat16)
    z32 = z16.float()
    y = torch.randint(0, v, (n,), generator=torch.Generator().manual_seed(0)).to(device)
    cfg = cl.LossConfig()
    lq = cl.teacher_log_prob(z32, y, cfg)[0]
    # name: (the function, a call of it or of its compiled form returning what the two compare)
    cases = {"teacher side, bf16 logits": (cl.teacher_log_prob, lambda f: f(z16, y, cfg)[0]),
             "teacher side, float32 logits": (cl.teacher_log_prob, lambda f: f(z32, y, cfg)[0]),
             "student side, bf16 logits (forward and backward)":
                 (cl.curio_sft_loss, lambda f: student_side(f, z16, y, lq, cfg)),
             "entropy, bf16 logits": (cl.entropy, lambda f: f(z16))}
    runs = {"logsumexp": lambda: torch.logsumexp(z16.float(), -1)}
    compile_s, diffs = {}, {}
    for name, (eager, call) in cases.items():
        fast = compiled(eager)
        sync(device)
        t0 = time.perf_counter()
        got = call(fast)                                                  # compiles
        sync(device)
        compile_s[name] = time.perf_counter() - t0
        want = call(eager)
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        diffs[name] = max((g.float() - w.float()).abs().max().item() for g, w in zip(got, want))
        runs[name + ": eager"] = lambda call=call, eager=eager: call(eager)
        runs[name + ": compiled"] = lambda call=call, fast=fast: call(fast)
    ms = {k: t * 1e3 for k, t in median_times(runs, reps, device).items()}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"torch {torch.__version__}, {name}, {n} x {v} logits, median of {reps}")
    print(f"logsumexp pass (float32 of bf16): {ms['logsumexp']:.2f} ms")
    for k in cases:
        eager, fast = ms[k + ": eager"], ms[k + ": compiled"]
        print(f"{k}: eager {eager:.2f} ms ({eager / ms['logsumexp']:.2f}x logsumexp), compiled "
              f"{fast:.2f} ms ({fast / ms['logsumexp']:.2f}x, {fast / eager:.2f}x eager; compiling "
              f"{compile_s[k]:.0f} s), max |difference| {diffs[k]:.3g}")


if __name__ == "__main__":
    main()
