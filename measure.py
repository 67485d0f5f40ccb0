# The measurement of sampled benchmark questions (arXiv:2602.02244 Sec. 5.1): avg@n, pass@k, the
# sampling entropy, n-gram diversity, shared by evaluate.py (a checkpoint) and by sft.py and rl.py
# (validation during training, --eval_every).
"""Sample n responses per question, grade them and measure them: evaluate.py calls
measure_benchmarks on a checkpoint's engine; sft.py and rl.py call `validate` on their colocated
engine (woken, given the trainer's weights, put back to sleep, as for GRPO's rollouts), which runs
the same measure_benchmarks. Sampling and grading themselves are plumbing/ (generation, grading).
"""
import hashlib
import itertools
import json
import re
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.distributed as dist

from data import Example, example_prompt, load_examples
from plumbing import generation, report
from plumbing.cli import check_settings
from plumbing.distributed import print0
from plumbing.generation import Engine, Sample, encode, generate
from plumbing.grading import (GRADING_MODES, answer_kind, grade, graded_text,
                              ground_truth_unparsable)
from plumbing.paired_stats import pass_at_k, pass_ks
from plumbing.run_dir import write_atomic


# ================================================================================================
# ALGO LOGIC: the metrics (whether a response is right: plumbing/grading.py)
# ================================================================================================
def ngram_diversity(token_ids: list[list[int]], n: int = 4) -> float | None:
    """1 - mean pairwise overlap of one question's samples (Fig. 4: "1 minus N-gram similarity").
    Overlap of two samples = Jaccard index |A & B| / |A | B| of their sets of token-id n-grams; a
    sample shorter than n counts as one n-gram. None with fewer than two samples."""
    sets = [set(zip(*(ids[i:] for i in range(n)))) or {tuple(ids)} for ids in token_ids]
    pairs = list(itertools.combinations(sets, 2))
    if not pairs:
        return None
    return 1.0 - sum(len(a & b) / len(a | b) for a, b in pairs) / len(pairs)



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
        # token-mean entropy of the sampling distribution, temperature and top-p applied (None from
        # an engine without it: rl.py's vLLM engine returns the model's raw log-probs)
        "entropy": sum(sum(s.entropy) for s in flat) / max(n_tokens, 1)
        if all(s.entropy is not None for s in flat) else None,
        "diversity": float(np.mean(diversities)) if diversities else None,
        "truncated": float(np.mean([s.finish_reason == "length" for s in flat])),
    }



def sample_and_grade(engine: Engine, tokenizer, name: str, examples: list[Example],
                     prompts: list[str], n: int, offset: int, args):
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




# ================================================================================================
# A measurement: benchmarks, ranks, saved progress
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


def drop_long_prompts(benchmarks: dict[str, list[Example]], tokenizer, args):
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


_NOT_IN_PROGRESS_KEY = {"out", "name", "save_samples", "grader_workers", "sft_data", "sft_examples",
                        "data", "limit", "max_prompt_len"}


