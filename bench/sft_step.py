"""Benchmark (not a test): SFT optimiser steps of vanilla SFT, CurioSFT with a separate teacher, and
CurioSFT without one (the student's own detached logits), on one random Qwen2 model, micro-batch and
machine: step time, tokens/s, MFU, peak memory next to the memory planner's prediction
(bench/memory.py), and the CurioSFT / SFT step-time ratios.

    python bench/sft_step.py            # CPU-sized default (Qwen vocabulary, small trunk)
    torchrun --standalone --nproc_per_node 1 bench/sft_step.py --shape qwen2.5-1.5b
                                        # one GPU: bf16, 8k tokens

One process, one student and its optimiser shared by the three variants, whose steps interleave (a
slow spell of the machine slows all three alike; a step of one variant moves the weights the next
starts from, which does not change its cost). The separate teacher is a frozen copy of the student,
resident for the whole run: the peak memory of the variants that do not use it has its resident
bytes subtracted. A step is what sft.py runs on a logging step of the presets (they log every step):
sft.micro_batch_loss on one padded micro-batch of sequences of different lengths (attention then
runs with a padding mask, as in sft.py), weighted by sft.token_weights, with the student's entropy
measured and the diagnostics gathered and summarized; backward, gradient clipping, AdamW (fused on
CUDA). CurioSFT's EMA update (Alg. 1 line 17, every 5 steps) is timed apart (best of 3) and a fifth
of it added to curio's step. Random weights give near-uniform logits, which a real model's are not:
the final norm's weight is scaled so that the median entropy of the logits is a trained model's,
about 0.2 nats (--entropy), and the authors' low-entropy rule then takes its pass over the
vocabulary for the share of tokens it would see. Peak memory: torch.cuda.max_memory_allocated, reset
before each step; CPU has no allocator statistics, so no memory figures there.

Model FLOPs of one step (forward + backward; recomputation from activation checkpointing and chunked
logits is not counted, as MFU's definition asks, nor the padding), for sequences of T_i real tokens,
N of them trained:
    6 * P_layers * sum T_i     the decoder layers' matmul weights (q, k, v, o, gate, up, down) act
                               on every token
  + 6 * H * V * N              lm_head acts only on the trained tokens (chunked_logits selects them
                               before it)
  + 6 * L * H * sum T_i^2      causal attention: QK^T and AV cost 2 * H * T^2 each over all T^2
                               pairs in the forward, the causal mask keeps half -> 2 * H * T^2 per
                               layer; backward costs twice the forward
(H = hidden = heads * head_dim, L = layers, V = vocabulary; biases, norms, softmax and other
elementwise work are left out: < 0.1% at these shapes.) MFU divides these FLOPs per second by the
device's dense bf16 peak (datasheet, from its name; --peak_tflops overrides; a device not in the
table, or a CPU, gets a measured matmul rate, labelled so). The hardware utilisation (HFU) adds what
the step really computes beyond them, on the padded tokens: the layers' forward again in backward
(activation checkpointing), lm_head's forward again per chunk, and for curio the teacher's forward.
"""
import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import curio_loss as cl  # noqa: E402
import data  # noqa: E402
import sft  # noqa: E402
from chunked_logits import normed_hidden, select_targets  # noqa: E402
from plumbing.distributed import setup_distributed, shutdown  # noqa: E402
from plumbing.models import clip_grad_norm, shard_model  # noqa: E402

# Real shapes (the models' HF config.json); "smoke" and "cpu" are small stand-ins for tests and CPU
# runs.
SHAPES = {
    "smoke": dict(hidden=64, layers=2, heads=2, kv_heads=1, inter=128, vocab=4096, tied=True,
                  max_pos=2048),
    "cpu": dict(hidden=256, layers=4, heads=4, kv_heads=2, inter=768, vocab=151936, tied=False,
                max_pos=2048),
    "qwen2.5-0.5b": dict(hidden=896, layers=24, heads=14, kv_heads=2, inter=4864, vocab=151936,
                         tied=True, max_pos=32768),
    "qwen2.5-1.5b": dict(hidden=1536, layers=28, heads=12, kv_heads=2, inter=8960, vocab=151936,
                         tied=True, max_pos=131072),
    # Qwen2.5-Math-7B with the 16k context the paper's runs use (Qwen2.5-Math-7B-16k-think)
    "qwen2.5-math-7b": dict(hidden=3584, layers=28, heads=28, kv_heads=4, inter=18944, vocab=152064,
                            tied=False, max_pos=16384),
}
# batch sequences in one micro-batch, the longest of seq tokens, each next one seq / 8 shorter (a
# length-sorted pack)
RUN_DEFAULTS = {"smoke": dict(batch=2, seq=256, loss_chunk=128),
                "cpu": dict(batch=2, seq=512, loss_chunk=1024)}
