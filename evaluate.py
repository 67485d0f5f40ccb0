# Evaluation of CurioSFT checkpoints (paper Sec. 5.1, Table 2, Figs. 1, 2, 4); docs/design.md maps the code.
"""Generation (vLLM on GPU, HF `generate` on CPU), grading (grading.py: the paper's rule or the authors'), avg@n,
unbiased pass@k, token entropy, n-gram diversity, expert-token entropy, tables and plots.

    python evaluate.py --model CKPT --data BENCH_DIR --out out/eval/ckpt [--engine auto|hf|vllm] [--n 8] \
        [--grading paper|authors]
    torchrun --nproc_per_node 8 evaluate.py ...      # data parallel: each rank a block of every benchmark
    python evaluate.py plot --results out/eval/*/results.json --logs runs/*/log.jsonl --out out/compare

Each finished benchmark is kept under OUT/progress/: a rerun with the same settings loads it instead of
generating it again.

rl.py reuses `load_engine`, `generate` and `grade` (its reward).
"""
import hashlib
import importlib.util
import itertools
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.distributed as dist
import transformers
from tqdm import tqdm

from common import check_settings, parse_config, print0, run_script, setup_distributed, shutdown
from curio_loss import entropy
from data import SYSTEM_PROMPT_MODES, Example, example_prompt, load_examples, tokenize_sft
from grading import GRADING_MODES, answer_kind, grade

ID_BENCHMARKS = ["aime", "aime25", "amc", "math", "minerva", "olympiad_bench"]  # paper Table 2, left
OOD_BENCHMARKS = ["gpqa", "mmlu_pro", "arc_c"]  # paper Table 2, right: multiple choice


@dataclass
class Args:
    """evaluate.py settings"""
    REQUIRED = ("model", "data")
    model: str = ""
    """checkpoint directory (config.json, weights, tokenizer), e.g. one saved by sft.py or rl.py"""
    data: str = ""
    """benchmark directory (or one file): .parquet/.jsonl/.json in the authors' schema, grouped by data_source"""
    out: str = "out/eval"
    """output directory: results.json, results.md, samples.jsonl, plots"""
    name: str = ""
    """label of this checkpoint in tables and plots (default: the model directory's name)"""
    engine: Literal["auto", "hf", "vllm"] = "auto"
    """auto (vLLM when CUDA and vllm are available, else HF generate) | hf | vllm"""
    n: int = 8
    """samples per question: avg@8 and pass@k up to k=8 (paper Sec. 5.1)"""
    n_mmlu_pro: int = 1
    """samples per MMLU-Pro question (the paper draws one: 12k questions)"""
    temperature: float = 0.6
    """sampling temperature (paper Sec. 5.1)"""
    top_p: float = 0.95
    """nucleus sampling (paper Sec. 5.1)"""
    max_new_tokens: int = 8192
    """maximum response length in tokens (paper App. E)"""
    max_prompt_len: int = 1024
    """longer prompts (in tokens, chat template included) are left out and counted per benchmark (paper App. E)"""
    system_prompt: Literal[SYSTEM_PROMPT_MODES] = "paper"
    """paper: Table 7's prompt around the row's question | row: Table 7 with the row's own system message (the toy
    demo's one-liner) | messages: the row's prompt messages as stored, through the chat template (the authors)"""
    seed: int = 0
    """sampling seed"""
    limit: int = 0
    """questions per benchmark after de-duplication, 0 = all (for smoke tests)"""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """model dtype: auto (bfloat16 on GPU, float32 on CPU) | float32 | bfloat16 | float16"""
    batch_size: int = 8
    """prompts per HF generate call (vLLM schedules its own batches)"""
    tensor_parallel_size: int = 1
    """vLLM: GPUs per model (1 under torchrun with several ranks: one engine per rank)"""
    gpu_memory_utilization: float = 0.85
    """vLLM: fraction of total GPU memory it may take"""
    max_model_len: int = 9216
    """vLLM: prompt + response tokens, at least max_prompt_len + max_new_tokens (1024 + 8192)"""
    grader_timeout: float = 10.0
    """seconds per graded response; a grader worker that overruns is killed and the response scores 0"""
    grader_workers: int = 4
    """grader processes"""
    grading: Literal[GRADING_MODES] = "paper"
    """paper: the text after the last </think>, math-verify (the paper's rule and RL reward) | authors: the authors'
    evaluation grader (whole response; math-verify or their boxed-answer grader), as behind the paper's tables"""
    sft_data: str = ""
    """optional SFT file: also measure expert-token entropy on it (paper Fig. 2a/b)"""
    sft_examples: int = 256
    """SFT examples for the expert-token entropy"""
    save_samples: bool = True
    """write every response with its score to samples.jsonl"""

    def __post_init__(self):
        check_settings(self, positive=["temperature", "top_p", "gpu_memory_utilization", "grader_timeout"],
                       fraction=["top_p", "gpu_memory_utilization"], non_negative=["limit"],
                       at_least_one=["n", "n_mmlu_pro", "max_new_tokens", "max_prompt_len", "batch_size",
                                     "tensor_parallel_size", "max_model_len", "grader_workers", "sft_examples"])


