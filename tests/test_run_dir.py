"""run_dir.py: one run per output directory, and the run's log (cut back on resume, optional loggers)."""
import json
import sys
import types

import pytest

from plumbing import run_dir

pytestmark = pytest.mark.usefixtures("world_of_one")


SETTINGS = {"model": "m", "lr": 1e-5, "loss": "curio", "max_steps": 10, "loggers": []}


def test_a_second_run_on_the_same_directory_is_refused(tmp_path):
    lock = run_dir.claim(tmp_path, SETTINGS, {"max_steps"}, resuming=False)
    with pytest.raises(SystemExit, match="another run is writing to this directory"):
        run_dir.claim(tmp_path, SETTINGS, {"max_steps"}, resuming=False)
    lock.close()
    run_dir.claim(tmp_path, SETTINGS, {"max_steps"}, resuming=False).close()   # free again once released


def test_resume_with_other_defining_settings_is_refused_by_name(tmp_path):
    run_dir.claim(tmp_path, SETTINGS, {"max_steps"}, resuming=False).close()
    changed = {**SETTINGS, "lr": 3e-5, "loss": "sft", "max_steps": 20}
    with pytest.raises(SystemExit, match=r"--loss 'curio' -> 'sft', --lr 1e-05 -> 3e-05\)"):
        run_dir.claim(tmp_path, changed, {"max_steps"}, resuming=True)
    assert json.loads((tmp_path / "run_config.json").read_text())["lr"] == 1e-5     # the record is untouched
    run_dir.claim(tmp_path, {**SETTINGS, "max_steps": 20}, {"max_steps"}, resuming=True).close()  # allowed change
    run_dir.claim(tmp_path, changed, {"max_steps"}, resuming=False).close()   # no checkpoint yet: a new run


def test_a_run_recorded_before_a_setting_existed_resumes_at_its_default(tmp_path):
    """A record without `hybrid` (written before the flag was added) resumes with the default, which
    runs what that version ran, and refuses any other value."""
    run_dir.claim(tmp_path, SETTINGS, set(), resuming=False).close()
    newer, defaults = {**SETTINGS, "hybrid": "none"}, {**SETTINGS, "hybrid": "none"}
    run_dir.claim(tmp_path, newer, set(), resuming=True, defaults=defaults).close()
    (tmp_path / "run_config.json").write_text(json.dumps(SETTINGS))            # the old record again
    with pytest.raises(SystemExit, match=r"--hybrid 'none' -> 'luffy'"):
        run_dir.claim(tmp_path, {**newer, "hybrid": "luffy"}, set(), resuming=True, defaults=defaults)


