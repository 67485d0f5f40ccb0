"""The CPU demo end to end (demo.py --size ci), and its progress lines and table cells."""
import concurrent.futures
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import data
from demo import decisive_token as decisive
from demo import run as demo
from demo import toy
from plumbing import checkpoints

ROOT = Path(__file__).resolve().parent.parent


def test_progress_text_shows_the_step_and_an_eta_from_the_measured_speed():
    line = "step 10 epoch 0 loss 0.3125 grad_norm 1.2 lr 0.001 ce 0.31 reward_mean 0.25 zero_std_frac 0.5"
    # first step line: step 2 at t=100 (after loading); now step 10 at t=120: 0.4 steps/s, 30 to go
    assert demo.progress_text(line, 40, (2, 100.0), 120.0) == \
        "step 10/40, loss 0.3125, reward_mean 0.25, zero_std_frac 0.5, ETA 75s"
    assert demo.progress_text(line, 40, (10, 120.0), 120.0).endswith("ETA -")   # one step seen
    assert demo.progress_text(line, None, None, 20.0) == line[:110]  # no step count: the line as is
    tqdm = "generating (hf):  50%|#####     | 2/4 [00:03<00:03,  1.50s/it]"
    assert demo.progress_text(tqdm, 40, None, 5.0) == tqdm  # tqdm's own ETA
    # a stage resumed at step 1676 of 2250 that runs 1 step/s has 550 s to go, not elapsed/step x 574
    resumed = "step 1700 epoch 2 loss 0.1 lr 0.001"
    assert demo.progress_text(resumed, 2250, (1676, 10.0), 34.0).endswith("ETA 550s")


def test_cells_show_one_seed_as_is_and_several_as_mean_and_spread():
    assert demo.cell([0.5]) == "50.0%"
    assert demo.cell([0.25, 0.5, 0.75]) == "50.0% (25.0%–75.0%)"
    assert demo.cell([1.0, 2.0], "{:.2f}") == "1.50 (1.00–2.00)"
    assert demo.cell([]) == "–"
    assert demo.over_seeds([{"x": 1}, {"x": None}, {"x": 3}], lambda m: m["x"]) == [1, 3]


@pytest.fixture(autouse=True)
def own_progress(monkeypatch):
    """Each test on a Progress of its own: the module's, left with one test's plan and skipped stages, printed
    its line into a later test's stage output."""
    monkeypatch.setattr(demo, "PROGRESS", demo.Progress())