# config/sft_paper.py: token_budget 32768, loss_chunk 4096
GPU_RUN = dict(batch=4, seq=8192, loss_chunk=4096)
VARIANTS = ["sft", "curio", "curio_self_teacher"]
TEACHER_EVERY = sft.Args().teacher_every

# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's datasheets, TFLOP/s; first matching rule
# wins.
PEAK_BF16_TFLOPS = [(("H100", "PCIe"), 756.0), (("H100", "NVL"), 835.0), (("H200", "NVL"), 835.0),
                    (("H100",), 989.0), (("H200",), 989.0), (("A100",), 312.0)]


def qwen2_config(shape: dict, seq: int):
    from transformers import Qwen2Config

    if seq > shape["max_pos"]:
        raise SystemExit(f"--seq {seq} exceeds the shape's max_position_embeddings "
                         f"{shape['max_pos']}")
    return Qwen2Config(vocab_size=shape["vocab"], hidden_size=shape["hidden"],
                       num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                       num_key_value_heads=shape["kv_heads"], intermediate_size=shape["inter"],
                       max_position_embeddings=shape["max_pos"], tie_word_embeddings=shape["tied"])


def layer_matmul_params(shape: dict) -> int:
    """Weights of the decoder layers' matmuls: q and o (H x H), k and v (H x kv_heads * head_dim),
    gate, up and down (H x intermediate), times the layers."""
    h, kv = shape["hidden"], shape["kv_heads"] * shape["hidden"] // shape["heads"]
    return shape["layers"] * (2 * h * h + 2 * h * kv + 3 * h * shape["inter"])


def sequence_lengths(run: dict) -> list[int]:
    """The micro-batch's sequence lengths: the longest first, each next one seq / 8 shorter."""
    return [run["seq"] - i * (run["seq"] // 8) for i in range(run["batch"])]


def model_flops(shape: dict, lengths: list[int], trained: int) -> dict:
    """Model FLOPs of one forward + backward over sequences of these real lengths (the module
    docstring derives each term)."""
    layers = 6 * layer_matmul_params(shape) * sum(lengths)
    head = 6 * shape["hidden"] * shape["vocab"] * trained
    attention = 6 * shape["layers"] * shape["hidden"] * sum(t**2 for t in lengths)
    return {"layers": layers, "lm_head": head, "attention": attention,
            "total": layers + head + attention}


def recompute_flops(shape: dict, padded: int, seq: int, trained: int, variant: str,
                    grad_ckpt: bool) -> int:
    """FLOPs the step computes beyond the model FLOPs, on `padded` tokens of sequences padded to
    `seq`: the layers' and attention's forward again (activation checkpointing), lm_head's forward
    again (chunked logits), and for curio the teacher's forward (its layers, attention and
    lm_head)."""
    layers = 2 * layer_matmul_params(shape) * padded
    attention = 2 * shape["layers"] * shape["hidden"] * seq * padded
    head = 2 * shape["hidden"] * shape["vocab"] * trained
    extra = (layers + attention if grad_ckpt else 0) + head
    return extra + (layers + attention + head if variant == "curio" else 0)


def datasheet_peak_tflops(device_name: str) -> float | None:
    for words, tflops in PEAK_BF16_TFLOPS:
        if all(w in device_name for w in words):
            return tflops
    return None


def measured_matmul_tflops(device, dtype, n: int) -> float:
    """Best of a few n x n x n matmuls: an achievable rate, not a datasheet peak."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(4):
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e12


def peak_tflops(device, dtype, override: float | None) -> tuple[float, str]:
    if override:
        return override, "--peak_tflops"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if (tflops := datasheet_peak_tflops(name)) is not None:
            return tflops, f"dense bf16 datasheet peak of {name}"
    n = 8192 if device.type == "cuda" else 1024
    rate = measured_matmul_tflops(device, dtype, n)
    return rate, f"measured {n}^3 {str(dtype).split('.')[-1]} matmul (no datasheet)"


def planner_prediction(planner: Path, config_json: Path, loss: str, tokens: int, seq_len: int,
                       trained: int, loss_chunk: int,
                       options: dict[str, bool]) -> tuple[int | None, str]:
    """(total_bytes, note) from `python bench/memory.py ... --json`; (None, why) when there is no
    planner or it fails. Boolean options (bf16, grad_ckpt) are passed only when the planner's --help
    lists them."""
    if not planner.is_file():
        return None, "planner: not available"
    cmd = [sys.executable, str(planner), "--model", str(config_json), "--stage", "sft", "--loss",
           loss, "--gpus", "1", "--token_budget", str(tokens), "--seq_len", str(seq_len),
           "--trained_tokens", str(trained), "--loss_chunk", str(loss_chunk), "--json"]
    usage = subprocess.run([sys.executable, str(planner), "--help"], capture_output=True,
                           text=True).stdout
    unknown = [name for name in options if f"--{name}" not in usage]
    cmd += [f"--{name}" if on else f"--no-{name}" for name, on in options.items()
            if name not in unknown]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        last = (out.stderr.strip().splitlines() or ["exit " + str(out.returncode)])[-1]
        return None, f"planner failed: {last}"
    try:
        total = int(json.loads(out.stdout)["total_bytes"])
    except (ValueError, KeyError, TypeError) as e:
        return None, f"planner printed no total_bytes JSON ({e})"
    return total, "planner" + (f" (its defaults for {', '.join(unknown)})" if unknown else "")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def local_bytes(module) -> int:
    """Bytes this rank holds for a module's parameters and buffers (FSDP2 shards: the local
    part)."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum((t.to_local() if isinstance(t, DTensor) else t).untyped_storage().nbytes()
               for t in tensors)


