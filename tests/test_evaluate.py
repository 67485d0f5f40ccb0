"""evaluate.py: pass@k, diversity, HF generation, expert-token entropy, the wiring of the grader (grading.py, tested in
test_grader.py), and an end-to-end CPU evaluation of a tiny random Qwen2 with tables and plots."""
import dataclasses
import itertools
import json
import math
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import evaluate as ev  # noqa: E402
import measure  # noqa: E402
from data import Example, build_prompt  # noqa: E402
from plumbing.synthetic import build_toy_tokenizer  # noqa: E402
from plumbing import cli, generation, report
from plumbing import paired_stats as ps


# ---------------------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_pass_at_k_equals_subset_enumeration(n):
    for c in range(n + 1):
        outcomes = [1] * c + [0] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(outcomes, k))
            brute = sum(any(s) for s in subsets) / len(subsets)
            assert ps.pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12), (n, c, k)


def test_pass_at_k_large_n_is_stable():
    exact = 1 - math.comb(1000 - 7, 300) / math.comb(1000, 300)  # Python ints: exact
    assert ps.pass_at_k(1000, 7, 300) == pytest.approx(exact, rel=1e-12)


def _sample(ids, entropy=0.5, finish="stop"):
    return generation.Sample(ids, "", [-1.0] * len(ids), [entropy] * len(ids), finish)


def test_benchmark_metrics_avg_pass_length_entropy():
    scores = [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]]
    samples = [[_sample([q, j, 9, 9, 9][: 2 + j]) for j in range(4)] for q in range(3)]
    m = measure.benchmark_metrics(samples, scores)
    assert m["avg"] == pytest.approx(6 / 12)  # avg@4
    assert list(m["pass_at_k"]) == ["1", "2", "4"]
    assert m["pass_at_k"]["1"] == pytest.approx(m["avg"])  # unbiased pass@1 is avg@n
    assert m["pass_at_k"]["2"] == pytest.approx((ps.pass_at_k(4, 2, 2) + 0 + 1) / 3)
    assert m["pass_at_k"]["4"] == pytest.approx(2 / 3)
    assert m["response_length"] == pytest.approx((2 + 3 + 4 + 5) / 4)
    assert m["entropy"] == pytest.approx(0.5) and m["truncated"] == 0.0
    # per-question accuracy 1/2, 0, 1: sample standard deviation 1/2 over 3 questions; one question of 3 mixed
    assert m["avg_stderr"] == pytest.approx(0.5 / math.sqrt(3)) and m["mixed_frac"] == pytest.approx(1 / 3)
    one = measure.benchmark_metrics(samples[:1], scores[:1])
    assert one["avg_stderr"] is None and one["mixed_frac"] == 1.0        # one question: no spread to measure
    table = report.results_table({"name": "x", "benchmarks": {"aime": m}, "summary": {"id_avg": 0.5, "ood_avg": None},
                                  "grader_failures": 0})
    assert "| avg@n | s.e. | pass@1 | pass@2 | pass@4 | mixed |" in table
    assert "| aime | 3 | 4 | 50.0 | 28.9 | 50.0 |" in table and "| 66.7 | 33.3 | 4 |" in table
    assert list(measure.benchmark_metrics(samples, [q[:3] for q in scores])["pass_at_k"]) == ["1", "2", "3"]


def test_ngram_diversity():
    a, b = [1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]
    assert measure.ngram_diversity([a, a, a]) == 0.0
    assert measure.ngram_diversity([a, b]) == 1.0
    # 4-grams {1234, 2345} vs {1234, 2346}: Jaccard 1/3
    assert measure.ngram_diversity([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6]]) == pytest.approx(2 / 3)
    # mean over the three pairs: (1 - 1) + (1 - 0) + (1 - 0), / 3
    assert measure.ngram_diversity([a, a, b]) == pytest.approx(2 / 3)
    assert measure.ngram_diversity([[1, 2], [1, 2]]) == 0.0 and measure.ngram_diversity([[1, 2], [2, 1]]) == 1.0
    assert measure.ngram_diversity([a]) is None


T = "<think>\nlet me think\n</think>\n"  # grading.py's own tests: tests/test_grader.py


