"""bench/roofline.py: the dry run's time estimate against the one GPU run it is calibrated on (bench/data/), the
attention forms it prices, and the fit that reads a GPU run's profile."""
import collections
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from run_python import run_python

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import roofline  # noqa: E402

H200 = ROOT / "bench" / "data" / "h200-2026-11-27"


def test_a_fit_from_a_packed_run_is_refused_in_one_line_naming_the_form_it_needs(tmp_path):
    """--fit reads the dense mask's attention and AdamW on DTensors from 6fbcbf7-form profiles: the second H200 run's
    summary (packed) beside such profiles is refused before any dry run, naming --form 6fbcbf7."""
    import shutil

    shutil.copy(ROOT / "bench" / "data" / "h200-2026-11-28" / "summary.json", tmp_path / "summary.json")
    for profile in H200.glob("profile_*.txt"):
        shutil.copy(profile, tmp_path / profile.name)
    done = run_python([ROOT / "bench" / "dryrun.py", "--against", tmp_path / "summary.json", "--fit"], timeout=300)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("--fit:") and "not packed: add --form 6fbcbf7" in last, done.stderr[-2000:]


def test_the_dry_run_predicts_the_h200_run_within_15_percent(tmp_path):
    """python bench/dryrun.py --against the H200's gpu_check summary, with --fit: bench/sft_step.py's three variants
    dry-run at its shapes and sequences on one simulated H200 (each a --gpus 1 dry run of sft.train, rank 0), the
    teacher side on its logits; the calibration fitted from the profiles beside the summary is the one the project
    ships (roofline.H200_2026_11_27), and every figure is predicted within 15%, memory within 2%."""
    out = tmp_path / "against.json"
    done = run_python([ROOT / "bench" / "dryrun.py", "--against", H200 / "summary.json", "--fit", "--json", out],
                      timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"predicted/measured: sft \d\.\d\d, curio \d\.\d\d, curio_self_teacher \d\.\d\d, "
                        r"teacher_side \d\.\d\d", last), last
    r = json.loads(out.read_text())
    assert set(r["ratios"]) == {"sft", "curio", "curio_self_teacher", "teacher_side"}
    assert all(0.85 <= x <= 1.15 for x in r["ratios"].values()), r["ratios"]
    shipped = roofline.H200_2026_11_27
    fitted = r["calibration"]
    for name in ("matmul", "gemv", "memory", "topk", "broadcast", "optimizer_us", "kernel_us"):
        assert fitted[name] == pytest.approx(getattr(shipped, name), rel=0.01), name
    for form, (fwd, bwd) in shipped.attention.items():
        assert fitted["attention"][form] == pytest.approx([fwd, bwd], rel=0.01), form
    for v, (dry, gpu) in r["peak_gib"].items():                 # torch's tracker on fake tensors against CUDA
        assert dry == pytest.approx(gpu, rel=0.02), v


