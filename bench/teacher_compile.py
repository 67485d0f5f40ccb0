"""A probe run once on one H200 (its output: bench/data/h200-2026-11-28/teacher_compile.log), not a
part of the checks: the teacher side (curio_loss.teacher_log_prob) eager against torch.compile'd,
and its parts, on 4096 x 151936 bf16 logits like an LLM's. Needs CUDA: python bench/teacher_compile.py"""
import time
import torch
import curio_loss as cl
from plumbing.synthetic import llm_like_logits

def timed(fn, *args, reps=10):
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t = time.perf_counter(); fn(*args); torch.cuda.synchronize(); times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2] * 1e3

n, v = 4096, 151936
z = llm_like_logits(n, v, seed=0).cuda().bfloat16()
y = torch.randint(0, v, (n,), device="cuda")
cfg = cl.LossConfig()
lse = timed(lambda: torch.logsumexp(z.float(), -1))
eager = timed(lambda: cl.teacher_log_prob(z, y, cfg))
top = cl._fp32(cl._top_k_values(z, 512))
h = cl.entropy(top); target = h + cl.entropy_increment(h, cfg)
t_topk = timed(lambda: cl._top_k_values(z, 512))
t_torch_topk = timed(lambda: z.topk(512, dim=-1).values)
t_solve = timed(lambda: cl.solve_temperature(top, target, cfg))
solve_c = torch.compile(cl.solve_temperature, dynamic=False)
t0 = time.perf_counter(); solve_c(top, target, cfg); torch.cuda.synchronize(); ct = time.perf_counter() - t0
t_solve_c = timed(lambda: solve_c(top, target, cfg))
ref = cl.solve_temperature(top, target, cfg)[0]; got = solve_c(top, target, cfg)[0]
tlp_c = torch.compile(cl.teacher_log_prob, dynamic=False)
t0 = time.perf_counter(); tlp_c(z, y, cfg); torch.cuda.synchronize(); ct2 = time.perf_counter() - t0
t_all_c = timed(lambda: tlp_c(z, y, cfg))
lq_ref = cl.teacher_log_prob(z, y, cfg)[0]; lq_c = tlp_c(z, y, cfg)[0]
print(f"torch {torch.__version__} {torch.cuda.get_device_name()}")
print(f"logsumexp pass (float32 of bf16) {lse:.2f} ms")
print(f"teacher_log_prob eager {eager:.2f} ms ({eager / lse:.2f}x lse); compiled {t_all_c:.2f} ms "
      f"({t_all_c / lse:.2f}x), compile {ct2:.0f} s, max |lq diff| {(lq_ref - lq_c).abs().max().item():.3g}")
print(f"  top-k blockwise {t_topk:.2f} ms, torch.topk {t_torch_topk:.2f} ms")
print(f"  solve_temperature eager {t_solve:.2f} ms, compiled {t_solve_c:.2f} ms (compile {ct:.0f} s), "
      f"max |tau diff| {(ref - got).abs().max().item():.3g}")
