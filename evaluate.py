# Evaluation of CurioSFT checkpoints (arXiv:2602.02244): Sec. 5.1, Table 2, Figs. 1, 2, 4.
"""Sample n responses per benchmark question, grade them, and measure avg@n, unbiased pass@k, the
sampling entropy, n-gram diversity and (with --sft_data) the entropy at the expert's tokens.

    python evaluate.py --model CKPT --data BENCH_DIR --out out/eval/ckpt [--grading paper|authors]
    torchrun --nproc_per_node 8 evaluate.py config/eval_paper.py ...   # a block per rank
    python evaluate.py plot --results out/eval/*/results.json --logs runs/*/log.jsonl --out cmp
    python evaluate.py compare out/eval/curio out/eval/sft   # A - B, paired bootstrap intervals
    python evaluate.py compare --a out/eval/curio_s{0,1,2} --b out/eval/sft_s{0,1,2}   # and seeds
    python evaluate.py tokens --model CKPT --data train.parquet --row 0 --out tokens.html

Each finished benchmark is kept under OUT/progress/: a rerun with the same settings loads it instead
of sampling it again. Sampling (vLLM or HF generate), grading, tables and plots are plumbing/; this
file is what is measured. python evaluate.py --help lists the flags.
"""
import difflib
import hashlib
import itertools
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

import curio_loss as cl
from chunked_logits import cat_diags, no_grad_logits, normed_hidden, select_targets
from data import ID_BENCHMARKS, OOD_BENCHMARKS, SYSTEM_PROMPT_MODES, Example, example_prompt
from data import collate, load_examples, tokenize_sft
from plumbing import report, token_page
from plumbing.checkpoints import verify_model_dir
from plumbing.cli import check_settings, parse_config, run_script
from plumbing.distributed import print0, setup_distributed, shutdown
from plumbing.generation import ENGINES, Engine, Sample, encode, engine_kind, generate, load_engine
from plumbing.grading import GRADING_MODES, answer_kind, grade, graded_text, ground_truth_unparsable
from plumbing.models import check_model_dir, resolve_model
from plumbing.run_dir import drop_if_empty, lock_dir, release, write_atomic


@dataclass
class Args:
    """evaluate.py settings"""
    REQUIRED = ("model", "data")
    RENAMED = {"n": "n_samples"}   # torchrun's own parser takes --n for its --nnodes
    model: str = ""
    """checkpoint directory (config.json, safetensors weights, tokenizer)"""
    data: str = ""
    """benchmark directory or file (.parquet/.jsonl/.json, the authors' schema)"""
    out: str = "out/eval"
    """output directory: results.json, results.md, samples.jsonl, plots"""
    name: str = ""
    """label of this checkpoint in tables and plots (default: the model directory's name)"""
    engine: Literal[ENGINES] = "auto"
    """auto: vLLM with CUDA and the vllm package, else HF generate | hf | vllm"""
    n_samples: int = 8
    """samples per question: avg@8, pass@k up to k = 8 (Sec. 5.1); once --n, which torchrun took"""
    n_mmlu_pro: int = 1
    """samples per MMLU-Pro question (Sec. 5.1: one, for its 12k questions)"""
    temperature: float = 0.6
    """sampling temperature (Sec. 5.1)"""
    top_p: float = 0.95
    """nucleus sampling (Sec. 5.1)"""
    max_new_tokens: int = 8192
    """longest response in tokens (App. E)"""
    max_prompt_len: int = 1024
    """longer prompts (chat template included) are left out and counted per benchmark (App. E)"""
    system_prompt: Literal[("auto", *SYSTEM_PROMPT_MODES)] = "auto"
    """the prompt around each question: paper | row | messages (data.example_prompt); auto: what
    the checkpoint was trained with (its run's run_config.json), else paper"""
    seed: int = 0
    """sampling seed"""
    limit: int = 0
    """questions per benchmark after de-duplication, 0 = all (smoke tests)"""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """model dtype; auto: bfloat16 on GPU, float32 on CPU"""
    batch_size: int = 8
    """prompts per HF generate call (vLLM schedules its own batches)"""
    tensor_parallel_size: int = 1
    """vLLM: GPUs per model (1 under torchrun: one engine per rank)"""
    gpu_memory_utilization: float = 0.85
    """vLLM: the share of the GPU's total memory it may take"""
    max_model_len: int = 9216
    """vLLM: prompt + response tokens, at least max_prompt_len + max_new_tokens"""
    grader_timeout: float = 10.0
    """seconds per graded response; an overrunning grader is killed and the response scores 0"""
    grader_workers: int = 4
    """grader processes"""
    grading: Literal[GRADING_MODES] = "paper"
    """paper: App. E's rule | authors: the authors' evaluation | authors_rl: their RL reward"""
    sft_data: str = ""
    """optional SFT file: also measure the entropy at its expert tokens (Fig. 2a/b)"""
    sft_examples: int = 256
    """SFT examples for the expert-token entropy"""
    save_samples: bool = True
    """write every response with its score to samples.jsonl"""

    def __post_init__(self):
        check_settings(self, positive=["temperature", "top_p", "gpu_memory_utilization",
                                       "grader_timeout"],
                       fraction=["top_p", "gpu_memory_utilization"], non_negative=["limit"],
                       at_least_one=["n_samples", "n_mmlu_pro", "max_new_tokens", "max_prompt_len",
                                     "batch_size", "tensor_parallel_size", "max_model_len",
                                     "grader_workers", "sft_examples"])