@dataclass
class PlotArgs:
    """evaluate.py plot settings"""
    REQUIRED = ("results",)
    results: list[str] = field(default_factory=list)
    """results.json files written by evaluate.py, one per checkpoint"""
    logs: list[str] = field(default_factory=list)
    """sft.py/rl.py JSONL logs ({"step": .., "student_entropy_top20": .., ...} per line): curves over training"""
    log_keys: list[str] = field(default_factory=list)
    """log fields to plot over training, one panel each (default: every field with "entropy" in its name)"""
    out: str = "out/compare"
    """output directory: compare.md and plots"""


# =========================================================================================================
# ALGO LOGIC: metrics, expert-token entropy (grading, the RL reward too, is grading.py)
# =========================================================================================================
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k = 1 - C(n-c, k) / C(n, k) (Chen et al. 2021), as a product: no huge binomials."""
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def ngram_diversity(token_ids: list[list[int]], n: int = 4) -> float | None:
    """1 - mean pairwise overlap of one question's samples (paper Fig. 4: "1 minus N-gram similarity").
    Overlap of two samples = Jaccard index |A & B| / |A | B| of their sets of token-id n-grams; a sample
    shorter than n counts as one n-gram. None with fewer than two samples."""
    sets = [set(zip(*(ids[i:] for i in range(n)))) or {tuple(ids)} for ids in token_ids]
    pairs = list(itertools.combinations(sets, 2))
    if not pairs:
        return None
    return 1.0 - sum(len(a & b) / len(a | b) for a, b in pairs) / len(pairs)


@torch.no_grad()
def expert_token_entropy(model, tokenizer, examples: list[Example], max_len: int = 9216,
                         system_prompt: str = "paper") -> dict:
    """Full-vocabulary entropy of the model's next-token distribution (tau = 1) at every position that predicts
    an expert response token or its EOS (the SFT loss positions, as data.py masks them), split at the 80th
    percentile over all positions into the top 20% and the bottom 80% (paper Fig. 2a/b). The split is by rank,
    so ties at the threshold still give 20% / 80% of the positions."""
    device = next(model.parameters()).device
    entropies = []
    for ex in tqdm(examples, desc="expert-token entropy", disable=len(examples) < 32 or not sys.stderr.isatty()):
        ids, mask = tokenize_sft(tokenizer, example_prompt(ex, tokenizer, system_prompt), ex.response)
        ids, mask = ids[:max_len], torch.tensor(mask[:max_len], dtype=torch.bool)
        logits = model(torch.tensor([ids], device=device)).logits[0]  # (L, V)
        entropies.append(entropy(logits[:-1][mask[1:].to(device)]).cpu())  # positions predicting response + EOS
    h = torch.cat(entropies).sort(descending=True).values  # (positions,)
    k = max(1, round(0.2 * len(h)))
    return {"top20": h[:k].mean().item(), "bottom80": h[k:].mean().item() if len(h) > k else None,
            "all": h.mean().item(), "tokens": len(h)}


def benchmark_metrics(samples: list[list["Sample"]], scores: list[list[float]]) -> dict:
    """Metrics of one benchmark from its questions' samples and 0/1 scores (question-major)."""
    n = len(scores[0])
    ks = sorted({2**i for i in range(n.bit_length()) if 2**i <= n} | {n})
    flat = [s for q in samples for s in q]
    n_tokens = sum(len(s.token_ids) for s in flat)
    diversities = [d for q in samples if (d := ngram_diversity([s.token_ids for s in q])) is not None]
    return {
        "questions": len(scores), "n": n,
        "avg": float(np.mean(scores)),  # avg@n: mean accuracy over all n samples of every question
        "pass_at_k": {str(k): float(np.mean([pass_at_k(n, int(sum(q)), k) for q in scores])) for k in ks},
        "response_length": n_tokens / len(flat),  # tokens, EOS included
        # Token-mean entropy of the sampling distribution (temperature and top-p applied): see Sample.entropy.
        "entropy": sum(sum(s.entropy) for s in flat) / max(n_tokens, 1),
        "diversity": float(np.mean(diversities)) if diversities else None,
        "truncated": float(np.mean([s.finish_reason == "length" for s in flat])),
    }


def table2_averages(benchmarks: dict[str, dict]) -> dict:
    """Paper Table 2 averages: ID and OOD accuracy (None when none of their benchmarks ran), and means over
    all benchmarks of avg@n, entropy and diversity (the x and y of Figs. 1 and 4)."""
    def mean(key, names=None):
        vals = [m[key] for b, m in benchmarks.items() if (names is None or b in names) and m[key] is not None]
        return float(np.mean(vals)) if vals else None
    return {"id_avg": mean("avg", ID_BENCHMARKS), "ood_avg": mean("avg", OOD_BENCHMARKS), "avg": mean("avg"),
            "entropy": mean("entropy"), "diversity": mean("diversity")}