@pytest.fixture(scope="module")
def demo_ci(tmp_path_factory):
    """The ci-size demo, uninterrupted: its output folder and the finished process."""
    out = tmp_path_factory.mktemp("demo_ci") / "demo"
    proc = subprocess.run([sys.executable, "demo/run.py", "--size", "ci", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc


def test_demo_ci_runs_every_stage(demo_ci, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, proc = demo_ci
    world = out / "world"
    for name in ("train_pretrain", "train_expert", "train_rl", "test"):
        assert data.load_examples(world / f"{name}.jsonl")
    test_sources = [json.loads(line)["data_source"] for line in (world / "test.jsonl").read_text().splitlines()]
    assert test_sources.count(toy.EXPERT_FAILS) == test_sources.count(toy.EXPERT_WORKS) == 4  # --expert_fails 0.5
    assert (world / "model" / "config.json").exists()
    names = ["base", "sft", "curio", "entropy", "sft+grpo", "curio+grpo", "entropy+grpo"]
    for name in names:
        ckpts = sorted((out / "runs" / name).glob("step_*"))
        assert ckpts, f"no checkpoint for {name}"
        model = AutoModelForCausalLM.from_pretrained(ckpts[-1])
        assert model.config.vocab_size == len(AutoTokenizer.from_pretrained(ckpts[-1]))
        result = json.loads((out / "eval" / name / "results.json").read_text())
        assert set(result["benchmarks"]) == {toy.EXPERT_FAILS, toy.EXPERT_WORKS}
    assert (out / "runs" / "curio" / "log.jsonl").read_text().count("w_mean") >= 1
    # every stage's log is the one stage_log names (the interrupted-demo test below finds them by it)
    done = re.findall(r"^\[([^]]+)\] done in \d+s \(log: (.+)\)$", proc.stdout, re.M)
    assert len(done) == 20 and all(Path(log) == demo.stage_log(out / "logs", name) for name, log in done), done
    # after each, the demo's progress: 15 stages of the seed, 4 comparisons and the probe
    progress = re.findall(r"^   demo: (\d+) of (\d+) stages done, \d+s so far, about (\d+)s left$", proc.stdout, re.M)
    assert [int(n) for n, _, _ in progress] == list(range(1, 21)) and {m for _, m, _ in progress} == {"20"}
    assert progress[-1][2] == "0" and "ci demo, seed 0, threads 1 (base 2), packed rows: demo: 0 of 20" in proc.stdout

    metrics = json.loads((out / "metrics.json").read_text())
    assert list(metrics["models"]) == names and metrics["seeds"] == [0]
    vocab = len(AutoTokenizer.from_pretrained(world / "model"))
    for m in metrics["models"].values():
        assert 0 <= m["branching"]["entropy"] <= math.log(vocab) + 1e-4
        assert 0 <= m["branching"]["p_expert"] <= 1 and 0 <= m["branching"]["p_put_off"] <= 1
        for shares in m["kinds"].values():  # every sample has one kind; the mistakes graded right are some mistakes
            assert list(shares) == [*toy.FLOOR_KINDS, demo.MISTAKE_GRADED_RIGHT]
            assert math.isclose(sum(shares[k] for k in toy.FLOOR_KINDS), 1.0)
            assert 0 <= shares[demo.MISTAKE_GRADED_RIGHT] <= shares["mistake"]
    for loss in ("sft", "curio", "entropy"):  # the base, then a checkpoint every --save_every 2 of 4 batches
        assert metrics["sft"][loss]["steps"] == [0, 2, 4] and len(metrics["sft"][loss]["branching"]) == 3
    assert set(metrics["grpo"]) == {"sft+grpo", "curio+grpo", "entropy+grpo"}
    # validation while training (--eval_every 2 in SFT's 4 steps, 1 in GRPO's 1) on the toy's own questions
    for loss in ("sft", "curio", "entropy"):
        assert [r["step"] for r in metrics["validation"][loss]] == [2, 4]
        assert [r["step"] for r in metrics["validation"][f"{loss}+grpo"]] == [1]
        assert all(0 <= r["val_accuracy"] <= 1 and r["val_entropy"] >= 0
                   for name in (loss, f"{loss}+grpo") for r in metrics["validation"][name])
    val_lines = (world / "val.jsonl").read_text().splitlines()
    val_questions = {json.loads(line)["prompt"][1]["content"] for line in val_lines}
    assert len(val_questions) == 8 and not val_questions & {json.loads(line)["prompt"][1]["content"]
                                                            for line in (world / "test.jsonl").read_text().splitlines()}
    assert {"data", "base", "curio", "eval base", "curio+grpo"} <= set(metrics["seconds"])

    # branching_stats batches right-padded prompts: the same numbers as one prompt at a time. At the floor: after
    # the expert's lines that come before its dead-end line, the probability of "+" (a positive number first).
    import torch

    rows = [json.loads(line) for line in (world / "test.jsonl").read_text().splitlines()]
    ckpt = sorted((out / "runs" / "sft").glob("step_*"))[-1]
    model, tok = AutoModelForCausalLM.from_pretrained(ckpt), AutoTokenizer.from_pretrained(ckpt)

    def next_token_probs(text):
        with torch.no_grad():
            return model(torch.tensor([tok.encode(text)])).logits[0, -1].softmax(-1)

    p_expert, p_put_off = [], []
    for r in rows:
        prompt, numbers = data.build_prompt(r["prompt"][1]["content"], tok, toy.FLOOR_SYSTEM), toy.parse_floor(
            r["prompt"][1]["content"])
        p_expert.append(next_token_probs(prompt)[tok.convert_tokens_to_ids(str(numbers[0]))].item())
        expert = toy.floor_response(numbers)
        if expert.endswith(toy.FLOOR_STUCK):
            before = expert.removeprefix(data.THINK).partition(f"\n{min(numbers)}: stuck")[0]
            p_put_off.append(next_token_probs(prompt + before + "\n")[tok.convert_tokens_to_ids("+")].item())
    stats = demo.branching_stats(ckpt, rows)
    assert math.isclose(stats["p_expert"], sum(p_expert) / len(p_expert), rel_tol=1e-4)
    assert len(p_put_off) == 4 and math.isclose(stats["p_put_off"], sum(p_put_off) / len(p_put_off), rel_tol=1e-4)

    summary = (out / "summary.md").read_text()
    assert summary in proc.stdout and all(f"| {name} |" in summary for name in names)
    # the paired differences come from evaluate.py compare, on the demo's own evaluations
    assert "evaluate.py compare --a" in proc.stdout and "| A − B | avg@n |" in summary
    for a, b in demo.COMPARISONS:
        paired = json.loads((out / "compare" / f"{a}_vs_{b}" / "paired.json").read_text())
        overall = next(r for r in paired["rows"] if r["benchmark"] == "all avg" and r["metric"] == "avg")
        difference = metrics["models"][a]["avg"] - metrics["models"][b]["avg"]
        assert math.isclose(overall["difference"], difference, abs_tol=1e-12) and overall["low"] <= overall["high"]
        assert f"| {a} - {b} | {100 * difference:+.1f} [" in summary
    assert "| model | " + " | ".join(toy.FLOOR_KINDS) + " | mistake, graded right |" in summary
    assert "first-number entropy (nats) at steps 0 / 2 / 4 |" in summary
    assert "One seed: its differences depend on the machine" in summary       # beside its paired differences
    assert all(f"{mean:+.1f} ± {sd:.0f} ({name})" in summary for name, (mean, sd) in demo.SEED_SPREAD.items())
    for stage in ("== 1.", "== 2.", "== 3-5.", "== 6."):
        assert stage in proc.stdout
    plots = ("accuracy_before_after_rl.png", "pass_at_k.png", "entropy_during_sft.png", "strategy_shares.png",
             "validation_during_training.png")
    for plot in (*plots, "paired_differences.png"):
        assert (out / "plots" / plot).stat().st_size > 0
    paired = {f"{a} - {b}": json.loads((out / "compare" / f"{a}_vs_{b}" / "paired.json").read_text())
              for a, b in demo.COMPARISONS}
    assert demo.paired_plot(paired, [paired, paired], tmp_path / "seeds").name == "paired_differences.png"
    many = [paired] * (demo.SEED_BARS_UP_TO + 1)           # each seed a dot, without its interval
    assert demo.paired_plot(paired, many, tmp_path / "many").stat().st_size > 0
    # --seeds: the same tables and plots over several seeds' metrics, as mean (min-max)
    other = json.loads(json.dumps(metrics))
    other["seeds"], other["models"]["curio"]["avg"] = [1], metrics["models"]["curio"]["avg"] + 0.5
    table = demo.tables([metrics, other], paired)
    assert table.startswith("Seeds: 0, 1.") and "One seed:" not in table
    assert f"| curio | {demo.cell([metrics['models']['curio']['avg'], other['models']['curio']['avg']])} |" in table
    assert [p.name for p in demo.plots([metrics, other], tmp_path / "seeds")] == list(plots)
    third = json.loads(json.dumps(metrics))
    for m, seconds in zip((metrics, other, third), (100, 200, 900)):   # one seed's base resumed, say
        m["seconds"]["base"] = seconds
    table = demo.tables([metrics, other, third], paired)
    assert "median (min–max) over seeds" in table and "base 200 (100–900)" in table

    # The decisive-token probe (stage 7, the ci size's: two losses) on this demo's world and base: a curve per loss
    # from the base's value at step 0, its table at the end of the summary (tests/test_demo_probe.py: --grpo)
    assert "[decisive token] $ " in proc.stdout and 'P("+", put the negative off)' in summary
    probe = json.loads((out / "decisive_token" / "results.json").read_text())
    check_probe_curves(probe, before=2)
    assert probe["seed"] == 0 and "grpo" not in probe

    # Finished stages are reused, so another seed into the same --out must stop, not mix two runs (run_seed's
    # SystemExit: demo/run.py's one line and exit status 1)
    with pytest.raises(SystemExit, match="holds a run with --seed 0: use another --out"):
        demo.run_seed(demo.SIZES["ci"], out, 1)
    (out / "seed").unlink()  # as in an --out written before seeds were recorded
    with pytest.raises(SystemExit, match="holds a run with an unrecorded --seed: use another --out"):
        demo.run_seed(demo.SIZES["ci"], out, 0)


def check_probe_curves(probe: dict, before: int) -> None:
    """The probe's results.json, --steps 2 --save_every 1 --losses sft curio: a curve per loss from the base."""
    assert list(probe["p_put_off"]) == ["sft", "curio"] and probe["questions"] > 0 and probe["before"] == before
    for curve in probe["p_put_off"].values():
        assert list(curve) == ["0", "1", "2"] and all(0 <= p <= 1 for p in curve.values())
    assert probe["p_put_off"]["sft"]["0"] == probe["p_put_off"]["curio"]["0"]      # both start from the base
    assert probe["p_put_off"]["sft"]["2"] != probe["p_put_off"]["curio"]["2"]      # the losses differ


def test_models_scored_side_by_side_score_as_one_alone(demo_ci):
    """Seeds run side by side measure their checkpoints in threads at once: each gets the entropy and
    probabilities it gets alone (concurrent from_pretrained calls left a tied lm_head random)."""
    rows = [json.loads(line) for line in (demo_ci[0] / "world" / "test.jsonl").read_text().splitlines()]
    ckpt = checkpoints.latest(demo_ci[0] / "runs" / "base")
    alone = demo.branching_stats(ckpt, rows)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda _: demo.branching_stats(ckpt, rows), range(8)))
    assert together == [alone] * 8, (alone, together)


def test_a_finished_seed_reuses_its_metrics_and_measures_an_older_layout_again(demo_ci, tmp_path, monkeypatch):
    import shutil

    out = tmp_path / "demo"
    shutil.copytree(demo_ci[0], out, ignore=shutil.ignore_patterns("plots", "compare"))
    (out / "seed").write_text("0\n")                        # (test_demo_ci_runs_every_stage removes its own)
    measured, measure = [], demo.branching_stats
    monkeypatch.setattr(demo, "branching_stats", lambda ckpt, rows: measured.append(ckpt) or measure(ckpt, rows))
    monkeypatch.setattr(demo, "run_stage", lambda cmd, *args, **kwargs: pytest.fail(f"a stage ran: {cmd}"))
    recorded = json.loads((out / "metrics.json").read_text())
    assert demo.run_seed(demo.SIZES["ci"], out, 0) == recorded and not measured
    older = {key: value for key, value in recorded.items() if key != "validation"}
    (out / "metrics.json").write_text(json.dumps(older))
    again = demo.run_seed(demo.SIZES["ci"], out, 0)
    assert measured and tuple(again) == demo.METRICS_KEYS and again["seeds"] == [0]
    assert json.loads((out / "metrics.json").read_text()) == again


def run_two_seeds_of_the_ci_demo(demo_ci, out: Path, monkeypatch, losses=demo.SFT_LOSSES) -> list:
    """run() over two seeds, copies of the ci demo's finished seed (their models trained with `losses` kept), so
    that no stage runs again; evaluate.py compare stood in for by the ci run's paired.json. Returns the
    comparisons run: (tag, name, evaluations)."""
    import argparse
    import shutil

    for seed in (0, 1):
        folder = out / f"seed_{seed}"
        shutil.copytree(demo_ci[0], folder, ignore=shutil.ignore_patterns("plots", "compare", "summary.md"))
        (folder / "seed").write_text(f"{seed}\n")
        metrics = json.loads((folder / "metrics.json").read_text())
        for dropped in set(demo.SFT_LOSSES) - set(losses):
            for part in ("models", "validation"):
                metrics[part] = {name: v for name, v in metrics[part].items() if name.split("+")[0] != dropped}
            metrics["sft"].pop(dropped)
            metrics["grpo"].pop(f"{dropped}+grpo")
            metrics["seconds"] = {stage: t for stage, t in metrics["seconds"].items() if dropped not in stage}
        (folder / "metrics.json").write_text(json.dumps({**metrics, "seeds": [seed]}))
    compared = []

    def compare(cmd, logs, name, **kwargs):        # evaluate.py compare's paired.json, the ci run's numbers
        assert name.startswith("compare "), f"a stage ran: {cmd}"
        a, b = name.removeprefix("compare ").split(" - ")
        i, folder = cmd.index("--b"), Path(cmd[-1])
        paired = json.loads((demo_ci[0] / "compare" / f"{a}_vs_{b}" / "paired.json").read_text())
        paired["a"]["evaluations"], paired["b"]["evaluations"] = ([str(p) for p in cmd[cmd.index("--a") + 1:i]],
                                                                  [str(p) for p in cmd[i + 1:-2]])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "paired.json").write_text(json.dumps(paired))
        compared.append((kwargs.get("tag", ""), name, len(paired["a"]["evaluations"])))

    monkeypatch.setattr(demo, "run_stage", compare)
    monkeypatch.setitem(demo.SIZES, "ci", {**demo.SIZES["ci"], "losses": tuple(losses)})
    demo.run(argparse.Namespace(size="ci", seeds=[0, 1], seed=None, jobs=4, threads=None, no_pack=False,
                                no_probe=False), out)
    return compared