@dataclass
class PlotArgs:
    """evaluate.py plot settings"""
    REQUIRED = ("results",)
    results: list[str] = field(default_factory=list)
    """results.json files written by evaluate.py, one per checkpoint"""
    logs: list[str] = field(default_factory=list)
    """sft.py / rl.py log.jsonl files: curves over training"""
    log_keys: list[str] = field(default_factory=list)
    """log fields to plot over training (default: every field with "entropy" in its name)"""
    out: str = "out/compare"
    """output directory: compare.md and plots"""


@dataclass
class CompareArgs:
    """evaluate.py compare settings"""
    REQUIRED = ("a", "b")
    a: list[str] = field(default_factory=list)
    """evaluations of checkpoint A: evaluate.py --out directories (or results.json), one per seed"""
    b: list[str] = field(default_factory=list)
    """evaluations of checkpoint B on the same questions; the difference is A - B"""
    resamples: int = 10_000
    """bootstrap replicates"""
    seed: int = 0
    """seed of the resampling: the same seed gives the same intervals"""
    out: str = "out/compare"
    """output directory: paired.md and paired.json"""

    def __post_init__(self):
        check_settings(self, at_least_one=["resamples"])


@dataclass
class TokensArgs:
    """evaluate.py tokens settings"""
    REQUIRED = ("model", "data")
    model: str = ""
    """the student: a checkpoint directory (an sft.py checkpoint, or the model it starts from)"""
    teacher: str = ""
    """the teacher's checkpoint, same vocabulary (e.g. the run's previous one: CurioSFT's teacher is
    a lagged copy of the student); default: the model itself, the self-teacher view"""
    data: str = ""
    """SFT file: .parquet / .jsonl / .json in the authors' schema, with expert responses"""
    row: int = 0
    """the example: its 0-based row in the file"""
    out: str = "out/tokens.html"
    """the page: one self-contained HTML file"""
    system_prompt: Literal[("auto", *SYSTEM_PROMPT_MODES)] = "auto"
    """the prompt around the question: paper | row | messages; auto: what the checkpoint was
    trained with (its run's run_config.json), else paper"""
    loss_chunk: int = 2048
    """tokens per logits chunk: the [tokens, vocab] logits exist one chunk at a time"""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """model dtype; auto: bfloat16 on GPU, float32 on CPU"""

    def __post_init__(self):
        check_settings(self, non_negative=["row"], at_least_one=["loss_chunk"])