# =========================================================================================================
# Generation: one function, two engines
# =========================================================================================================
@dataclass
class Sample:
    token_ids: list[int]  # generated tokens, the EOS included when the model stopped
    text: str  # decoded token_ids without the EOS, special tokens kept (so "</think>" always survives)
    # The next two only with generate(logprobs=True) (evaluate.py's entropy metric), else None: rl.py's rollouts
    # skip them, as the trainer recomputes log-probs and entropy with its own numerics.
    logprobs: list[float] | None  # log-prob of each token under the sampling distribution (temperature, top-p)
    # Per-token entropy of the sampling distribution. HF: exact, from the processed scores of every step.
    # vLLM: -logprob of the sampled token, a one-sample estimate whose token mean is a consistent estimate of the
    # same mean entropy (E[-log p(y)] = H(p) for y ~ p); only the mean is meaningful, not single values.
    entropy: list[float] | None
    # HF: "stop" (an EOS) or "length". vLLM: as it reports it: also "abort", "error", "repetition", which are not
    # truncations; the truncation metrics count "length" only.
    finish_reason: str


@dataclass
class Engine:
    kind: str  # "hf" or "vllm"
    model: Any  # a transformers model (hf) or a vllm.LLM (vllm); rl.py loads new weights into it
    logprobs: bool = True  # vLLM: built to return the sampling distribution's log-probs (load_engine)


# Qwen checkpoints end a response with either of two tokens (ids 151645 and 151643 in Qwen2.5's tokenizer): chat
# models <|im_end|>, base models and SFT on them <|endoftext|>. A checkpoint's generation_config often names only
# one; the authors' rollouts stop on both (stop_token_ids in their agent loop), and so does generate.
QWEN_EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _decode(tokenizer, token_ids: list[int], stopped: bool) -> str:
    """Text of a response without its final EOS. Other special tokens stay: a tokenizer may mark </think> special."""
    if stopped and token_ids and token_ids[-1] in tokenizer.all_special_ids:
        token_ids = token_ids[:-1]
    return tokenizer.decode(token_ids, skip_special_tokens=False)


def _eos_ids(model, tokenizer) -> list[int]:
    """The tokens that end a response: the tokenizer's EOS (what SFT trains), the checkpoint's generation_config
    EOS ids (HF models; vLLM 0.32 adds them itself: SamplingParams.update_from_generation_config) and every Qwen
    EOS token the tokenizer has."""
    config = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    config = config if isinstance(config, list) else [config]
    vocab = tokenizer.get_vocab()  # added tokens included; a token it lacks is skipped, never mapped to <unk>
    qwen = [vocab.get(token) for token in QWEN_EOS_TOKENS]
    return list(dict.fromkeys(i for i in [tokenizer.eos_token_id, *config, *qwen] if i is not None))