def test_a_seed_from_another_seeds_base_trains_and_evaluates_from_that_world_and_base(demo_ci, tmp_path,
                                                                                     monkeypatch):
    """run_seed(base_of=...) (the small size's seeds after the first): no data, base or base evaluation of its own;
    its SFT runs read the other folder's world and start from its base, with this seed, into its own folder."""
    base_folder = demo_ci[0]
    commands = []

    def stage(cmd, logs, name, *args, **kwargs):
        commands.append((name, [str(c) for c in cmd]))
        raise demo.StageStopped(name)                 # (the stage's outputs are not there to read)

    monkeypatch.setattr(demo, "run_stage", stage)
    with pytest.raises(demo.StageStopped):
        demo.run_seed(demo.SIZES["ci"], tmp_path / "seed_1", 1, base_of=base_folder)
    assert sorted(name for name, _ in commands) == ["curio", "entropy", "sft"]     # the base evaluated there
    world, base = base_folder / "world", checkpoints.latest(base_folder / "runs" / "base")
    for name, cmd in commands:
        assert cmd[cmd.index("--model") + 1] == str(base) and cmd[cmd.index("--seed") + 1] == "1"
        assert cmd[cmd.index("--train_file") + 1] == str(world / "train_expert.jsonl")
        assert cmd[cmd.index("--out_dir") + 1] == str(tmp_path / "seed_1" / "runs" / name)
    assert not (tmp_path / "seed_1" / "world").exists()