# ---------------------------------------------------------------------------------------------------------
# Tiny model: generation, expert-token entropy, end to end
# ---------------------------------------------------------------------------------------------------------
QUESTIONS = ["What is 2+3?", "Compute 7*6.", "What is 10-4?", "Simplify 1/2 + 1/2."]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    texts = [build_prompt(q) + "Add them.\n</think>\nThe answer is \\boxed{5}." for q in QUESTIONS] * 20
    tok = build_toy_tokenizer(texts, vocab_size=400)
    cfg = transformers.Qwen2Config(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, intermediate_size=128, max_position_embeddings=512)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ckpt") / "tiny-qwen2"
    transformers.Qwen2ForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_hf_generation_samples(checkpoint):
    engine, tok = generation.load_engine(checkpoint, "hf")
    prompts = [build_prompt(q, tok) for q in QUESTIONS[:2]]
    out = generation.generate(engine, tok, prompts, n=3, max_new_tokens=12, seed=1)
    assert [len(q) for q in out] == [3, 3]
    for s in (s for q in out for s in q):
        assert 1 <= len(s.token_ids) <= 12 and len(s.logprobs) == len(s.entropy) == len(s.token_ids)
        assert all(lp <= 1e-6 for lp in s.logprobs) and all(0 <= h <= math.log(len(tok)) + 1e-4 for h in s.entropy)
        assert (s.finish_reason == "stop") == (s.token_ids[-1] == tok.eos_token_id)
    again = generation.generate(engine, tok, prompts, n=3, max_new_tokens=12, seed=1)
    assert [[s.token_ids for s in q] for q in again] == [[s.token_ids for s in q] for q in out]  # seeded
    # A tiny nucleus keeps only the top token: the sampling distribution is one-hot, entropy 0, log-prob 0.
    greedy = generation.generate(engine.model, tok, prompts[:1], n=2, top_p=1e-6, max_new_tokens=8)[0]
    assert greedy[0].token_ids == greedy[1].token_ids
    assert max(map(abs, greedy[0].entropy + greedy[0].logprobs)) < 1e-5


def test_expert_token_entropy(checkpoint):
    engine, tok = generation.load_engine(checkpoint, "hf")
    examples = [Example(q, "5", f"Step {i}. </think> \\boxed{{5}}", "toy", i) for i, q in enumerate(QUESTIONS)]
    e = ev.expert_token_entropy(engine.model, tok, examples)
    assert e["tokens"] == sum(len(tok(ex.response, add_special_tokens=False)["input_ids"]) + 1 for ex in examples)
    assert e["top20"] >= e["all"] >= e["bottom80"] > 0
    torch.nn.init.zeros_(engine.model.get_output_embeddings().weight)  # uniform next-token distribution
    uniform = ev.expert_token_entropy(engine.model, tok, examples)
    assert uniform["all"] == pytest.approx(math.log(engine.model.config.vocab_size), rel=1e-5)


def _write_sft_data(root: Path) -> Path:
    """An SFT file of the QUESTIONS with one short expert answer each (--sft_data's expert-token entropy)."""
    sft = root / "sft.jsonl"
    sft.write_text("".join(json.dumps({"data_source": "toy", "prompt": [{"role": "user", "content": q}],
                                       "reward_model": {"ground_truth": "5"},
                                       "target": [{"role": "assistant", "content": "<think>\nAdd.</think> 5"}]}) + "\n"
                           for q in QUESTIONS))
    return sft


def _write_benchmarks(root: Path) -> Path:
    def row(source, question, gt):
        return {"data_source": source, "prompt": [{"role": "system", "content": "sys"},
                                                  {"role": "user", "content": question}],
                "ability": "math", "reward_model": {"ground_truth": gt, "style": "rule"},
                "extra_info": {"index": 0, "split": "test"}}

    bench = root / "bench"
    bench.mkdir()
    math_rows = [row("math", QUESTIONS[0], "5"), row("math", QUESTIONS[1], "42"), row("aime", QUESTIONS[2], "6"),
                 row("aime", QUESTIONS[2], "6"), row("aime", QUESTIONS[3], "1")]  # one repeated question
    (bench / "valid.all.jsonl").write_text("".join(json.dumps(r) + "\n" for r in math_rows))
    pd.DataFrame([row("arc_c", "Which is a mammal?\nA) cod\nB) cat", "B")]).to_parquet(bench / "valid.arc_c.parquet")
    (bench / "README.txt").write_text("not a benchmark file")
    return bench


