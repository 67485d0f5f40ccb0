"""What the paper-scale runs need, checked on CPU: gradient accumulation that never holds a full unsharded
gradient, Hugging Face checkpoints in the training dtype, sharded as save_pretrained shards them, rotation of old
checkpoints, CPU offload, and the process-group timeout."""
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from plumbing import checkpoints, distributed, models

REPO = Path(__file__).resolve().parents[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(script: str, *args, nproc: int = 2, timeout: int = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
           str(free_port()), script, *map(str, args)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


# ---------------------------------------------------------------- gradient accumulation
# Runs the real sft.py / rl.py training loop on 2 gloo ranks, with torch.Tensor.backward wrapped: after every
# backward, no FSDP parameter may hold an unsharded gradient (FSDP2 keeps one, in `_unsharded_param.grad` or
# `unsharded_accumulated_grad`, when a backward runs with gradient sync off).
ACCUMULATION_PROBE = r"""
import runpy, sys, torch
sys.path.insert(0, {repo!r})
from plumbing import distributed, models

sharded, backwards, leaks = [], [0], []
shard_model = models.shard_model
def recording_shard_model(*args, **kwargs):
    sharded.append(shard_model(*args, **kwargs))
    return sharded[-1]
models.shard_model = recording_shard_model

backward = torch.Tensor.backward
def checked_backward(self, *args, **kwargs):
    backward(self, *args, **kwargs)
    backwards[0] += 1
    for model in sharded:
        for module in model.modules():
            if hasattr(module, "_get_fsdp_state"):
                for group in module._get_fsdp_state()._fsdp_param_groups:
                    for p in group.fsdp_params:
                        if p.unsharded_accumulated_grad is not None or (
                                hasattr(p, "_unsharded_param") and p._unsharded_param.grad is not None):
                            leaks.append(p._param_fqn)
torch.Tensor.backward = checked_backward

shutdown = distributed.shutdown
def report_then_shutdown(code=0):
    print(f"PROBE backwards={{backwards[0]}} leaks={{len(leaks)}} {{sorted(set(leaks))[:3]}}", flush=True)
    shutdown(code)
distributed.shutdown = report_then_shutdown
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def probe_counts(proc) -> list[tuple[int, int]]:
    """(backwards, leaks) per rank; ranks print concurrently, so a report may share a line with another's."""
    return [(int(b), int(n)) for b, n in re.findall(r"PROBE backwards=(\d+) leaks=(\d+)", proc.stdout)]


def test_sft_accumulation_keeps_no_unsharded_gradient(tiny_model_dir, toy_sft_file, tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(ACCUMULATION_PROBE.format(repo=str(REPO)))
    proc = torchrun(probe, "sft.py", "config/sft_tiny.py", "--model", tiny_model_dir, "--scratch", "--train_file",
                    toy_sft_file, "--out_dir", tmp_path / "out", "--loss", "curio", "--max_steps", "2",
                    "--token_budget", "96")
    counts = probe_counts(proc)
    assert len(counts) == 2                                  # one line per rank
    for backwards, leaks in counts:
        assert backwards > 2, "the probe needs several micro-batches per optimiser step"
        assert leaks == 0


def test_rl_accumulation_keeps_no_unsharded_gradient(world_of_one, tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    from conftest import toy_rows

    models.load_full_model(str(tiny_model_dir), scratch=True, seed=0).save_pretrained(tmp_path / "start")
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(tmp_path / "start")
    (tmp_path / "prompts.jsonl").write_text("\n".join(json.dumps(r) for r in toy_rows(16)))
    probe = tmp_path / "probe.py"
    probe.write_text(ACCUMULATION_PROBE.format(repo=str(REPO)))
    proc = torchrun(probe, "rl.py", "config/rl_tiny.py", "--model", tmp_path / "start", "--train_file",
                    tmp_path / "prompts.jsonl", "--out_dir", tmp_path / "out", "--steps", "1", "--micro_batch", "2",
                    "--max_response_len", "8", "--grader_workers", "1", "--system_prompt", "row")
    for backwards, leaks in probe_counts(proc):
        assert backwards > 2 and leaks == 0


# ---------------------------------------------------------------- checkpoints
def sharded_model(model_dir, seed=0):
    full = models.load_full_model(str(model_dir), scratch=True, seed=seed)
    return models.shard_model(full, torch.device("cpu"), bf16=False, grad_ckpt=False)


def save(model, tokenizer, out_dir, step, **kwargs):
    optimizer = torch.optim.AdamW(model.parameters())
    return checkpoints.save(Path(out_dir), step, model, tokenizer, checkpoints.trainer_state(model, optimizer, None),
                            {"step": step}, **kwargs)


def test_checkpoint_is_sharded_like_save_pretrained_and_reloads_bit_exactly(world_of_one, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = sharded_model(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    trained = {k: v.clone() for k, v in models.full_state_dict(model).items()}
    path = save(model, tokenizer, tmp_path, 3, max_shard_gb=100e3 / 2**30)      # ~100 kB shards: several files
    index = json.loads((path / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert sorted(p.name for p in path.glob("model*.safetensors")) == files
    assert not (path / "model.safetensors").exists()
    on_disk = {k: v for f in files for k, v in load_file(path / f).items()}
    assert set(index["weight_map"]) == set(on_disk) == set(trained)
    assert index["metadata"]["total_size"] == sum(v.numel() * 4 for v in on_disk.values())
    for f in files:                                          # within the limit, or one tensor larger than it
        shard = load_file(path / f)
        assert sum(v.numel() * 4 for v in shard.values()) <= 100e3 or len(shard) == 1
    reloaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
    assert all(torch.equal(reloaded[k], trained[k]) for k in trained)


def test_checkpoint_in_training_dtype_with_tied_embeddings(world_of_one, tiny_model_dir, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tied_dir = tmp_path / "tied"
    config = AutoConfig.from_pretrained(tiny_model_dir)
    config.tie_word_embeddings = True
    config.save_pretrained(tied_dir)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(tied_dir)
    model = sharded_model(tied_dir)
    trained = models.full_state_dict(model)
    path = save(model, AutoTokenizer.from_pretrained(tied_dir), tmp_path / "run", 1, dtype=torch.bfloat16)
    on_disk = load_file(path / "model.safetensors")          # one file below the default 5 GB
    assert "lm_head.weight" not in on_disk and {v.dtype for v in on_disk.values()} == {torch.bfloat16}
    assert json.loads((path / "config.json").read_text())["dtype"] == "bfloat16"
    reloaded = AutoModelForCausalLM.from_pretrained(path)    # dtype "auto": the config's
    assert reloaded.dtype == torch.bfloat16
    for k, v in reloaded.state_dict().items():
        assert torch.equal(v, trained[k].to(torch.bfloat16)), k
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()


def test_keep_last_rotates_complete_checkpoints_but_never_the_resumed_one(world_of_one, tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    model, tokenizer = sharded_model(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    first = save(model, tokenizer, tmp_path, 1)
    (tmp_path / "step_000002.tmp").mkdir()                  # an interrupted save: not a checkpoint, not counted
    for step in (3, 4, 5):
        save(model, tokenizer, tmp_path, step, keep_last=2, keep=first)
    assert [p.name for p in checkpoints.complete(tmp_path)] == ["step_000001", "step_000004", "step_000005"]
    save(model, tokenizer, tmp_path, 6, keep_last=1)
    assert [p.name for p in checkpoints.complete(tmp_path)] == ["step_000006"]
    save(model, tokenizer, tmp_path, 7)                      # keep_last 0: keep everything
    assert len(checkpoints.complete(tmp_path)) == 2


def test_offload_trains_like_no_offload(tiny_model_dir, toy_sft_file, tmp_path):
    """FSDP2's CPUOffloadPolicy on 2 gloo ranks: the same steps give the same weights as without offload."""
    base = ("sft.py", "config/sft_tiny.py", "--model", tiny_model_dir, "--scratch", "--train_file", toy_sft_file,
            "--loss", "curio", "--max_steps", "2", "--teacher_every", "1")
    torchrun(*base, "--out_dir", tmp_path / "plain")
    torchrun(*base, "--out_dir", tmp_path / "offload", "--offload")
    a = load_file(checkpoints.latest(tmp_path / "plain") / "model.safetensors")
    b = load_file(checkpoints.latest(tmp_path / "offload") / "model.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_offload_flag_sets_fsdp_cpu_offload(world_of_one, tiny_model_dir):
    full = models.load_full_model(str(tiny_model_dir), scratch=True, seed=0)
    model = models.shard_model(full, torch.device("cpu"), bf16=False, grad_ckpt=False, offload=True)
    params = [p for g in model._get_fsdp_state()._fsdp_param_groups for p in g.fsdp_params]
    assert params and all(p.offload_to_cpu for p in params)


def test_dist_timeout_reaches_the_process_group(monkeypatch):
    seen = {}
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: seen.update(k))
    monkeypatch.delenv("RANK", raising=False)
    distributed.setup_distributed(timeout_min=90)
    assert seen["timeout"].total_seconds() == 90 * 60
