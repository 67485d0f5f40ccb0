"""Nothing broken is saved or resumed: non-finite weights stop a save, damaged checkpoint files are found by
their digests and the previous checkpoint is used, unreadable files are named."""
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from plumbing import checkpoints, models


@pytest.fixture()
def model_and_tokenizer(world_of_one, tiny_model_dir):
    from transformers import AutoTokenizer

    full = models.load_full_model(str(tiny_model_dir), scratch=True, seed=0)
    model = models.shard_model(full, torch.device("cpu"), bf16=False, grad_ckpt=False)
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


def save(model, tokenizer, out_dir, step):
    optimizer = torch.optim.AdamW(model.parameters())
    return checkpoints.save(Path(out_dir), step, model, tokenizer, checkpoints.trainer_state(model, optimizer, None),
                            {"step": step})


def test_non_finite_weights_are_never_saved(model_and_tokenizer, tmp_path):
    model, tokenizer = model_and_tokenizer
    with torch.no_grad():
        next(model.parameters()).to_local()[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="step 4: weight .* non-finite"):
        save(model, tokenizer, tmp_path, 4)
    assert checkpoints.complete(tmp_path) == []


def test_digests_cover_every_file(model_and_tokenizer, tmp_path):
    path = save(*model_and_tokenizer, tmp_path, 1)
    recorded = json.loads((path / "sha256.json").read_text())
    on_disk = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()}
    assert set(recorded) == on_disk - {"sha256.json", "state.json"}
    assert any(name.startswith("trainer/") for name in recorded) and "model.safetensors" in recorded
    assert checkpoints.damaged_files(path) == []


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_damaged_checkpoint_falls_back_to_the_previous_one(model_and_tokenizer, tmp_path, damage, capsys):
    model, tokenizer = model_and_tokenizer
    first, second = save(model, tokenizer, tmp_path, 1), save(model, tokenizer, tmp_path, 2)
    shard = next((second / "trainer").glob("*.distcp"))
    raw = bytearray(shard.read_bytes())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0x40
        shard.write_bytes(bytes(raw))
    elif damage == "truncate":
        shard.write_bytes(bytes(raw[: len(raw) // 3]))
    else:
        shard.unlink()
    assert checkpoints.damaged_files(second) == [str(shard.relative_to(second))]
    assert checkpoints.resume_point(tmp_path) == first
    assert "do not match their digests" in capsys.readouterr().out
    (first / "model.safetensors").write_bytes(b"")
    with pytest.raises(SystemExit, match="every checkpoint is damaged"):
        checkpoints.resume_point(tmp_path)


def test_unreadable_state_files_are_named(model_and_tokenizer, tmp_path):
    model, tokenizer = model_and_tokenizer
    path = save(model, tokenizer, tmp_path, 1)
    state = checkpoints.trainer_state(model, torch.optim.AdamW(model.parameters()), None)
    (path / "state.json").write_text('{"step": ')
    with pytest.raises(SystemExit, match="state.json: not valid JSON"):
        checkpoints.load(path, state)
    (path / "rng_rank0.pt").write_bytes(b"")
    with pytest.raises(SystemExit, match="rng_rank0.pt: not a readable RNG state"):
        checkpoints.load(path, state)


def test_a_checkpoint_that_cannot_fit_on_the_disk_stops_before_writing(model_and_tokenizer, tmp_path, monkeypatch):
    model, tokenizer = model_and_tokenizer
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=10_000))
    with pytest.raises(SystemExit, match=r"checkpoint step 3 needs 0.\d+ GB, the disk has 0.00 GB free"):
        save(model, tokenizer, tmp_path, 3)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- whole sft.py runs (subprocesses)
def run_sft(tiny_model_dir, toy_sft_file, out_dir, *extra, check=True):
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "sft.py", "config/sft_tiny.py", "--model", str(tiny_model_dir), "--scratch",
           "--train_file", str(toy_sft_file), "--out_dir", str(out_dir), "--loss", "curio", *extra]
    proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=600)
    assert not check or proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def test_a_diverging_step_is_not_applied_and_nothing_broken_is_saved(tiny_model_dir, toy_sft_file, tmp_path):
    proc = run_sft(tiny_model_dir, toy_sft_file, tmp_path, "--lr", "1e30", "--max_steps", "4", check=False)
    assert proc.returncode == 1
    assert re.match(r"step [234]: .*not finite.*; nothing after step 0 is saved\n$", proc.stderr)
    assert re.match(r"step [234]: (the loss is not finite: .+|every per-token loss is finite, the gradient norm is "
                    r"not); the update was not applied", proc.stderr)
    assert proc.stderr.count("\n") == 1                      # one line, no traceback
    assert checkpoints.complete(tmp_path) == []


def test_resume_refuses_other_settings_and_logs_each_step_once(tiny_model_dir, toy_sft_file, tmp_path):
    run_sft(tiny_model_dir, toy_sft_file, tmp_path, "--max_steps", "5", "--save_every", "2", "--epochs", "2")
    assert [p.name for p in checkpoints.complete(tmp_path)] == ["step_000002", "step_000004", "step_000005"]
    shutil.rmtree(tmp_path / "step_000005")                  # a crash after step 5, before its checkpoint
    proc = run_sft(tiny_model_dir, toy_sft_file, tmp_path, "--max_steps", "6", "--epochs", "2", "--lr", "3e-3",
                   check=False)
    assert proc.returncode == 1 and "holds a run with other settings (--lr 0.001 -> 0.003)" in proc.stderr
    run_sft(tiny_model_dir, toy_sft_file, tmp_path, "--max_steps", "6", "--save_every", "2", "--epochs", "2")
    steps = [json.loads(line)["step"] for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_weights_only_export_loads_and_matches_its_digests(model_and_tokenizer, tmp_path):
    """python -m plumbing.checkpoints export SRC DST: the Hugging Face model without trainer/, each file checked."""
    import subprocess
    import sys

    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = save(*model_and_tokenizer, tmp_path / "run", 3)
    out = tmp_path / "export"
    proc = subprocess.run([sys.executable, "-m", "plumbing.checkpoints", "export", str(path), str(out)],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and f"each matching {path}/sha256.json" in proc.stdout, proc.stderr[-2000:]
    exported = json.loads((out / "sha256.json").read_text())
    recorded = json.loads((path / "sha256.json").read_text())
    assert exported == {k: v for k, v in recorded.items() if not checkpoints.is_trainer_file(k)}
    assert not (out / "trainer").exists() and "model.safetensors" in exported and "config.json" in exported
    assert checkpoints.damaged_files(out) == []                              # the digests hold in the copy
    model = AutoModelForCausalLM.from_pretrained(out)
    saved = AutoModelForCausalLM.from_pretrained(path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), saved.state_dict().values()))
    assert AutoTokenizer.from_pretrained(out)("2+3")["input_ids"]
    size = sum(f.stat().st_size for f in out.rglob("*"))
    assert size < 0.5 * sum(f.stat().st_size for f in path.rglob("*"))       # the float32 trainer state stays

    # a damaged checkpoint is not exported, and a directory is never exported into twice
    with open(path / "model.safetensors", "r+b") as f:
        f.seek(-8, 2)
        f.write(b"\x00" * 8)
    with pytest.raises(SystemExit, match=r"model.safetensors: does not match its digest in sha256.json"):
        checkpoints.export_weights(path, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    with pytest.raises(SystemExit, match="exists and is not empty"):
        checkpoints.export_weights(path, out)