def _check_checkpoint(path: str) -> None:
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"model {path!r}: no such directory")
    if not (p / "config.json").is_file():
        raise ValueError(f"model {path!r}: not a checkpoint directory (no config.json)")
    if not any((p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise ValueError(f"model {path!r}: no tokenizer files (tokenizer.json / tokenizer_config.json)")


def vllm_available() -> bool:
    return torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None


def engine_kind(engine: str) -> str:
    """The engine a --engine value means: auto is vLLM with CUDA and the vllm package, else HF generate."""
    if engine not in ("auto", "hf", "vllm"):
        raise ValueError(f"unknown engine {engine!r} (auto, hf or vllm)")
    return ("vllm" if vllm_available() else "hf") if engine == "auto" else engine


def load_engine(path: str, engine: str = "auto", dtype: str = "auto", seed: int = 0, *, logprobs: bool = True,
                **vllm_kwargs):
    """(Engine, tokenizer) for a checkpoint directory. vllm_kwargs go to vllm.LLM (tensor_parallel_size,
    gpu_memory_utilization, max_model_len, distributed_executor_backend, enable_sleep_mode, ...); the HF engine
    ignores them. logprobs=False: a vLLM engine that never returns log-probs, with a leaner sampler (rl.py).
    Never trust_remote_code."""
    _check_checkpoint(path)
    kind = engine_kind(engine)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    if kind == "vllm":
        if not vllm_available():
            raise ValueError("engine vllm needs CUDA and the vllm package (requirements-gpu.txt)")
        from vllm import LLM  # lazy: vLLM cannot even be imported on a CPU build of torch

        if logprobs:
            # Log-probs after temperature and top-p, i.e. of the distribution actually sampled. An engine-wide cost:
            # with it, vLLM 0.32's TopKTopPSampler (v1/sample/ops/topk_topp_sampler.py) never takes FlashInfer's
            # fused top-p path and its forward_native takes a [batch, vocab] log_softmax at every decoding step,
            # whether a request asked for log-probs or not.
            vllm_kwargs["logprobs_mode"] = "processed_logprobs"
        return Engine("vllm", LLM(model=path, seed=seed, dtype=dtype, **vllm_kwargs), logprobs), tokenizer
    device = "cuda" if torch.cuda.is_available() else "cpu"
    auto = torch.bfloat16 if device == "cuda" else torch.float32  # bf16 matmuls are slow on CPU
    torch_dtype = auto if dtype == "auto" else getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device).eval()
    return Engine("hf", model), tokenizer


def generate(engine, tokenizer, prompts: list[str], n: int = 8, temperature: float = 0.6, top_p: float = 0.95,
             max_new_tokens: int = 8192, seed: int = 0, batch_size: int = 8,
             logprobs: bool = True, offset: int = 0) -> list[list[Sample]]:
    """n samples for each prompt (prompt-major). `engine` is an Engine or a bare HF model. logprobs=False leaves
    Sample.logprobs and Sample.entropy None and saves what they cost: vLLM builds no Python object per token, HF
    keeps no [batch * n, vocab] scores per generated token. offset: the index of prompts[0] in the whole list a
    caller splits over ranks; the seeds derive from global indices, so the samples do not depend on the split."""
    if not isinstance(engine, Engine):
        engine = Engine("hf", engine)
    if engine.kind == "vllm":
        if logprobs and not engine.logprobs:
            raise ValueError("generate(logprobs=True) on a vLLM engine loaded with logprobs=False")
        return _generate_vllm(engine.model, tokenizer, prompts, n, temperature, top_p, max_new_tokens, seed, logprobs,
                              offset)
    return _generate_hf(engine.model, tokenizer, prompts, n, temperature, top_p, max_new_tokens, seed, batch_size,
                        logprobs, offset)


def _generate_vllm(llm, tokenizer, prompts, n, temperature, top_p, max_new_tokens, seed, logprobs, offset):
    from vllm import SamplingParams

    # vLLM 0.32 vllm/sampling_params.py: logprobs=0 returns the sampled token's log-prob only, None none at all.
    # stop_token_ids end a sample as the EOS does and stay in token_ids (v1/core/sched/utils.py check_stop).
    # detokenize=False: vLLM keeps no incremental text; _decode decodes each sample once.
    # One seed per prompt; vLLM gives the n children of a request seed + child index (v1/engine/parallel_sampling.py),
    # so seed + i * n is unique. (Seeded requests take the PyTorch sampler rather than FlashInfer's, which has no
    # per-request generators: topk_topp_sampler.py forward_cuda.)
    shared = dict(n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens,
                  logprobs=0 if logprobs else None, stop_token_ids=_eos_ids(llm, tokenizer), detokenize=False)
    params = [SamplingParams(**shared, seed=seed + (offset + i) * n) for i in range(len(prompts))]
    outputs = llm.generate([{"prompt_token_ids": _encode(tokenizer, p)} for p in prompts], params,
                           use_tqdm=sys.stderr.isatty())
    result = []
    for out in outputs:
        samples = []
        for o in out.outputs:
            ids = list(o.token_ids)
            lps = [step[t].logprob for step, t in zip(o.logprobs, ids)] if logprobs else None
            # finish_reason as vLLM 0.32 names it (v1/engine/__init__.py FINISH_REASON_STRINGS): "stop" (an EOS or
            # stop token, kept in token_ids, as SFT trains it), "length" (max_tokens or max_model_len), "abort",
            # "error", "repetition"
            samples.append(Sample(ids, _decode(tokenizer, ids, o.finish_reason == "stop"), lps,
                                  None if lps is None else [-lp for lp in lps], o.finish_reason))
        result.append(samples)
    return result


@torch.no_grad()
def _generate_hf(model, tokenizer, prompts, n, temperature, top_p, max_new_tokens, seed, batch_size, logprobs, offset):
    # With logprobs, HF keeps every step's scores, (batch * n, vocab) each: fine for small models; vLLM for real runs.
    eos = _eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    device = next(model.parameters()).device
    result = []
    for start in tqdm(range(0, len(prompts), batch_size), desc="generating (hf)",
                      disable=len(prompts) <= batch_size or not sys.stderr.isatty()):
        torch.manual_seed(seed + (offset + start) * n)  # a seed per batch from its first prompt's global index
        encoded = [_encode(tokenizer, p) for p in prompts[start : start + batch_size]]
        width = max(map(len, encoded))
        ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded], device=device)  # (B, P), left-padded
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded], device=device)  # (B, P)
        out = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=temperature, top_p=top_p,
            top_k=0, repetition_penalty=1.0,  # override checkpoint defaults: sample exactly as vLLM does
            num_return_sequences=n, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad,
            output_scores=logprobs, return_dict_in_generate=True)
        new = out.sequences[:, width:]  # (B * n, T), rows grouped by prompt
        if logprobs:  # out.scores: T x (B * n, V) after temperature and top-p, i.e. the sampling distribution
            logp = torch.stack([s.float().log_softmax(-1).gather(-1, new[:, t : t + 1])[:, 0]
                                for t, s in enumerate(out.scores)], 1)  # (B * n, T)
            ent = torch.stack([entropy(s) for s in out.scores], 1)  # (B * n, T)
        for row in range(new.shape[0]):
            ids = new[row].tolist()
            stop = next((t for t, i in enumerate(ids) if i in eos), None)
            length = len(ids) if stop is None else stop + 1  # keep the EOS, drop the padding after it
            stopped = stop is not None
            sample = Sample(ids[:length], _decode(tokenizer, ids[:length], stopped),
                            logp[row, :length].tolist() if logprobs else None,
                            ent[row, :length].tolist() if logprobs else None, "stop" if stopped else "length")
            if row % n == 0:
                result.append([])
            result[-1].append(sample)
    return result


