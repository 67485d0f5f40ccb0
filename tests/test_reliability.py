"""Nothing broken is saved or resumed: non-finite weights stop a save, damaged checkpoint files are found by
their digests and the previous checkpoint is used, unreadable files are named, a changed training file or a
damaged --model is refused, a full disk stops a save with one line, SIGTERM saves and a resume finishes the run
as if uninterrupted, and a second run on one directory is refused cleanly."""
import errno
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import evaluate as ev
import measure
from plumbing import checkpoints, models
from run_python import run_python

REPO = Path(__file__).resolve().parents[1]
# One thread: MKL may pick a different thread count per call on a loaded machine, which changes the last bits
# of a sum; the runs compared bit for bit below must add in one order.
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


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
    assert set(recorded) == on_disk - {"sha256.json"}          # state.json included: a resume reads it
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
    with pytest.raises(SystemExit, match=r"checkpoint step 3 needs \d+\.\d MB, the disk has 0.0 MB free"):
        save(model, tokenizer, tmp_path, 3)
    assert list(tmp_path.iterdir()) == []


def test_a_flipped_byte_in_state_json_is_found_and_bad_counters_are_named(model_and_tokenizer, tmp_path):
    model, tokenizer = model_and_tokenizer
    first, second = save(model, tokenizer, tmp_path, 1), save(model, tokenizer, tmp_path, 2)
    state_file = second / "state.json"
    state_file.write_text(state_file.read_text().replace('"step": 2', '"step": 3'))
    assert checkpoints.damaged_files(second) == ["state.json"]
    assert checkpoints.resume_point(tmp_path) == first
    state = checkpoints.trainer_state(model, torch.optim.AdamW(model.parameters()), None)
    for bad in ("{}", "[]", '{"step": -1}', '{"step": "2"}'):
        state_file.write_text(bad)
        with pytest.raises(SystemExit, match=r"state.json: expected counters such as \{\"step\": 12\}"):
            checkpoints.load(second, state)


def test_a_checkpoint_without_digests_is_resumed_and_said_to_be_unchecked(model_and_tokenizer, tmp_path, capsys):
    path = save(*model_and_tokenizer, tmp_path, 1)
    (path / "sha256.json").unlink()
    assert checkpoints.resume_point(tmp_path) == path
    assert f"checkpoint {path}: no sha256.json" in capsys.readouterr().out


def test_a_checkpoint_that_lost_its_digests_beside_ones_that_have_them_is_not_resumed(model_and_tokenizer, tmp_path,
                                                                                      capsys):
    first, second = (save(*model_and_tokenizer, tmp_path, step) for step in (1, 2))
    (second / "sha256.json").unlink()                  # its files could then hold anything: a flipped byte
    assert checkpoints.resume_point(tmp_path) == first
    assert f"checkpoint {second}: its sha256.json is missing" in capsys.readouterr().out


