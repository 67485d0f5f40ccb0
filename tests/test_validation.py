"""Validation during training (--eval_every, measure.validate): the val_* records at their steps, the training
unchanged by them, an evaluation interrupted and rerun, a bad eval file refused before anything is written."""
import json

import pytest
import torch
from safetensors.torch import load_file

import curio_loss as cl
import measure
import rl
import sft
from plumbing import checkpoints, generation, models, run_dir
from plumbing.cli import parse_config
from tests.conftest import toy_rows

TIMED = ("tokens_per_s", "step_time_s", "val_s")


def untimed(out):
    return [{k: v for k, v in json.loads(line).items() if k not in TIMED and not k.endswith("_s")}
            for line in (out / "log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def eval_file(tmp_path_factory):
    """Six questions from two sources: the per-source fields appear."""
    rows = toy_rows(6, seed=7)
    for i, row in enumerate(rows):
        row["data_source"] = "toy_a" if i % 2 else "toy_b"
    path = tmp_path_factory.mktemp("eval") / "val.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sft_args(model_dir, train_file, out, *flags):
    return parse_config(sft.Args, cl.LossConfig, argv=[
        "config/sft_tiny.py", "--model", str(model_dir), "--scratch", "--train_file", str(train_file),
        "--out_dir", str(out), "--token_budget", "1024", "--max_steps", "4", "--eval_max_new_tokens", "6",
        "--gen_batch_size", "6", *flags])


def run_sft(model_dir, train_file, out, *flags):
    args, cfg = sft_args(model_dir, train_file, out, *flags)
    sft.train(args, cfg, torch.device("cpu"))


@pytest.fixture(autouse=True)
def quick_grader(monkeypatch):
    """The real grader's processes take seconds to start: one in-process stand-in that grades by the text, so
    that the scores still depend on the samples."""
    monkeypatch.setattr(measure, "grade", lambda texts, *args: ([float(len(t) % 2) for t in texts], 0))
    monkeypatch.setattr(rl, "grade", lambda texts, *args: ([float(len(t) % 2) for t in texts], 0))


def test_sft_validates_at_its_steps_and_trains_as_without(world_of_one, tiny_model_dir, toy_sft_file, eval_file,
                                                          tmp_path, one_thread):
    run_sft(tiny_model_dir, toy_sft_file, tmp_path / "plain")
    run_sft(tiny_model_dir, toy_sft_file, tmp_path / "val", "--eval_every", "2", "--eval_file", str(eval_file))
    plain, val = untimed(tmp_path / "plain"), untimed(tmp_path / "val")
    assert [r for r in val if "val_accuracy" not in r] == plain            # every training field, bit for bit
    evals = [r for r in val if "val_accuracy" in r]
    assert [r["step"] for r in evals] == [2, 4]
    for r in evals:
        assert 0 <= r["val_accuracy"] <= 1 and r["val_entropy"] > 0 and 1 <= r["val_response_len"] <= 6
        assert {"val_accuracy/toy_a", "val_accuracy/toy_b", "val_entropy/toy_a"} <= r.keys()   # two sources
    final = [load_file(checkpoints.latest(tmp_path / d) / "model.safetensors") for d in ("plain", "val")]
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])
    samples = [json.loads(line) for line in (tmp_path / "val" / "val_samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [2] * 6 + [4] * 6
    assert {s["data_source"] for s in samples} == {"toy_a", "toy_b"} and all("score" in s for s in samples)
    # the pooled accuracy is the samples' mean score
    assert evals[0]["val_accuracy"] == pytest.approx(sum(s["score"] for s in samples[:6]) / 6)
    # the step-4 model samples otherwise than the step-2 one: the engine got the trainer's weights
    assert [s["response"] for s in samples[:6]] != [s["response"] for s in samples[6:]]


def test_an_evaluation_interrupted_is_repeated_and_a_finished_run_does_nothing(
        world_of_one, tiny_model_dir, toy_sft_file, eval_file, tmp_path, one_thread, monkeypatch):
    """A crash inside the step-4 evaluation (after step 2's checkpoint and step 3's evaluation): the rerun redoes
    steps 3 and 4 with their evaluations, and log.jsonl and val_samples.jsonl end as an uninterrupted run's; a
    third run evaluates nothing."""
    flags = ["--eval_every", "1", "--eval_file", str(eval_file), "--save_every", "2"]
    run_sft(tiny_model_dir, toy_sft_file, tmp_path / "whole", *flags)
    measured, calls = measure.measure_benchmarks, []

    def crash_on_fourth(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("killed during the evaluation")
        return measured(*args, **kwargs)

    monkeypatch.setattr(measure, "measure_benchmarks", crash_on_fourth)
    out = tmp_path / "crashed"
    with pytest.raises(RuntimeError, match="killed"):
        run_sft(tiny_model_dir, toy_sft_file, out, *flags)
    run_dir.release()                                          # the crashed run's lock (a new process has none)
    assert [p.name for p in checkpoints.complete(out)] == ["step_000002"]
    assert [r["step"] for r in untimed(out) if "val_accuracy" in r] == [1, 2, 3]
    monkeypatch.setattr(measure, "measure_benchmarks", measured)
    run_sft(tiny_model_dir, toy_sft_file, out, *flags)
    assert untimed(out) == untimed(tmp_path / "whole")
    val_samples = [(d / "val_samples.jsonl").read_text() for d in (out, tmp_path / "whole")]
    assert val_samples[0] == val_samples[1]
    monkeypatch.setattr(measure, "measure_benchmarks", crash_on_fourth)   # a finished run evaluates nothing
    calls.clear()
    run_sft(tiny_model_dir, toy_sft_file, out, *flags)
    assert calls == [] and untimed(out) == untimed(tmp_path / "whole")


def test_rl_validates_with_its_rollout_engine_and_trains_as_without(world_of_one, checkpoint, toy_sft_file,
                                                                    eval_file, tmp_path, one_thread):
    def args(out, **kw):
        return rl.Args(model=str(checkpoint), train_file=str(toy_sft_file), out_dir=str(out), steps=2,
                       prompts_per_step=2, rollouts=2, mini_batch=2, micro_batch=8, max_prompt_len=512,
                       max_response_len=6, bf16=False, grad_ckpt=False, loss_chunk=512, engine="hf", save_every=0,
                       grader_workers=1, eval_max_new_tokens=6, **kw)

    rl.train(args(tmp_path / "plain"), world_of_one)
    rl.train(args(tmp_path / "val", eval_every=1, eval_file=str(eval_file), eval_n=2), world_of_one)
    plain, val = untimed(tmp_path / "plain"), untimed(tmp_path / "val")
    assert [r for r in val if "val_accuracy" not in r] == plain
    assert [r["step"] for r in val if "val_accuracy" in r] == [1, 2]
    for name in ("rollouts.jsonl", "step_000002/model.safetensors"):
        assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "val" / name).read_bytes()
    samples = (tmp_path / "val" / "val_samples.jsonl").read_text().splitlines()
    assert len(samples) == 2 * 6 * 2                                     # 2 evaluations x 6 questions x eval_n


@pytest.mark.parametrize("problem", ["no answer", "missing file", "no eval file"])
def test_a_bad_eval_file_is_refused_before_anything_is_written(world_of_one, tiny_model_dir, toy_sft_file,
                                                               tmp_path, problem):
    bad = tmp_path / "val.jsonl"
    rows = toy_rows(3)
    del rows[1]["reward_model"]["ground_truth"]
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    flags = {"no answer": ["--eval_file", str(bad)], "missing file": ["--eval_file", str(tmp_path / "none.jsonl")],
             "no eval file": []}[problem]
    out = tmp_path / "run"
    with pytest.raises((SystemExit, ValueError, FileNotFoundError)) as refused:
        run_sft(tiny_model_dir, toy_sft_file, out, "--eval_every", "2", *flags)
    if problem == "no eval file":
        assert "--eval_every 2: needs --eval_file" in str(refused.value)
    else:                                                      # evaluate.py's own message (its loader's)
        with pytest.raises((ValueError, FileNotFoundError)) as by_evaluate:
            measure.load_benchmarks(flags[1])
        assert str(refused.value) == str(by_evaluate.value)
        assert "row 1" in str(refused.value) or "no such file" in str(refused.value)
    assert not out.exists()


def test_validation_leaves_the_trainings_random_stream_as_it_was(world_of_one, checkpoint, eval_file, tmp_path,
                                                                 monkeypatch):
    """Whatever the engine draws from torch's global generator, the training's stream continues as without it
    (fork_rng): the trainers' own draws (data order, scratch weights) stay those of a run without --eval_every."""
    engine, tokenizer = generation.load_engine(str(checkpoint), "hf")
    settings = measure.eval_settings(rl.Args(eval_max_new_tokens=4), batch_size=6)
    questions = measure.load_eval_file(str(eval_file), tokenizer, settings)
    model = models.shard_model(models.load_full_model(str(checkpoint), scratch=False, seed=0), torch.device("cpu"),
                               bf16=False, grad_ckpt=False)
    measured = measure.measure_benchmarks
    monkeypatch.setattr(measure, "measure_benchmarks", lambda *a, **k: (torch.rand(5), measured(*a, **k))[1])
    state = torch.get_rng_state()
    fields = measure.validate(engine, model, tokenizer, questions, settings, 3, None, tmp_path / "s.jsonl")
    assert torch.equal(torch.get_rng_state(), state) and fields["step"] == 3


def test_evaluate_plot_draws_validation_curves_rl_after_its_sft_run(tmp_path, monkeypatch):
    """evaluate.py plot --logs: validation.png, the RL run's curve continuing its SFT run's after that run's last
    step (its --model is one of the SFT run's checkpoints), dashed, in the same colour."""
    from plumbing import report

    result = {"name": "x", "benchmarks": {"math": {"avg": 0.9, "pass_at_k": {"1": 0.9}}},
              "summary": {"id_avg": None, "ood_avg": None, "avg": 0.9, "entropy": 0.1, "diversity": 0.2}}
    sft_dir, rl_dir = tmp_path / "sft", tmp_path / "grpo"
    for d, rows, model in ((sft_dir, [{"step": s, "loss": 1.0, "student_entropy_top20": 0.3} for s in (1, 2, 3, 4)]
                            + [{"step": s, "val_accuracy": 0.1 * s, "val_entropy": 0.5, "val_response_len": 9}
                               for s in (2, 4)], "base"),
                           (rl_dir, [{"step": 1, "zero_std_frac": 0.5, "reward_mean": 0.5, "entropy": 0.1},
                                     {"step": 1, "val_accuracy": 0.6, "val_entropy": 0.4, "val_response_len": 8}],
                            str(sft_dir / "step_000004"))):
        d.mkdir()
        (d / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (d / "run_config.json").write_text(json.dumps({"model": model}))
    drawn = {}
    save = report._save

    def keep_lines(fig, path):
        if path.name == "validation.png":
            drawn.update({ax.get_title(): [(list(line.get_xdata()), list(line.get_ydata()), line.get_color(),
                                            line.get_linestyle()) for line in ax.get_lines()] for ax in fig.axes})
        return save(fig, path)

    monkeypatch.setattr(report, "_save", keep_lines)
    logs = [str(sft_dir / "log.jsonl"), str(rl_dir / "log.jsonl")]
    written = report.plot_results([result], str(tmp_path / "out"), logs)
    assert (tmp_path / "out" / "validation.png").is_file() and str(tmp_path / "out" / "validation.png") in written
    (sft_x, sft_y, sft_colour, sft_style), (rl_x, rl_y, rl_colour, rl_style) = drawn["validation accuracy"]
    assert sft_x == [2, 4] and sft_y == pytest.approx([20, 40]) and sft_style == "-"
    assert rl_x == [5] and rl_y == pytest.approx([60]) and rl_colour == sft_colour and rl_style == "--"
