"""--compile (torch.compile of the decoder layers and the loss's passes over the logits) trains as the
eager step does: inductor's CPU kernels here, its GPU ones on a GPU (bench/sft_step.py --forms packed
compiled times them there). Most tests compile with aot_eager (dynamo's graphs and autograd's split,
eager kernels: cheap); the bf16 student side with inductor, and a whole sft.py run with inductor
under -m slow (150 s on 2 cores)."""
import functools
import json
import os

import pytest
import torch
from run_python import run_python
from test_sft import assert_two_ranks_train_as_one_process, final_weights

import baselines
import curio_loss as cl
from plumbing.compiling import compiled
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


@pytest.fixture
def aot_eager(monkeypatch):
    """torch.compile with the aot_eager backend (dynamo's graphs and autograd's split, eager kernels: cheap), and
    dynamo's caches and its recompile-limit setting as they were, after."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    compiled.cache_clear()
    torch._dynamo.reset()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=False):
        yield
    compiled.cache_clear()
    torch._dynamo.reset()


@pytest.mark.slow      # inductor compiles every graph of the step: 150 s on 2 cores, its cache cold
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


@pytest.mark.slow      # two ranks compile alike: 230 s on 2 cores
def test_two_compiled_ranks_train_as_one_eager_process(tiny_model_dir, toy_sft_file, tmp_path):
    """torchrun --nproc_per_node 2 sft.py --compile: the compiled layers inside FSDP2's hooks and
    HF's activation checkpoint, over gloo, train as one eager process on the same global batch."""
    assert_two_ranks_train_as_one_process(tiny_model_dir, toy_sft_file, tmp_path, "--grad_ckpt",
                                          two_ranks_only=("--compile",))


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


def test_compiled_student_side_of_bf16_logits_equals_the_blockwise_one(monkeypatch):
    """A GPU's bf16 logits: eager, the loss reads them in float32 blocks (_LogProb); compiled, the
    plain expressions that inductor fuses (_LogProb is not traced). The same loss, and the same
    gradient within bf16's rounding of it."""
    g = torch.Generator().manual_seed(0)
    z = llm_like_logits(48, 1000, seed=5).bfloat16()
    y, lq = torch.randint(0, 1000, (48,), generator=g), -3 * torch.rand(48, generator=g)
    scale = torch.linspace(0.5, 1.5, 48)
    eager_z, compiled_z = z.clone().requires_grad_(), z.clone().requires_grad_()
    eager_loss, eager_diag = cl.curio_sft_loss(eager_z, y, lq, cl.LossConfig())
    (eager_loss * scale).sum().backward()

    class NotUnderCompile:
        @staticmethod
        def apply(*args):
            raise AssertionError("_LogProb traced under torch.compile")

    monkeypatch.setattr(cl, "_LogProb", NotUnderCompile)
    loss, diag = compiled(cl.curio_sft_loss)(compiled_z, y, lq, cl.LossConfig())
    (loss * scale).sum().backward()
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(diag["weight"], eager_diag["weight"], rtol=1e-5, atol=1e-5)
    grad, eager_grad = compiled_z.grad.float(), eager_z.grad.float()
    torch.testing.assert_close(grad, eager_grad, rtol=1e-2, atol=1e-4)       # bf16: 8 mantissa bits
    assert eager_grad.abs().max() > 0.1


def test_packed_rows_of_any_sequence_count_share_the_layers_graphs(world_of_one, tiny_model_dir, aot_eager):
    """Twelve packed micro-batches of 1-6 sequences each through a student (activation
    checkpointing: a recompute in backward) and a frozen teacher, their layers compiled: no graph
    per count of sequences, so torch's limit of 8 graphs is never reached (--compile makes
    reaching it an error). dynamo's graphs, not inductor's kernels, decide this: aot_eager keeps
    it cheap."""
    import random

    import data
    from chunked_logits import normed_hidden
    from plumbing import models

    student = models.shard_model(models.load_full_model(str(tiny_model_dir), True, 0), world_of_one,
                                 bf16=False, grad_ckpt=True, compile_layers=True)
    teacher = models.shard_model(models.load_full_model(str(tiny_model_dir), True, 0), world_of_one,
                                 bf16=False, grad_ckpt=False, trainable=False, compile_layers=True)
    assert torch._dynamo.config.fail_on_recompile_limit_hit
    g = random.Random(0)
    for _ in range(12):
        lengths = [g.randint(5, 40) for _ in range(g.randint(1, 6))]
        rows = [([g.randrange(3, 300) for _ in range(n)], [0] + [1] * (n - 1)) for n in lengths]
        batch = data.collate(rows, 0, pack=True)
        with torch.no_grad():
            normed_hidden(teacher, batch)
        normed_hidden(student, batch).square().mean().backward()
    assert all(p.grad is not None for p in student.model.layers.parameters())


@pytest.mark.parametrize("name", sorted(baselines.LOSSES))
def test_every_loss_compiled_gives_its_eager_value_and_gradient(world_of_one, tiny_model_dir, aot_eager, name):
    """sft.py's micro-batch loss of every --loss with --compile, the logged entropy wanted (the kl baseline and
    GEM give it from their own log-probs: the chunk's recompute in backward must run the forward's graph), under
    aot_eager (dynamo's graphs and autograd's split, eager kernels: cheap): the eager loss, diagnostics and
    gradient within float32 reordering."""
    import dataclasses

    from test_sft import fsdp_model, toy_batch

    import chunked_logits
    import sft

    batch, _, _ = toy_batch(tiny_model_dir)
    args, cfg = sft.Args(loss=name, loss_chunk=32), baselines.config_for(name, cl.LossConfig())
    results = []
    for compile_loss in (False, True):
        model = fsdp_model(tiny_model_dir)
        second = fsdp_model(tiny_model_dir).requires_grad_(False) if baselines.second_model(name) else None
        teacher, base = (second, None) if baselines.second_model(name) == "teacher" else (None, second)
        run_args = dataclasses.replace(args, compile=compile_loss)
        old = chunked_logits.token_log_probs(model, batch, args.loss_chunk, compile_loss=compile_loss)[0] \
            if name == "psft" else None
        total, diag = sft.micro_batch_loss(model, teacher, base, batch, old, run_args, cfg, want_entropy=True)
        total.backward()
        results.append((total.detach(), diag, [p.grad.clone() for p in model.parameters()]))
    (eager, eager_diag, eager_grads), (total, diag, grads) = results
    torch.testing.assert_close(total, eager, rtol=1e-5, atol=1e-5)
    assert diag.keys() == eager_diag.keys() and "student_entropy" in diag
    for key in diag:
        torch.testing.assert_close(diag[key], eager_diag[key], rtol=1e-5, atol=1e-5, msg=key)
    for got, want in zip(grads, eager_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