def build(shape: dict, run: dict, device, bf16: bool, grad_ckpt: bool):
    """Student, its frozen teacher copy (both FSDP2, as sft.py builds them), the optimiser and one
    padded micro-batch (data.collate: a prompt of an eighth of each sequence, untrained)."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    full = Qwen2ForCausalLM(qwen2_config(shape, run["seq"]))
    teacher = shard_model(copy.deepcopy(full), device, bf16, grad_ckpt=False, trainable=False)
    model = shard_model(full, device, bf16, grad_ckpt)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01,
                            fused=device.type == "cuda")
    g = torch.Generator().manual_seed(0)
    items = []
    for length in sequence_lengths(run):
        ids = torch.randint(0, shape["vocab"], (length,), generator=g).tolist()
        items.append((ids, [0] * (length // 8) + [1] * (length - length // 8)))
    return model, teacher, opt, data.collate(items, pad_id=0, device=device)


@torch.no_grad()
def scale_to_entropy(models, batch, median_entropy: float) -> dict:
    """Scale the final norm's weight of every model by one factor, so that the median entropy of the
    student's logits at the trained positions is `median_entropy` (logits scale linearly with it).
    Returns that entropy's median and the share of positions at or below the authors' 0.03 nats,
    after."""
    h, _ = select_targets(normed_hidden(models[0], batch), batch)
    z = models[0].lm_head(h[:2048]).float()                               # [n, V]
    models[0].reshard()
    lo, hi = 0.01, 100.0                                          # entropy falls as the scale grows
    for _ in range(30):
        mid = (lo * hi) ** 0.5
        lo, hi = (lo, mid) if cl.entropy(z * mid).median() < median_entropy else (mid, hi)
    for model in models:
        model.model.norm.weight.mul_(hi)
    h_scaled = cl.entropy(z * hi)
    return {"scale": hi, "median_entropy": h_scaled.median().item(),
            "share_at_most_0.03": (h_scaled <= 0.03).float().mean().item()}


def step(model, teacher, opt, batch, args, device) -> float:
    """One optimiser step as sft.py takes it on a logging step; seconds."""
    sync(device)
    t0 = time.perf_counter()
    n = int(batch["loss_mask"][:, 1:].sum())
    weights = torch.full((n,), 1.0 / n, device=device)           # batch_token_mean, one micro-batch
    total, diag = sft.micro_batch_loss(model, teacher, None, batch, None, args, cl.LossConfig(),
                                       True, weights)
    total.backward()
    clip_grad_norm(model, sft.Args().grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    all_diags = sft.gather_diags(diag)
    cl.summarize(all_diags)
    sync(device)
    return time.perf_counter() - t0


def measure(shape: dict, run: dict, steps: int, bf16: bool, grad_ckpt: bool, entropy: float,
            device) -> dict:
    """Interleaved steps of every variant: step times, and on CUDA the peak allocated bytes of each
    variant's step."""
    model, teacher, opt, batch = build(shape, run, device, bf16, grad_ckpt)
    logits = scale_to_entropy([model, teacher], batch, entropy)
    teacher_bytes = local_bytes(teacher)
    times, peaks = {v: [] for v in VARIANTS}, {v: 0 for v in VARIANTS}
    for i in range(steps + 1):                      # round 0 warms up (and creates the AdamW state)
        for v in VARIANTS:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            args = sft.Args(loss=v, loss_chunk=run["loss_chunk"])
            t = step(model, teacher if v == "curio" else None, opt, batch, args, device)
            if device.type == "cuda":                   # the teacher's weights count for curio only
                resident_other = 0 if v == "curio" else teacher_bytes
                peaks[v] = max(peaks[v], torch.cuda.max_memory_allocated(device) - resident_other)
            if i:
                times[v].append(t)
    ema = []
    for _ in range(3):                                   # Alg. 1 line 17, every TEACHER_EVERY steps
        sync(device)
        t0 = time.perf_counter()
        sft.update_teacher(teacher, model, sft.Args().teacher_mu)
        sync(device)
        ema.append(time.perf_counter() - t0)
    params = sum((p.to_local() if isinstance(p, DTensor) else p).numel()
                 for p in model.parameters())
    return {"times": times, "peak_bytes": peaks if device.type == "cuda" else None,
            "ema_update_s": min(ema), "params": params,
            "trained_tokens": int(batch["loss_mask"][:, 1:].sum()),
            "padded_tokens": batch["input_ids"].numel(), "teacher_bytes": teacher_bytes,
            "logits": logits}