def _progress_key(args, examples: list[Example], prompts: list[str]) -> dict:
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
    batch is the same whatever the number of ranks (the seeds are the questions' own either way:
    generate's offset)."""
    batches = -(-count // batch_size)
    first, end = batches * rank // world, batches * (rank + 1) // world
    return range(min(count, first * batch_size), min(count, end * batch_size))


def measure_benchmarks(engine: Engine, tokenizer, benchmarks: dict[str, list[Example]], args,
                       progress_dir: Path | None = None, group=None,
                       quiet: bool = False) -> tuple[dict | None, list, int]:
    """({benchmark: metrics}, sample records, grader failures): sample, grade and measure one
    benchmark at a time. args: evaluate.py's settings or any object with the fields it reads
    (EvalSettings). With a process group (`group`) each rank samples and grades its block of every
    benchmark and rank 0 gathers them; the other ranks get (None, [], 0). With progress_dir, rank 0
    saves each finished benchmark there, and a benchmark saved by a run with the same settings is
    loaded instead: a crash loses one benchmark. quiet: no line per benchmark (validation during
    training prints its own one)."""
    say = (lambda _: None) if quiet else print0
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
            say(f"[{i}/{len(benchmarks)}] {name}: loaded from {path} (saved by a run with the "
                   f"same settings)")
        else:
            say(f"[{i}/{len(benchmarks)}] {name}: {len(prompts)} prompts x {n} samples, "
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
            say(f"[{i}/{len(benchmarks)}] {name}: avg@{n} {avg}, {seconds:.0f} s")
    if rank != 0:
        return None, [], 0
    return metrics, records, failures


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



def prompt_mode(args) -> str:
    """args.system_prompt, auto read as paper where no checkpoint was looked at (run_eval and
    evaluate_checkpoint put the checkpoint's own mode in its place)."""
    return "paper" if args.system_prompt == "auto" else args.system_prompt


# ================================================================================================
# Validation during training: sft.py and rl.py, --eval_every N (the authors' verl test_freq)
# ================================================================================================
@dataclass
class ValidationArgs:
    """validation during training: measure.validate, the measurement evaluate.py makes

    sft.py's and rl.py's Args inherit these flags."""
    eval_every: int = 0
    """validate every this many optimiser steps (sft.py) or GRPO steps (rl.py), 0: never: sample
    --eval_file, grade, log val_*"""
    eval_file: str = ""
    """the questions and answers to validate on, in evaluate.py's schema (the authors':
    validation.parquet)"""
    eval_n: int = 1
    """samples per validation question: val_accuracy is avg@eval_n"""
    eval_temperature: float = 0.6
    """validation sampling temperature (the authors' val_kwargs, Sec. 5.1)"""
    eval_top_p: float = 0.95
    """validation nucleus sampling (Sec. 5.1; the authors' val_kwargs: 1.0)"""
    eval_max_new_tokens: int = 0
    """longest validation response in tokens (0: --max_response_len)"""
    eval_grading: Literal[GRADING_MODES] = "paper"
    """how validation responses are graded (evaluate.py --grading; the authors': authors)"""

    def __post_init__(self):
        check_settings(self, positive=["eval_temperature"], fraction=["eval_top_p"],
                       non_negative=["eval_every", "eval_max_new_tokens"], at_least_one=["eval_n"])
        if self.eval_every and not self.eval_file:
            raise SystemExit(f"--eval_every {self.eval_every}: needs --eval_file (the questions "
                             f"to validate on)")


# a resumed run may change them: validation samples with generators of its own and changes no
# training computation, only the val_* records
VALIDATION_MAY_CHANGE = {f.name for f in fields(ValidationArgs)}


@dataclass
class EvalSettings:
    """What measure_benchmarks reads (evaluate.py's Args has these fields and more), from a
    training run's flags (eval_settings)."""
    n_samples: int
    n_mmlu_pro: int
    temperature: float
    top_p: float
    max_new_tokens: int
    max_prompt_len: int
    system_prompt: str
    seed: int
    batch_size: int
    grader_timeout: float
    grader_workers: int
    grading: str


def eval_settings(args, batch_size: int, grader_timeout: float = 10.0,
                  grader_workers: int = 4) -> EvalSettings:
    """The measurement of a training run (sft.py, rl.py): its ValidationArgs, its prompts' length
    limit and system prompt, its seed (the same at every evaluation: from one to the next, only
    the model changes)."""
    return EvalSettings(n_samples=args.eval_n, n_mmlu_pro=args.eval_n,
                        temperature=args.eval_temperature, top_p=args.eval_top_p,
                        max_new_tokens=args.eval_max_new_tokens or args.max_response_len,
                        max_prompt_len=args.max_prompt_len, system_prompt=args.system_prompt,
                        seed=args.seed, batch_size=batch_size, grader_timeout=grader_timeout,
                        grader_workers=grader_workers, grading=args.eval_grading)


def load_eval_file(path: str, tokenizer, settings: EvalSettings) -> dict[str, list[Example]]:
    """At the start of a training run, before anything is written: the eval file's questions as
    evaluate.py reads them (its one-line refusals of a missing file, a row without an answer, a
    schema it does not read), without the prompts over max_prompt_len."""
    benchmarks = load_benchmarks(path)
    benchmarks, dropped = drop_long_prompts(benchmarks, tokenizer, settings)
    if not benchmarks:
        raise ValueError(f"--eval_file {path}: every prompt is over --max_prompt_len "
                         f"{settings.max_prompt_len} tokens")
    if any(dropped.values()):
        print0(f"--eval_file {path}: prompts over {settings.max_prompt_len} tokens, left out: "
               + ", ".join(f"{b} {n}" for b, n in dropped.items()))
    return benchmarks


def eval_due(step: int, every: int) -> bool:
    """--eval_every: after optimiser step `step` (counted from 1), as verl's test_freq (without its
    extra evaluation at the last step: a finished run asked for more steps goes on as one run)."""
    return every > 0 and step % every == 0


class Validation:
    """A training run's --eval_every: its settings and questions, read when the run starts (a bad
    eval file is refused before anything is written), the colocated engine (rl.py's rollout
    engine, or sft.py's own: own_engine) and, after each due step, validate()."""

    def __init__(self, args, tokenizer):
        self.every, self.engine, self.bucket_bytes = args.eval_every, None, args.sync_bucket_mb << 20
        self.settings = eval_settings(args, args.gen_batch_size, args.grader_timeout,
                                      args.grader_workers)
        self.questions = load_eval_file(args.eval_file, tokenizer, self.settings) \
            if self.every else None

    def own_engine(self, args, device, bf16: bool, random_weights: bool = False) -> None:
        """sft.py's engine, asleep until a validation (made before the models: vLLM's share of the
        GPU must be free), seeded outside the training's random stream."""
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            self.engine, _ = generation.rollout_engine(
                args.model, args.engine, "bfloat16" if bf16 else "float32",
                args.seed + dist.get_rank(), args.gpu_memory_utilization,
                args.max_prompt_len + self.settings.max_new_tokens, sleep=True,
                has_trainer_weights=False, random_weights=random_weights)

    def after(self, step: int, model, tokenizer, run) -> None:
        """validate() after optimiser step `step` when it is due: a part of the step, logged (the
        run's log) and saved with it (the run's val_samples.jsonl)."""
        if eval_due(step, self.every):
            validate(self.engine, model, tokenizer, self.questions, self.settings, step, run.log,
                     run.out_dir / "val_samples.jsonl", self.bucket_bytes)


def validation_fields(metrics: dict[str, dict], failures: int) -> dict:
    """The log's val_* fields from measure_benchmarks' metrics: pooled over every sample of every
    source (accuracy, response length) and over every sampled token (entropy); with several
    sources, each one's too (val_accuracy/SOURCE, ...)."""
    samples = {b: m["questions"] * m["n"] for b, m in metrics.items()}
    tokens = {b: samples[b] * m["response_length"] for b, m in metrics.items()}
    n_samples, n_tokens = sum(samples.values()), max(sum(tokens.values()), 1e-9)
    entropy = all(m["entropy"] is not None for m in metrics.values())    # else none is logged
    fields = {
        "val_accuracy": sum(m["avg"] * samples[b] for b, m in metrics.items()) / n_samples,
        **({"val_entropy": sum(m["entropy"] * tokens[b] for b, m in metrics.items()) / n_tokens}
           if entropy else {}),
        "val_response_len": sum(tokens.values()) / n_samples,
        "val_truncated_frac": sum(m["truncated"] * samples[b] for b, m in metrics.items())
        / n_samples,
        "val_grader_failures": failures}
    if len(metrics) > 1:
        for b, m in metrics.items():
            fields |= {f"val_accuracy/{b}": m["avg"], f"val_response_len/{b}": m["response_length"],
                       **({f"val_entropy/{b}": m["entropy"]} if entropy else {})}
    return fields


def validate(engine: Engine, model, tokenizer, benchmarks: dict[str, list[Example]],
             settings: EvalSettings, step: int, log, samples_file: Path,
             bucket_bytes: int = 1 << 30) -> dict | None:
    """One evaluation during training, part of optimiser step `step` (logged and saved with it):
    the colocated engine woken with the trainer's weights, the eval file's questions sampled and
    measured as evaluate.py measures them (each rank a block), the engine put back to sleep. Rank 0
    writes a log record {step, val_*} (log: run_dir.RunLog) and the graded samples to samples_file
    and returns the fields; other ranks return None. The samples draw from generators of their
    own, seeded by settings.seed, inside fork_rng: the training's random stream is untouched.
    Every rank calls it."""
    start = time.perf_counter()
    group = dist.group.WORLD if dist.get_world_size() > 1 else None
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        try:
            generation.wake(engine, model, bucket_bytes)
        except generation.SyncError as e:
            raise SystemExit(f"step {step}: validation: {e}") from None
        metrics, records, failures = measure_benchmarks(engine, tokenizer, benchmarks, settings,
                                                        group=group, quiet=True)
        generation.sleep(engine)
    if metrics is None:
        return None
    fields = {"step": step, **validation_fields(metrics, failures),
              "val_s": time.perf_counter() - start}
    with open(samples_file, "a") as f:
        f.write("".join(json.dumps({"step": step, **r}) + "\n" for r in records))
    if log is not None:
        log.write(fields)
    return fields