def test_several_seeds_run_side_by_side_and_the_summary_opens_with_what_they_support(demo_ci, tmp_path,
                                                                                     monkeypatch, capsys):
    """Each seed's comparisons under its own name, then the pooled ones over both; summary.md opens with the
    headline and holds the seed table and the probe's table."""
    out = tmp_path / "demo"
    compared = run_two_seeds_of_the_ci_demo(demo_ci, out, monkeypatch)
    names = [f"compare {a} - {b}" for a, b in demo.COMPARISONS]
    assert sorted(compared) == sorted([("", name, 2) for name in names] + [(f"seed {s} ", name, 1)
                                                                          for s in (0, 1) for name in names])
    summary = (out / "summary.md").read_text()
    assert summary.startswith("## What 2 seeds support\n") and summary in capsys.readouterr().out
    assert summary.index("CurioSFT − SFT at the end:") < summary.index("| model | avg@n |")
    assert "| mean, 95% Student's t over 2 seeds |" in summary and "\n| 1 | " in summary
    assert 'P("+", put the negative off) at the decisive token' in summary
    assert (out / "plots" / "paired_differences.png").stat().st_size > 0


def test_a_size_without_the_entropy_loss_compares_and_reports_only_the_models_it_trains(demo_ci, tmp_path,
                                                                                      monkeypatch):
    """The small size trains cross-entropy and CurioSFT only: no comparison, row or plot asks for the entropy
    loss's models."""
    assert demo.SIZES["small"]["losses"] == ("sft", "curio")
    out = tmp_path / "demo"
    compared = run_two_seeds_of_the_ci_demo(demo_ci, out, monkeypatch, losses=("sft", "curio"))
    assert sorted({name for _, name, _ in compared}) == ["compare curio - sft", "compare curio+grpo - sft+grpo"]
    summary = (out / "summary.md").read_text()
    assert "| curio+grpo | " in summary and "| sft+grpo | " in summary and "entropy+grpo" not in summary
    assert "| entropy | " not in summary and "| curio - sft | " in summary
    for plot in ("accuracy_before_after_rl", "pass_at_k", "entropy_during_sft", "strategy_shares"):
        assert (out / "plots" / f"{plot}.png").stat().st_size > 0