def test_stage_pairs_match_names_and_skip_missing_accuracy():
    def result(name, avg=0.5):
        return {"name": name, "summary": {"avg": avg}}

    results = [result("sft"), result("curio", None), result("sft+grpo"), result("curio+grpo"), result("dft+grpo"),
               result("sft+grpo+grpo"), result("base")]
    pairs = [(b["name"], a["name"]) for b, a in report.stage_pairs(results, "avg")]
    # curio has no accuracy, dft was not evaluated, base has no later stage; "+" nests
    assert pairs == [("sft", "sft+grpo"), ("sft+grpo", "sft+grpo+grpo")]


def test_evaluate_wiring_with_canned_responses(tmp_path, monkeypatch):
    """De-duplication, generation, grading and per-benchmark metrics line up (the real grader, fake samples)."""
    answers = {"2+3": ["5"] * 4, "7*6": ["42", "41", "0", "1"], "10-4": ["5"] * 4, "1/2 + 1/2": ["1"] * 4,
               "mammal": ["B", "B", "A", "A"]}

    def fake_generate(engine, tokenizer, prompts, n, *args, **kwargs):
        assert n == 4
        out = []
        for p in prompts:
            picks = next(v for k, v in answers.items() if k in p)
            texts = [T + (f"ANSWER: {a}" if a.isalpha() else f"\\boxed{{{a}}}") for a in picks]
            out.append([generation.Sample(list(range(j, j + 5)), t, [-1.0] * 5, [0.1] * 5, "stop")
                        for j, t in enumerate(texts)])
        return out

    monkeypatch.setattr(measure, "generate", fake_generate)
    benchmarks = ev.load_benchmarks(str(_write_benchmarks(tmp_path)))
    result, records = ev.evaluate_benchmarks(None, None, benchmarks, ev.Args(n_samples=4, grader_workers=2, model="m"))
    m = result["benchmarks"]
    assert (m["math"]["avg"], m["aime"]["avg"], m["arc_c"]["avg"]) == (5 / 8, 4 / 8, 2 / 4)
    assert m["math"]["pass_at_k"]["4"] == 1.0 and m["aime"]["pass_at_k"]["4"] == 0.5
    assert m["math"]["pass_at_k"]["2"] == pytest.approx((1 + ps.pass_at_k(4, 1, 2)) / 2)
    assert result["summary"]["id_avg"] == pytest.approx((5 / 8 + 4 / 8) / 2) and result["summary"]["ood_avg"] == 0.5
    assert [r["score"] for r in records if r["data_source"] == "arc_c"] == [1.0, 1.0, 0.0, 0.0]
    assert m["math"]["diversity"] == pytest.approx(5 / 6)  # shifted ids: neighbours share 1 of 3 distinct 4-grams
    # --grading authors reaches the grader: a bare "ANSWER: B" is no answer to the authors' math-verify + boxed grader.
    _, records = ev.evaluate_benchmarks(None, None, benchmarks,
                                        ev.Args(n_samples=4, grader_workers=2, model="m", grading="authors"))
    assert [r["score"] for r in records if r["data_source"] == "arc_c"] == [0.0] * 4
    assert sum(r["score"] for r in records if r["data_source"] == "math") == 5


def test_the_authors_grading_sees_the_end_token(tmp_path, monkeypatch):
    """Each response is graded as its grading reads it: the authors' with the end token the engine stopped on
    (an unboxed 84/2 just before it reads as 84), the paper's rule the text alone."""
    def fake_generate(engine, tokenizer, prompts, n, *args, **kwargs):
        answers = [next(a for q, a in (("2+3", "10/2"), ("7*6", "84/2")) if q in p) for p in prompts]
        return [[generation.Sample([1, 2], T + f"The answer is {a}", [-1.0] * 2, [0.1] * 2, "stop", stop)
                 for stop in ("<|im_end|>", "")] for a in answers]

    monkeypatch.setattr(measure, "generate", fake_generate)
    math = {"math": ev.load_benchmarks(str(_write_benchmarks(tmp_path)))["math"]}
    for grading, scores in (("paper", [1.0] * 4), ("authors", [0.0, 1.0] * 2), ("authors_rl", [0.0, 1.0] * 2)):
        args = ev.Args(n_samples=2, grader_workers=1, model="m", grading=grading)
        _, records = ev.evaluate_benchmarks(None, None, math, args)
        assert [r["score"] for r in records] == scores, grading


IN_A_CALLERS_GROUP = """
import sys
sys.path.insert(0, sys.argv[1])
import evaluate
from plumbing import distributed
distributed.setup_distributed()                 # the caller's own process group (a world of one)
evaluate.main(sys.argv[2:])
print("the caller goes on", flush=True)
"""