# ================================================================================================
# ALGO LOGIC: the metrics (whether a response is right: plumbing/grading.py)
# ================================================================================================
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k = 1 - C(n-c, k) / C(n, k) (Chen et al. 2021), as a product of ratios."""
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_ks(n: int) -> list[int]:
    """The k of pass@k reported for n samples per question: the powers of 2 up to n, and n."""
    return sorted({2**i for i in range(n.bit_length()) if 2**i <= n} | {n})


def ngram_diversity(token_ids: list[list[int]], n: int = 4) -> float | None:
    """1 - mean pairwise overlap of one question's samples (Fig. 4: "1 minus N-gram similarity").
    Overlap of two samples = Jaccard index |A & B| / |A | B| of their sets of token-id n-grams; a
    sample shorter than n counts as one n-gram. None with fewer than two samples."""
    sets = [set(zip(*(ids[i:] for i in range(n)))) or {tuple(ids)} for ids in token_ids]
    pairs = list(itertools.combinations(sets, 2))
    if not pairs:
        return None
    return 1.0 - sum(len(a & b) / len(a | b) for a, b in pairs) / len(pairs)


@torch.no_grad()
def expert_token_entropy(model, tokenizer, examples: list[Example], max_len: int = 9216,
                         system_prompt: str = "paper") -> dict:
    """Full-vocabulary entropy of the model's next-token distribution (tau = 1) at every position
    that predicts an expert response token or its EOS (the SFT loss positions, as data.py masks
    them), split at the 80th percentile over all positions into the top 20% and the bottom 80%
    (Fig. 2a/b). The split is by rank, so ties at the threshold still give 20% / 80% of the
    positions."""
    device = next(model.parameters()).device
    entropies = []
    quiet = len(examples) < 32 or not sys.stderr.isatty()
    for ex in tqdm(examples, desc="expert-token entropy", disable=quiet):
        prompt = example_prompt(ex, tokenizer, system_prompt)
        ids, mask = tokenize_sft(tokenizer, prompt, ex.response)
        ids, mask = ids[:max_len], torch.tensor(mask[:max_len], dtype=torch.bool)
        logits = model(torch.tensor([ids], device=device)).logits[0]             # [L, V]
        entropies.append(cl.entropy(logits[:-1][mask[1:].to(device)]).cpu())  # response + EOS
    h = torch.cat(entropies).sort(descending=True).values                      # [positions]
    k = max(1, round(0.2 * len(h)))
    return {"top20": h[:k].mean().item(), "bottom80": h[k:].mean().item() if len(h) > k else None,
            "all": h.mean().item(), "tokens": len(h)}


def benchmark_metrics(samples: list[list[Sample]], scores: list[list[float]]) -> dict:
    """Metrics of one benchmark from its questions' samples and 0/1 scores (question-major)."""
    n = len(scores[0])
    ks = pass_ks(n)
    flat = [s for q in samples for s in q]
    n_tokens = sum(len(s.token_ids) for s in flat)
    diversities = [ngram_diversity([s.token_ids for s in q]) for q in samples]
    diversities = [d for d in diversities if d is not None]
    pass_k = {str(k): float(np.mean([pass_at_k(n, int(sum(q)), k) for q in scores])) for k in ks}
    correct = np.array([sum(q) for q in scores])                              # [questions]
    return {
        "questions": len(scores), "n": n,
        "avg": float(np.mean(scores)),  # avg@n: mean accuracy over all n samples of every question
        # its standard error over questions (the questions are the sample; n samples each)
        "avg_stderr": float(np.std(correct / n, ddof=1) / np.sqrt(len(scores)))
        if len(scores) > 1 else None,
        # questions whose samples disagree: the GRPO groups with a learning signal, before any RL
        "mixed_frac": float(np.mean((correct > 0) & (correct < n))),
        "pass_at_k": pass_k,
        "response_length": n_tokens / len(flat),  # tokens, EOS included
        # token-mean entropy of the sampling distribution, temperature and top-p applied
        "entropy": sum(sum(s.entropy) for s in flat) / max(n_tokens, 1),
        "diversity": float(np.mean(diversities)) if diversities else None,
        "truncated": float(np.mean([s.finish_reason == "length" for s in flat])),
    }


def table2_averages(benchmarks: dict[str, dict]) -> dict:
    """Table 2's averages: ID and OOD accuracy (None when none of their benchmarks ran), and
    means over all benchmarks of avg@n, entropy and diversity (the x and y of Figs. 1 and 4)."""
    def mean(key, names=None):
        vals = [m[key] for b, m in benchmarks.items()
                if (names is None or b in names) and m[key] is not None]
        return float(np.mean(vals)) if vals else None
    return {"id_avg": mean("avg", ID_BENCHMARKS), "ood_avg": mean("avg", OOD_BENCHMARKS),
            "avg": mean("avg"), "entropy": mean("entropy"), "diversity": mean("diversity")}


