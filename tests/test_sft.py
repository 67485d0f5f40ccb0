"""sft.py: the loss plumbing in-process (a world of one), and whole runs as subprocesses (1 and 2 ranks)."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import chunked_logits
import baselines
import curio_loss as cl
import data
import sft
from plumbing import checkpoints, models
from run_python import run_python

REPO = Path(__file__).resolve().parents[1]


def fsdp_model(model_dir, seed=0):
    return models.shard_model(models.load_full_model(str(model_dir), scratch=True, seed=seed),
                              torch.device("cpu"), bf16=False, grad_ckpt=False)


def toy_batch(model_dir, n=4):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    examples = [data.Example(r["prompt"][1]["content"], r["reward_model"]["ground_truth"],
                             r["target"][0]["content"].removeprefix("<think>\n"), "toy", i)
                for i, r in enumerate(__import__("conftest").toy_rows(n, seed=3))]
    items, _ = data.build_sft_data(tok, examples)
    return data.collate(items, tok.pad_token_id), items, tok


def test_trained_positions_are_exactly_response_and_eos(world_of_one, tiny_model_dir):
    batch, items, tok = toy_batch(tiny_model_dir)
    hidden = torch.arange(batch["input_ids"].numel(), dtype=torch.float32).view(*batch["input_ids"].shape, 1)
    h, y = chunked_logits.select_targets(hidden, batch)
    want = [int(i) for ids, mask in items for i, m in zip(ids.tolist(), mask.tolist()) if m]
    assert y.tolist() == want
    assert y.tolist().count(tok.eos_token_id) == len(items)          # every example ends with a trained EOS
    # each trained token is predicted from the position just before it
    t = batch["input_ids"].shape[1]
    assert all(batch["input_ids"].view(-1)[int(p) + 1] == tok_id for p, tok_id in zip(h.view(-1), y)
               if (int(p) + 1) % t != 0)


def test_the_unchunked_definition_is_the_chunked_checkpointed_loss(world_of_one, tiny_model_dir):
    """sft.curio_loss_unchunked, Alg. 1 lines 4-13 in a few lines with the logits whole, against what training runs
    (curio_micro_batch_loss: the logits a chunk at a time, each recomputed in backward): the loss and the gradient."""
    model, teacher = fsdp_model(tiny_model_dir, 0), fsdp_model(tiny_model_dir, 1)
    teacher.requires_grad_(False)
    batch, _, _ = toy_batch(tiny_model_dir)
    cfg = cl.LossConfig()
    grads = []
    for loss_of in (lambda: sft.curio_loss_unchunked(model, teacher, batch, cfg),
                    lambda: sft.curio_micro_batch_loss(model, teacher, batch, sft.Args(loss_chunk=7), cfg, False)[0]):
        loss = loss_of()
        loss.backward()
        grads.append((loss.detach(), [p.grad.full_tensor().clone() for p in model.parameters()]))
        model.zero_grad(set_to_none=True)
    (unchunked, g0), (chunked, g1) = grads
    torch.testing.assert_close(chunked, unchunked, rtol=1e-5, atol=1e-5)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_chunked_loss_equals_loss_on_full_logits(world_of_one, tiny_model_dir):
    model, teacher = fsdp_model(tiny_model_dir, 0), fsdp_model(tiny_model_dir, 1)
    teacher.requires_grad_(False)
    batch, _, _ = toy_batch(tiny_model_dir)
    args = sft.Args(loss="curio", loss_chunk=16)
    total, diag = sft.micro_batch_loss(model, teacher, None, batch, None, args, cl.LossConfig(), want_entropy=True)
    sel = batch["loss_mask"][:, 1:].bool()
    y = batch["input_ids"][:, 1:][sel]
    logits = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1][sel]
    with torch.no_grad():
        t_logits = teacher(batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1][sel]
    lq, want_diag = cl.teacher_log_prob(t_logits, y)
    want, _ = cl.curio_sft_loss(logits, y, lq)
    torch.testing.assert_close(total, want.sum(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(diag["tau"], want_diag["tau"])
    assert len(y) > 3 * args.loss_chunk                                 # several chunks were used
    torch.testing.assert_close(diag["student_entropy"], cl.entropy(logits.detach()), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [5, 16, 64, 4096])
def test_entropy_top20_takes_the_micro_batchs_top_tokens_whatever_the_chunk(world_of_one, tiny_model_dir, chunk):
    """The 20% of highest entropy among all the micro-batch's response tokens get the bonus (the 80/20 paper's
    set), not 20% of each logits chunk: the loss is the same for every --loss_chunk."""
    model = fsdp_model(tiny_model_dir)
    batch, _, _ = toy_batch(tiny_model_dir)
    args, cfg = sft.Args(loss="entropy_top20", loss_chunk=chunk), cl.LossConfig()
    total, diag = sft.micro_batch_loss(model, None, None, batch, None, args, cfg, want_entropy=False)
    sel = batch["loss_mask"][:, 1:].bool()
    logits = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1][sel]
    y = batch["input_ids"][:, 1:][sel]
    h = cl.entropy(logits.detach())
    want = -cl.student_log_prob(logits, y)[0] - cfg.entropy_coef * torch.where(baselines.top_entropy_mask(h), h, 0.0)
    torch.testing.assert_close(total, want.sum(), rtol=1e-5, atol=1e-4)
    assert len(y) > 3 * 16 and int(len(y) * 0.2 + 0.9999) == int(baselines.top_entropy_mask(h).sum())


def test_the_self_teacher_takes_lq_from_the_chunks_own_logits(world_of_one, tiny_model_dir):
    """curio_self_teacher: one lm_head pass per chunk in the forward (the teacher side reads the chunk's detached
    logits), and the loss of CurioSFT with the student's own logits as the teacher's."""
    model = fsdp_model(tiny_model_dir)
    batch, _, _ = toy_batch(tiny_model_dir)
    args = sft.Args(loss="curio_self_teacher", loss_chunk=16)
    calls = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: o.dim() == 2 and calls.append(len(o)))  # chunks
    total, diag = sft.micro_batch_loss(model, None, None, batch, None, args, cl.LossConfig(), want_entropy=False)
    hook.remove()
    sel = batch["loss_mask"][:, 1:].bool()
    y = batch["input_ids"][:, 1:][sel]
    assert sum(calls) == len(y) and len(calls) == -(-len(y) // 16)       # each token through the head once
    logits = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1][sel]
    lq, want_diag = cl.teacher_log_prob(logits.detach(), y)
    want, _ = cl.curio_sft_loss(logits, y, lq)
    torch.testing.assert_close(total, want.sum(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(diag["tau"], want_diag["tau"])
    total.backward()                                    # the recompute in backward gives the same graph
    assert model.lm_head.weight.grad is not None


@pytest.mark.parametrize("name", sorted(baselines.LOSSES))
def test_every_loss_lowers_its_own_loss_on_a_fixed_batch(world_of_one, tiny_model_dir, name):
    second = baselines.second_model(name)
    model = fsdp_model(tiny_model_dir)
    other = None
    if second is not None:
        other = fsdp_model(tiny_model_dir)
        other.requires_grad_(False)
    teacher, base = (other, None) if second == "teacher" else (None, other)
    batch, _, _ = toy_batch(tiny_model_dir)
    args, cfg = sft.Args(loss=name, loss_chunk=32), baselines.config_for(name, cl.LossConfig())
    old = chunked_logits.token_log_probs(model, batch, args.loss_chunk)[0] if name == "psft" else None
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(6):
        total, diag = sft.micro_batch_loss(model, teacher, base, batch, old, args, cfg, want_entropy=False)
        opt.zero_grad()
        total.backward()
        opt.step()
        # DFT's loss -sg(p) log p has the gradient of -p, the objective it lowers (its value rises with p < 1/e)
        losses.append(-diag["lp"].exp().sum().item() if name == "dft" else total.item())
    assert losses[-1] < losses[0] - 0.05 * abs(losses[0]), (name, losses)
    if name in baselines.CURIO_LOSSES:    # the ablation's one temperature reaches the teacher side, and only there
        assert (diag["tau"] == 1.3).all() == (name == "curio_fixed_tau")


def test_psft_runs_the_old_log_probs_pass_only_with_several_updates_per_batch(world_of_one, tiny_model_dir,
                                                                             monkeypatch):
    model = fsdp_model(tiny_model_dir)
    batch, _, _ = toy_batch(tiny_model_dir)
    passes = []
    real = baselines.token_log_probs
    monkeypatch.setattr(baselines, "token_log_probs", lambda *a, **k: passes.append(1) or real(*a, **k))
    assert baselines.old_log_probs(model, [batch, batch], sft.Args(loss="psft")) == [None, None]
    assert baselines.old_log_probs(model, [batch], sft.Args(loss="sft", updates_per_batch=4)) == [None]
    assert not passes
    several = baselines.old_log_probs(model, [batch, batch], sft.Args(loss="psft", updates_per_batch=4))
    assert len(passes) == 2 and all(old is not None and old.dtype == torch.float32 for old in several)
    # with one update per batch, no pass gives the pass's loss and gradient, bit for bit
    args, cfg = sft.Args(loss="psft", loss_chunk=32), baselines.config_for("psft", cl.LossConfig())
    results = []
    for old in (None, chunked_logits.token_log_probs(model, batch, args.loss_chunk)[0]):
        total, _ = sft.micro_batch_loss(model, None, None, batch, old, args, cfg, want_entropy=False)
        total.backward()
        results.append((total.detach(), [p.grad.full_tensor().clone() for p in model.parameters()]))
        model.zero_grad(set_to_none=True)
    assert torch.equal(results[0][0], results[1][0])
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1]))


def test_the_entropy_bonus_logs_the_entropy_it_computed(world_of_one, tiny_model_dir, monkeypatch):
    """The logged student entropy of --loss entropy is the bonus's own: one entropy pass per chunk, not two."""
    model = fsdp_model(tiny_model_dir)
    batch, _, _ = toy_batch(tiny_model_dir)
    passes = []
    real = cl.entropy
    monkeypatch.setattr(cl, "entropy", lambda *a, **k: passes.append(1) or real(*a, **k))
    args, cfg = sft.Args(loss="entropy", loss_chunk=32), cl.LossConfig()
    with torch.no_grad():
        _, diag = sft.micro_batch_loss(model, None, None, batch, None, args, cfg, want_entropy=True)
    n_chunks = -(-len(diag["lp"]) // args.loss_chunk)
    assert len(passes) == n_chunks
    lp, ent = chunked_logits.token_log_probs(model, batch, args.loss_chunk)
    assert torch.equal(diag["student_entropy"], ent) and torch.equal(diag["lp"], lp)
    lp_only, none = chunked_logits.token_log_probs(model, batch, args.loss_chunk, with_entropy=False)
    assert none is None and torch.equal(lp_only, lp) and len(passes) == n_chunks + -(-len(lp) // 32)


@pytest.mark.parametrize("name", ["gem", "kl"])
def test_gem_and_kl_log_the_entropy_of_their_own_log_probs(world_of_one, tiny_model_dir, monkeypatch, name):
    """The logged student entropy of GEM and kl comes from the loss's own log-softmax: no cl.entropy pass, the same
    values."""
    model = fsdp_model(tiny_model_dir)
    base = fsdp_model(tiny_model_dir, 1).requires_grad_(False) if name == "kl" else None
    batch, _, _ = toy_batch(tiny_model_dir)
    passes = []
    real = cl.entropy
    monkeypatch.setattr(cl, "entropy", lambda *a, **k: passes.append(1) or real(*a, **k))
    args, cfg = sft.Args(loss=name, loss_chunk=32), cl.LossConfig()
    with torch.no_grad():
        _, diag = sft.micro_batch_loss(model, None, base, batch, None, args, cfg, want_entropy=True)
    assert not passes
    assert torch.equal(diag["student_entropy"], chunked_logits.token_log_probs(model, batch, args.loss_chunk)[1])


def test_entropy_top20_bit_for_bit_as_with_a_separate_entropy_pass(world_of_one, tiny_model_dir):
    """entropy_top20 takes its mask from the chunks' own entropies (baselines.top20_micro_batch_loss): its loss,
    diagnostics and gradients are, bit for bit, those of a separate no-grad entropy pass for the mask followed by
    chunked_sum over entropy_reg_loss (the straightforward form), and the head runs once per token."""
    model = fsdp_model(tiny_model_dir)
    batch, _, _ = toy_batch(tiny_model_dir)
    args, cfg = sft.Args(loss="entropy_top20", loss_chunk=16), cl.LossConfig()
    weights = torch.rand(int(batch["target_index"].numel()), generator=torch.Generator().manual_seed(0))
    calls = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: o.dim() == 2 and calls.append(len(o)))  # chunks
    total, diag = sft.micro_batch_loss(model, None, None, batch, None, args, cfg, True, weights)
    hook.remove()
    total.backward()
    grads = [p.grad.full_tensor().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    assert sum(calls) == len(weights) and len(calls) > 3

    h, y = chunked_logits.select_targets(chunked_logits.normed_hidden(model, batch), batch)
    with torch.no_grad():
        ent = torch.cat([cl.entropy(model.lm_head(h[s : s + 16])) for s in range(0, len(y), 16)])

    def chunk_loss(h_c, y_c, mask_c, w_c, memo):
        loss, d = baselines.entropy_reg_loss(model.lm_head(h_c), y_c, cfg, mask_c)
        return (loss * w_c).sum(), d

    want, want_diag = chunked_logits.chunked_sum(chunk_loss, 16, h, y, baselines.top_entropy_mask(ent), weights)
    want.backward()
    assert torch.equal(total, want) and diag.keys() == want_diag.keys()
    assert all(torch.equal(diag[k], want_diag[k]) for k in diag)
    assert all(torch.equal(a, p.grad.full_tensor()) for a, p in zip(grads, model.parameters()))


def test_teacher_ema_is_alg1_line17_bit_for_bit(world_of_one, tiny_model_dir):
    student, teacher = fsdp_model(tiny_model_dir, 0), fsdp_model(tiny_model_dir, 1)
    teacher.requires_grad_(False)
    # on one CPU rank the full state dict may alias the parameters: copy before the update
    old, new = ({k: v.clone() for k, v in models.full_state_dict(m).items()} for m in (teacher, student))
    sft.update_teacher(teacher, student, mu=0.99)
    got = models.full_state_dict(teacher)
    for k in old:
        assert torch.equal(got[k], (1 - 0.99) * old[k] + 0.99 * new[k]), k
    assert not torch.equal(got["lm_head.weight"], old["lm_head.weight"])


# ---------------------------------------------------------------- whole runs (subprocesses)
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_sft(model_dir, train_file, out_dir, *extra, nproc=1):
    cmd = ["sft.py", "config/sft_tiny.py", "--model", str(model_dir), "--scratch",
           "--train_file", str(train_file), "--out_dir", str(out_dir), "--token_budget", "1024", *extra]
    if nproc > 1:
        cmd = ["-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", str(free_port()), *cmd]
    proc = run_python(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"})      # torchrun: a fresh interpreter
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(line) for line in (Path(out_dir) / "log.jsonl").read_text().splitlines()]


def final_weights(out_dir):
    return load_file(checkpoints.latest(Path(out_dir)) / "model.safetensors")


def assert_two_ranks_train_as_one_process(model_dir, train_file, tmp_path, *flags, two_ranks_only=()):
    """CurioSFT's 3 steps on 2 gloo ranks with FSDP2 (and `two_ranks_only`), the same global batch split: the same
    losses, grad norms, temperatures and final weights as 1 process."""
    extra = ("--loss", "curio", "--max_steps", "3", "--teacher_every", "2", *flags)
    one = run_sft(model_dir, train_file, tmp_path / "one", *extra)
    two = run_sft(model_dir, train_file, tmp_path / "two", *extra, *two_ranks_only, nproc=2)
    assert [r["step"] for r in two] == [1, 2, 3]
    for a, b in zip(one, two):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
        assert a["tau_mean"] == pytest.approx(b["tau_mean"], rel=1e-5)
    w1, w2 = final_weights(tmp_path / "one"), final_weights(tmp_path / "two")
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], rtol=1e-5, atol=1e-6)


