"""A run stopped and run again is the run uninterrupted: SIGTERM at several points of sft.py and rl.py, a finished
run asked for more steps, rl.py's samples whatever --gen_batch_size. The half of tests/test_reliability.py that runs
beside it (--dist loadfile keeps a file on one worker), with its helpers."""
import json

from test_reliability import ONE_THREAD, final_weights, run_sft, stop_at, untimed_log


def test_sigterm_at_several_points_resumes_to_the_uninterrupted_run(tiny_model_dir, toy_sft_file, tmp_path):
    """Stopped after step 1 (a first data batch), again after step 4 (the next epoch's first), then run
    to the end: the same log and the same final weights, byte for byte, as one uninterrupted run."""
    flags = ["--max_steps", "6", "--epochs", "2", "--save_every", "0"]
    run_sft(tiny_model_dir, toy_sft_file, tmp_path / "whole", *flags)
    stopped = tmp_path / "stopped"
    sft_flags = ["config/sft_tiny.py", "--model", str(tiny_model_dir), "--scratch", "--train_file",
                 str(toy_sft_file), "--loss", "curio", *flags]
    for step in (1, 4):
        stop_at(step, "sft.py", stopped, *sft_flags)
    run_sft(tiny_model_dir, toy_sft_file, stopped, *flags)           # the same command resumes
    assert not (stopped / "stopped").exists()
    whole, resumed = tmp_path / "whole" / "step_000006", stopped / "step_000006"
    assert (whole / "model.safetensors").read_bytes() == (resumed / "model.safetensors").read_bytes()
    assert untimed_log(stopped) == untimed_log(tmp_path / "whole") and len(untimed_log(stopped)) == 6


def test_rl_stopped_at_several_points_resumes_to_the_uninterrupted_run(checkpoint, toy_sft_file, tmp_path):
    """rl.py stopped by SIGTERM after step 1 and after step 3 of 4, each time rerun: its log, its
    rollouts and its final weights equal an uninterrupted run's."""
    flags = ["config/rl_tiny.py", "--model", str(checkpoint), "--train_file", str(toy_sft_file),
             "--steps", "4", "--rollouts", "2", "--max_response_len", "8", "--grader_workers", "1",
             "--save_every", "0"]
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    toy = {**ONE_THREAD, "TOY_GRADE": "1"}
    stop_at(0, "rl.py", whole, *flags, env=toy, exit_status=0)
    for step in (1, 3):
        stop_at(step, "rl.py", stopped, *flags, env=toy)
    stop_at(0, "rl.py", stopped, *flags, env=toy, exit_status=0)     # the same command resumes
    assert any(r["grad_norm"] > 0 for r in untimed_log(whole))       # the updates moved the weights
    assert untimed_log(stopped) == untimed_log(whole) and len(untimed_log(whole)) == 4
    assert (stopped / "rollouts.jsonl").read_text() == (whole / "rollouts.jsonl").read_text()
    weights = [(out / "step_000004" / "model.safetensors").read_bytes() for out in (whole, stopped)]
    assert weights[0] == weights[1]


def test_a_finished_run_asked_for_more_steps_goes_on_as_one_run_or_refuses(tiny_model_dir, toy_sft_file, tmp_path):
    """--max_steps 2, then 4: the same log and weights as one run to 4 (the schedule spans every epoch, the data
    plan is the step's), though the first part also ran with the other settings a resume may change (sft.py's
    MAY_CHANGE_ON_RESUME). Asked for fewer steps than it ran, or more after an end inside a data batch (the next
    run would skip the rest of it): one line refuses, and nothing is reported complete."""
    whole, on, mid = tmp_path / "whole", tmp_path / "on", tmp_path / "mid"
    run_sft(tiny_model_dir, toy_sft_file, whole, "--max_steps", "4")
    run_sft(tiny_model_dir, toy_sft_file, on, "--max_steps", "2", "--save_every", "1", "--keep_last", "1",
            "--log_every", "2", "--grad_ckpt", "--log_line", "full", "--dist_timeout_min", "5")
    proc = run_sft(tiny_model_dir, toy_sft_file, on, "--max_steps", "4")
    assert f"{on}: complete at step 2; going on to step 4 (--max_steps)" in proc.stdout, proc.stdout[-2000:]
    assert final_weights(on, 4) == final_weights(whole, 4)
    assert untimed_log(on) == [r for r in untimed_log(whole) if r["step"] != 2]     # --log_every 2: not step 2
    assert json.loads((on / "complete.json").read_text()) == {"step": 4}
    proc = run_sft(tiny_model_dir, toy_sft_file, on, "--max_steps", "3", check=False)
    assert proc.returncode == 1 and proc.stderr == (f"{on}: the run there is at step 4, past the 3 asked for "
                                                    "(--max_steps): ask for 4 or more, or choose another --out_dir\n")
    split = ["--updates_per_batch", "2", "--token_budget", "96"]          # two updates per data batch
    run_sft(tiny_model_dir, toy_sft_file, mid, "--max_steps", "3", *split)
    proc = run_sft(tiny_model_dir, toy_sft_file, mid, "--max_steps", "4", *split, check=False)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "step 3 is inside a data batch (--updates_per_batch 2), whose remaining updates would be skipped" \
        in proc.stderr and "complete" not in proc.stdout
    assert json.loads((mid / "complete.json").read_text()) == {"step": 3}     # the run as it was


def test_gen_batch_size_changes_no_sample_in_a_fresh_run_or_on_resume(checkpoint, toy_sft_file, tmp_path):
    """rl.py's samples draw from a seed per prompt and sample: runs with --gen_batch_size 8 (one generate call a
    step) and 1 (eight) give the same rollouts.jsonl, log and weights; so does a run finished at step 1 with 1
    and asked for 3 with 8 (it goes on: the learning rate is constant, prompts and seeds follow the step), its
    first step run with other settings a resume may change too (rl.py's MAY_CHANGE_ON_RESUME)."""
    flags = ["config/rl_tiny.py", "--model", str(checkpoint), "--train_file", str(toy_sft_file), "--rollouts", "2",
             "--max_response_len", "8", "--grader_workers", "1", "--save_every", "0", "--log_rollouts", "8"]
    toy = {**ONE_THREAD, "TOY_GRADE": "1"}
    runs = {name: tmp_path / name for name in ("eight", "one", "on")}
    stop_at(0, "rl.py", runs["eight"], *flags, "--steps", "3", "--gen_batch_size", "8", env=toy, exit_status=0)
    stop_at(0, "rl.py", runs["one"], *flags, "--steps", "3", "--gen_batch_size", "1", env=toy, exit_status=0)
    stop_at(0, "rl.py", runs["on"], *flags, "--steps", "1", "--gen_batch_size", "1", "--save_every", "1",
            "--keep_last", "1", "--grad_ckpt", "--log_line", "full", "--sync_bucket_mb", "1", env=toy, exit_status=0)
    stop_at(0, "rl.py", runs["on"], *flags, "--steps", "3", "--gen_batch_size", "8", env=toy, exit_status=0)
    rollouts = {name: (run / "rollouts.jsonl").read_text() for name, run in runs.items()}
    assert len(rollouts["eight"].splitlines()) == 3 * 8
    assert rollouts["one"] == rollouts["eight"] and rollouts["on"] == rollouts["eight"]
    # the engine check's figures too: the HF engine's log-probs come from a forward of each sample alone
    logs = [untimed_log(runs[name]) for name in ("one", "eight", "on")]
    assert logs[0] == logs[1] == logs[2]
    assert final_weights(runs["one"], 3) == final_weights(runs["eight"], 3) == final_weights(runs["on"], 3)