def sample_and_grade(engine: Engine, tokenizer, name: str, examples: list[Example],
                     prompts: list[str], n: int, offset: int, args: Args):
    """(samples, 0/1 scores per question, sample records, grader failures) of a block of one
    benchmark's questions starting at question `offset`."""
    if not prompts:  # a rank with no block (more ranks than batches)
        return [], [], [], 0
    samples = generate(engine, tokenizer, prompts, n, args.temperature, args.top_p,
                       args.max_new_tokens, args.seed, args.batch_size, offset=offset)
    records = []
    for ex, question_samples in zip(examples, samples):
        for j, s in enumerate(question_samples):
            records.append({"data_source": name, "row": ex.row, "question": ex.question,
                            "ground_truth": ex.ground_truth,
                            "kind": answer_kind(name, ex.ground_truth), "sample": j,
                            "response": s.text, "length": len(s.token_ids),
                            "finish_reason": s.finish_reason})
    texts = [graded_text(s.text, s.stop_text, args.grading) for q in samples for s in q]
    scores, failures = grade(texts, [r["ground_truth"] for r in records],
                             [r["kind"] for r in records], args.grader_timeout, args.grader_workers,
                             args.grading)
    for r, s in zip(records, scores):
        r["score"] = s
    return samples, [scores[i * n : (i + 1) * n] for i in range(len(samples))], records, failures


@torch.no_grad()
def curio_token_view(model, teacher, batch: dict, cfg: cl.LossConfig, chunk: int) -> dict:
    """What CurioSFT does at each trained token (response and EOS) of a batch: {name: [N]} with the
    student's lp, the teacher's entropy H_t (top-k, App. D), Delta_t (Eq. 7), tau_t and lq (Alg. 1
    lines 6-11), and the weight w_t = 1 - alpha (lp - lq) that CurioSFT puts on cross-entropy
    there; the expert token ("target"). teacher: a second model, or None for the model itself (the
    self-teacher, as sft.py --loss curio_self_teacher). The logits exist one chunk at a time."""
    h, y = select_targets(normed_hidden(model, batch), batch)                # [N, H], [N]
    h_teacher = None if teacher is None else select_targets(normed_hidden(teacher, batch), batch)[0]
    parts = []
    for s in range(0, max(len(y), 1), chunk):
        logits = model.lm_head(h[s : s + chunk])                             # [n, V]
        z_teacher = logits if teacher is None else no_grad_logits(teacher.lm_head,
                                                                  h_teacher[s : s + chunk])
        lq, teacher_diag = cl.teacher_log_prob(z_teacher, y[s : s + chunk], cfg)
        _, student_diag = cl.curio_sft_loss(logits, y[s : s + chunk], lq, cfg)   # lp, weight
        delta = cl.entropy_increment(teacher_diag["teacher_entropy"], cfg)
        parts.append(teacher_diag | student_diag | {"delta": delta, "target": y[s : s + chunk]})
    return cat_diags(parts)


# ================================================================================================
# ALGO LOGIC: paired comparisons of two checkpoints on the same questions (evaluate.py compare)
# ================================================================================================
@dataclass
class Evaluation:
    """The per-question scores of one evaluate.py run (its samples.jsonl)."""
    name: str
    path: str
    correct: dict[str, dict[str, int]]   # benchmark -> question text -> samples graded right
    n: dict[str, int]                    # benchmark -> samples per question


