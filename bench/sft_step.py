"""Benchmark (not a test): SFT optimiser steps of vanilla SFT, CurioSFT with a separate teacher, and
CurioSFT without one (the student's own detached logits), as sft.py takes them: step time, tokens/s,
MFU, peak memory next to the memory planner's prediction (bench/memory.py), and the CurioSFT / SFT
step-time ratios; for each form of the step (--forms: bench/forms.py), old and new timed side by
side in one run, with the step-time ratio of each form to the first.

    python bench/sft_step.py            # CPU-sized default (Qwen vocabulary, small trunk)
    torchrun --standalone --nproc_per_node 1 bench/sft_step.py --shape qwen2.5-1.5b
                                        # one GPU: bf16, 8k tokens

Every step is sft.train's own, none retyped here. The bench writes a model directory (a random
Qwen2 of the shape, in bf16, a byte tokenizer without merges) and a train.jsonl of one micro-batch:
sequences the longest first, each next seq / 8 shorter, an eighth of each an untrained prompt. The
final norm is scaled first so that the logits' median entropy is a trained model's (--entropy, 0.2
nats), not a random model's near-uniform one: the authors' low-entropy rule then takes its pass for
the share of tokens it would see. Rounds alternate one run per variant (a slow spell of the machine
slows a round alike); a run trains 1 + teacher_every steps, the first untimed (AdamW's states are
created; the compiled form compiles then), the others one period of the teacher's schedule, so
curio's mean holds its EMA update (Alg. 1 line 17) as the loop runs it. Step time: the median over
rounds of a run's mean step_time_s (its log.jsonl; on CUDA the next step's host read waits for a
step's queued work). Every step of a run trains the same micro-batch: its compiled form's graphs
are the first shape's, where a real run's micro-batches differ and take symbolic-length graphs
after the first. Checkpoint writing is stubbed out (plumbing.checkpoints.save, trainer_state). Peak
memory (CUDA): max_memory_allocated over the sft.train call less what was allocated before it:
weights (curio's teacher only where it exists), gradients, AdamW's states, the steps' transients
(loading holds less than a step); none on CPU, which has no allocator statistics.

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
import dataclasses
import functools
import gc
import json
import random
import statistics
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import curio_loss as cl  # noqa: E402
import forms  # noqa: E402  (bench/, this file's folder)
import data  # noqa: E402
import sft  # noqa: E402
from chunked_logits import normed_hidden, select_targets  # noqa: E402
from plumbing import checkpoints  # noqa: E402
from plumbing.distributed import setup_distributed, shutdown  # noqa: E402
from plumbing.synthetic import build_toy_tokenizer  # noqa: E402

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


def recompute_flops(shape: dict, computed: list[int], trained: int, variant: str,
                    grad_ckpt: bool) -> int:
    """FLOPs the step computes beyond the model FLOPs, on sequences of `computed` tokens each (padded
    rows count their padding): the layers' and attention's forward again (activation
    checkpointing), lm_head's forward again (chunked logits), and for curio the teacher's forward
    (its layers, attention and lm_head)."""
    layers = 2 * layer_matmul_params(shape) * sum(computed)
    attention = 2 * shape["layers"] * shape["hidden"] * sum(t**2 for t in computed)
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
    usage = planner_usage(planner)
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


@functools.lru_cache(maxsize=None)
def planner_usage(planner: Path) -> str:
    """The planner's --help (once: a Python start and the planner's imports, seconds each)."""
    return subprocess.run([sys.executable, str(planner), "--help"], capture_output=True,
                          text=True).stdout


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_times(runs: dict, reps: int, device) -> dict:
    """{name: the median seconds of a call of runs[name]} over reps rounds, each round calling every
    function once (interleaved: a slow spell of the machine slows them alike), after a round that
    warms up (and compiles what is compiled)."""
    times = {k: [] for k in runs}
    for i in range(reps + 1):
        for k, fn in runs.items():
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            if i:
                times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


LETTERS = string.ascii_letters + string.digits     # one token each: the tokenizer has no merges


def write_inputs(args, shape: dict, run: dict, entropy: float, device) -> dict:
    """args.model (the random Qwen2 of `shape`, its final norm scaled to `entropy`, a byte tokenizer
    without merges) and args.train_file (a row of random letters per sequence_lengths(run), an
    eighth of it the prompt), read back through sft.py's data path."""
    from transformers import Qwen2ForCausalLM

    model_dir, config = Path(args.model), qwen2_config(shape, run["seq"])
    tokenizer = build_toy_tokenizer([LETTERS], vocab_size=0)
    config.eos_token_id = config.pad_token_id = tokenizer.eos_token_id
    config.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    overhead = len(tokenizer(data.chat_prompt([{"role": "user", "content": ""}], tokenizer),
                             add_special_tokens=False)["input_ids"])
    g, rows, lengths = random.Random(0), [], sequence_lengths(run)
    for length in lengths:
        text, prompt = "".join(g.choices(LETTERS, k=length)), length // 8    # prompt + response
        rows.append({"data_source": "bench", "reward_model": {"ground_truth": "0"},
                     "prompt": [{"role": "user", "content": text[: prompt - overhead]}],
                     "target": [{"role": "assistant", "content": text[prompt + 1 :]}]})  # + EOS
    data.write_jsonl(rows, args.train_file)
    # (the weights are written below: the data path asks for the config and tokenizer only)
    _, dataset, loaded, n_targets, _ = sft.load_sft_data(dataclasses.replace(args, scratch=True))
    if loaded != lengths:
        raise SystemExit(f"--seq {run['seq']}: sequences of {loaded} tokens, not {lengths} (an "
                         f"eighth of each must hold the chat template's {overhead} tokens)")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16).float()      # the weights bf16 can hold
    batch = data.collate_ids(list(range(len(dataset))), dataset, tokenizer.pad_token_id, device)
    logits = scale_to_entropy(model.to(device), batch, entropy, args.bf16)
    model.to(torch.bfloat16).save_pretrained(model_dir)
    return {"logits": logits, "params": sum(p.numel() for p in model.parameters()),
            "trained_tokens": sum(n_targets)}