def test_an_evaluation_called_in_a_process_with_its_own_group_returns_to_its_caller(checkpoint, tmp_path):
    """evaluate.main ends only the group it made under torchrun: a caller's own group (a trainer, a test
    process) is left to it, where shutdown would have ended the caller's process without a word."""
    import subprocess

    script = tmp_path / "caller.py"
    script.write_text(IN_A_CALLERS_GROUP)
    argv = ["--model", str(checkpoint), "--data", str(_write_benchmarks(tmp_path)), "--out", str(tmp_path / "eval"),
            "--engine", "hf", "--n_samples", "1", "--max_new_tokens", "4", "--grader_workers", "1", "--limit", "1"]
    proc = subprocess.run([sys.executable, str(script), str(Path(__file__).resolve().parents[1]), *argv],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "the caller goes on" in proc.stdout, proc.stderr[-2000:]
    assert (tmp_path / "eval" / "results.json").exists()


def test_end_to_end_cpu(checkpoint, tmp_path):
    bench = _write_benchmarks(tmp_path)
    sft = _write_sft_data(tmp_path)
    out = tmp_path / "eval"
    ev.main(["--model", checkpoint, "--data", str(bench), "--out", str(out), "--engine", "hf", "--n_samples", "4",
             "--max-new-tokens", "16", "--grader-workers", "2", "--name", "tiny", "--sft-data", str(sft)])
    result = json.loads((out / "results.json").read_text())
    e = result["expert_entropy"]
    assert e["top20"] >= e["all"] >= e["bottom80"] > 0 and e["tokens"] > len(QUESTIONS)
    bench_metrics = result["benchmarks"]
    assert set(bench_metrics) == {"math", "aime", "arc_c"}
    assert {b: m["questions"] for b, m in bench_metrics.items()} == {"math": 2, "aime": 2, "arc_c": 1}  # de-duplicated
    for m in bench_metrics.values():
        assert m["n"] == 4 and 0 <= m["avg"] <= 1 and list(m["pass_at_k"]) == ["1", "2", "4"]
        passes = list(m["pass_at_k"].values())
        assert passes[0] == pytest.approx(m["avg"]) and passes == sorted(passes) and passes[-1] <= 1
        assert 1 <= m["response_length"] <= 16 and 0 < m["entropy"] <= math.log(result_vocab(checkpoint))
        assert 0 <= m["diversity"] <= 1 and 0 <= m["truncated"] <= 1
    id_avg = (bench_metrics["math"]["avg"] + bench_metrics["aime"]["avg"]) / 2
    assert result["summary"]["id_avg"] == pytest.approx(id_avg)
    assert result["summary"]["ood_avg"] == bench_metrics["arc_c"]["avg"] and result["grader_failures"] == 0
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 5 * 4 and {r["kind"] for r in records} == {"math", "mc"}
    table = (out / "results.md").read_text()
    assert "| aime | 2 | 4 |" in table and "pass@4" in table
    assert (out / "pass_at_k.png").stat().st_size > 0 and (out / "accuracy_vs_entropy_diversity.png").is_file()
    assert not (out / "accuracy_before_after_rl.png").exists()              # one checkpoint: nothing to pair
    # compare reads what evaluate.py wrote: a checkpoint against itself differs by 0, with no spread
    ev.main(["compare", str(out), str(out), "--out", str(tmp_path / "self"), "--resamples", "200"])
    paired = json.loads((tmp_path / "self" / "paired.json").read_text())
    assert {r["benchmark"] for r in paired["rows"]} == {"math", "aime", "arc_c", "ID avg", "OOD avg", "all avg"}
    assert all(r["difference"] == r["low"] == r["high"] == 0 for r in paired["rows"])

    # Compare mode: a checkpoint, the same after "RL" (paired by name), and an SFT log.
    other = json.loads((out / "results.json").read_text()) | {"name": "tiny+grpo"}
    (tmp_path / "other.json").write_text(json.dumps(other))
    log = tmp_path / "sft" / "log.jsonl"
    log.parent.mkdir()
    log.write_text("".join(json.dumps({"step": s, "loss": 1.0, "entropy_top20": 2 - s / 10, "entropy_bottom80": 0.1})
                           + "\n" for s in range(5)))
    ev.main(["plot", "--results", str(out / "results.json"), str(tmp_path / "other.json"), "--logs", str(log),
             "--out", str(tmp_path / "cmp")])
    compare = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| tiny |" in compare and "| tiny+grpo |" in compare and "ID avg" in compare
    for name in ("pass_at_k.png", "accuracy_vs_entropy_diversity.png", "over_training.png",
                 "accuracy_before_after_rl.png"):
        assert (tmp_path / "cmp" / name).stat().st_size > 0


def result_vocab(checkpoint):
    return transformers.AutoConfig.from_pretrained(checkpoint).vocab_size


# ---------------------------------------------------------------------------------------------------------
# Command line and bad input
# ---------------------------------------------------------------------------------------------------------
def test_cli_is_generated_from_the_dataclass():
    docs = cli.field_docs(ev.Args)
    assert set(docs) == {f.name for f in dataclasses.fields(ev.Args)} and all(docs.values())
    args, = cli.parse_config(ev.Args, argv=["--model", "m", "--data", "d", "--n_samples", "4", "--top-p", "0.9",
                                               "--no-save-samples"])
    assert (args.n_samples, args.top_p, args.save_samples, args.temperature) == (4, 0.9, False, 0.6)
    plot, = cli.parse_config(ev.PlotArgs, argv=["--results", "a.json", "b.json"])
    assert plot.results == ["a.json", "b.json"] and plot.logs == []


def test_bad_input_gives_clear_errors(checkpoint, tmp_path, capsys):
    bench = _write_benchmarks(tmp_path)
    not_model = tmp_path / "not_a_model"
    not_model.mkdir()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.jsonl").write_text(json.dumps({"data_source": "math", "question": "no prompt field"}) + "\n")
    (tmp_path / "r.json").write_text(json.dumps({"accuracy": 1}))
    cases = [
        (["--model", checkpoint, "--data", str(tmp_path / "missing")], "no such file or directory"),
        (["--model", checkpoint, "--data", str(not_model)], "no .parquet, .jsonl or .json files"),
        (["--model", checkpoint, "--data", str(bad)], "x.jsonl row 0"),
        (["--model", str(tmp_path / "nope"), "--data", str(bench)], "no such directory"),
        (["--model", str(not_model), "--data", str(bench)], "no config.json, not a model directory"),
        (["--model", checkpoint, "--data", str(bench), "--engine", "tpu"], "--engine: invalid choice: 'tpu'"),
        (["--model", checkpoint, "--data", str(bench), "--dtype", "fp8"], "--dtype: invalid choice: 'fp8'"),
        (["--model", checkpoint, "--data", str(bench), "--grading", "oat"], "--grading: invalid choice: 'oat'"),
        (["--model", checkpoint, "--data", str(bench), "--limit=-1"], "--limit -1: must be a finite number >= 0"),
        (["--model", checkpoint, "--data", str(bench), "--n_samples", "0"], "--n_samples 0: must be >= 1"),
        (["--model", checkpoint, "--data", str(bench), "--temperature", "0"], "--temperature 0.0: must be a finite"),
        (["--model", checkpoint, "--data", str(bench), "--top_p", "1.5"], "--top_p 1.5: must be in [0, 1]"),
        (["--model", checkpoint, "--data", str(bench), "--gpu_memory_utilization", "0"],
         "--gpu_memory_utilization 0.0: must be a finite number > 0"),
        (["--data", str(bench)], "required: --model"),
        (["plot"], "required: --results"),
        (["plot", "--results", str(tmp_path / "r.json")], "not a results.json"),
        (["plot", "--results", str(bench / "valid.all.jsonl")], "not JSON"),
        (["plot", "--results", str(tmp_path / "missing.json")], "no such file"),
    ]
    for argv, message in cases:  # user errors: run_script prints them as one line (test_cli_errors_are_one_line)
        with pytest.raises((SystemExit, ValueError, FileNotFoundError)) as exc:
            ev.main(argv + ["--out", str(tmp_path / "o")])
        assert message in str(exc.value) + capsys.readouterr().err, (argv, exc.value)


def test_rl_logs_get_the_mixed_reward_plot_and_sft_logs_the_entropy_plot(tmp_path):
    import matplotlib.pyplot as plt

    result = {"name": "x", "benchmarks": {"math": {"avg": 0.9, "pass_at_k": {"1": 0.9, "2": 0.95}}},
              "summary": {"id_avg": None, "ood_avg": None, "avg": 0.9, "entropy": 0.1, "diversity": 0.2}}
    (tmp_path / "grpo").mkdir()
    (tmp_path / "grpo" / "log.jsonl").write_text("".join(
        json.dumps({"step": i, "zero_std_frac": 0.25 * i, "reward_mean": 0.5, "entropy": 0.1}) + "\n" for i in (1, 2)))
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "log.jsonl").write_text(json.dumps({"step": 1, "student_entropy_top20": 0.3}) + "\n")
    seen = []
    original = report._curves
    report._curves = lambda runs, panels, title, path: seen.append((runs, panels, path.name)) or original(runs, panels,
                                                                                                       title, path)
    try:
        written = report.plot_results([result], str(tmp_path / "out"), [str(tmp_path / "sft" / "log.jsonl"),
                                                                    str(tmp_path / "grpo" / "log.jsonl")])
    finally:
        report._curves = original
    assert {Path(p).name for p in written} >= {"over_training.png", "rl_over_training.png"}
    (sft_runs, sft_panels, _), (rl_runs, rl_panels, _) = seen
    assert [name for name, _ in sft_runs] == ["sft"] and sft_panels[0][0] == "student_entropy_top20"
    assert [row["mixed_reward_groups"] for row in rl_runs[0][1]] == [75.0, 50.0]      # 100 (1 - zero_std_frac)
    plt.close("all")