def test_a_write_that_fills_the_disk_removes_the_checkpoint_and_says_so(model_and_tokenizer, tmp_path,
                                                                        monkeypatch):
    model, tokenizer = model_and_tokenizer
    kept = save(model, tokenizer, tmp_path, 1)

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(checkpoints, "save_file", no_space)
    with pytest.raises(SystemExit, match=r"checkpoint step 2 could not be written: the disk is full .*; it was "
                                         rf"removed and the newest checkpoint is {re.escape(str(kept))}$"):
        save(model, tokenizer, tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000001"]


def test_a_save_on_a_nearly_full_filesystem_stops_with_one_line(model_and_tokenizer, tmp_path, monkeypatch):
    """A real full disk: a tmpfs with room for the pre-check's estimate of one checkpoint and half a checkpoint
    more (mounting needs root; skipped elsewhere). The second save is stopped by the pre-check; with the
    estimate forced to 0 and the disk filled to half a checkpoint, by the filesystem's own ENOSPC mid-write."""
    model, tokenizer = model_and_tokenizer
    probe = save(model, tokenizer, tmp_path / "probe", 1)
    size = sum(f.stat().st_size for f in probe.rglob("*") if f.is_file())
    state = checkpoints.trainer_state(model, torch.optim.AdamW(model.parameters()), None)
    room = checkpoints._large_files_bytes(state, model, torch.float32) + size // 2
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={room // 1024}k", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        first = save(model, tokenizer, mount, 1)
        with pytest.raises(SystemExit, match=r"checkpoint step 2 needs .* MB, the disk has .* MB free"):
            save(model, tokenizer, mount, 2)
        monkeypatch.setattr(checkpoints, "_large_files_bytes", lambda *args: 0)
        with open(mount / "filler", "wb") as f:                # leave room for half a checkpoint
            f.write(bytes(shutil.disk_usage(mount).free - size // 2))
        with pytest.raises(SystemExit, match=r"checkpoint step 2 could not be written: the disk is full .*; it "
                                             r"was removed and the newest checkpoint is .*step_000001$"):
            save(model, tokenizer, mount, 2)
        assert checkpoints.complete(mount) == [first] and checkpoints.damaged_files(first) == []
        assert not list(mount.glob("*.tmp"))
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=True)   # a failed write may hold a file


@pytest.mark.parametrize("name", ["../../x", "/etc/passwd", "..", ".", "a/b", "\\..\\x", "", "x" * 300,
                                  "results", "../progress/../../results"])
def test_a_hostile_data_source_never_names_a_file_outside_progress(tmp_path, name):
    progress = tmp_path / "out" / "progress"
    target = progress / measure.progress_file_name(name)
    assert target.parent == progress and target.name not in (".", "..") and len(target.name) < 100
    assert target.resolve().parent == progress.resolve()
    # distinct names stay distinct
    assert measure.progress_file_name(name) != measure.progress_file_name(name + "/")


def test_a_damaged_model_is_refused_by_evaluate_and_rl(model_and_tokenizer, tmp_path, toy_sft_file, capsys):
    path = save(*model_and_tokenizer, tmp_path, 1)
    weights = path / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-5] ^= 0x01
    weights.write_bytes(bytes(raw))
    bench = tmp_path / "bench.jsonl"
    bench.write_text(toy_sft_file.read_text())
    with pytest.raises(SystemExit, match=r"files do not match their digests \(model.safetensors\)"):
        ev.run_eval(ev.Args(model=str(path), data=str(bench), out=str(tmp_path / "eval"), engine="hf"))
    assert not (tmp_path / "eval").exists()                # no folder holding only its lock
    proc = run_python(["rl.py", "config/rl_tiny.py", "--model", path, "--train_file", toy_sft_file, "--out_dir",
                       tmp_path / "rl"], env=ONE_THREAD, timeout=300)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert "files do not match their digests (model.safetensors)" in proc.stderr
    assert not (tmp_path / "rl").exists()                  # nothing written for a refused run


def test_two_evaluations_into_one_directory_are_refused(model_and_tokenizer, tmp_path, toy_sft_file):
    from plumbing import run_dir

    model = save(*model_and_tokenizer, tmp_path, 1)
    bench = tmp_path / "bench.jsonl"
    bench.write_text(toy_sft_file.read_text())
    out = tmp_path / "eval"
    run_dir.lock_dir(out, "evaluation")                 # the first evaluation (flock: per open file)
    try:
        with pytest.raises(SystemExit, match="another evaluation is writing to this directory"):
            ev.run_eval(ev.Args(model=str(model), data=str(bench), out=str(out), engine="hf"))
    finally:
        run_dir.release()
    assert list(out.iterdir()) == [out / ".lock"]


# ---------------------------------------------------------------- whole sft.py runs (subprocesses)
def run_sft(tiny_model_dir, toy_sft_file, out_dir, *extra, check=True):
    proc = run_python(["sft.py", "config/sft_tiny.py", "--model", tiny_model_dir, "--scratch", "--train_file",
                       toy_sft_file, "--out_dir", out_dir, "--loss", "curio", *extra], env=ONE_THREAD)
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
    # the same command again: the run is complete, says so and trains nothing (it trained a step 7 before)
    log, saved = (tmp_path / "log.jsonl").read_text(), checkpoints.complete(tmp_path)
    proc = run_sft(tiny_model_dir, toy_sft_file, tmp_path, "--max_steps", "6", "--save_every", "2", "--epochs", "2")
    assert f"{tmp_path}: complete at step 6 of 6; nothing to train" in proc.stdout, proc.stdout[-2000:]
    assert "resumed from" not in proc.stdout                 # known from its record: no model was loaded
    assert (tmp_path / "log.jsonl").read_text() == log and checkpoints.complete(tmp_path) == saved


def test_a_changed_training_file_is_refused_on_resume(tiny_model_dir, toy_sft_file, tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text(toy_sft_file.read_text())
    out = tmp_path / "run"
    run_sft(tiny_model_dir, train, out, "--max_steps", "2", "--save_every", "1")
    lines = train.read_text().splitlines()
    train.write_text("\n".join(lines[:-1]))                     # the same path, one row fewer
    proc = run_sft(tiny_model_dir, train, out, "--max_steps", "4", check=False)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert re.match(rf"{re.escape(str(train))} is not the file this run started on \(then: 40 rows, .*now: 39 "
                    r"rows", proc.stderr)
    assert [p.name for p in checkpoints.complete(out)] == ["step_000001", "step_000002"]


STOP_AT_STEP = """
import os, runpy, signal, sys
from plumbing import run_dir
write = run_dir.RunLog.write
def write_then_signal(self, record):
    write(self, record)
    if record["step"] == int(os.environ["STOP_AT"]):
        os.kill(os.getpid(), signal.SIGTERM)   # as SLURM does, in the middle of the run
run_dir.RunLog.write = write_then_signal
if os.environ.get("TOY_GRADE"):                # a reward that varies within a group: the updates move
    from plumbing import grading
    grading.grade = lambda texts, *args: ([float(len(t) % 2) for t in texts], 0)
script, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""


def stop_at(step, script, out, *flags, env=ONE_THREAD, exit_status=75):
    """script (sft.py or rl.py) run with flags, sent SIGTERM once step `step` is logged: it must save
    that step and leave with STOPPED_EXIT, saying how to resume (step 0: never sent)."""
    proc = run_python(["-c", STOP_AT_STEP, script, *flags, "--out_dir", out], env={**env, "STOP_AT": str(step)})
    assert proc.returncode == exit_status, proc.stdout[-2000:] + proc.stderr[-2000:]   # 75: requeue me
    if step == 0:
        return
    assert f"stopped by SIGTERM after step {step}, saved" in proc.stdout
    assert json.loads((out / "stopped").read_text()) == {"step": step, "signal": "SIGTERM"}
    assert checkpoints.complete(out)[-1].name == f"step_{step:06d}"


def untimed_log(run):
    return [{k: v for k, v in json.loads(line).items() if not k.endswith("_s") and k != "tokens_per_s"}
            for line in (run / "log.jsonl").read_text().splitlines()]


HOLD_AFTER_CLAIM = """
import runpy, sys, time
from pathlib import Path
from plumbing import run_dir
claim = run_dir.claim
def claim_then_wait(out_dir, *args, **kwargs):
    lock = claim(out_dir, *args, **kwargs)
    (Path(out_dir) / "claimed").touch()                  # the run holds its directory
    while not (Path(out_dir) / "go").exists():           # until the test has started the second one
        time.sleep(0.05)
    return lock
run_dir.claim = claim_then_wait
sys.argv = ["sft.py", *sys.argv[1:]]
runpy.run_path("sft.py", run_name="__main__")
"""


def test_two_simultaneous_starts_one_runs_one_is_refused_cleanly(tiny_model_dir, toy_sft_file, tmp_path):
    flags = ["config/sft_tiny.py", "--model", str(tiny_model_dir), "--scratch", "--train_file", str(toy_sft_file),
             "--out_dir", str(tmp_path), "--max_steps", "2"]
    # The first run holds the directory until the second has tried: the overlap is certain, not a race.
    first = subprocess.Popen([sys.executable, "-c", HOLD_AFTER_CLAIM, *flags], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=ONE_THREAD)
    deadline = time.monotonic() + 300
    while not (tmp_path / "claimed").exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    second = run_python(["sft.py", *flags], env=ONE_THREAD)
    (tmp_path / "go").touch()
    results = sorted([(first.wait(timeout=600), first.communicate()[1]), (second.returncode, second.stderr)])
    assert [code for code, _ in results] == [0, 1], results           # never 134 (an abort)
    assert "another run is writing to this directory" in results[1][1] and results[1][1].count("\n") == 1
    assert [p.name for p in checkpoints.complete(tmp_path)] == ["step_000002"]


def test_weights_only_export_loads_and_matches_its_digests(model_and_tokenizer, tmp_path):
    """python -m plumbing.checkpoints export SRC DST: the Hugging Face model without trainer/, each file checked."""
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
    assert not (tmp_path / "bad").exists() and not (tmp_path / "bad.tmp").exists()
    (path / "model.safetensors").unlink()                 # a listed file missing: one line, nothing written
    with pytest.raises(SystemExit, match=r"model.safetensors: missing, though sha256.json lists it"):
        checkpoints.export_weights(path, tmp_path / "bad")
    assert not (tmp_path / "bad").exists() and not (tmp_path / "bad.tmp").exists()
    (path / "sha256.json").write_text("[]")
    with pytest.raises(SystemExit, match=r"sha256.json: not a JSON object of file digests"):
        checkpoints.export_weights(path, tmp_path / "bad")
    with pytest.raises(SystemExit, match="exists and is not empty"):
        checkpoints.export_weights(path, out)


class RunsCode:
    """What a crafted pickle holds: unpickling it writes the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def redigest(path):
    """What a crafted checkpoint does to pass the digest check: sha256.json recomputed over its files."""
    digests = {str(p.relative_to(path)): checkpoints.file_sha256(p) for p in sorted(path.rglob("*"))
               if p.is_file() and p.name != "sha256.json"}
    (path / "sha256.json").write_text(json.dumps(digests, indent=1))
    assert checkpoints.damaged_files(path) == []


def test_a_crafted_checkpoint_runs_no_code_and_is_refused_in_one_line(model_and_tokenizer, tmp_path):
    """trainer/.metadata is a pickle: one that also holds a payload (its digests recomputed) is refused, naming
    it, and the payload never runs; the same for a non-tensor trainer value (the optimiser's lr) that holds one.
    A checkpoint as saved loads, with the model, optimiser and step restored."""
    import pickle
    import torch.distributed.checkpoint as dcp

    model, tokenizer = model_and_tokenizer
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.25)
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    path = checkpoints.save(tmp_path / "run", 3, model, tokenizer,
                            checkpoints.trainer_state(model, optimizer, None), {"step": 3})
    saved = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    optimizer.param_groups[0]["lr"] = 1.0
    assert checkpoints.restore(path, model, optimizer, None) == {"step": 3}      # as saved: it loads
    assert all(torch.equal(v.full_tensor(), saved[k]) for k, v in model.state_dict().items())
    assert optimizer.param_groups[0]["lr"] == 0.25 and optimizer.state

    marker = tmp_path / "payload_ran"
    metadata_file = path / "trainer" / ".metadata"
    original = metadata_file.read_bytes()
    metadata = pickle.loads(original)
    metadata.planner_data["payload"] = RunsCode(marker)     # a full pickle.load would run it, then load on
    metadata_file.write_bytes(pickle.dumps(metadata))
    redigest(path)
    assert checkpoints.resume_point(tmp_path / "run") == path                     # the digests match
    state = checkpoints.trainer_state(model, optimizer, None)
    with pytest.raises(SystemExit) as refused:
        checkpoints.load(path, state)
    assert str(refused.value) == (f"{metadata_file}: not torch.distributed.checkpoint metadata (it names "
                                  "builtins.exec, which is not checkpoint metadata); refused, nothing in it was run")
    assert not marker.exists()

    # a non-tensor value of the trainer state: DCP stores it as torch.save bytes in a .distcp file
    metadata_file.write_bytes(original)
    crafted = checkpoints.trainer_state(model, optimizer, None)
    crafted["optim"]["param_groups"][0]["lr"] = RunsCode(marker)
    shutil.rmtree(path / "trainer")
    dcp.save(crafted, checkpoint_id=str(path / "trainer"))
    redigest(path)
    with pytest.raises(SystemExit) as refused:
        checkpoints.load(path, checkpoints.trainer_state(model, optimizer, None))
    assert re.fullmatch(rf"{re.escape(str(path / 'trainer'))}/__\d+_\d+\.distcp: its saved value "
                        r"optim\.param_groups\.0\.lr names builtins\.exec, which is not a plain value; refused, "
                        r"nothing in it was run", str(refused.value)), str(refused.value)
    assert not marker.exists()


# ---------------------------------------------------------------- where a run ends
def final_weights(run, step):
    return (run / f"step_{step:06d}" / "model.safetensors").read_bytes()


def test_a_completion_record_naming_a_damaged_checkpoint_is_ignored(tiny_model_dir, toy_sft_file, tmp_path):
    """complete.json counts only with its checkpoint intact: step 4's files no longer match their digests, so the
    same command resumes from step 2 (saying why) and ends as the first run did, instead of 'complete'."""
    flags = ["--max_steps", "4", "--save_every", "2"]
    run_sft(tiny_model_dir, toy_sft_file, tmp_path, *flags)
    weights, log = final_weights(tmp_path, 4), untimed_log(tmp_path)
    shard = next((tmp_path / "step_000004" / "trainer").glob("*.distcp"))
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    shard.write_bytes(bytes(raw))
    proc = run_sft(tiny_model_dir, toy_sft_file, tmp_path, *flags)
    assert "nothing to train" not in proc.stdout
    assert (f"{tmp_path / 'complete.json'}: names step 4, but the newest intact checkpoint is "
            f"{tmp_path / 'step_000002'}: ignored and removed") in proc.stdout, proc.stdout[-2000:]
    assert f"resumed from {tmp_path / 'step_000002'} at step 2" in proc.stdout
    assert final_weights(tmp_path, 4) == weights and untimed_log(tmp_path) == log
    assert json.loads((tmp_path / "complete.json").read_text()) == {"step": 4}
