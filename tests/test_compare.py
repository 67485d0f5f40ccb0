"""evaluate.py compare: the paired bootstrap against closed forms on synthetic scores, its two levels (questions,
seeds), its inputs (samples.jsonl as evaluate.py writes it) and its one-line errors."""
import json
import math

import numpy as np
import pytest

import evaluate as ev
from plumbing import paired_stats as ps


def evaluation(correct: dict[str, list[int]], n: int, name: str = "x", questions: str = "q") -> ps.Evaluation:
    """An Evaluation of benchmarks {name: [samples right per question]}, question texts f"{questions}{i}"."""
    return ps.Evaluation(name, name, {b: {f"{questions}{i}": int(c) for i, c in enumerate(cs)}
                                      for b, cs in correct.items()}, dict.fromkeys(correct, n))


def row(result: dict, benchmark: str, metric: str = "avg") -> dict:
    return next(r for r in result["rows"] if r["benchmark"] == benchmark and r["metric"] == metric)


def test_a_constant_difference_has_a_zero_width_interval():
    rng = np.random.default_rng(1)
    base = rng.integers(0, 7, size=50)
    a, b = evaluation({"aime": base + 1}, 8), evaluation({"aime": base}, 8)
    r = row(ps.paired_comparison([a], [b], resamples=2000), "aime")
    assert r["difference"] == r["low"] == r["high"] == pytest.approx(1 / 8, abs=1e-12)
    # several evaluations per side, each the same: the seeds add no spread either
    r = row(ps.paired_comparison([a, a, a], [b, b], resamples=2000), "aime")
    assert r["high"] - r["low"] == pytest.approx(0, abs=1e-12) and r["difference"] == pytest.approx(1 / 8)


def test_large_samples_give_two_paired_standard_errors_of_width_and_swapping_negates():
    rng = np.random.default_rng(2)
    n, questions = 4, 4000
    skill = rng.integers(0, n + 1, size=questions)                       # shared difficulty: the pairing matters
    a_correct = np.clip(skill + rng.integers(-1, 2, size=questions), 0, n)
    a, b = evaluation({"math": a_correct}, n, "A"), evaluation({"math": skill}, n, "B")
    result = ps.paired_comparison([a], [b])
    assert result["resamples"] == 10_000 and result["resampled"] == "questions"
    r = row(result, "math")
    d = (a_correct - skill) / n
    assert r["difference"] == pytest.approx(d.mean())
    assert r["high"] - r["low"] == pytest.approx(2 * 1.96 * d.std() / math.sqrt(questions), rel=0.05)
    unpaired = 2 * 1.96 * math.sqrt((a_correct / n).var() + (skill / n).var()) / math.sqrt(questions)
    assert r["high"] - r["low"] < 0.5 * unpaired                          # pairing removes the shared difficulty
    # pass@k: the unbiased estimator's per-question values, averaged
    pass2 = row(result, "math", "pass@2")
    assert pass2["a"] == pytest.approx(np.mean([ps.pass_at_k(n, int(c), 2) for c in a_correct]))
    assert [r["metric"] for r in result["rows"] if r["benchmark"] == "math"] == ["avg", "pass@2", "pass@4"]
    swapped = row(ps.paired_comparison([b], [a]), "math")
    assert (swapped["difference"], swapped["low"], swapped["high"]) == pytest.approx(
        (-r["difference"], -r["high"], -r["low"]), abs=1e-12)


def test_the_seed_decides_the_replicates():
    rng = np.random.default_rng(3)
    a, b = evaluation({"amc": rng.integers(0, 9, 40)}, 8), evaluation({"amc": rng.integers(0, 9, 40)}, 8)
    first, again, other = (row(ps.paired_comparison([a], [b], 3000, seed), "amc") for seed in (0, 0, 1))
    assert first == again and (first["low"], first["high"]) != (other["low"], other["high"])


def test_seeds_of_each_side_are_resampled_when_every_evaluation_holds_the_same_questions():
    """No spread within an evaluation (every question alike): the interval is the bootstrap of the seeds' mean."""
    rng = np.random.default_rng(4)
    seeds, n = 400, 8
    levels = rng.integers(0, n + 1, size=seeds)
    a = [evaluation({"aime": [c] * 3}, n, "A") for c in levels]
    b = [evaluation({"aime": [2] * 3}, n, "B")]
    result = ps.paired_comparison(a, b)
    assert result["resampled"] == "questions, and each side's seeds independently"
    r = row(result, "aime")
    assert r["difference"] == pytest.approx(levels.mean() / n - 2 / n)
    assert r["high"] - r["low"] == pytest.approx(2 * 1.96 * (levels / n).std() / math.sqrt(seeds), rel=0.06)