def two_step_stage(pause_s: float, then: str = "print('step 2 loss 0.4', flush=True)") -> list:
    """A stage's command for run_stage: it prints step 1, pauses, then runs `then`."""
    code = f"import time; print('step 1 loss 0.5', flush=True); time.sleep({pause_s}); {then}"
    return [sys.executable, "-c", code]


def test_a_running_stage_prints_its_progress(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CURIOSFT_FRESH_PROCESSES", "1")    # starts at once (a fork server's first start: seconds)
    demo.run_stage(two_step_stage(1.5), tmp_path, "sft", steps=4, every_s=0.5)
    out = capsys.readouterr().out
    assert "[sft]" in out and "step 2/4, loss 0.4, ETA" in out and "[sft] done in" in out
    assert "step 1/4" not in out  # within every_s of the start: only in the log
    assert "step 1 loss 0.5" in (tmp_path / "sft.log").read_text()


def test_a_stage_prints_each_line_in_one_write(tmp_path, monkeypatch):
    """Stages print side by side from threads: a line written in two parts (print()'s text, then its
    newline) could run into another stage's line."""
    writes = []

    class Recorder:
        def write(self, text):
            writes.append(text)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", Recorder())
    demo.run_stage(two_step_stage(0.3), tmp_path, "sft", steps=4, every_s=0.1)
    assert len(writes) >= 3 and all(w.startswith("[sft] ") and w.count("\n") == 1 and w.endswith("\n")
                                    for w in writes), writes


def test_a_stage_log_is_written_line_by_line_while_the_stage_runs(tmp_path):
    log = demo.stage_log(tmp_path, "sft")
    then = f"print('log so far:', open({str(log)!r}).read().strip(), flush=True)"
    demo.run_stage(two_step_stage(0.5, then), tmp_path, "sft", steps=2)
    assert "log so far: step 1 loss 0.5" in log.read_text()       # (tail -f follows the stage)


def test_t_quantiles_leave_two_and_a_half_and_twenty_percent_in_each_tail():
    import torch

    for quantiles, inside_want, rounding in ((demo.T_975, 0.95, 2e-4), (demo.T_80, 0.60, 3e-4)):
        for df, t in enumerate(quantiles, start=1):
            x = torch.linspace(-t, t, 40_001, dtype=torch.float64)   # the trapezoid errs by < 1e-6
            inside = torch.trapezoid(torch.distributions.StudentT(df).log_prob(x).exp(), x).item()
            assert abs(inside - inside_want) < rounding, (df, inside)     # 3 decimals' rounding


def stand_in_compare(d):
    """A stand-in for evaluate.py compare's paired.json: A - B is d over all questions (95% interval
    +- 0.01), -d where the expert's order works and 2 d where it fails."""
    return {"rows": [{"benchmark": benchmark, "metric": "avg", "difference": k * d, "low": k * d - 0.01,
                      "high": k * d + 0.01}
                     for benchmark, k in (("all avg", 1), (toy.EXPERT_WORKS, -1), (toy.EXPERT_FAILS, 2))]}


def test_seed_table_gives_each_seed_then_the_interval_across_seeds():
    differences = [0.02, -0.01, 0.03, 0.00]
    by_seed = [{f"{a} - {b}": stand_in_compare(d) for a, b in demo.COMPARISONS} for d in differences]
    pooled = {f"{a} - {b}": stand_in_compare(0.01) for a, b in demo.COMPARISONS}
    lines = demo.seed_table([{"seeds": [s]} for s in range(4)], by_seed, pooled)
    columns = len(demo.COMPARISONS)
    assert "| 1 | " + " | ".join(["-1.0 [-2.0, +0.0]"] * columns) + " |" in lines
    # mean 1.0 points, sd 1.826, t(3) = 3.182: half-width 3.182 * 1.826 / 2 = 2.9
    assert "| mean, 95% Student's t over 4 seeds | " + " | ".join(["+1.0 [-1.9, +3.9]"] * columns) + " |" in lines
    assert "| seeds where A > B | " + " | ".join(["2 of 4"] * columns) + " |" in lines
    assert any(line.endswith(" | " + " | ".join(["1.8 (-1.0 to +3.0)"] * columns) + " |") for line in lines)
    # (t(3) at 97.5% + t(3) at 80%) * sd / sqrt(4) = (3.182 + 0.978) * 1.826 / 2 = 3.8 points
    assert any(line.endswith(" | " + " | ".join(["3.8"] * columns) + " |") for line in lines)
    assert demo.t_interval([1.0, 3.0]) == (2.0, 12.706 * 2 ** 0.5 / 2 ** 0.5)
    # by kind of question, the same three across seeds: where it works negated, where it fails doubled
    works, fails = "-1.0 [-3.9, +1.9] | -1.0 [-2.0, +0.0] | 1 of 4", "+2.0 [-3.8, +7.8] | +2.0 [+1.0, +3.0] | 2 of 4"
    assert lines.count(f"| {demo.COMPARISONS[0][0]} - {demo.COMPARISONS[0][1]} | {works} | {fails} |") == 1


def test_the_spread_quoted_beside_one_seed_is_the_one_docs_demo_measured():
    docs = (ROOT / "docs" / "demo.md").read_text()

    def first_numbers(row_start):        # the number opening each comparison's cell in that row
        row = next(line for line in docs.splitlines() if line.startswith(row_start))
        return [float(cell.split()[0]) for cell in row.strip(" |").split(" | ")[1:]]

    assert "| seed | " + " | ".join(demo.SEED_SPREAD) + " |" in docs
    means, sds = first_numbers("| mean, 95% Student's t"), first_numbers("| one seed's A − B: standard deviation")
    assert list(zip(means, sds)) == list(demo.SEED_SPREAD.values())


def test_the_probes_expert_adds_two_positive_numbers_then_the_negative():
    assert decisive.positives_then_negative([2, -5, 6, 3, 1]) == [2, 6, -5, 3, 1]      # 8 - 5: through
    assert decisive.positives_then_negative([2, 1, 6, -9, 4]) == [2, 1, -9, 6, 4]      # 3 - 9: a dead end
    assert not toy.add_in_order(decisive.positives_then_negative([2, 1, 6, -9, 4]))[1]
    # the small toy's questions hold 1-4, which two numbers take past 7 only as 3 + 4: its expert adds three
    assert decisive.positives_then_negative([1, 4, -8, 2, 3], before=3) == [1, 4, 2, -8, 3]      # 7 - 8: a dead end
    assert decisive.positives_then_negative([4, 3, 1, -7, 2], before=3) == [4, 3, 1, -7, 2]      # 8 - 7: through
    rows = decisive.expert_rows(64, 0, frozenset(), before=3, positives=4)
    assert len(rows) == 64 and all(sorted(v for v in toy.parse_floor(r["prompt"][1]["content"]) if v > 0)
                                   == [1, 2, 3, 4] for r in rows)


@pytest.mark.slow
def test_an_interrupted_demo_resumes_to_the_uninterrupted_results(demo_ci, tmp_path):
    """Ctrl-C (SIGINT to the demo and its stages, as a terminal sends it) while the SFT branches train
    side by side, and again, on the rerun, while the evaluations after them run (from the uninterrupted
    run's world and base, to keep the test short; the ci size's GRPO has one step, which a stop signal
    lets finish): each time one line saying what was saved; the same command then finishes, and the
    metrics equal an uninterrupted run's. A finished demo run again trains nothing. (A stage in the main
    thread, as the base is, takes the same path: run_stage.)"""
    import shutil

    out = tmp_path / "demo"
    for part in ("world", "runs/base", "eval/base"):
        shutil.copytree(demo_ci[0] / part, out / part)
    (out / "seed").write_text("0\n")                        # (test_demo_ci_runs_every_stage removes its own)
    # without the probe, whose first line waits for its own SFT run's: the SFT branches ended before it came
    cmd = [sys.executable, "demo/run.py", "--size", "ci", "--out", str(out), "--no_probe"]

    def at_work(stage: str, printed: str, before: dict) -> bool:
        """`stage` has started, and every stage running has printed its first line (sft.py and rl.py
        once their Ctrl-C handler is in place, evaluate.py from its main): past its imports, where
        Ctrl-C would end it with a traceback. Logs count from `before`, their sizes at the start."""
        started = {line[1:line.index("] $")] for line in printed.splitlines() if "] $" in line}
        running = started - {line[1:line.index("] done")] for line in printed.splitlines() if "] done" in line}
        logs = [demo.stage_log(out / "logs", name) for name in running]
        first_lines = [log.read_text()[before.get(log, 0):] if log.exists() else "" for log in logs]
        return stage in started and all(re.search(r" kept|benchmarks:", text) for text in first_lines)

    for stage in ("curio", "eval curio"):
        printed = tmp_path / f"stdout_{stage}.txt"
        before = {log: len(log.read_text()) for log in (out / "logs").glob("*.log")}
        with open(printed, "w") as stdout_file:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=stdout_file, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True)
            deadline = time.time() + 600
            while not at_work(stage, printed.read_text(), before) and proc.poll() is None and time.time() < deadline:
                time.sleep(0.05)
            os.killpg(proc.pid, signal.SIGINT)
            stderr = proc.communicate(timeout=600)[1]
        stdout = printed.read_text()
        assert proc.returncode != 0 and "Traceback" not in stderr + stdout, stderr[-3000:]
        assert stderr.strip().splitlines()[-1].startswith("demo stopped: "), stderr[-3000:]
        assert "The same command resumes it" in stderr and f"[{stage}]" in stderr
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got, want = (json.loads((o / "metrics.json").read_text()) for o in (out, demo_ci[0]))
    got.pop("seconds"), want.pop("seconds")
    assert got == want
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "$ " not in again.stdout, again.stdout[-3000:]        # no stage runs
    assert f"every stage had finished: {out / 'metrics.json'} reused" in again.stdout        # nor any measurement


