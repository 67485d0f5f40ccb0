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
of sampling it again. The measurement itself (sampling, grading, avg@n, pass@k, the sampling
entropy) is measure.py, which sft.py and rl.py call to validate while they train; sampling,
grading, tables and plots are plumbing/. python evaluate.py --help lists the flags.
"""
import difflib
import json
import os
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

import curio_loss as cl
from data import SYSTEM_PROMPT_MODES, Example, example_prompt
from data import load_examples, tokenize_sft
from measure import drop_long_prompts, load_benchmarks, measure_benchmarks
from plumbing import paired_stats as ps, report
from plumbing.benchmarks import ID_BENCHMARKS, OOD_BENCHMARKS
from plumbing.checkpoints import verify_model_dir
from plumbing.cli import check_settings, parse_config, run_script
from plumbing.distributed import print0, setup_distributed, shutdown
from plumbing.generation import ENGINES, Engine, engine_kind, load_engine
from plumbing.grading import GRADING_MODES
from plumbing.models import check_model_dir, resolve_model
from plumbing.run_dir import drop_if_empty, lock_dir, release, write_atomic
from plumbing.token_view import TokensArgs, TokensLossConfig, load_token_example, write_token_page


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
    """prompts per HF generate call (vLLM schedules its own batches); no sample depends on it"""
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
    plots: bool = True
    """pass@k and accuracy plots beside results.json (--no-plots: the CPU demo draws its own)"""

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


# ================================================================================================
# ALGO LOGIC: the metrics beyond measure.py's (avg@n, pass@k, sampling entropy, diversity)
# ================================================================================================
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


def table2_averages(benchmarks: dict[str, dict]) -> dict:
    """Table 2's averages: ID and OOD accuracy (None when none of their benchmarks ran), and
    means over all benchmarks of avg@n, entropy and diversity (the x and y of Figs. 1 and 4)."""
    def mean(key, names=None):
        vals = [m[key] for b, m in benchmarks.items()
                if (names is None or b in names) and m[key] is not None]
        return float(np.mean(vals)) if vals else None
    return {"id_avg": mean("avg", ID_BENCHMARKS), "ood_avg": mean("avg", OOD_BENCHMARKS),
            "avg": mean("avg"), "entropy": mean("entropy"), "diversity": mean("diversity")}


# ================================================================================================
# The evaluation run: a checkpoint's engine, its benchmarks, the result files
# ================================================================================================
def check_out_dir(out: str) -> None:
    """A one-line error, before any model loads, when --out cannot take the results."""
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise ValueError(f"--out {out!r}: exists and is not a directory")
    nearest = next(q for q in (p.absolute(), *p.absolute().parents) if q.exists())  # mkdir's
    if not nearest.is_dir() or not os.access(nearest, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out!r}: cannot write in {str(nearest)!r}")


def evaluate_benchmarks(engine: Engine, tokenizer, benchmarks: dict[str, list[Example]], args: Args,
                        progress_dir: Path | None = None, group=None) -> tuple[dict | None, list]:
    """(results, sample records): the benchmarks measured (measure.measure_benchmarks: each
    rank a block under torchrun, each finished benchmark saved in progress_dir), with Table 2's
    averages. Ranks other than 0 get (None, [])."""
    metrics, records, failures = measure_benchmarks(engine, tokenizer, benchmarks, args,
                                                    progress_dir, group)
    if metrics is None:
        return None, []
    name = args.name or Path(args.model.rstrip("/")).name
    return {"name": name, "model": args.model, "settings": asdict(args), "benchmarks": metrics,
            "summary": table2_averages(metrics), "grader_failures": failures}, records
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
    if args.plots:
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
    """paired.md and paired.json: A - B with paired bootstrap intervals (plumbing.paired_stats)."""
    a, b = [ps.load_evaluation(p) for p in args.a], [ps.load_evaluation(p) for p in args.b]
    result = ps.paired_comparison(a, b, args.resamples, args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = report.paired_table(result)
    write_atomic(out / "paired.md", table)
    write_atomic(out / "paired.json", json.dumps(result, indent=1))
    print(table)
    return result


def run_tokens(args: TokensArgs, loss: TokensLossConfig) -> dict:
    """The page of one SFT example (plumbing.token_view); returns its per-token view."""
    example = load_token_example(args.data, args.row)       # a bad --row: before any model loads
    args = replace(args, model=resolve_model(args.model))
    args = replace(args, system_prompt=trained_system_prompt(args.model, args.system_prompt))
    return write_token_page(args, example, loss.loss_config())


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
        run_tokens(*parse_config(TokensArgs, TokensLossConfig, argv=argv[1:],
                                 prog="evaluate.py tokens"))
    elif argv[:1] and not argv[0].startswith("-") and not argv[0].endswith(".py"):
        close = difflib.get_close_matches(argv[0], SUBCOMMANDS, n=1)
        raise SystemExit(f"evaluate.py: unknown subcommand {argv[0]!r}"
                         + (f", did you mean {close[0]}?" if close else "")
                         + f" (subcommands: {', '.join(SUBCOMMANDS)}; an evaluation takes flags)")
    else:
        run_eval(parse_config(Args, argv=argv, prog="evaluate.py")[0])
        if "RANK" in os.environ:  # torchrun: run_eval's group, every rank done before it goes
            shutdown()          # (not a caller's own group: shutdown ends the process)


if __name__ == "__main__":
    run_script(main)