def test_the_same_files_through_other_paths_are_the_same_settings(tmp_path, monkeypatch):
    """--model, --train_file given as another path to the same file on resume (../, ./, a link, absolute): not a
    change; another file is one, and training data whose digest differs is refused whatever its path."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("{}")
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "data" / "train.jsonl")
    (tmp_path / "other.jsonl").write_text("{}")
    monkeypatch.chdir(tmp_path / "data")
    out = tmp_path / "out"
    settings = {**SETTINGS, "model": ".", "train_file": "train.jsonl"}
    data = {"file": "train.jsonl", "sha256": "ab" * 32, "rows": 1}
    run_dir.claim(out, settings, set(), resuming=False, data=data).close()
    for path in ("../data/train.jsonl", "./train.jsonl", str(tmp_path / "link.jsonl"),
                 str(tmp_path / "data" / "train.jsonl")):
        moved = {**settings, "model": "../data", "train_file": path}
        run_dir.claim(out, moved, set(), resuming=True, data={**data, "file": path}).close()
    with pytest.raises(SystemExit, match=r"--train_file '.*train.jsonl' -> '../other.jsonl'\)"):
        run_dir.claim(out, {**settings, "train_file": "../other.jsonl"}, set(), resuming=True, data=data)
    with pytest.raises(SystemExit, match=r"^../data/train.jsonl is not the file this run started on"):
        run_dir.claim(out, {**settings, "train_file": "../data/train.jsonl"}, set(), resuming=True,
                      data={"file": "../data/train.jsonl", "sha256": "cd" * 32, "rows": 1})


def test_stale_partial_checkpoints_are_removed(tmp_path):
    (tmp_path / "step_000004.tmp" / "trainer").mkdir(parents=True)
    (tmp_path / "step_000002").mkdir()
    run_dir.claim(tmp_path, SETTINGS, set(), resuming=False).close()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step_")) == ["step_000002"]


def checkpoint_dirs(out, *steps):
    """Complete checkpoint directories as checkpoints.complete sees them (digests are check_end's caller's)."""
    for step in steps:
        (out / f"step_{step:06d}").mkdir(parents=True)
        (out / f"step_{step:06d}" / "state.json").write_text(json.dumps({"step": step}))
    return out / f"step_{steps[-1]:06d}" if steps else None


@pytest.mark.parametrize("record", ['{"step": 24}', '{"step": 12', '{"step": true}', "[]", '{"step": 6}'])
def test_a_completion_record_without_its_checkpoint_is_ignored(tmp_path, capsys, record):
    """The probe's case: complete.json says 24 (by hand, a truncated copy, two machines' files), the newest intact
    checkpoint is step 12: not complete; the record is dropped with one line and the run resumes. A record that is
    not JSON of that shape is said to be none."""
    newest = checkpoint_dirs(tmp_path, 6, 12)
    (tmp_path / "complete.json").write_text(record)
    assert run_dir.completed(tmp_path) is None                       # the demo's check: not a finished stage
    assert not run_dir.check_end(tmp_path, newest, 24, "--max_steps")
    said = capsys.readouterr().out
    if record in ('{"step": 24}', '{"step": 6}'):
        assert (f"{tmp_path / 'complete.json'}: names step {json.loads(record)['step']}, but the newest intact "
                f"checkpoint is {newest}: ignored and removed\n") == said
    else:
        assert said == (f"{tmp_path / 'complete.json'}: not a completion record ({{\"step\": N}}): ignored and "
                        "removed\n")
    assert "complete at" not in said and not (tmp_path / "complete.json").exists()
    (tmp_path / "complete.json").write_text('{"step": 12}')         # named by nothing intact: resume_point's None
    assert not run_dir.check_end(tmp_path, None, 24, "--max_steps")
    assert "newest intact checkpoint is none" in capsys.readouterr().out


def odd(step):
    return f"step {step} is odd"


def test_a_run_ends_only_at_the_step_it_is_asked_for(tmp_path, capsys):
    """Complete at its step: True, and the record written if it was lost. Asked for more: it goes on (the record
    removed until the new end), unless why_not_on objects; asked for fewer than it ran: refused. Never 'complete'
    at an old end."""
    newest = checkpoint_dirs(tmp_path, 2, 4)
    assert run_dir.check_end(tmp_path, newest, 4, "--steps")
    assert json.loads((tmp_path / "complete.json").read_text()) == {"step": 4}
    assert run_dir.completed(tmp_path) == 4
    assert f"{tmp_path}: complete at step 4 of 4; nothing to train" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=rf"^{tmp_path}: the run there is at step 4, past the 3 asked for "
                                         r"\(--steps\): ask for 4 or more, or choose another --out_dir$"):
        run_dir.check_end(tmp_path, newest, 3, "--steps")
    with pytest.raises(SystemExit, match=r"ended at step 4; going on to step 6 \(--steps\) would not give what one "
                                         r"run to it gives: step 4 is odd; choose another --out_dir$"):
        run_dir.check_end(tmp_path, newest, 6, "--steps", odd)
    assert (tmp_path / "complete.json").exists()                     # a refusal changes nothing
    assert not run_dir.check_end(tmp_path, newest, 6, "--steps", lambda step: None)
    assert f"{tmp_path}: complete at step 4; going on to step 6 (--steps)" in capsys.readouterr().out
    assert not (tmp_path / "complete.json").exists()
    assert not run_dir.check_end(tmp_path, None, 6, "--steps", odd)      # a new run: nothing to object to


def test_log_is_cut_back_to_the_resumed_step(tmp_path, capsys):
    log = run_dir.RunLog(tmp_path, 0, 6, "sft")
    for step in range(1, 6):
        log.write({"step": step, "loss": 1.0 / step})
    log.close()
    with open(tmp_path / "log.jsonl", "a") as f:
        f.write('{"step": 6, "lo')                          # a crash in the middle of a write
    log = run_dir.RunLog(tmp_path, 3, 6, "sft")              # the checkpoint was at step 3
    log.write({"step": 4, "loss": 0.5})
    log.close()
    steps = [json.loads(line)["step"] for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    assert "step 4 loss 0.5 eta " in capsys.readouterr().out   # not a terminal: plain lines with the ETA
    (tmp_path / "log.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(SystemExit, match="log.jsonl, line 2: not a log record"):
        run_dir.RunLog(tmp_path, 2, 6, "sft")


@pytest.mark.parametrize("name, package", [("wandb", "wandb"), ("tensorboard", "tensorboard")])
def test_absent_logger_package_is_a_clear_error(tmp_path, monkeypatch, name, package):
    monkeypatch.setitem(sys.modules, "wandb", None)                 # None in sys.modules: import fails
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(SystemExit, match=f"--loggers {name}: the {package} package is not installed"):
        run_dir.RunLog(tmp_path, 0, 1, "sft", loggers=[name])


def test_wandb_gets_every_record_and_keeps_its_run_id(tmp_path, monkeypatch):
    calls = []
    run = types.SimpleNamespace(log=lambda data, step: calls.append((step, data)))
    fake = types.SimpleNamespace(util=types.SimpleNamespace(generate_id=lambda: "abc123"),
                                 init=lambda **kw: calls.append(kw) or run)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    log = run_dir.RunLog(tmp_path, 0, 2, "rl", loggers=["wandb"], config={"lr": 1e-6})
    log.write({"step": 1, "reward_mean": 0.25})
    assert calls[0]["id"] == "abc123" and calls[0]["config"] == {"lr": 1e-6} and calls[0]["resume"] == "allow"
    assert calls[1] == (1, {"reward_mean": 0.25})
    fake.util.generate_id = lambda: "other"
    run_dir.RunLog(tmp_path, 1, 2, "rl", loggers=["wandb"])
    assert calls[2]["id"] == "abc123"                        # the resumed run continues the same W&B run


def test_the_console_line_is_compact_unless_asked_for_in_full(tmp_path, capsys):
    record = {"step": 1, "epoch": 0, "loss": 0.5, "grad_norm": 1.25, "lr": 1e-5, "w_mean": 0.98, "tau_mean": 1.3,
              "frac_clamped_low": 0.25, "student_entropy_top20": 2.5, "tokens_per_s": 1000.0}
    for line in ("compact", "full"):
        (tmp_path / line).mkdir()
        log = run_dir.RunLog(tmp_path / line, 0, 2, "sft", line=line)
        log.write(record)
        log.close()
        assert json.loads((tmp_path / line / "log.jsonl").read_text()) == record     # the file keeps everything
    compact, full = capsys.readouterr().out.splitlines()
    assert compact.startswith("step 1 epoch 0 loss 0.5 lr 1e-05 grad_norm 1.25 student_entropy_top20 2.5 "
                              "tokens_per_s 1000 eta ") and "tau_mean" not in compact
    assert "tau_mean 1.3 frac_clamped_low 0.25" in full