def test_a_comparison_is_reused_only_over_the_same_seeds(tmp_path, monkeypatch):
    """--seeds 0 1 into an --out that holds the comparisons of --seeds 0 redoes them; the same seeds reuse them."""
    def compare(cmd, logs, name, **kwargs):                    # evaluate.py compare's record of its inputs
        i = cmd.index("--b")
        folder = Path(cmd[-1])
        folder.mkdir(parents=True, exist_ok=True)
        record = {"a": {"evaluations": [str(p) for p in cmd[cmd.index("--a") + 1:i]]},
                  "b": {"evaluations": [str(p) for p in cmd[i + 1:-2]]}}
        (folder / "paired.json").write_text(json.dumps(record))
        runs.append(name)
        if name == "compare {} - {}".format(*demo.COMPARISONS[0]):
            time.sleep(0.3)                                   # the first comparison finishes last

    runs = []
    monkeypatch.setattr(demo, "run_stage", compare)
    one, two = [tmp_path / "seed_0" / "eval"], [tmp_path / f"seed_{s}" / "eval" for s in (0, 1)]
    demo.compare_all(one, tmp_path)
    assert len(runs) == len(demo.COMPARISONS)
    demo.compare_all(one, tmp_path)
    assert len(runs) == len(demo.COMPARISONS)                 # reused
    paired = demo.compare_all(two, tmp_path)
    assert len(runs) == 2 * len(demo.COMPARISONS)             # redone over both seeds
    assert list(paired) == [f"{a} - {b}" for a, b in demo.COMPARISONS]
    for (a, b), result in zip(demo.COMPARISONS, paired.values()):
        assert [result["a"]["evaluations"], result["b"]["evaluations"]] == [[str(e / a) for e in two],
                                                                          [str(e / b) for e in two]]