def test_unparsable_ground_truths_and_grader_failures_are_counted_per_benchmark(tmp_path, monkeypatch, capsys):
    def fake_generate(engine, tokenizer, prompts, n, *args, **kwargs):
        return [[generation.Sample([1, 2], T + "The answer is \\boxed{5}", [-1.0] * 2, [0.1] * 2, "stop", "")
                 for _ in range(n)] for _ in prompts]

    def row(source, question, gt):
        return {"data_source": source, "reward_model": {"ground_truth": gt, "style": "rule"},
                "prompt": [{"role": "user", "content": question}]}
    bench = tmp_path / "b.jsonl"
    rows = [row("math", "2+3?", "5"), row("math", "q2", "\\text{}"), row("math", "q3", "$"),
            row("aime", "q4", "5"), row("arc_c", "q5", "B")]
    bench.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(measure, "generate", fake_generate)
    result, _ = ev.evaluate_benchmarks(None, None, ev.load_benchmarks(str(bench)),
                                       ev.Args(n_samples=2, grader_workers=1, model="m"))
    math_ = result["benchmarks"]["math"]
    assert (math_["unparsable_ground_truths"], math_["grader_failures"]) == (2, 4)    # 2 questions x 2 samples
    assert math_["avg"] == pytest.approx(1 / 3)
    assert [(m["unparsable_ground_truths"], m["grader_failures"]) for b, m in result["benchmarks"].items()
            if b != "math"] == [(0, 0), (0, 0)]
    assert result["grader_failures"] == 4
    out = capsys.readouterr().out
    assert "warning: math: math-verify cannot parse 2 ground truths (rows 1, 2): those questions score 0" in out
    assert "warning: math: 4 responses could not be graded" in out and "warning: aime" not in out