def summarize(m: dict, shape: dict, run: dict, plans: dict, peak: float, grad_ckpt: bool) -> dict:
    """Per variant: step time (curio's with its share of the EMA update), ratio to SFT, tokens/s,
    MFU, HFU, peak memory and the planner's prediction."""
    lengths = sequence_lengths(run)
    tokens, flops = sum(lengths), model_flops(shape, lengths, m["trained_tokens"])
    sft_t, variants = statistics.median(m["times"]["sft"]), {}
    for v in VARIANTS:
        ema_share = m["ema_update_s"] / TEACHER_EVERY if v == "curio" else 0.0
        t = statistics.median(m["times"][v]) + ema_share
        measured = m["peak_bytes"][v] if m["peak_bytes"] else None
        planned, note = plans[v]
        extra = recompute_flops(shape, m["padded_tokens"], run["seq"], m["trained_tokens"], v,
                                grad_ckpt)
        variants[v] = {"step_s": t, "times_s": m["times"][v], "ratio_to_sft": t / sft_t,
                       "tokens_per_s": tokens / t, "mfu": flops["total"] / t / (peak * 1e12),
                       "hfu": (flops["total"] + extra) / t / (peak * 1e12), "peak_bytes": measured,
                       "planner_bytes": planned, "planner_note": note,
                       "measured_over_planned": measured / planned if measured and planned
                       else None}
    return {"tokens": tokens, "lengths": lengths, "model_flops": flops, "variants": variants}


