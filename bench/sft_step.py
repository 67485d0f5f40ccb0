"""Benchmark (not a test): one SFT optimiser step of vanilla SFT, CurioSFT with a separate teacher, and CurioSFT
without one, on the same random Qwen2 model, batch and machine; step time and peak memory as ratios to vanilla.

    python bench/sft_step.py                      # CPU-sized default (Qwen vocabulary, small trunk)
    python bench/sft_step.py --preset gpu_0.5b    # one GPU, bf16, a ~0.5B Qwen2, 4k-token sequences

Step times come from one process that interleaves the variants' steps (a noisy machine slows all three alike);
peak memory from one process per variant (process RSS on CPU, max allocated on GPU).
"""
import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402
import curio_loss as cl  # noqa: E402
import sft  # noqa: E402

PRESETS = {  # model size, sequences per micro-batch, sequence length
    "cpu": dict(hidden=256, layers=4, heads=4, kv_heads=2, inter=768, vocab=151936, batch=2, seq=512, chunk=1024),
    "gpu_0.5b": dict(hidden=896, layers=24, heads=14, kv_heads=2, inter=4864, vocab=151936, batch=2, seq=4096, chunk=4096),
}
VARIANTS = ["sft", "curio", "curio_self_teacher"]


def build(variant: str, p: dict, device, grad_ckpt: bool):
    """Student (and teacher) on a fixed random Qwen2, its optimiser, and a fixed batch."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    bf16 = device.type == "cuda"
    cfg = Qwen2Config(vocab_size=p["vocab"], hidden_size=p["hidden"], num_hidden_layers=p["layers"],
                      num_attention_heads=p["heads"], num_key_value_heads=p["kv_heads"], intermediate_size=p["inter"],
                      max_position_embeddings=p["seq"], tie_word_embeddings=False)
    torch.manual_seed(0)
    model = common.shard_model(Qwen2ForCausalLM(cfg), device, bf16, grad_ckpt)
    teacher = None
    if variant == "curio":
        torch.manual_seed(0)
        teacher = common.shard_model(Qwen2ForCausalLM(cfg), device, bf16, grad_ckpt=False, trainable=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, p["vocab"], (p["batch"], p["seq"]), generator=g)
    mask = torch.ones_like(ids, dtype=torch.float32)
    mask[:, : p["seq"] // 8] = 0                                         # a prompt, untrained
    batch = {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device), "loss_mask": mask.to(device)}
    return model, teacher, opt, batch, sft.Args(loss=variant, loss_chunk=p["chunk"])


def step(model, teacher, opt, batch, args, device) -> float:
    """One optimiser step; seconds."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    total, _ = sft.micro_batch_loss(model, teacher, None, batch, None, args, cl.LossConfig(), want_entropy=False)
    (total / batch["loss_mask"][:, 1:].sum()).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def worker(mode: str, p: dict, steps: int, grad_ckpt: bool) -> dict:
    """mode 'time': all variants in this process, their steps interleaved (a slow spell of the machine hits
    all alike). mode VARIANT: that variant alone, for its peak memory."""
    _, _, device = common.setup_distributed()
    if mode != "time":
        setup = build(mode, p, device, grad_ckpt)
        for _ in range(2):
            step(*setup, device)
        peak = (torch.cuda.max_memory_allocated() if device.type == "cuda"
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        return {"peak_bytes": peak, "params": sum(x.numel() for x in setup[0].parameters())}
    setups = {v: build(v, p, device, grad_ckpt) for v in VARIANTS}
    times = {v: [] for v in VARIANTS}
    for i in range(steps + 1):                                           # round 0 warms up
        for v in VARIANTS:
            t = step(*setups[v], device)
            if i:
                times[v].append(t)
    return {"times": times, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="gpu_0.5b" if torch.cuda.is_available() else "cpu", choices=PRESETS)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant, interleaved")
    parser.add_argument("--grad_ckpt", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, PRESETS[a.preset], a.steps, a.grad_ckpt)), flush=True)
        common.shutdown()

    def run(mode):
        out = subprocess.run([sys.executable, __file__, "--preset", a.preset, "--steps", str(a.steps), "--worker", mode,
                              "--grad_ckpt" if a.grad_ckpt else "--no-grad_ckpt"], capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(out.stderr[-3000:])
        return json.loads(out.stdout.strip().splitlines()[-1])

    timing = run("time")
    memory = {v: run(v) for v in VARIANTS}
    p = PRESETS[a.preset]
    tokens = p["batch"] * p["seq"]
    print(f"{timing['device']}, preset {a.preset}: {memory['sft']['params'] / 1e6:.0f}M params, {p['batch']} x {p['seq']} "
          f"tokens, vocab {p['vocab']}, activation checkpointing {'on' if a.grad_ckpt else 'off'}, "
          f"median of {a.steps} interleaved steps per variant")
    base_t = statistics.median(timing["times"]["sft"])
    for v in VARIANTS:
        t, m = statistics.median(timing["times"][v]), memory[v]["peak_bytes"]
        print(f"{v:20s} step {t:8.3f} s  ({t / base_t:.2f}x)  {tokens / t:9.0f} tokens/s  "
              f"peak memory {m / 2**30:6.2f} GiB  ({m / memory['sft']['peak_bytes']:.2f}x)")


if __name__ == "__main__":
    main()
