"""--compile (torch.compile of the decoder layers and the loss's teacher side) trains as the eager
step does: inductor's CPU kernels here, its GPU ones on a GPU (bench/sft_step.py --forms packed
compiled times them there). Compiling on 2 CPU cores takes a minute or two."""
import json
import os

import torch
from run_python import run_python
from test_sft import final_weights

import curio_loss as cl
from plumbing.synthetic import llm_like_logits


def sft_log(model_dir, train_file, out_dir, *extra, env=None):
    """sft.py on the tiny model: its log records and its stderr."""
    proc = run_python(["sft.py", "config/sft_tiny.py", "--model", str(model_dir), "--scratch",
                       "--train_file", str(train_file), "--out_dir", str(out_dir), "--loss", "curio",
                       "--max_steps", "2", "--teacher_every", "1", "--grad_ckpt", *extra],
                      env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = (out_dir / "log.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines], proc.stderr


def test_compiled_step_trains_as_the_eager_one(tiny_model_dir, toy_sft_file, tmp_path):
    """CurioSFT with its teacher, activation checkpointing and packed micro-batches (whose last
    loss chunk is shorter: the teacher side compiles a second, symbolic shape): the same losses,
    temperatures and weights as without --compile, within float32 reordering; dynamo's log shows
    that the layers and the teacher side were compiled."""
    eager, _ = sft_log(tiny_model_dir, toy_sft_file, tmp_path / "eager")
    compiled, log = sft_log(tiny_model_dir, toy_sft_file, tmp_path / "compiled", "--compile",
                            env={"TORCH_LOGS": "dynamo"})
    traced = [line for line in log.splitlines() if "torchdynamo start tracing" in line]
    assert any("teacher_log_prob" in line for line in traced), log[-3000:]
    assert any("modeling_qwen2.py" in line for line in traced), log[-3000:]
    assert [r["step"] for r in compiled] == [1, 2]
    for a, b in zip(eager, compiled):
        for key in ("loss", "grad_norm", "tau_mean", "frac_clamped_low", "w_top20"):
            assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(a[key])), (key, a[key], b[key])
    w_eager, w_compiled = final_weights(tmp_path / "eager"), final_weights(tmp_path / "compiled")
    for k in w_eager:
        torch.testing.assert_close(w_compiled[k], w_eager[k], rtol=1e-5, atol=1e-6)


def test_compiled_teacher_side_takes_one_block_of_every_row(monkeypatch):
    """Under torch.compile the blockwise passes take all rows at once (a loop over a symbolic row
    count would compile again per count) and _full_entropy a fused product for its bmm: the values
    are the blockwise ones, here in eager mode with the compiling branch forced."""
    z = llm_like_logits(70, 1000, seed=3)
    z_max, inv_tau = z.amax(-1), 1 / (1.1 + 0.4 * torch.rand(70, generator=torch.Generator()))
    y = torch.randint(0, 1000, (70,), generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(cl, "_block_rows", lambda *a: 16)           # five blocks of rows eagerly
    blockwise = (cl._log_sum_exp(z, z_max, inv_tau), cl._full_entropy(z, z_max),
                 cl.teacher_log_prob(z, y, cl.LossConfig()))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert len(list(cl._row_blocks(z))) == 1
    one_block = (cl._log_sum_exp(z, z_max, inv_tau), cl._full_entropy(z, z_max),
                 cl.teacher_log_prob(z, y, cl.LossConfig()))
    for got, want in zip(one_block[:2], blockwise[:2]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    (lq_one, diag_one), (lq, diag) = one_block[2], blockwise[2]
    torch.testing.assert_close(lq_one, lq, rtol=0, atol=1e-5)
    for key in ("tau", "forced_tau_min", "clamped_low", "clamped_high"):
        torch.testing.assert_close(diag_one[key], diag[key], rtol=0, atol=1e-6)


def test_compiled_student_side_of_bf16_logits_equals_the_blockwise_one():
    """A GPU's bf16 logits: eager, the loss reads them in float32 blocks (_LogProb); compiled, the
    plain expressions that inductor fuses. The same loss, and the same gradient within bf16's
    rounding of it."""
    from plumbing.models import compiled

    g = torch.Generator().manual_seed(0)
    z = llm_like_logits(48, 1000, seed=5).bfloat16()
    y, lq = torch.randint(0, 1000, (48,), generator=g), -3 * torch.rand(48, generator=g)
    grads, losses = [], []
    for loss_fn in (cl.curio_sft_loss, compiled(cl.curio_sft_loss)):
        logits = z.clone().requires_grad_()
        loss, diag = loss_fn(logits, y, lq, cl.LossConfig())
        (loss * torch.linspace(0.5, 1.5, 48)).sum().backward()
        grads.append(logits.grad.float())
        losses.append((loss, diag["weight"]))
    (eager_loss, eager_w), (loss, w) = losses
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w, eager_w, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-2, atol=1e-4)       # bf16: 8 mantissa bits
    assert grads[0].abs().max() > 0.1