def report(r: dict):
    shape, flops = r["model"], r["model_flops"]
    print(f"{r['device']}, shape {r['shape']} ({r['params'] / 1e6:.0f}M params, {shape['layers']} "
          f"layers), sequences of {r['lengths']} tokens padded to {r['seq']} "
          f"({r['trained_tokens']} trained), loss chunk {r['loss_chunk']}, "
          f"{'bf16' if r['bf16'] else 'float32'}, activation checkpointing "
          f"{'on' if r['grad_ckpt'] else 'off'}, median of {r['steps']} interleaved steps")
    lg = r["logits"]
    print(f"logits scaled by {lg['scale']:.3g}: median entropy {lg['median_entropy']:.3f} nats, "
          f"{lg['share_at_most_0.03']:.0%} of positions at or below 0.03 nats")
    print(f"model TFLOPs per step {flops['total'] / 1e12:.3g} (layers "
          f"{flops['layers'] / 1e12:.3g}, lm_head {flops['lm_head'] / 1e12:.3g}, attention "
          f"{flops['attention'] / 1e12:.3g}); peak {r['peak_tflops']:.3g} TFLOP/s "
          f"({r['peak_source']})")
    for v, x in r["variants"].items():
        mem = "n/a on CPU" if x["peak_bytes"] is None else f"{x['peak_bytes'] / 2**30:6.2f} GiB"
        plan = x["planner_note"] if x["planner_bytes"] is None \
            else f"planner {x['planner_bytes'] / 2**30:.2f} GiB"
        if x["measured_over_planned"]:
            plan += f", measured/planned {x['measured_over_planned']:.2f}"
        print(f"{v:20s} step {x['step_s']:8.3f} s ({x['ratio_to_sft']:.2f}x)  "
              f"{x['tokens_per_s']:9.0f} tokens/s  MFU {x['mfu']:6.1%}  HFU {x['hfu']:6.1%}  peak "
              f"memory {mem}  ({plan})")
    print(f"teacher EMA update {r['ema_update_s'] * 1e3:.1f} ms every {TEACHER_EVERY} steps (in "
          "curio's step time)")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen2.5-1.5b" if torch.cuda.is_available() else "cpu",
                        choices=SHAPES)
    parser.add_argument("--layers", type=int, default=0, help="override the shape's layer count")
    parser.add_argument("--batch", type=int, default=0,
                        help="sequences in the micro-batch (default: 4, real shapes)")
    parser.add_argument("--seq", type=int, default=0,
                        help="the longest sequence's tokens (default: 8192, real shapes)")
    parser.add_argument("--entropy", type=float, default=0.2,
                        help="median entropy of the logits, nats")
    parser.add_argument("--loss_chunk", type=int, default=0,
                        help="tokens per logits chunk (default: 4096)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant, interleaved")
    parser.add_argument("--grad_ckpt", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                        help="CUDA only, as in sft.py")
    parser.add_argument("--peak_tflops", type=float, default=0.0,
                        help="peak TFLOP/s for MFU (default: by name)")
    parser.add_argument("--planner", default=str(ROOT / "bench" / "memory.py"),
                        help="memory planner script")
    parser.add_argument("--json", default="", help="also write every figure to this file")
    a = parser.parse_args()
    shape = SHAPES[a.shape] | ({"layers": a.layers} if a.layers else {})
    run = {k: getattr(a, k) or v for k, v in RUN_DEFAULTS.get(a.shape, GPU_RUN).items()}

    _, world, device = setup_distributed()
    if world != 1:
        raise SystemExit("bench/sft_step.py times one process: run it with --nproc_per_node 1")
    bf16 = a.bf16 and device.type == "cuda"
    m = measure(shape, run, a.steps, bf16, a.grad_ckpt, a.entropy, device)
    peak, peak_source = peak_tflops(device, torch.bfloat16 if bf16 else torch.float32,
                                    a.peak_tflops)
    with tempfile.TemporaryDirectory() as tmp:                     # the planner reads a config.json
        config_json = Path(tmp) / "config.json"
        qwen2_config(shape, run["seq"]).to_json_file(config_json)
        sizes = (run["batch"] * run["seq"], run["seq"], m["trained_tokens"], run["loss_chunk"])
        plans = {v: planner_prediction(Path(a.planner), config_json, v, *sizes,
                                       {"bf16": bf16, "grad_ckpt": a.grad_ckpt}) for v in VARIANTS}
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "cuda": torch.version.cuda, "shape": a.shape,
              "model": shape, **run, "trained_tokens": m["trained_tokens"], "params": m["params"],
              "bf16": bf16, "grad_ckpt": a.grad_ckpt, "steps": a.steps, "peak_tflops": peak,
              "peak_source": peak_source, "ema_update_s": m["ema_update_s"],
              "teacher_bytes": m["teacher_bytes"], "logits": m["logits"],
              **summarize(m, shape, run, plans, peak, a.grad_ckpt)}
    report(result)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(result, indent=1))
    shutdown()


if __name__ == "__main__":
    main()