# =========================================================================================================
# Benchmarks, the evaluation run, tables and plots
# =========================================================================================================
def load_benchmarks(path: str, limit: int = 0) -> dict[str, list[Example]]:
    """{data_source: unique examples} from a directory of .parquet/.jsonl/.json files (or one file).

    Questions are de-duplicated on (data_source, question text): valid.all.parquet repeats AIME24, AIME25 and
    AMC 32 times each, and avg@8 / pass@k must mean n samples of each distinct problem, not 8 x 32."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"data {path!r}: no such file or directory")
    files = [p] if p.is_file() else sorted(f for f in p.iterdir() if f.suffix in (".parquet", ".jsonl", ".json"))
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
    print0(f"benchmarks: {', '.join(f'{b} ({len(v)})' for b, v in benchmarks.items())}; {dropped} duplicates dropped")
    return {b: v[:limit] if limit else v for b, v in benchmarks.items()}


def _write_atomic(path: Path, text: str) -> None:
    """Write to a temporary name, then rename: a crash or a full disk never leaves a partial file under `path`
    (demo.py takes an existing results.json as a finished stage)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def check_out_dir(out: str) -> None:
    """A one-line error, before any model loads, when --out cannot take the results."""
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise ValueError(f"--out {out!r}: exists and is not a directory")
    nearest = next(q for q in (p.absolute(), *p.absolute().parents) if q.exists())  # what mkdir would write in
    if not nearest.is_dir() or not os.access(nearest, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out!r}: cannot write in {str(nearest)!r}")


# Settings that change no sample and no score: a benchmark saved under other values of these is still reused.
# data, limit and max_prompt_len are left out too: the saved run's questions themselves are compared.
_NOT_IN_PROGRESS_KEY = {"out", "name", "save_samples", "grader_workers", "sft_data", "sft_examples", "data", "limit",
                        "max_prompt_len"}


def _progress_key(args: Args, examples: list[Example], prompts: list[str]) -> dict:
    """What a saved benchmark must match to be reused: the settings, its questions and the checkpoint's files
    (name, size, modification time: a checkpoint saved again under the same path is a different model)."""
    questions = hashlib.sha256(json.dumps([[p, ex.ground_truth] for ex, p in zip(examples, prompts)]).encode())
    model_files = {f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(Path(args.model).iterdir())
                   if f.is_file()}
    settings = {k: v for k, v in asdict(args).items() if k not in _NOT_IN_PROGRESS_KEY}
    return json.loads(json.dumps({"settings": settings, "questions_sha256": questions.hexdigest(),
                                  "model_files": model_files}))  # as read back from JSON


