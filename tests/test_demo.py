"""The CPU demo end to end (demo.py --size ci), and the toy task it is built on."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import data
import evaluate

ROOT = Path(__file__).resolve().parent.parent


def test_toy_task_schema_styles_and_grading(tmp_path):
    diverse = data.make_toy_task(64, seed=3, style="diverse")
    canonical = data.make_toy_task(64, seed=3, style="canonical")
    # Same questions and answers in both styles; only the order of the additions differs.
    assert [r["prompt"] for r in diverse] == [r["prompt"] for r in canonical]
    assert [r["reward_model"] for r in diverse] == [r["reward_model"] for r in canonical]
    assert any(d["target"] != c["target"] for d, c in zip(diverse, canonical))
    assert data.make_toy_task(8, seed=3) == data.make_toy_task(8, seed=3)  # deterministic

    def added(text):  # the operands in the order the response adds them
        lines = data.toy_additions(text)
        return [lines[0][0]] + [b for _, b, _ in lines]

    for d, c in zip(diverse, canonical):
        operands = [int(v) for v in re.findall(r"\d+", c["prompt"][1]["content"])]
        assert 3 <= len(operands) == len(set(operands)) <= 4 and all(1 <= v <= 9 for v in operands)
        assert added(c["target"][0]["content"]) == operands  # canonical: the question's order
        assert sorted(added(d["target"][0]["content"])) == sorted(operands)  # diverse: a permutation of it
        # Every line's sum is right, and the boxed answer is the total.
        for a, b, total in data.toy_additions(d["target"][0]["content"]):
            assert a + b == total
        assert d["reward_model"]["ground_truth"] == str(sum(operands))
    assert len({tuple(added(d["target"][0]["content"])) for d in diverse}) > 32  # many orders, not one
    # toy_solution_kind tells the expert's order from another valid one, and each kind of mistake
    for d, c in zip(diverse, canonical):
        question, expert, other = c["prompt"][1]["content"], c["target"][0]["content"], d["target"][0]["content"]
        assert data.toy_solution_kind(question, expert) == "expert order"
        assert data.toy_solution_kind(question, other) == ("expert order" if other == expert else "other order")
    q = "What is the total of 2, 9, 3?"
    for response, kind in [("9 + 3 = 12\n12 + 2 = 14\n</think>\n\\boxed{14}", "other order"),
                           ("2 + 9 = 11\n11 + 2 = 13\n</think>", "wrong operand"),   # 2 twice, 3 never
                           ("2 + 6 = 8\n8 + 3 = 11\n</think>", "wrong operand"),     # 6 is not in the question
                           ("2 + 9 = 12\n12 + 3 = 15\n</think>", "wrong sum"),
                           ("2 + 9 = 12\n11 + 3 = 14\n</think>", "wrong sum"),       # not "malformed"
                           ("2 + 9 = 11\n11 + 3 = 14\n14 + 7 =\n</think>", "malformed"),  # a line of another form
                           ("2 + 9 = 11\n11 + 3 = 14 + 1\n</think>", "malformed"),  # a whole line, not a prefix
                           ("2 + 9 = 11\n</think>\n11 + 3 = 14\n</think>", "malformed"),  # up to the last </think>
                           ("2 + 9 = 11\n12 + 3 = 15\n</think>", "malformed"),       # does not go on from 11
                           ("2 + 9 = 11\n11 + 3 = 14", "malformed"),                  # no </think>
                           ("</think>\\boxed{14}", "malformed")]:
        assert data.toy_solution_kind(q, response) == kind, response
    # Rows round-trip through load_examples, and the expert response grades correct (math-verify).
    examples = data.load_examples(data.write_jsonl(diverse + canonical, tmp_path / "toy.jsonl"), require_response=True)
    assert all(ex.response.rstrip().endswith(f"\\boxed{{{ex.ground_truth}}}.") for ex in examples)
    assert all("</think>" in ex.response and ex.system == data.TOY_SYSTEM for ex in examples)
    responses, truths = [ex.response for ex in examples[:16]], [ex.ground_truth for ex in examples[:16]]
    wrong = [r.replace(f"{{{t}}}", f"{{{int(t) + 1}}}") for r, t in zip(responses, truths)]
    scores, failures = evaluate.grade(responses + wrong, truths + truths, ["math"] * 32, workers=1)
    assert scores == [1.0] * 16 + [0.0] * 16 and failures == 0
    with pytest.raises(ValueError, match="style"):
        data.make_toy_task(1, seed=0, style="other")
    with pytest.raises(ValueError, match="distinct"):
        data.make_toy_task(1, seed=0, k=(3, 4), max_operand=3)


def test_toy_tokenizer_has_a_vocabulary_tail():
    rows = data.make_toy_task(100, seed=0, style="diverse")
    tok = data.build_toy_tokenizer(data.toy_tokenizer_texts(rows, n_labels=1000), vocab_size=2048)
    # (almost) every pseudo-word is one token: a vocabulary far beyond the digits and words the task uses
    assert len(tok) > 1000 and sum(len(tok.tokenize(" " + w)) == 1 for w in data.TOY_LABELS[:1000]) >= 990
    assert tok.tokenize("<think>\n")[0] == "<think>"
    # With the row's one-line system prompt a toy prompt is under a third of its Table 7 length: the demo's speed.
    ex = data.Example("What is the total of 7, 1, 3?", "11", None, "toy", 0, data.TOY_SYSTEM)
    row, paper = (len(tok.encode(data.example_prompt(ex, tok, p))) for p in ("row", "paper"))
    assert 3 * row < paper


def test_demo_ci_runs_every_stage(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "demo.py", "--size", "ci", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("train_diverse", "train_canonical", "test"):
        assert data.load_examples(out / "world" / f"{name}.jsonl")
    assert (out / "world" / "model" / "config.json").exists()
    names = ["base", "sft", "curio", "entropy", "sft+grpo", "curio+grpo"]
    for name in names:
        ckpts = sorted((out / "runs" / name).glob("step_*"))
        assert ckpts, f"no checkpoint for {name}"
        model = AutoModelForCausalLM.from_pretrained(ckpts[-1])
        assert model.config.vocab_size == len(AutoTokenizer.from_pretrained(ckpts[-1]))
        result = json.loads((out / "eval" / name / "results.json").read_text())
        assert result["summary"]["avg"] is not None and result["expert_entropy"]["tokens"] > 0
    assert (out / "runs" / "curio" / "log.jsonl").read_text().count("w_mean") >= 1
    assert "== 6. plots and summary" in proc.stdout and all(f"| {name} |" in proc.stdout for name in names)
    summary = (out / "summary.md").read_text()
    assert "top-20% expert-token entropy at 0 / 25 / 50 / 75 / 100%" in summary
    # CurioSFT's weight on CE at branching / factual tokens; plain CE has none
    assert re.search(r"^\| curio \|.*\| -?\d+\.\d{3} / -?\d+\.\d{3} \|$", summary, re.M)
    assert re.search(r"^\| sft \|.*\| – \|$", summary, re.M)
    assert "| model | expert order | other order | wrong operand | wrong sum | malformed |" in summary
    for plot in ("pass_at_k.png", "accuracy_vs_entropy_diversity.png", "over_training.png",
                 "accuracy_before_after_rl.png"):
        assert (out / "plots" / plot).stat().st_size > 0

    # Finished stages are reused, so another seed into the same --out must stop, not mix two runs.
    proc = subprocess.run([sys.executable, "demo.py", "--size", "ci", "--out", str(out), "--seed", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "holds a run with --seed 0" in proc.stderr
    (out / "seed").unlink()  # as in an --out written before seeds were recorded
    proc = subprocess.run([sys.executable, "demo.py", "--size", "ci", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "holds a run with an unrecorded --seed" in proc.stderr


def test_a_running_stage_prints_its_progress(tmp_path, capsys):
    import demo

    code = "import time; print('step 1 loss 0.5 eta 0:00:02', flush=True); time.sleep(1.5); print('step 2', flush=True)"
    demo.run([sys.executable, "-c", code], tmp_path / "stage.log", every_s=0.5)
    out = capsys.readouterr().out
    assert "step 1 loss 0.5 eta 0:00:02" in out and "done in" in out