def test_the_paired_plot_draws_the_t_interval_over_the_seeds_and_each_seed(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(demo, "save_png", lambda fig, path, dpi: figures.append(fig) or path)
    names = [f"{a} - {b}" for a, b in demo.COMPARISONS]
    for differences in ([0.02, -0.01, 0.03, 0.00], [0.02, -0.01, 0.03, 0.00] * 3):
        by_seed = [{name: stand_in_compare(d) for name in names} for d in differences]
        demo.paired_plot({name: stand_in_compare(0.01) for name in names}, by_seed, tmp_path)
        ax = figures[-1].axes[0]
        bars = {c.get_label(): c for c in ax.containers}
        t = bars["mean, Student's t over seeds"]
        mean, half = demo.t_interval(differences)
        assert t.lines[0].get_xdata()[0] == pytest.approx(100 * mean)
        (low, _), (high, _) = t.lines[2][0].get_segments()[0]
        assert (low, high) == pytest.approx((100 * (mean - half), 100 * (mean + half)))
        # each seed a bar up to SEED_BARS_UP_TO seeds, above it a dot: the bars are the two means'
        assert len(ax.containers) == 2 * len(names) + len(names) * len(differences) * (
            len(differences) <= demo.SEED_BARS_UP_TO)


def test_no_stage_starts_after_ctrl_c(tmp_path, monkeypatch):
    """A stage that got Ctrl-C in its last data batch may finish normally: the demo must then start nothing more
    (the stages after it would not have seen the signal)."""
    import threading

    monkeypatch.setattr(demo, "STOPPING", threading.Event())
    assert demo.run_stage([sys.executable, "-c", "print('ran')"], tmp_path, "a") >= 0
    demo.STOPPING.set()
    with pytest.raises(demo.StageStopped, match=r"^\[b\] not started$"):
        demo.run_stage([sys.executable, "-c", "print('ran')"], tmp_path, "b")
    assert not (tmp_path / "b.log").exists()


def test_slots_run_at_most_their_capacity_of_threads_and_a_wider_stage_alone():
    import threading

    slots, lock, running, most = demo.Slots(2), threading.Lock(), [0], [0]

    def stage(n):
        with slots.held(n):
            with lock:
                running[0] += n
                most[0] = max(most[0], running[0])
            time.sleep(0.05)
            with lock:
                running[0] -= n

    threads = [threading.Thread(target=stage, args=(n,)) for n in (1, 1, 1, 2, 1, 3, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads) and slots.used == 0
    assert most[0] == 3          # the 3-thread stage ran, alone; no two others together passed 2


def test_progress_gives_the_time_left_from_the_work_done_so_far(monkeypatch):
    progress = demo.Progress(cores=2)
    progress.plan(100.0, 4)
    assert progress.line().endswith("0 of 4 stages done, 0s so far, about 50s left")   # 100 s of one core, on 2
    monkeypatch.setattr(progress, "t0", time.time() - 30)
    progress.running("a", 10.0)                     # a stage a quarter through its 40 s
    progress.finished("b", 10.0)
    # 20 of 100 done in 30 s: 80 left take 120 s
    assert "1 of 4 stages done, 30s so far, about 120s left" in progress.line()
    progress.skipped(40.0)                          # found done: its work leaves the plan
    assert "1 of 3 stages done, 30s so far, about 60s left" in progress.line()


def stand_in_metrics(seed, sft_entropy, curio_entropy):
    """metrics.json's fields that headline() reads: the first number's entropy of each model, and along SFT."""
    def branching(entropy):
        return {"branching": {"entropy": entropy}}

    return {"seeds": [seed], "models": {"base": branching(1.4), "sft": branching(sft_entropy),
                                        "curio": branching(curio_entropy)},
            "sft": {loss: {"steps": [0, 16, 32], "branching": [{"entropy": 1.4}, {"entropy": 2 * e}, {"entropy": e}]}
                    for loss, e in (("sft", sft_entropy), ("curio", curio_entropy))}}


def test_the_headline_gives_each_claim_as_a_mean_over_seeds_with_its_interval():
    metrics = [stand_in_metrics(s, 0.05, 0.05 + d) for s, d in enumerate([0.02, 0.04, 0.06, 0.08])]
    by_seed = [{f"{a} - {b}": stand_in_compare(d) for a, b in demo.COMPARISONS} for d in [0.02, -0.01, 0.03, 0.00]]
    lines = "\n".join(demo.headline(metrics, by_seed))
    assert lines.startswith("## What 4 seeds support")
    # CurioSFT - SFT in nats at the end: mean 0.05, sd 0.0258, t(3) 3.182: half-width 0.041
    assert "CurioSFT − SFT at the end: +0.050 [+0.009, +0.091], above 0 on 4 of 4 seeds" in lines
    # along SFT the stand-in's entropies are 2e and e: 1.5 times the differences, the interval too
    assert "(steps 16-32), on average: +0.075 [+0.013, +0.137], above 0 on 4 of 4 seeds" in lines
    assert "the base 1.40, after SFT 0.050, after CurioSFT 0.100" in lines
    # by kind (stand_in_compare: twice the difference where the expert's order fails, minus it where it works)
    assert "is a dead end: +2.0 [-3.8, +7.8], above 0 on 2 of 4 seeds; where it works: -1.0 [-3.9, +1.9]" in lines
    assert "SFT+GRPO: +1.0 [-1.9, +3.9], above 0 on 2 of 4 seeds." in lines
    # each bold claim is what its interval shows: above zero, holding it, below it
    assert ("**Base − SFT: SFT takes the exploring away (the interval excludes zero); CurioSFT − SFT at the end: "
            "CurioSFT keeps more of it (the interval excludes zero); along SFT: CurioSFT keeps more of it (the "
            "interval excludes zero).**") in lines
    assert ("**CurioSFT − SFT before RL, where the expert's order is a dead end: the interval holds zero; where it "
            "works: the interval holds zero**") in lines
    assert "**After GRPO, the paper's question: the interval holds zero.**" in lines
    far = [{name: stand_in_compare(d) for name in by_seed[0]} for d in [0.05, 0.06, 0.07, 0.08]]
    assert ("**After GRPO, the paper's question: CurioSFT+GRPO above (the interval excludes zero).**"
            in "\n".join(demo.headline(metrics, far)))
    below = [stand_in_metrics(s, 0.05 + d, 0.05) for s, d in enumerate([0.02, 0.04, 0.06, 0.08])]
    assert ("CurioSFT − SFT at the end: the reverse (the interval is below zero); along SFT: the reverse (the "
            "interval is below zero).**") in "\n".join(demo.headline(below, by_seed))


def test_a_folder_run_at_another_size_or_float_order_is_refused(tmp_path):
    out = tmp_path / "seed_0"
    out.mkdir()
    (out / "seed").write_text("0\n")
    small = demo.with_float_order(demo.SIZES["small"], None, False)
    (out / "settings.json").write_text(json.dumps({"size": "small", "float_order": demo.float_order(small)}))
    for size, message in ((demo.SIZES["ci"], "holds a run with size small, not ci"),
                          (demo.with_float_order(demo.SIZES["small"], 2, False),
                           "float_order threads 1 (base 1), packed rows, not threads 2 (base 2), packed rows"),
                          (demo.with_float_order(demo.SIZES["small"], None, True), "not threads 1 (base 1), padded")):
        with pytest.raises(SystemExit, match=re.escape(message)):
            demo.run_seed(size, out, 0)
    padded = demo.with_float_order(demo.SIZES["small"], None, True)
    assert all(padded[stage][-1] == "--no-pack" for stage in ("pretrain", "sft", "rl"))
    assert "--no-pack" not in demo.SIZES["small"]["sft"]                   # (a copy: the size itself unchanged)