def test_two_ranks_match_one_process(tiny_model_dir, toy_sft_file, tmp_path):
    assert_two_ranks_train_as_one_process(tiny_model_dir, toy_sft_file, tmp_path)


def test_resume_continues_exactly(tiny_model_dir, toy_sft_file, tmp_path):
    extra = ("--loss", "curio", "--teacher_every", "1", "--epochs", "2")
    straight = run_sft(tiny_model_dir, toy_sft_file, tmp_path / "a", *extra, "--max_steps", "7")
    run_sft(tiny_model_dir, toy_sft_file, tmp_path / "b", *extra, "--max_steps", "5")       # crosses an epoch
    resumed = run_sft(tiny_model_dir, toy_sft_file, tmp_path / "b", *extra, "--max_steps", "7")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6, 7]
    assert [r["epoch"] for r in resumed] == [0, 0, 0, 0, 0, 1, 1]
    for a, b in zip(straight[5:], resumed[5:]):
        assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"] and a["tau_mean"] == b["tau_mean"]
    wa, wb = final_weights(tmp_path / "a"), final_weights(tmp_path / "b")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # the checkpoint is a Hugging Face model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    ckpt = checkpoints.latest(tmp_path / "b")
    assert ckpt.name == "step_000007" and not list((tmp_path / "b").glob("*.tmp"))
    AutoModelForCausalLM.from_pretrained(ckpt)
    AutoTokenizer.from_pretrained(ckpt)


