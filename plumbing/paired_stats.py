"""Plumbing (a reader of the method may skip this file): the paired statistics of `evaluate.py
compare`, A - B per benchmark and metric (avg@n, pass@k) and for the ID, OOD and overall averages,
with a 95% percentile bootstrap paired over questions (and over seeds, with several evaluations per
side), from each evaluation's per-question scores in its samples.jsonl; and the unbiased pass@k
estimator both evaluate.py's metrics and the comparison use. report.paired_table lays the result
out.
"""
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from plumbing.benchmarks import ID_BENCHMARKS, OOD_BENCHMARKS


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k = 1 - C(n-c, k) / C(n, k) (Chen et al. 2021), as a product of ratios."""
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_ks(n: int) -> list[int]:
    """The k of pass@k reported for n samples per question: the powers of 2 up to n, and n."""
    return sorted({2**i for i in range(n.bit_length()) if 2**i <= n} | {n})


@dataclass
class Evaluation:
    """The per-question scores of one evaluate.py run (its samples.jsonl)."""
    name: str
    path: str
    correct: dict[str, dict[str, int]]   # benchmark -> question text -> samples graded right
    n: dict[str, int]                    # benchmark -> samples per question


def per_question(correct: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """Each question's avg@n (correct / n) and unbiased pass@k for k > 1 (pass@1 is avg@n): the
    benchmark's metrics are their means over questions (evaluate.benchmark_metrics)."""
    return {"avg": correct / n} | {f"pass@{k}": np.array([pass_at_k(n, int(c), k) for c in correct])
                                   for k in pass_ks(n) if k > 1}


def _draw_shares(draws: np.ndarray) -> np.ndarray:
    """[R, S] the share of each of S seeds among a replicate's S draws (draws [R, S] of 0..S-1)."""
    replicates, seeds = draws.shape
    flat = (draws + seeds * np.arange(replicates)[:, None]).ravel()
    return np.bincount(flat, minlength=replicates * seeds).reshape(replicates, seeds) / seeds