def test_a_run_keeps_its_colour_in_every_panel_and_in_the_legend(monkeypatch):
    """evaluate.py plot --logs a b: the first run lacks the first panel's key; the second must still be drawn in
    its own colour there, and the legend must give each run the colour its lines have."""
    from matplotlib.colors import to_hex

    from plumbing import report

    figures = []
    monkeypatch.setattr(report, "_save", lambda fig, path: figures.append(fig) or str(path))
    runs = [("sft", [{"step": 1, "ce": 1.0}, {"step": 2, "ce": 0.5}]),
            ("curio", [{"step": 1, "ce": 1.2, "w_mean": 0.9}, {"step": 2, "ce": 0.6, "w_mean": 1.0}])]
    report._curves(runs, [("w_mean", "w", ""), ("ce", "ce", "")], "t", "x.png")
    (fig,) = figures
    w_panel, ce_panel = fig.axes[:2]
    colour = {line.get_label(): to_hex(line.get_color()) for line in w_panel.lines + ce_panel.lines}
    assert [line.get_label() for line in w_panel.lines] == ["curio"] and colour["curio"] == to_hex("C1")
    assert colour["sft"] == to_hex("C0")
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == ["sft", "curio"]
    assert [to_hex(h.get_color()) for h in legend.legend_handles] == [to_hex("C0"), to_hex("C1")]