FORMS = r"""
import collections, json, os, sys
from pathlib import Path
from unittest import mock
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/bench"]
import sim_gpu
sim_gpu.preload(Path(os.environ["CURIOSFT_SIM_GPU_LIB"]))
import torch
import torch.nn.functional as F
import curio_loss as cl
import roofline
from plumbing import attention
from torch._subclasses.fake_tensor import FakeTensorMode

sim_gpu.install_cuda_shims()
kernels = collections.Counter()
sim_gpu.route_attention_like_cuda(kernels)
B, H, Hkv, T, d, lengths = 4, 12, 2, 8192, 128, [8192, 7168, 6144, 5120]
total = sum(lengths)
work, failed = {}, {}
with FakeTensorMode(allow_non_fake_inputs=True):
    def qkv(b, t):
        return [torch.empty(b, H, t, d, dtype=torch.bfloat16, device="cuda", requires_grad=True) for _ in range(3)]

    def varlen(dtype=torch.bfloat16):         # plumbing/attention.py's call: a packed row, GQA
        q = torch.empty(total, H, d, dtype=dtype, device="cuda", requires_grad=True)
        k, v = (torch.empty(total, Hkv, d, dtype=dtype, device="cuda", requires_grad=True) for _ in range(2))
        cum = torch.tensor([0, 8192, 15360, 21504, 26624], dtype=torch.int32).to("cuda")
        attention.VARLEN_ATTN(q, k, v, cum, cum, T, T, window_size=(-1, 0), enable_gqa=True).sum().backward()

    def log_prob(blockwise):                  # the student's log-probs of a chunk of bf16 logits
        z = torch.empty(4096, 151936, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        y = torch.zeros(4096, dtype=torch.long, device="cuda")
        with mock.patch.object(cl, "BLOCKWISE", blockwise):
            cl.student_log_prob(cl.loss_logits(z), y)[0].sum().backward()

    mask = torch.ones(B, 1, T, T, dtype=torch.bool, device="cuda")
    runs = {"dense_mask": (None, lambda: F.scaled_dot_product_attention(*qkv(B, T), attn_mask=mask).sum().backward()),
            "causal": (None, lambda: F.scaled_dot_product_attention(*qkv(B, T), is_causal=True).sum().backward()),
            "varlen": (lengths, varlen),
            "varlen_unknown_lengths": (None, varlen),
            "varlen_other_lengths": (lengths[:3], varlen),
            "varlen_float32": (lengths, lambda: varlen(torch.float32)),
            "log_prob_blockwise": (None, lambda: log_prob(True)),
            "log_prob_6fbcbf7": (None, lambda: log_prob(False))}
    for name, (varlen_lengths, fn) in runs.items():
        roof = roofline.Roofline(varlen_lengths=varlen_lengths)
        try:
            with roof:
                fn()
        except (ValueError, RuntimeError) as e:
            failed[name] = str(e)
        work[name] = roofline.compact(roof.work)
print(json.dumps({"work": work, "failed": failed, "kernels": kernels}), flush=True)
os._exit(0)      # torch may abort at interpreter exit (a joinable thread destroyed): once in a CI run, result printed
"""


def by_key(record, field: int, cls: str | None = None) -> dict:
    """A compact record's FLOPs (field 4) or bytes (5) by op, summed over its kernels (of class cls)."""
    out = collections.Counter()
    for n, _, c, key, *fields in record:
        if cls in (None, c):
            out[key] += n * fields[field - 4]
    return dict(out)