def _shared_questions(a: np.ndarray, b: np.ndarray, seeds_a, seeds_b, rng, chunk=1 << 22):
    """Bootstrap replicates [metrics, R] of mean(A) - mean(B) when every evaluation holds the same
    questions: a [S, metrics, Q], b [T, metrics, Q]. Each replicate takes the seeds it drew for each
    side (seeds_a [R, S], seeds_b [R, T]; independent sides) and one draw of Q question indices,
    applied to both sides: the pairing."""
    n_metrics, n_questions = a.shape[1:]
    weight_a, weight_b = _draw_shares(seeds_a), _draw_shares(seeds_b)       # [R, S], [R, T]
    out = np.empty((n_metrics, len(seeds_a)))
    step = max(1, chunk // (n_metrics * n_questions))
    for r in range(0, len(seeds_a), step):
        diff = (np.einsum("rs,smq->rmq", weight_a[r : r + step], a)
                - np.einsum("rs,smq->rmq", weight_b[r : r + step], b))       # [r, metrics, Q]
        drawn = rng.integers(n_questions, size=(len(diff), 1, n_questions))
        out[:, r : r + step] = np.take_along_axis(diff, drawn, axis=2).mean(2).T
    return out


def _paired_seeds(diffs: list[np.ndarray], pairs, rng, chunk=1 << 22):
    """Bootstrap replicates [metrics, R] of the mean over seed pairs of A_i - B_i when pair i has
    questions of its own: diffs[i] [metrics, Q_i]. Each replicate draws pairs (pairs [R, S]), then
    Q_i questions within each drawn pair, independently for every draw (a two-level bootstrap)."""
    longest = max(d.shape[1] for d in diffs)
    padded = np.stack([np.pad(d, ((0, 0), (0, longest - d.shape[1]))) for d in diffs])  # [S, m, Q]
    sizes = np.array([d.shape[1] for d in diffs])
    out = np.zeros((padded.shape[1], len(pairs)))
    step = max(1, chunk // (padded.shape[1] * longest))
    for k in range(pairs.shape[1]):                  # the k-th pair drawn by every replicate
        for r in range(0, len(pairs), step):
            drawn = pairs[r : r + step, k]
            size = sizes[drawn][:, None]                                      # [r, 1]
            at = np.floor(rng.random((len(drawn), longest)) * size).astype(int)
            used = np.arange(longest) < size                                  # the first Q_i draws
            values = np.take_along_axis(padded[drawn], at[:, None, :], axis=2)  # [r, m, Q]
            out[:, r : r + step] += ((values * used[:, None, :]).sum(2) / size).T
    return out / pairs.shape[1]


def load_evaluation(path: str) -> Evaluation:
    """An evaluate.py --out directory (or its results.json) as each question's count of samples
    graded right, from samples.jsonl: results.json holds only the aggregates. Questions are told
    apart by (data_source, question text), as evaluate.load_benchmarks de-duplicates them."""
    folder = Path(path).parent if Path(path).name == "results.json" else Path(path)
    results_file, samples_file = folder / "results.json", folder / "samples.jsonl"
    if not results_file.is_file():
        raise FileNotFoundError(f"{results_file}: no such file (an evaluate.py --out directory)")
    if not samples_file.is_file():
        raise FileNotFoundError(f"{samples_file}: no such file; compare needs each sample's score, "
                                f"which evaluate.py writes there unless --no-save_samples")
    try:
        name = json.loads(results_file.read_text())["name"]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{results_file}: not a results.json written by evaluate.py") from None
    scores = {}                                    # (benchmark, question) -> {sample: 0/1 score}
    for i, line in enumerate(samples_file.read_text().splitlines(), 1):
        try:
            r = json.loads(line)
            key, sample, score = (r["data_source"], r["question"]), int(r["sample"]), r["score"]
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{samples_file} line {i}: not a sample record of evaluate.py "
                             f"({type(e).__name__}: {e})") from None
        if score not in (0, 1) or sample in scores.setdefault(key, {}):
            raise ValueError(f"{samples_file} line {i}: a score other than 0 or 1, or sample "
                             f"{sample} of its question a second time")
        scores[key][sample] = score
    if not scores:
        raise ValueError(f"{samples_file}: no samples")
    correct, n = {}, {}
    for (bench, question), samples in scores.items():
        expected = range(n.setdefault(bench, len(samples)))   # as the benchmark's first question
        if sorted(samples) != list(expected):
            raise ValueError(f"{samples_file}: {bench}: question {question[:60]!r} has samples "
                             f"{sorted(samples)}, not 0 to {len(expected) - 1}")
        correct.setdefault(bench, {})[question] = int(sum(samples.values()))
    return Evaluation(name, str(folder), correct, n)


def _mismatch(evaluations: list[Evaluation], reference: Evaluation) -> str | None:
    """Why the evaluations did not all evaluate the reference's questions with its n, or None."""
    for e in evaluations:
        if e.correct.keys() != reference.correct.keys():
            return (f"{e.path}: benchmarks {', '.join(e.correct)}; {reference.path}: "
                    f"{', '.join(reference.correct)}")
        for b, questions in e.correct.items():
            if questions.keys() != reference.correct[b].keys():
                apart = len(questions.keys() ^ reference.correct[b].keys())
                return f"{e.path}: {b}: {apart} questions are not in both it and {reference.path}"
            if e.n[b] != reference.n[b]:
                return (f"{e.path}: {b}: {e.n[b]} samples per question; {reference.path}: "
                        f"{reference.n[b]}")
    return None


def _question_values(e: Evaluation, bench: str, order: list[str]) -> np.ndarray:
    """[metrics, questions]: per_question of one evaluation's benchmark, its questions in order."""
    correct = np.array([e.correct[bench][q] for q in order], dtype=float)
    return np.stack(list(per_question(correct, e.n[bench]).values()))


def paired_comparison(a: list[Evaluation], b: list[Evaluation], resamples: int = 10_000,
                      seed: int = 0) -> dict:
    """A - B per benchmark and metric (avg@n, pass@k) and for the ID, OOD and overall averages
    (evaluate.table2_averages), with a 95% percentile bootstrap interval. The pairing is over
    questions: a replicate resamples each benchmark's question indices once and applies them to
    both sides. With several evaluations per side (seeds) the seeds are resampled too, with the
    same draw for every benchmark: where every evaluation holds the same questions, each side's
    seeds independently; else A's i-th and B's i-th evaluations must share their questions and are
    resampled as pairs, with the questions drawn again within each drawn pair."""
    apart = _mismatch(a + b, a[0])
    shared = apart is None
    if not shared and len(a) != len(b):
        raise ValueError(f"{apart}: with other questions per evaluation, give A and B one "
                         f"evaluation per seed each, in the same order")
    for ea, eb in ([] if shared else zip(a, b)):
        if (why := _mismatch([eb], ea)) is not None:
            raise ValueError(f"{why}: A's and B's evaluations of a seed must share their questions")
    rng = np.random.default_rng(seed)
    if shared:
        seeds_a, seeds_b = (rng.integers(len(side), size=(resamples, len(side))) for side in (a, b))
    else:
        pairs = rng.integers(len(a), size=(resamples, len(a)))
    rows, replicates, metrics = [], {}, {}
    for bench in a[0].correct:
        n = a[0].n[bench]
        metrics[bench] = list(per_question(np.zeros(0), n))                   # the metrics' names
        if shared:
            order = list(a[0].correct[bench])
            xa, xb = (np.stack([_question_values(e, bench, order) for e in side])
                      for side in (a, b))                                      # [S, metrics, Q]
            reps = _shared_questions(xa, xb, seeds_a, seeds_b, rng)
            questions = len(order)
        else:              # each seed pair's questions, in the order of A's evaluation
            xa = [_question_values(ea, bench, list(ea.correct[bench])) for ea in a]
            xb = [_question_values(eb, bench, list(ea.correct[bench])) for ea, eb in zip(a, b)]
            reps = _paired_seeds([x - y for x, y in zip(xa, xb)], pairs, rng)
            questions = sum(x.shape[1] for x in xa)
        mean_a, mean_b = (np.mean([x.mean(1) for x in side], axis=0) for side in (xa, xb))
        for i, metric in enumerate(metrics[bench]):
            replicates[bench, metric] = reps[i]
            rows.append(_row(bench, questions, n, metric, mean_a[i], mean_b[i], reps[i]))
    present = list(a[0].correct)
    groups = {"ID avg": [x for x in ID_BENCHMARKS if x in present],
              "OOD avg": [x for x in OOD_BENCHMARKS if x in present],
              "all avg": present if len(present) > 1 else []}
    for group, members in groups.items():
        common = [m for m in metrics[members[0]] if all(m in metrics[x] for x in members)] \
            if members else []
        for metric in common:       # each benchmark weighs the same, as in table2_averages
            parts = [r for r in rows if r["benchmark"] in members and r["metric"] == metric]
            reps = np.mean([replicates[x, metric] for x in members], axis=0)
            mean_a, mean_b = (np.mean([r[side] for r in parts]) for side in ("a", "b"))
            rows.append(_row(group, sum(r["questions"] for r in parts), None, metric, mean_a,
                             mean_b, reps))
    resampled = ("questions" if len(a) == len(b) == 1 else
                 "questions, and each side's seeds independently" if shared else
                 "seed pairs (A's and B's i-th evaluations), then questions within each drawn pair")
    return {"a": _side(a), "b": _side(b), "resampled": resampled, "resamples": resamples,
            "seed": seed, "level": 0.95, "rows": rows}


def _row(benchmark, questions, n, metric, a, b, replicates) -> dict:
    low, high = np.percentile(replicates, [2.5, 97.5])
    return {"benchmark": benchmark, "questions": questions, "n": n, "metric": metric,
            "a": float(a), "b": float(b), "difference": float(a - b), "low": float(low),
            "high": float(high)}


def _side(evaluations: list[Evaluation]) -> dict:
    return {"name": " / ".join(dict.fromkeys(e.name for e in evaluations)),
            "evaluations": [e.path for e in evaluations]}