def test_seed_pairs_with_questions_of_their_own_are_resampled_as_pairs():
    """Each seed its own questions (the demo: every seed draws its test set), a constant difference within each
    pair: the interval is the bootstrap over pairs; unequal question counts per pair are drawn within each."""
    rng = np.random.default_rng(5)
    seeds, n = 300, 4
    shift = rng.integers(0, 3, size=seeds)
    a, b = [], []
    for s in range(seeds):
        base = rng.integers(0, 2, size=2 + s % 3)
        a.append(evaluation({"math": base + shift[s]}, n, "A", questions=f"s{s}q"))
        b.append(evaluation({"math": base}, n, "B", questions=f"s{s}q"))
    result = ps.paired_comparison(a, b)
    assert result["resampled"].startswith("seed pairs")
    r = row(result, "math")
    assert r["difference"] == pytest.approx(shift.mean() / n)
    assert r["high"] - r["low"] == pytest.approx(2 * 1.96 * (shift / n).std() / math.sqrt(seeds), rel=0.06)
    # the same shift in every pair: no spread at either level; spread within the pairs: the questions are drawn
    flat = [evaluation({"math": [0] * 4}, n, "B", questions=f"s{s}q") for s in range(3)]
    same = [evaluation({"math": [1] * 4}, n, "A", questions=f"s{s}q") for s in range(3)]
    noisy = [evaluation({"math": [0, 1, 2, 1]}, n, "A", questions=f"s{s}q") for s in range(3)]
    widths = [row(ps.paired_comparison(x, flat, 2000), "math") for x in (same, noisy)]
    assert widths[0]["low"] == widths[0]["high"] == pytest.approx(1 / n) and widths[1]["high"] - widths[1]["low"] > 0.1


def test_the_id_and_ood_averages_weigh_each_benchmark_the_same():
    rng = np.random.default_rng(6)
    q, n = 3000, 1
    truth = {b: rng.integers(0, 2, size=q) for b in ("aime", "math", "gpqa")}
    a = evaluation({b: np.maximum(c, rng.integers(0, 2, size=q)) for b, c in truth.items()}, n)
    b = evaluation(truth, n)
    result = ps.paired_comparison([a], [b])
    id_avg, per = row(result, "ID avg"), [row(result, x) for x in ("aime", "math")]
    assert id_avg["difference"] == pytest.approx((per[0]["difference"] + per[1]["difference"]) / 2)
    assert id_avg["questions"] == 2 * q and id_avg["n"] is None
    # independent benchmarks: the average's standard error is sqrt(se1^2 + se2^2) / 2
    ses = [np.std((np.array(list(a.correct[x].values())) - truth[x]) / n) / math.sqrt(q) for x in ("aime", "math")]
    assert id_avg["high"] - id_avg["low"] == pytest.approx(2 * 1.96 * math.hypot(*ses) / 2, rel=0.06)
    assert row(result, "OOD avg")["difference"] == row(result, "gpqa")["difference"]
    assert row(result, "all avg")["difference"] == pytest.approx(np.mean([row(result, x)["difference"]
                                                                      for x in ("aime", "math", "gpqa")]))


def write_evaluation(folder, name, correct: dict[str, list[int]], n: int):
    """results.json and samples.jsonl as evaluate.py writes them."""
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"name": name, "benchmarks": {}, "summary": {}}))
    records = [{"data_source": b, "row": i, "question": f"Q{i}?", "sample": j, "score": float(j < c),
                "response": "..."} for b, cs in correct.items() for i, c in enumerate(cs) for j in range(n)]
    (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_command_line_writes_the_table_and_json(tmp_path, capsys):
    a = write_evaluation(tmp_path / "a", "curio", {"aime": [2, 4, 0], "gpqa": [1, 1, 0]}, 4)
    b = write_evaluation(tmp_path / "b", "sft", {"aime": [1, 4, 0], "gpqa": [0, 1, 0]}, 4)
    ev.main(["compare", str(a), str(b / "results.json"), "--out", str(tmp_path / "cmp"), "--resamples", "500"])
    saved = json.loads((tmp_path / "cmp" / "paired.json").read_text())
    assert saved["a"]["name"] == "curio" and saved["b"]["evaluations"] == [str(b)] and saved["resamples"] == 500
    assert row(saved, "aime")["difference"] == pytest.approx(1 / 12)
    table = (tmp_path / "cmp" / "paired.md").read_text()
    assert table in capsys.readouterr().out and table.startswith("## curio − sft")
    assert "| aime | 3 | avg@4 | 50.0 | 41.7 | +8.3 | [" in table and "| ID avg | 3 | avg@n |" in table
    again = ps.paired_comparison([ps.load_evaluation(str(a))], [ps.load_evaluation(str(b))], 500)
    assert again["rows"] == saved["rows"]                                # --seed 0 by default: the same draws


def test_bad_input_is_one_line_naming_the_file(tmp_path):
    a = write_evaluation(tmp_path / "a", "a", {"aime": [1, 2]}, 2)
    fewer = write_evaluation(tmp_path / "fewer", "b", {"aime": [1]}, 2)
    more_n = write_evaluation(tmp_path / "n4", "b", {"aime": [1, 2]}, 4)
    other = write_evaluation(tmp_path / "other", "b", {"math": [1, 2]}, 2)
    no_samples = write_evaluation(tmp_path / "none", "b", {"aime": [1, 2]}, 2)
    (no_samples / "samples.jsonl").unlink()
    broken = write_evaluation(tmp_path / "broken", "b", {"aime": [1, 2]}, 2)
    (broken / "samples.jsonl").write_text('{"data_source": "aime", "question": "Q0?"}\n')
    cases = [(fewer, r"fewer: aime: 1 questions are not in both"), (more_n, r"n4: aime: 4 samples per question"),
             (other, r"other: benchmarks math; .*: aime"),
             (no_samples, r"none/samples.jsonl: no such file.*--no-save_samples"),
             (broken, r"broken/samples.jsonl line 1: not a sample record")]
    for folder, message in cases:
        with pytest.raises((ValueError, FileNotFoundError), match=message):
            ev.main(["compare", str(a), str(folder), "--out", str(tmp_path / "cmp")])
    with pytest.raises(ValueError, match="give A and B one evaluation per seed each"):
        ev.main(["compare", "--a", str(a), str(a), "--b", str(fewer), "--out", str(tmp_path / "cmp")])