def test_each_attention_form_is_priced_by_the_tiles_it_computes(library):
    """A right-padded batch of four sequences (8192 ... 5120 tokens) with a dense mask computes all of B T^2; causal
    (no mask) half of it; packed (torch's varlen attention, the custom op plumbing/attention.py calls on CUDA, its
    forward and backward) sum(l_i^2) / 2 over the query heads, with the lengths the roofline is given
    (Roofline.varlen_lengths), a fake tensor's offsets holding none: without them, or with others, it refuses to
    price the call. Priced on the H200's calibration, the forms' times follow their FLOPs (causal and varlen share
    dense_mask's measured efficiency: an assumption). The simulated GPU runs the custom op as it is (its fake
    implementation) and refuses float32, as its flash kernel does."""
    done = subprocess.run([sys.executable, "-c", FORMS, str(ROOT)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, CURIOSFT_SIM_GPU_LIB=library))
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    work, failed = out["work"], out["failed"]
    keys = {name: by_key(rows, 4, "attention") for name, rows in work.items()}
    B, H, d, lengths = 4, 12, 128, [8192, 7168, 6144, 5120]
    dense = 4 * B * H * 8192**2 * d                               # QK^T and PV, 2 FLOPs a multiply-add
    assert keys["dense_mask"] == {"fwd dense_mask": dense, "bwd dense_mask": 2.5 * dense}
    assert keys["causal"] == {"fwd causal": dense // 2, "bwd causal": 2.5 * dense // 2}
    varlen = 4 * H * d * sum(n * n for n in lengths) // 2
    assert keys["varlen"] == {"fwd varlen": varlen, "bwd varlen": 2.5 * varlen}
    assert out["kernels"] == {"varlen": 3, "efficient": 1, "flash": 1}, out["kernels"]   # (float32 refused)
    for name in ("varlen_unknown_lengths", "varlen_other_lengths"):
        assert "Roofline.varlen_lengths must name the packed micro-batch's" in failed[name], failed
    assert failed["varlen_float32"].startswith("varlen attention: its flash kernel takes float16 or bfloat16")
    gpu, cal = roofline.GPU(hbm_tbs=4.8), roofline.H200_2026_11_27
    seconds = {name: roofline.seconds(rows, gpu, cal, by="cls")["attention"] for name, rows in work.items()}
    assert seconds["causal"] == pytest.approx(seconds["dense_mask"] / 2, rel=0.01)
    assert seconds["varlen"] / seconds["dense_mask"] == pytest.approx(varlen / dense, rel=0.01)
    # the loss's blockwise pass over bf16 logits (curio_loss._LogProb) by its real kernels: no float32 copy, a
    # gather and a scatter of the targets alone (4096 of them, not 4096 x 151936), and cheaper than 6fbcbf7's form
    moved = {name: by_key(work[name], 5) for name in ("log_prob_blockwise", "log_prob_6fbcbf7")}
    blockwise, old = moved["log_prob_blockwise"], moved["log_prob_6fbcbf7"]
    assert "aten._to_copy" in old and old["aten._to_copy"] >= 6 * 4096 * 151936           # bf16 in, float32 out
    assert blockwise.get("aten._to_copy", 0) < 4096 * 151936
    assert blockwise["aten.gather"] < 10 * 4096 * 8 and blockwise["aten.scatter_add_"] < 10 * 4096 * 8, blockwise
    # each float32 block read from the bf16 logits (copy_: 2 + 4 bytes an element, the block not read first)
    assert blockwise["aten.copy_"] == pytest.approx(2 * 6 * 4096 * 151936, rel=0.01), blockwise
    time = {name: sum(roofline.seconds(work[name], gpu, cal).values()) for name in moved}
    print(f"one 4096-token chunk's log-probs, forward and backward, on the H200's calibration: blockwise "
          f"{time['log_prob_blockwise'] * 1e3:.1f} ms, 6fbcbf7's {time['log_prob_6fbcbf7'] * 1e3:.1f} ms")
    assert time["log_prob_blockwise"] < 0.8 * time["log_prob_6fbcbf7"]


def test_a_profile_table_is_read_and_a_class_costs_its_work_at_its_efficiency():
    """read_profile parses torch.profiler's table (rows whose cut names coincide summed), and work_seconds prices each
    class on its own roof."""
    rows = roofline.read_profile((H200 / "profile_sft.txt").read_text())
    assert rows["aten::mm"] == pytest.approx([2.615, 2.717, 3846])
    assert rows["aten::_cudnn_attention_forward"][2] == 336
    cut = "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocas..."
    assert rows[cut][2] == 3036 + 336 + 1848 + 840                                  # four rows of that cut name
    gpu, cal = roofline.GPU(bf16_tflops=1000, hbm_tbs=4.0), roofline.Calibration(
        "test", matmul=0.5, memory=0.5, broadcast=100.0, topk=400.0, gemv=1000.0, optimizer_us=10.0,
        attention={f: (0.4, 0.2) for f in roofline.FORMS}, kernel_us=3.0)
    work = roofline.Work
    assert roofline.work_seconds(work("r", "matmul", "mm", flops=10**15), gpu, cal) == pytest.approx(2.0)
    assert roofline.work_seconds(work("r", "attention", "bwd causal", flops=10**15), gpu, cal) == pytest.approx(5.0)
    assert roofline.work_seconds(work("r", "memory", "exp", bytes=4 * 10**12), gpu, cal) == pytest.approx(2.0)
    assert roofline.work_seconds(work("r", "broadcast", "sub", bytes=1, elements=10**11), gpu, cal) == \
        pytest.approx(1.0)
    assert roofline.work_seconds(work("r", "topk", "topk", elements=4 * 10**11), gpu, cal) == pytest.approx(1.0)
    assert roofline.work_seconds(work("r", "gemv", "bmm", bytes=10**12), gpu, cal) == pytest.approx(1.0)
    assert roofline.work_seconds(work("r", "optimizer", "adamw", bytes=2 * 10**12, elements=100), gpu, cal) == \
        pytest.approx(1.0 + 1e-3)
    assert roofline.work_seconds(work("r", "memory", "tiny", bytes=8), gpu, cal) == pytest.approx(3e-6)