def _load_progress(path: Path, key: dict) -> dict | None:
    """A benchmark saved by a run with the same settings, else None (no file, other settings, unreadable)."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) and saved.get("key") == key else None


def _generate_and_grade(engine: Engine, tokenizer, name: str, examples: list[Example], prompts: list[str], n: int,
                        offset: int, args: Args) -> tuple[list[list[Sample]], list[list[float]], list[dict], int]:
    """(samples, 0/1 scores, sample records, grader failures) of a block of one benchmark's questions starting at
    question `offset`."""
    if not prompts:  # a rank with no block (more ranks than batches)
        return [], [], [], 0
    samples = generate(engine, tokenizer, prompts, n, args.temperature, args.top_p, args.max_new_tokens, args.seed,
                       args.batch_size, offset=offset)
    records = [{"data_source": name, "row": ex.row, "question": ex.question, "ground_truth": ex.ground_truth,
                "kind": answer_kind(name, ex.ground_truth), "sample": j, "response": s.text,
                "length": len(s.token_ids), "finish_reason": s.finish_reason}
               for ex, qs in zip(examples, samples) for j, s in enumerate(qs)]
    scores, failures = grade([r["response"] for r in records], [r["ground_truth"] for r in records],
                             [r["kind"] for r in records], args.grader_timeout, args.grader_workers, args.grading)
    for r, s in zip(records, scores):
        r["score"] = s
    return samples, [scores[i * n : (i + 1) * n] for i in range(len(samples))], records, failures


def rank_block(count: int, batch_size: int, rank: int, world: int) -> range:
    """This rank's questions: a contiguous block of whole batches of batch_size, so that every HF batch, and the
    seed _generate_hf gives it, is the same whatever the number of ranks."""
    batches = -(-count // batch_size)
    first, end = batches * rank // world, batches * (rank + 1) // world
    return range(min(count, first * batch_size), min(count, end * batch_size))


def evaluate_benchmarks(engine: Engine, tokenizer, benchmarks: dict[str, list[Example]], args: Args,
                        progress_dir: Path | None = None, group=None) -> tuple[dict | None, list]:
    """(results, sample records): generate, grade and measure one benchmark at a time. With a process group
    (`group`, gloo, torchrun) each rank generates and grades its block of every benchmark and rank 0 gathers them;
    the other ranks get (None, []). With progress_dir, rank 0 saves each finished benchmark there, and a benchmark
    saved by a run with the same settings is loaded instead of generated again: a crash loses one benchmark."""
    rank, world = (dist.get_rank(group), dist.get_world_size(group)) if group is not None else (0, 1)
    metrics, records, failures = {}, [], 0
    for i, (name, examples) in enumerate(benchmarks.items(), 1):
        start = time.perf_counter()
        n = args.n_mmlu_pro if name.startswith("mmlu_pro") else args.n
        prompts = [example_prompt(ex, tokenizer, args.system_prompt) for ex in examples]
        path = progress_dir / f"{name}.json" if progress_dir is not None else None
        key = _progress_key(args, examples, prompts) if path is not None and rank == 0 else None
        saved = [_load_progress(path, key) if key is not None else None]
        if group is not None:  # every rank skips a saved benchmark, or none does
            dist.broadcast_object_list(saved, src=0, group=group)
        saved = saved[0]
        if saved is not None:
            print0(f"[{i}/{len(benchmarks)}] {name}: loaded from {path} (saved by a run with the same settings)")
        else:
            print0(f"[{i}/{len(benchmarks)}] {name}: {len(prompts)} prompts x {n} samples, {world} rank(s)")
            block = rank_block(len(prompts), args.batch_size, rank, world)
            part = _generate_and_grade(engine, tokenizer, name, examples[block.start : block.stop],
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
                    _write_atomic(path, json.dumps(saved))
        if rank == 0:
            metrics[name] = saved["metrics"]
            records += saved["records"]
            failures += saved["grader_failures"]
            print0(f"[{i}/{len(benchmarks)}] {name}: avg@{n} {_pct(metrics[name]['avg'])}, "
                   f"{time.perf_counter() - start:.0f} s")
    if rank != 0:
        return None, []
    name = args.name or Path(args.model.rstrip("/")).name
    return {"name": name, "model": args.model, "settings": asdict(args), "benchmarks": metrics,
            "summary": table2_averages(metrics), "grader_failures": failures}, records


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def results_table(result: dict) -> str:
    """Markdown: one row per benchmark, then the paper's ID / OOD averages."""
    bench = result["benchmarks"]
    ks = sorted({int(k) for m in bench.values() for k in m["pass_at_k"]})
    head = ["benchmark", "questions", "n", "avg@n"] + [f"pass@{k}" for k in ks] + [
        "length", "entropy", "diversity", "truncated"]
    lines = [f"## {result['name']}", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for b, m in bench.items():
        cells = [b, m["questions"], m["n"], _pct(m["avg"])] + [_pct(m["pass_at_k"].get(str(k))) for k in ks] + [
            f"{m['response_length']:.0f}", f"{m['entropy']:.3f}",
            "–" if m["diversity"] is None else f"{m['diversity']:.3f}", _pct(m["truncated"])]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    s = result["summary"]
    grading = result.get("settings", {}).get("grading", "paper")
    lines += ["", f"ID avg {_pct(s['id_avg'])} · OOD avg {_pct(s['ood_avg'])} · grading {grading} · grader failures "
                  f"{result['grader_failures']}"]
    if result.get("expert_entropy"):
        e = result["expert_entropy"]
        lines.append(f"expert-token entropy (nats): top 20% {e['top20']:.3f}, bottom 80% {e['bottom80'] or 0:.3f}, "
                     f"all {e['all']:.3f}, over {e['tokens']} positions")
    return "\n".join(lines) + "\n"


def compare_table(results: list[dict]) -> str:
    """Markdown in the layout of paper Table 2: avg@n per benchmark, ID and OOD averages, entropy."""
    present = {b for r in results for b in r["benchmarks"]}
    names = [b for b in ID_BENCHMARKS if b in present] + ["ID avg"] + [b for b in OOD_BENCHMARKS if b in present]
    names += ["OOD avg"] + sorted(present - set(ID_BENCHMARKS) - set(OOD_BENCHMARKS))
    head = ["checkpoint"] + names + ["entropy", "diversity"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in results:
        s = r["summary"]
        cells = [r["name"]] + [_pct(s["id_avg"]) if b == "ID avg" else _pct(s["ood_avg"]) if b == "OOD avg" else
                               _pct(r["benchmarks"].get(b, {}).get("avg")) for b in names]
        cells += ["–" if s[k] is None else f"{s[k]:.3f}" for k in ("entropy", "diversity")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def stage_pairs(results: list[dict], acc_key: str) -> list[tuple[dict, dict]]:
    """(X, X+stage) for every result named "X+stage" (e.g. "curio+grpo") whose X is also there: a checkpoint before
    and after a later stage (paper Table 3). Pairs where either accuracy is missing are left out of the plot."""
    by_name = {r["name"]: r for r in results}
    pairs = [(by_name[r["name"].rpartition("+")[0]], r) for r in results if r["name"].rpartition("+")[0] in by_name]
    return [(b, a) for b, a in pairs if b["summary"][acc_key] is not None and a["summary"][acc_key] is not None]


def plot_results(results: list[dict], out_dir: str, logs: list[str] = (), log_keys: list[str] = ()) -> list[str]:
    """pass@k curves per benchmark, accuracy vs entropy and vs diversity across checkpoints (paper Figs. 1, 4),
    accuracy before and after RL for each pair named X / X+grpo (`stage_pairs`, paper Table 3), `log_keys` over
    training from sft.py logs (paper Fig. 2), and from rl.py logs the share of GRPO groups with mixed rewards (the
    only groups with a learning signal) and the mean reward. Returns the written paths."""
    out, written = Path(out_dir), []
    benchmarks = list(dict.fromkeys(b for r in results for b in r["benchmarks"]))
    cols = min(3, len(benchmarks))
    rows = -(-len(benchmarks) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows + 0.6), squeeze=False)
    for ax, b in zip(axes.flat, benchmarks):
        for r in results:
            if b in r["benchmarks"]:
                curve = r["benchmarks"][b]["pass_at_k"]
                ax.plot([int(k) for k in curve], [100 * v for v in curve.values()], marker="o", label=r["name"])
        ax.set(title=b, xlabel="k (samples)", ylabel="pass@k (%)")
        ax.set_xscale("log", base=2)
        ks = sorted({int(k) for r in results if b in r["benchmarks"] for k in r["benchmarks"][b]["pass_at_k"]})
        ax.set_xticks(ks, [str(k) for k in ks])
    for ax in axes.flat[len(benchmarks):]:
        ax.axis("off")
    _legend(fig, axes)
    fig.suptitle("pass@k: the chance that one of k samples is right (unbiased estimator)")
    written.append(_save(fig, out / "pass_at_k.png"))

    acc_key = "id_avg" if all(r["summary"]["id_avg"] is not None for r in results) else "avg"
    acc_label = "in-distribution accuracy, avg@n (%)" if acc_key == "id_avg" else "accuracy, avg@n (%)"
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    for ax, key, xlabel in zip(axes, ("entropy", "diversity"), ("sampling entropy (nats per token)",
                                                                 "diversity (1 - 4-gram Jaccard similarity)")):
        for r in results:
            x, y = r["summary"][key], r["summary"][acc_key]
            if x is not None and y is not None:
                ax.scatter(x, 100 * y)
                ax.annotate(r["name"], (x, 100 * y), fontsize="small")
        ax.set(xlabel=xlabel, ylabel=acc_label, title=f"accuracy against {key}")
    written.append(_save(fig, out / "accuracy_vs_entropy_diversity.png"))

    pairs = stage_pairs(results, acc_key)
    if pairs:
        fig, ax = plt.subplots(figsize=(1.6 + 1.6 * len(pairs), 3.8))
        values = []
        for i, (before, after) in enumerate(pairs):
            for dx, r, color, label in ((-0.2, before, "tab:gray", "before RL"), (0.2, after, "tab:blue", "after RL")):
                y = 100 * r["summary"][acc_key]
                values.append(y)
                ax.bar(i + dx, y, width=0.4, color=color, label=label if i == 0 else None)
                ax.annotate(f"{y:.1f}", (i + dx, y), ha="center", va="bottom", fontsize="small")
        low, high = min(values), max(values)
        margin = max(2.0, 0.3 * (high - low))
        ax.set_ylim(max(0.0, low - margin), min(100.0, high + margin))   # the differences, not the bars' height
        ax.set_xticks(range(len(pairs)), [f"{b['name']}\n→ {a['name']}" for b, a in pairs], fontsize="small")
        ax.set(ylabel=acc_label, title="accuracy before and after RL (y axis zoomed)")
        ax.legend(fontsize="small", loc="lower right")
        written.append(_save(fig, out / "accuracy_before_after_rl.png"))

    if logs:
        runs = [(Path(path).parent.name, [json.loads(line) for line in Path(path).read_text().splitlines()
                                          if line.strip()]) for path in logs]
        sft_runs = [(n, rows) for n, rows in runs if not any("zero_var_frac" in row for row in rows)]
        rl_runs = [(n, rows) for n, rows in runs if any("zero_var_frac" in row for row in rows)]
        keys = list(log_keys) or sorted({k for _, rows in sft_runs for row in rows for k, v in row.items()
                                         if "entropy" in k and isinstance(v, (int, float))})
        if sft_runs and keys:
            written.append(_curves(sft_runs, [(k, k, "nats" if "entropy" in k else "") for k in keys],
                                   "SFT: over training", out / "over_training.png"))
        if rl_runs:
            for _, rows in rl_runs:
                for row in rows:
                    row["mixed_reward_groups"] = 100 * (1 - row["zero_var_frac"])
            panels = [("mixed_reward_groups", "groups with mixed rewards", "%"), ("reward_mean", "mean reward", ""),
                      ("entropy", "rollout entropy", "nats")]
            written.append(_curves(rl_runs, panels,
                                   "GRPO: only groups with mixed rewards carry a learning signal",
                                   out / "rl_over_training.png"))
    return written


def _curves(runs, panels, title, path) -> str:
    """One panel per (log key, title, unit), one line per run, one legend for the figure."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.8), squeeze=False)
    for ax, (key, panel_title, unit) in zip(axes.flat, panels):
        for name, rows in runs:
            points = [(row["step"], row[key]) for row in rows if "step" in row and key in row]
            if points:
                ax.plot(*zip(*points), label=name)
        ax.set(xlabel="optimiser step", ylabel=f"{panel_title} ({unit})" if unit else panel_title, title=panel_title)
    _legend(fig, axes)
    fig.suptitle(title)
    return _save(fig, path)


def _legend(fig, axes) -> None:
    """One legend for the whole figure, from the first panel that has labelled lines."""
    for ax in axes.flat:
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize="small")
            return


def _save(fig, path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout(rect=(0, 0.09 if fig.legends else 0, 1, 0.93 if fig.get_suptitle() else 1))  # room for both
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


# =========================================================================================================
# Command line: flags generated from the dataclasses above
# =========================================================================================================
def drop_long_prompts(benchmarks: dict[str, list[Example]], tokenizer, args: Args) -> tuple[dict, dict[str, int]]:
    """(benchmarks without the questions whose prompt, as generate encodes it, is over max_prompt_len tokens,
    {benchmark: questions dropped}). The authors' scripts filter prompts over 1024 tokens the same way (verl's
    filter_overlong_prompts); a benchmark left with no question is left out."""
    kept, dropped = {}, {}
    for b, examples in benchmarks.items():
        fits = [ex for ex in examples
                if len(_encode(tokenizer, example_prompt(ex, tokenizer, args.system_prompt))) <= args.max_prompt_len]
        dropped[b] = len(examples) - len(fits)
        if fits:
            kept[b] = fits
    return kept, dropped


def run_eval(args: Args) -> dict | None:
    """Evaluate one checkpoint; under torchrun every rank takes a block of each benchmark and rank 0 writes the
    results, which it returns (the other ranks return None)."""
    if not args.model or not args.data:
        raise ValueError("--model and --data are required")
    if engine_kind(args.engine) == "vllm" and args.max_prompt_len + args.max_new_tokens > args.max_model_len:
        # vLLM would end such responses at max_model_len ("length"), short of max_new_tokens
        raise ValueError(f"--max-prompt-len {args.max_prompt_len} + --max-new-tokens {args.max_new_tokens} is over "
                         f"--max-model-len {args.max_model_len}: raise --max-model-len or lower the other two")
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1 and args.tensor_parallel_size > 1:
        raise ValueError(f"--tensor_parallel_size {args.tensor_parallel_size} with {world} ranks: torchrun runs one "
                         f"engine per rank (data parallel); use one process for tensor parallelism")
    check_out_dir(args.out)
    benchmarks = load_benchmarks(args.data, args.limit)  # fail on bad data before loading a model
    rank, group = 0, None
    if "RANK" in os.environ:  # torchrun
        rank, world, _ = setup_distributed()
        group = dist.new_group(backend="gloo")  # objects (the blocks' samples) travel over gloo, also with nccl
    expert = None
    if args.sft_data and rank == 0:  # teacher forcing needs HF logits; done first, so vLLM gets the memory after
        examples = load_examples(args.sft_data, require_response=True)[: args.sft_examples]
        hf, tokenizer = load_engine(args.model, "hf", args.dtype)
        expert = expert_token_entropy(hf.model, tokenizer, examples, system_prompt=args.system_prompt)
        del hf
        torch.cuda.empty_cache()
    # Several ranks: one vLLM engine per rank, in the rank's own process (as rl.py's), seeded per prompt.
    per_rank = dict(distributed_executor_backend="external_launcher") if world > 1 else {}
    engine, tokenizer = load_engine(args.model, args.engine, args.dtype, args.seed,
                                    tensor_parallel_size=args.tensor_parallel_size,
                                    gpu_memory_utilization=args.gpu_memory_utilization,
                                    max_model_len=args.max_model_len, **per_rank)
    print0(f"engine: {engine.kind}")
    benchmarks, dropped = drop_long_prompts(benchmarks, tokenizer, args)
    print0(f"prompts over {args.max_prompt_len} tokens, dropped: {', '.join(f'{b} {n}' for b, n in dropped.items())}")
    if not benchmarks:
        raise ValueError(f"every prompt is over --max-prompt-len {args.max_prompt_len} tokens")
    out = Path(args.out)
    result, records = evaluate_benchmarks(engine, tokenizer, benchmarks, args, out / "progress", group)
    if rank != 0:
        return None
    result["expert_entropy"] = expert
    result["long_prompts_dropped"] = dropped
    _write_atomic(out / "results.md", results_table(result))
    if args.save_samples:
        _write_atomic(out / "samples.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    plot_results([result], args.out)
    _write_atomic(out / "results.json", json.dumps(result, indent=2))  # last: marks a finished evaluation
    print(results_table(result))
    return result


def run_plot(args: PlotArgs) -> list[str]:
    if not args.results:
        raise ValueError("--results needs at least one results.json")
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
    (Path(args.out) / "compare.md").write_text(compare_table(results))
    print(compare_table(results))
    return plot_results(results, args.out, args.logs, args.log_keys)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plot"]:
        run_plot(parse_config(PlotArgs, argv=argv[1:], prog="evaluate.py plot")[0])
    else:
        run_eval(parse_config(Args, argv=argv, prog="evaluate.py")[0])
        if dist.is_initialized():  # torchrun: every rank done before the group goes
            shutdown()


if __name__ == "__main__":
    run_script(main)