def per_question(correct: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """Each question's avg@n (correct / n) and unbiased pass@k for k > 1 (pass@1 is avg@n): the
    benchmark's metrics are their means over questions (benchmark_metrics)."""
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
    apart by (data_source, question text), as load_benchmarks de-duplicates them."""
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
    (table2_averages), with a 95% percentile bootstrap interval. The pairing is over questions: a
    replicate resamples each benchmark's question indices once and applies them to both sides.
    With several evaluations per side (seeds) the seeds are resampled too, with the same draw for
    every benchmark: where every evaluation holds the same questions, each side's seeds
    independently; else A's i-th and B's i-th evaluations must share their questions and are
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


# ================================================================================================
# The evaluation run: benchmarks, ranks, saved progress
# ================================================================================================
def load_benchmarks(path: str, limit: int = 0) -> dict[str, list[Example]]:
    """{data_source: unique examples} from a directory of .parquet/.jsonl/.json files (or one file).

    Questions are de-duplicated on (data_source, question text): valid.all.parquet repeats
    AIME24, AIME25 and AMC 32 times each, and avg@8 / pass@k must mean n samples of each distinct
    problem, not 8 x 32."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"data {path!r}: no such file or directory")
    suffixes = (".parquet", ".jsonl", ".json")
    files = [p] if p.is_file() else sorted(f for f in p.iterdir() if f.suffix in suffixes)
    if not files:
        raise FileNotFoundError(f"data {path!r}: no .parquet, .jsonl or .json files")
    benchmarks, seen, dropped = {}, set(), 0
    for f in files:
        for ex in load_examples(f):
            if (ex.data_source, ex.question) in seen:
                dropped += 1
                continue
            seen.add((ex.data_source, ex.question))
            benchmarks.setdefault(ex.data_source, []).append(ex)
    counts = ", ".join(f"{b} ({len(v)})" for b, v in benchmarks.items())
    print0(f"benchmarks: {counts}; {dropped} duplicates dropped")
    return {b: v[:limit] if limit else v for b, v in benchmarks.items()}


def drop_long_prompts(benchmarks: dict[str, list[Example]], tokenizer, args: Args):
    """(benchmarks without the questions whose prompt, as generate encodes it, is over
    max_prompt_len tokens, {benchmark: questions dropped}). The authors' scripts drop prompts
    over 1024 tokens the same way; a benchmark left with no question is left out."""
    kept, dropped = {}, {}
    for b, examples in benchmarks.items():
        lengths = [len(encode(tokenizer, example_prompt(ex, tokenizer, prompt_mode(args))))
                   for ex in examples]
        fits = [ex for ex, length in zip(examples, lengths) if length <= args.max_prompt_len]
        dropped[b] = len(examples) - len(fits)
        if fits:
            kept[b] = fits
    return kept, dropped


def check_out_dir(out: str) -> None:
    """A one-line error, before any model loads, when --out cannot take the results."""
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise ValueError(f"--out {out!r}: exists and is not a directory")
    nearest = next(q for q in (p.absolute(), *p.absolute().parents) if q.exists())  # mkdir's
    if not nearest.is_dir() or not os.access(nearest, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out!r}: cannot write in {str(nearest)!r}")


# Settings that change no sample and no score: a benchmark saved under other values of these is
# still reused. data, limit and max_prompt_len are left out too: the saved run's questions
# themselves are compared.
_NOT_IN_PROGRESS_KEY = {"out", "name", "save_samples", "grader_workers", "sft_data", "sft_examples",
                        "data", "limit", "max_prompt_len"}


def _progress_key(args: Args, examples: list[Example], prompts: list[str]) -> dict:
    """What a saved benchmark must match to be reused: the settings, its questions and the
    checkpoint's files (name, size, modification time: a checkpoint saved again under the same
    path is a different model)."""
    questions = json.dumps([[p, ex.ground_truth] for ex, p in zip(examples, prompts)])
    model_files = {f.name: [f.stat().st_size, f.stat().st_mtime_ns]
                   for f in sorted(Path(args.model).iterdir()) if f.is_file()}
    settings = {k: v for k, v in asdict(args).items() if k not in _NOT_IN_PROGRESS_KEY}
    key = {"settings": settings, "questions_sha256": hashlib.sha256(questions.encode()).hexdigest(),
           "model_files": model_files}
    return json.loads(json.dumps(key))  # as read back from JSON


def progress_file_name(data_source: str) -> str:
    """A file name inside OUT/progress/ for a benchmark. data_source comes from the data file: all
    but letters, digits, '.', '_' and '-' becomes '_' (no '/', no '..'), and a digest of the name
    keeps apart two names that differ only there."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", data_source)[:64].lstrip(".") or "_"
    return f"{safe}-{hashlib.sha256(data_source.encode()).hexdigest()[:12]}.json"


def _load_progress(path: Path, key: dict) -> dict | None:
    """A benchmark saved by a run with the same settings, else None (none, others, unreadable)."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) and saved.get("key") == key else None


def rank_block(count: int, batch_size: int, rank: int, world: int) -> range:
    """This rank's questions: a contiguous block of whole batches of batch_size, so that every HF
    batch, and the seed generate gives it, is the same whatever the number of ranks."""
    batches = -(-count // batch_size)
    first, end = batches * rank // world, batches * (rank + 1) // world
    return range(min(count, first * batch_size), min(count, end * batch_size))


def evaluate_benchmarks(engine: Engine, tokenizer, benchmarks: dict[str, list[Example]], args: Args,
                        progress_dir: Path | None = None, group=None) -> tuple[dict | None, list]:
    """(results, sample records): sample, grade and measure one benchmark at a time. With a
    process group (`group`, gloo, torchrun) each rank samples and grades its block of every
    benchmark and rank 0 gathers them; the other ranks get (None, []). With progress_dir, rank 0
    saves each finished benchmark there, and a benchmark saved by a run with the same settings is
    loaded instead: a crash loses one benchmark."""
    rank, world = 0, 1
    if group is not None:
        rank, world = dist.get_rank(group), dist.get_world_size(group)
    metrics, records, failures = {}, [], 0
    for i, (name, examples) in enumerate(benchmarks.items(), 1):
        start = time.perf_counter()
        n = args.n_mmlu_pro if name.startswith("mmlu_pro") else args.n_samples
        prompts = [example_prompt(ex, tokenizer, prompt_mode(args)) for ex in examples]
        path = progress_dir / progress_file_name(name) if progress_dir is not None else None
        key = _progress_key(args, examples, prompts) if path is not None and rank == 0 else None
        saved = [_load_progress(path, key) if key is not None else None]
        if group is not None:  # every rank skips a saved benchmark, or none does
            dist.broadcast_object_list(saved, src=0, group=group)
        saved = saved[0]
        if saved is not None:
            print0(f"[{i}/{len(benchmarks)}] {name}: loaded from {path} (saved by a run with the "
                   f"same settings)")
        else:
            print0(f"[{i}/{len(benchmarks)}] {name}: {len(prompts)} prompts x {n} samples, "
                   f"{world} rank(s)")
            block = rank_block(len(prompts), args.batch_size, rank, world)
            part = sample_and_grade(engine, tokenizer, name, examples[block.start : block.stop],
                                    prompts[block.start : block.stop], n, block.start, args)
            parts = [part]
            if group is not None:
                parts = [None] * world
                dist.all_gather_object(parts, part, group=group)
            if rank == 0:  # blocks in rank order: question order
                samples, scores, recs = ([x for p in parts for x in p[k]] for k in range(3))
                saved = {"key": key, "metrics": benchmark_metrics(samples, scores), "records": recs,
                         "grader_failures": sum(p[3] for p in parts)}
                if path is not None:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    write_atomic(path, json.dumps(saved))
        if rank == 0:
            unparsable = [ex.row for ex in examples if ground_truth_unparsable(
                ex.ground_truth, answer_kind(name, ex.ground_truth), args.grading)]
            metrics[name] = {**saved["metrics"], "grader_failures": saved["grader_failures"],
                             "unparsable_ground_truths": len(unparsable)}
            records += saved["records"]
            failures += saved["grader_failures"]
            warn_about_grading(name, unparsable, saved["grader_failures"], args.grading)
            avg = report.percent(metrics[name]["avg"])
            seconds = time.perf_counter() - start
            print0(f"[{i}/{len(benchmarks)}] {name}: avg@{n} {avg}, {seconds:.0f} s")
    if rank != 0:
        return None, []
    name = args.name or Path(args.model.rstrip("/")).name
    return {"name": name, "model": args.model, "settings": asdict(args), "benchmarks": metrics,
            "summary": table2_averages(metrics), "grader_failures": failures}, records


def warn_about_grading(name: str, unparsable: list[int], failures: int, grading: str) -> None:
    """A warning per benchmark whose scores have zeros that no response earned."""
    if unparsable:
        rows = ", ".join(map(str, unparsable[:8])) + (", ..." if len(unparsable) > 8 else "")
        fate = "score 0" if grading == "paper" else "count only where the boxed grader matches"
        print0(f"warning: {name}: math-verify cannot parse {len(unparsable)} ground truths "
               f"(rows {rows}): those questions {fate}")
    if failures:
        print0(f"warning: {name}: {failures} responses could not be graded (a grader error or over "
               f"--grader-timeout): each scores 0")


def trained_system_prompt(model: str, given: str) -> str:
    """--system_prompt as it applies to this checkpoint: auto is what its training run recorded
    (run_config.json beside it or in its run directory), else paper; a given mode that differs
    from the recorded one is used, and said."""
    recorded = None
    for folder in (Path(model), Path(model).parent):
        try:
            recorded = json.loads((folder / "run_config.json").read_text()).get("system_prompt")
            break
        except (OSError, ValueError, AttributeError):
            continue
    if given == "auto":
        return recorded if recorded in SYSTEM_PROMPT_MODES else "paper"
    if recorded and recorded != given:
        print0(f"note: --system_prompt {given}, while {model} was trained with {recorded}")
    return given


def prompt_mode(args) -> str:
    """args.system_prompt, auto read as paper where no checkpoint was looked at (run_eval and
    evaluate_checkpoint put the checkpoint's own mode in its place)."""
    return "paper" if args.system_prompt == "auto" else args.system_prompt


def run_eval(args: Args) -> dict | None:
    """Evaluate one checkpoint; under torchrun every rank takes a block of each benchmark and
    rank 0 writes the results, which it returns (the other ranks return None)."""
    longest = args.max_prompt_len + args.max_new_tokens
    if engine_kind(args.engine) == "vllm" and longest > args.max_model_len:
        # vLLM would end such responses at max_model_len ("length"), short of max_new_tokens
        raise ValueError(f"--max-prompt-len {args.max_prompt_len} + --max-new-tokens "
                         f"{args.max_new_tokens} is over --max-model-len {args.max_model_len}: "
                         f"raise --max-model-len or lower the others")
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1 and args.tensor_parallel_size > 1:
        raise ValueError(f"--tensor_parallel_size {args.tensor_parallel_size} with {world} ranks: "
                         f"torchrun runs one engine per rank (data parallel); use one process for "
                         f"tensor parallelism")
    check_out_dir(args.out)
    benchmarks = load_benchmarks(args.data, args.limit)  # fail on bad data before loading a model
    rank, group = 0, None
    if "RANK" in os.environ:  # torchrun
        rank, world, _ = setup_distributed()
        group = dist.new_group(backend="gloo")  # objects (the blocks' samples) go over gloo
    # an org/name is the hub's copy, named after the model rather than its snapshot directory
    args = replace(args, name=args.name or Path(args.model.rstrip("/")).name,
                   model=resolve_model(args.model))
    check_model_dir(args.model)
    if rank == 0:
        lock_dir(Path(args.out), "evaluation")             # one evaluation per output directory
    try:
        return evaluate_checkpoint(args, benchmarks, rank, world, group)
    finally:
        release()
        if rank == 0:
            drop_if_empty(Path(args.out))              # a failed start leaves no folder behind


def evaluate_checkpoint(args: Args, benchmarks: dict[str, list[Example]], rank: int, world: int,
                        group) -> dict | None:
    """run_eval's work once OUT is held: expert entropy, engine, benchmarks, result files."""
    if rank == 0:
        verify_model_dir(args.model)                       # a damaged checkpoint stops here
    args = replace(args, system_prompt=trained_system_prompt(args.model, args.system_prompt))
    expert = None
    if args.sft_data and rank == 0:  # HF logits; first, so that vLLM gets the memory after
        examples = load_examples(args.sft_data, require_response=True)[: args.sft_examples]
        hf, tokenizer = load_engine(args.model, "hf", args.dtype)
        expert = expert_token_entropy(hf.model, tokenizer, examples,
                                      system_prompt=args.system_prompt)
        del hf
        torch.cuda.empty_cache()
    # Several ranks: one vLLM engine per rank, in the rank's own process (as rl.py's), seeded per
    # prompt.
    per_rank = dict(distributed_executor_backend="external_launcher") if world > 1 else {}
    engine, tokenizer = load_engine(args.model, args.engine, args.dtype, args.seed,
                                    tensor_parallel_size=args.tensor_parallel_size,
                                    gpu_memory_utilization=args.gpu_memory_utilization,
                                    max_model_len=args.max_model_len, **per_rank)
    print0(f"engine: {engine.kind}")
    benchmarks, dropped = drop_long_prompts(benchmarks, tokenizer, args)
    print0(f"prompts over {args.max_prompt_len} tokens, dropped: "
           + ", ".join(f"{b} {n}" for b, n in dropped.items()))
    if not benchmarks:
        raise ValueError(f"every prompt is over --max-prompt-len {args.max_prompt_len} tokens")
    out = Path(args.out)
    result, records = evaluate_benchmarks(engine, tokenizer, benchmarks, args, out / "progress",
                                          group)
    if rank != 0:
        return None
    result["expert_entropy"] = expert
    result["long_prompts_dropped"] = dropped
    write_atomic(out / "results.md", report.results_table(result))
    if args.save_samples:
        write_atomic(out / "samples.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    report.plot_results([result], args.out)
    write_atomic(out / "results.json", json.dumps(result, indent=2))  # last: marks it finished
    print(report.results_table(result))
    return result


def run_plot(args: PlotArgs) -> list[str]:
    """compare.md (Table 2's layout) and the plots over several results.json and training logs."""
    results = []
    for path in args.results:
        if not Path(path).is_file():
            raise FileNotFoundError(f"results {path!r}: no such file")
        try:
            result = json.loads(Path(path).read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"results {path!r}: not JSON ({e})") from None
        if not isinstance(result, dict) or not {"name", "benchmarks", "summary"} <= result.keys():
            raise ValueError(f"results {path!r}: not a results.json written by evaluate.py")
        results.append(result)
    for path in args.logs:
        if not Path(path).is_file():
            raise FileNotFoundError(f"log {path!r}: no such file")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "compare.md").write_text(report.compare_table(results))
    print(report.compare_table(results))
    return report.plot_results(results, args.out, args.logs, args.log_keys)


def run_compare(args: CompareArgs) -> dict:
    """paired.md and paired.json: A - B with paired bootstrap intervals (paired_comparison)."""
    a, b = [load_evaluation(p) for p in args.a], [load_evaluation(p) for p in args.b]
    result = paired_comparison(a, b, args.resamples, args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = report.paired_table(result)
    write_atomic(out / "paired.md", table)
    write_atomic(out / "paired.json", json.dumps(result, indent=1))
    print(table)
    return result


def run_tokens(args: TokensArgs, cfg: cl.LossConfig) -> dict:
    """The page of one SFT example (curio_token_view); returns the view."""
    examples = load_examples(args.data, require_response=True)
    if args.row >= len(examples):
        raise ValueError(f"--row {args.row}: {args.data} has rows 0 to {len(examples) - 1}")
    example = examples[args.row]
    args = replace(args, model=resolve_model(args.model))
    args = replace(args, system_prompt=trained_system_prompt(args.model, args.system_prompt))
    student, tokenizer = load_engine(args.model, "hf", args.dtype)
    teacher = None
    if args.teacher:
        teacher = load_engine(resolve_model(args.teacher), "hf", args.dtype)[0].model
        if teacher.config.vocab_size != student.model.config.vocab_size:
            raise ValueError(f"--teacher {args.teacher}: vocabulary {teacher.config.vocab_size}, "
                             f"the model's {student.model.config.vocab_size}")
    prompt = example_prompt(example, tokenizer, args.system_prompt)
    ids, mask = tokenize_sft(tokenizer, prompt, example.response)
    device = next(student.model.parameters()).device
    batch = collate([(ids, mask)], tokenizer.pad_token_id, device)
    view = {k: v.cpu() for k, v in curio_token_view(student.model, teacher, batch, cfg,
                                                    args.loss_chunk).items()}
    summary = cl.summarize(view, cfg.alpha)        # what sft.py logs, over this example's tokens
    page = token_page.render(tokenizer, ids, mask, view, summary, cfg, {
        "model": args.model, "teacher": args.teacher or "the model itself (self-teacher)",
        "example": f"{args.data}, row {args.row} ({example.data_source})",
        "system_prompt": args.system_prompt})
    Path(args.out).absolute().parent.mkdir(parents=True, exist_ok=True)
    write_atomic(Path(args.out), page)
    print(f"{args.out}: {len(view['lp'])} response tokens; w_t {summary['w_top20']:.3f} at the top "
          f"20% teacher-entropy tokens, {summary['w_bottom80']:.3f} at the rest")
    return view


SUBCOMMANDS = ("plot", "compare", "tokens")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plot"]:
        run_plot(parse_config(PlotArgs, argv=argv[1:], prog="evaluate.py plot")[0])
    elif argv[:1] == ["compare"]:
        words = argv[1:]
        if len(words) >= 2 and not any(w.startswith("-") for w in words[:2]):  # compare A B [...]
            words = ["--a", words[0], "--b", words[1], *words[2:]]
        run_compare(parse_config(CompareArgs, argv=words, prog="evaluate.py compare")[0])
    elif argv[:1] == ["tokens"]:
        run_tokens(*parse_config(TokensArgs, cl.LossConfig, argv=argv[1:],
                                 prog="evaluate.py tokens"))
    elif argv[:1] and not argv[0].startswith("-") and not argv[0].endswith(".py"):
        close = difflib.get_close_matches(argv[0], SUBCOMMANDS, n=1)
        raise SystemExit(f"evaluate.py: unknown subcommand {argv[0]!r}"
                         + (f", did you mean {close[0]}?" if close else "")
                         + f" (subcommands: {', '.join(SUBCOMMANDS)}; an evaluation takes flags)")
    else:
        run_eval(parse_config(Args, argv=argv, prog="evaluate.py")[0])
        if dist.is_initialized():  # torchrun: every rank done before the group goes
            shutdown()


if __name__ == "__main__":
    run_script(main)