@torch.no_grad()
def scale_to_entropy(model, batch, median_entropy: float, bf16: bool) -> dict:
    """Scale the final norm's weight by one factor (bf16-exact), so that the median entropy of the
    logits at the trained positions is `median_entropy` (logits scale linearly with it). Returns
    that entropy's median and the share of positions at or below the authors' 0.03 nats, after."""
    with torch.autocast(batch["input_ids"].device.type, torch.bfloat16, enabled=bf16):
        h, _ = select_targets(normed_hidden(model, batch), batch)
        z = model.lm_head(h[:2048]).float()                               # [n, V]
    lo, hi = 0.01, 100.0                                          # entropy falls as the scale grows
    for _ in range(30):
        mid = (lo * hi) ** 0.5
        lo, hi = (lo, mid) if cl.entropy(z * mid).median() < median_entropy else (mid, hi)
    hi = torch.tensor(hi).bfloat16().item()
    model.model.norm.weight.mul_(hi)
    h_scaled = cl.entropy(z * hi)
    return {"scale": hi, "median_entropy": h_scaled.median().item(),
            "share_at_most_0.03": (h_scaled <= 0.03).float().mean().item()}


def train_once(args, form: str, device) -> tuple[list[dict], int | None]:
    """sft.train(args) in `form`, checkpoint writing stubbed out: its log records and, on CUDA, the
    peak bytes allocated during the call beyond those allocated before it."""
    gc.collect()                                     # the previous run's models, before counting
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    args = dataclasses.replace(args, pack=forms.packs(form), compile=forms.compiles(form))
    with mock.patch.object(checkpoints, "save", lambda *a, **k: "nothing (bench/sft_step.py)"), \
            mock.patch.object(checkpoints, "trainer_state", lambda *a: None), \
            forms.code_paths(form):
        sft.train(args, cl.LossConfig(), device)
    peak = torch.cuda.max_memory_allocated(device) - before if device.type == "cuda" else None
    lines = (Path(args.out_dir) / "log.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines], peak


def measure(tmp: Path, shape: dict, run: dict, forms: list[str], rounds: int, bf16: bool,
            grad_ckpt: bool, entropy: float, device) -> dict:
    """Rounds of an sft.train run per form and variant: step times, runs' means, CUDA peaks (the
    largest), keyed (form, variant)."""
    # sft.py's defaults (the presets' optimiser, teacher schedule, a log record every step) for
    # 1 + teacher_every steps, each of one micro-batch: the bench's sequences, as sft.train's own
    # plan makes them (one micro-batch in every form: they fit the budget padded too)
    base = sft.Args(model=str(tmp / "model"), train_file=str(tmp / "train.jsonl"),
                    epochs=1 + TEACHER_EVERY, global_batch=run["batch"],
                    token_budget=run["batch"] * run["seq"], max_prompt_len=run["seq"],
                    max_response_len=run["seq"], system_prompt="messages",
                    loss_chunk=run["loss_chunk"], bf16=bf16, grad_ckpt=grad_ckpt, log_every=1)
    inputs, tokens = write_inputs(base, shape, run, entropy, device), sum(sequence_lengths(run))
    keys = [(f, v) for f in forms for v in VARIANTS]
    times, means, peaks = {k: [] for k in keys}, {k: [] for k in keys}, {}
    for r in range(rounds):
        for form, v in keys:                # interleaved: a slow spell slows every form alike
            args = dataclasses.replace(base, loss=v, out_dir=str(tmp / f"run{r}_{form}_{v}"))
            records, peak = train_once(args, form, device)
            timed = records[1:]                      # step 1 creates AdamW's states
            if any(round(x["tokens_per_s"] * x["step_time_s"]) != tokens for x in timed):
                raise SystemExit(f"{args.out_dir}: a step trained other than the bench's "
                                 f"{tokens} tokens")
            times[form, v] += [x["step_time_s"] for x in timed]
            means[form, v].append(statistics.fmean(x["step_time_s"] for x in timed))
            peaks[form, v] = max(peaks.get((form, v), 0), peak or 0)
    return {**inputs, "times": times, "run_means": means,
            "peak_bytes": peaks if device.type == "cuda" else None}


def summarize(m: dict, shape: dict, run: dict, forms_run: list[str], plans: dict, peak: float,
              grad_ckpt: bool) -> dict:
    """Per form and variant: step time (the median over rounds of a run's mean: curio's holds its
    EMA update), ratio to SFT's in the same form and to the same variant's in the first form,
    tokens/s, MFU, HFU, peak memory and the planner's prediction. "variants" is the last form's."""
    lengths = sequence_lengths(run)
    tokens, flops = sum(lengths), model_flops(shape, lengths, m["trained_tokens"])
    step_s = {k: statistics.median(t) for k, t in m["run_means"].items()}
    out = {}
    for form in forms_run:
        computed = lengths if forms.packs(form) else [run["seq"]] * len(lengths)
        variants = {}
        for v in VARIANTS:
            t, measured = step_s[form, v], m["peak_bytes"][form, v] if m["peak_bytes"] else None
            planned, note = plans[form, v]
            extra = recompute_flops(shape, computed, m["trained_tokens"], v, grad_ckpt)
            variants[v] = {"step_s": t, "times_s": m["times"][form, v],
                           "ratio_to_sft": t / step_s[form, "sft"],
                           "ratio_to_first_form": t / step_s[forms_run[0], v],
                           "tokens_per_s": tokens / t, "mfu": flops["total"] / t / (peak * 1e12),
                           "hfu": (flops["total"] + extra) / t / (peak * 1e12),
                           "peak_bytes": measured, "planner_bytes": planned, "planner_note": note,
                           "measured_over_planned": measured / planned if measured and planned
                           else None}
        out[form] = {"computed_tokens": sum(computed), "variants": variants}
    return {"tokens": tokens, "lengths": lengths, "model_flops": flops, "forms": out,
            "variants": out[forms_run[-1]]["variants"]}


def report(r: dict):
    shape, flops = r["model"], r["model_flops"]
    print(f"{r['device']}, shape {r['shape']} ({r['params'] / 1e6:.0f}M params, {shape['layers']} "
          f"layers), one micro-batch of sequences of {r['lengths']} tokens "
          f"({r['trained_tokens']} trained), loss chunk {r['loss_chunk']}, "
          f"{'bf16' if r['bf16'] else 'float32'}, activation checkpointing "
          f"{'on' if r['grad_ckpt'] else 'off'}, median of {r['rounds']} rounds of sft.train runs "
          f"({TEACHER_EVERY} timed steps each, the teacher's update among them)")
    lg = r["logits"]
    print(f"logits scaled by {lg['scale']:.3g}: median entropy {lg['median_entropy']:.3f} nats, "
          f"{lg['share_at_most_0.03']:.0%} of positions at or below 0.03 nats")
    print(f"model TFLOPs per step {flops['total'] / 1e12:.3g} (layers "
          f"{flops['layers'] / 1e12:.3g}, lm_head {flops['lm_head'] / 1e12:.3g}, attention "
          f"{flops['attention'] / 1e12:.3g}); peak {r['peak_tflops']:.3g} TFLOP/s "
          f"({r['peak_source']})")
    first = r["forms_run"][0]
    for form in r["forms_run"]:
        f = r["forms"][form]
        print(f"{form}: {forms.FORMS[form]}; {f['computed_tokens']} tokens computed")
        for v, x in f["variants"].items():
            mem = "n/a on CPU" if x["peak_bytes"] is None else f"{x['peak_bytes'] / 2**30:6.2f} GiB"
            plan = x["planner_note"] if x["planner_bytes"] is None \
                else f"planner {x['planner_bytes'] / 2**30:.2f} GiB"
            if x["measured_over_planned"]:
                plan += f", measured/planned {x['measured_over_planned']:.2f}"
            vs = f", {x['ratio_to_first_form']:.2f}x {first}'s" if form != first else ""
            print(f"  {v:20s} step {x['step_s']:8.3f} s ({x['ratio_to_sft']:.2f}x sft{vs})  "
                  f"{x['tokens_per_s']:9.0f} tokens/s  MFU {x['mfu']:6.1%}  HFU {x['hfu']:6.1%}  "
                  f"peak memory {mem}  ({plan})")


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
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of a run per form and variant")
    parser.add_argument("--forms", nargs="+", default=["6fbcbf7", "packed"], choices=forms.FORMS,
                        help="the micro-batch's forms, each timed: the ratios are to the first; "
                             "the last is the headline")
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
    with tempfile.TemporaryDirectory() as tmp:
        m = measure(Path(tmp), shape, run, a.forms, a.rounds, bf16, a.grad_ckpt, a.entropy, device)
        config_json = Path(tmp, "model", "config.json")
        plans = {}
        for form in a.forms:         # the planner's options where it has them (--help lists them)
            options = {"bf16": bf16, "grad_ckpt": a.grad_ckpt, "pack": forms.packs(form)}
            # the micro-batch's tokens: packed, the sequences' own; padded, rows x the longest
            tokens = sum(sequence_lengths(run)) if forms.packs(form) else run["batch"] * run["seq"]
            sizes = (tokens, run["seq"], m["trained_tokens"], run["loss_chunk"])
            for v in VARIANTS:
                plans[form, v] = planner_prediction(Path(a.planner), config_json, v, *sizes, options)
    peak, peak_source = peak_tflops(device, torch.bfloat16 if bf16 else torch.float32,
                                    a.peak_tflops)
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "cuda": torch.version.cuda, "shape": a.shape,
              "model": shape, **run, "trained_tokens": m["trained_tokens"], "params": m["params"],
              "bf16": bf16, "grad_ckpt": a.grad_ckpt, "rounds": a.rounds, "forms_run": a.forms,
              "teacher_every": TEACHER_EVERY, "peak_tflops": peak, "peak_source": peak_source,
              "logits": m["logits"],
              **summarize(m, shape, run, a.forms, plans, peak, a.grad_ckpt)}
    report(result)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(result, indent=1))
    shutdown()


if __name__ == "__main__":
    main()
