"""Nothing broken is saved or resumed: non-finite weights stop a save, damaged checkpoint files are found by
their digests and the previous checkpoint is used, unreadable files are named."""
import json
import shutil
from pathlib import Path

import pytest
import torch

import checkpoints
import common


@pytest.fixture(scope="module")
def world_of_one():
    if not torch.distributed.is_initialized():
        common.setup_distributed()


@pytest.fixture()
def model_and_tokenizer(world_of_one, tiny_model_dir):
    from transformers import AutoTokenizer

    full = common.load_full_model(str(tiny_model_dir), scratch=True, seed=0)
    model = common.shard_model(full, torch.device("cpu"), bf16=False, grad_ckpt=False)
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