def test_bad_data_row_is_a_clear_error(tiny_model_dir, toy_sft_file, tmp_path):
    rows = [json.loads(line) for line in toy_sft_file.read_text().splitlines()]
    rows[3]["target"][0]["content"] = "   "
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(json.dumps(r) for r in rows))
    proc = subprocess.run([sys.executable, "sft.py", "config/sft_tiny.py", "--model", str(tiny_model_dir),
                           "--scratch", "--train_file", str(bad), "--out_dir", str(tmp_path / "out")],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "bad.jsonl row 3: field 'target[0].content' is empty" in proc.stderr


def test_pretrained_student_trains_with_checkpointing(world_of_one, tiny_model_dir, tmp_path):
    """from_pretrained returns eval mode, in which HF silently skips gradient checkpointing."""
    import shutil

    models.load_full_model(str(tiny_model_dir), scratch=True, seed=0).save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, tmp_path / name)
    model = models.shard_model(models.load_full_model(str(tmp_path), scratch=False, seed=0),
                               torch.device("cpu"), bf16=False, grad_ckpt=True)
    assert model.training and model.is_gradient_checkpointing
    assert all(layer.training for layer in model.model.layers)
    frozen = models.shard_model(models.load_full_model(str(tmp_path), scratch=False, seed=0),
                                torch.device("cpu"), bf16=False, grad_ckpt=False, trainable=False)
    assert not frozen.training and not any(p.requires_grad for p in frozen.parameters())
