"""The CPU demo: does an SFT stage that keeps exploring give RL more to win? The whole pipeline on
demo/toy.py's floor task, one stage command after another.

    python demo/run.py --out out/demo              # bash run.sh: the small size, seeds 0-3 side by side
    python demo/run.py --size ci --out out/demo_ci  # every stage, tiny (tests/test_demo.py)
    python demo/run.py --size full --seeds 0 1 2 3 4 5 6 7 --out out/demo_seeds
        # the full size (docs/demo.md's tables): ~18 min a seed on 2 cores
    python demo/run.py --threads 2 --out out/demo_t2   # the same seeds in another float order

One seed's result after RL moves with the CPU's float order (training on this toy is chaotic), so the
default runs several seeds and opens its summary with what they support: means over the seeds with
their intervals (`headline`).

Stages (each is the stage's own command line, printed before it runs, so it can be copied and
re-run; its output goes to OUT/logs/ and the demo prints a progress line every few seconds, and
after each stage the demo's own: stages done and the time left):
  1. demo/toy.py    the floor task's splits and tokenizer; then a tiny Qwen2 config beside it
                    (the "model directory")
  2. sft.py --scratch --loss sft on the pre-training rows: the base model, from random weights
  3. sft.py --loss sft | curio | entropy from the base on the expert rows (checkpoints along it)
  4. evaluate.py    avg@8 and pass@k on the test questions, those where the expert's order works and
                    those where it is a dead end reported apart (their data_source)
  5. rl.py          GRPO from each SFT checkpoint on the RL prompts, then evaluate.py again
  6. tables (OUT/summary.md, OUT/metrics.json) and plots (OUT/plots/): accuracy before and after RL,
     pass@k, the branching tokens during SFT, and which order each model's samples took
     (toy.floor_solution_kind); the paired differences between methods with their intervals
     (evaluate.py compare, into OUT/compare/)
  7. demo/decisive_token.py on the first seed, beside its stages 3-5: an expert that teaches the
     wrong move at the decisive token
With several seeds each seed's folder is OUT/seed_S and its stages run beside the other seeds'
(--jobs threads at a time); at the small size every seed starts from the first seed's world and base
(stages 1-2 and the base's evaluation run once, there). Each stage runs in a process of its own,
forked from one that imported torch once (demo/stage_process.py). A stage whose output already
exists is skipped, so an interrupted demo continues where it stopped.
"""
import argparse
import collections
import concurrent.futures
import contextlib
import functools
import json
import re
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository root: the stage scripts run from there
sys.path.insert(0, str(ROOT))
import data  # noqa: E402
from demo import toy  # noqa: E402
from demo.stage_process import StageProcess  # noqa: E402
from plumbing import checkpoints, run_dir  # noqa: E402
from plumbing.distributed import STOPPED_EXIT  # noqa: E402
from plumbing.report import pyplot, save_png  # noqa: E402
from plumbing.synthetic import make_model_dir  # noqa: E402
PY = sys.executable

# Everything that differs between the CI smoke run and the demo proper.
SIZES = {
    "ci": dict(
        name="ci",
        data=["--n_pretrain", "48", "--n_sft", "16", "--n_rl", "8", "--n_test", "8",
              "--vocab_labels", "200", "--vocab_size", "1024"],
        model=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=1, intermediate_size=64),
        pretrain=["--epochs", "1", "--global_batch", "16", "--lr", "3e-3"],
        sft=["--epochs", "2", "--global_batch", "8", "--lr", "1e-3", "--save_every", "2"],
        eval=["--n_samples", "2", "--max_new_tokens", "40", "--sft_examples", "8"],
        rl=["--steps", "1", "--prompts_per_step", "2", "--rollouts", "2", "--mini_batch", "2",
            "--max_response_len", "40"],
        n_val=8,
        val_sft=["--eval_every", "2", "--eval_n", "1", "--eval_max_new_tokens", "40"],
        val_rl=["--eval_every", "1", "--eval_n", "1", "--eval_max_new_tokens", "40"],
        probe=["--n_rows", "16", "--steps", "2", "--save_every", "1", "--losses", "sft", "curio"],
        seeds=[0], threads=1, base_threads=2, losses=("sft", "curio", "entropy"), shared_base=False,
        cost=dict(data=5, base=8, sft=8, curio=9, entropy=8, eval=6, rl=8, compare=4, probe=30),
    ),
    # The default (bash run.sh): several seeds side by side from a toy a 0.3M-parameter model learns
    # in 375 steps, so that the claims are means over seeds with their intervals. Sized for 10 min
    # on 2 cores: SFT 96 steps at 3e-3 (at 1e-3 the first number's entropy had hardly left the
    # base's by step 64; at 64 steps SFT's was 0.94 nats and CurioSFT's no higher; at 160 the seeds
    # spread from 0.20 to 0.74 and CurioSFT's was lower on one of four), GRPO 8 steps.
    "small": dict(
        name="small",
        # every question holds 1-4 (and one negative number): the base needs not learn to read
        # which numbers a question holds, which took the full size's 1.1M-parameter model most of
        # its 2,250 steps (a 2-layer model at 2,250 steps, or this toy with 1-5, still made
        # mistakes in most samples)
        data=["--positives", "4", "--distinct_test", "--n_sft", "512", "--n_rl", "256"],
        model=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=192),
        pretrain=["--epochs", "2", "--global_batch", "32", "--lr", "3e-3", "--warmup_steps", "20",
                  "--token_budget", "2048", "--loss_chunk", "2048", "--log_every", "25",
                  "--save_every", "250", "--keep_last", "1"],
        sft=["--epochs", "3", "--global_batch", "16", "--lr", "3e-3", "--warmup_steps", "16",
             "--token_budget", "2048", "--log_every", "4", "--save_every", "16"],
        eval=["--n_samples", "4", "--max_new_tokens", "48", "--sft_examples", "64", "--batch_size",
              "32", "--no-plots"],
        rl=["--steps", "8", "--prompts_per_step", "8", "--rollouts", "8", "--mini_batch", "4",
            "--micro_batch", "16", "--gen_batch_size", "32", "--max_response_len", "48", "--lr",
            "1e-4", "--top_p", "1.0"],
        n_val=32, val_sft=[], val_rl=[],              # no validation while training: time
        probe=["--n_rows", "256", "--steps", "16", "--save_every", "4", "--losses", "sft", "curio"],
        # Cross-entropy and CurioSFT only (the entropy loss's branch would add a third of stages
        # 3-5), each seed from one world and base, the first seed's, as the paper's methods start
        # from one base model: the seeds vary SFT's batches and GRPO's and the evaluation's samples.
        # The base, a third of a seed's work, then runs once (alone: on two threads its steps were
        # no faster).
        seeds=[0, 1, 2, 3], threads=1, base_threads=1, losses=("sft", "curio"), shared_base=True,
        cost=dict(data=10, base=60, sft=13, curio=28, eval=10, rl=15, compare=1, probe=20),
    ),
    "full": dict(
        name="full",
        data=[],  # demo/toy.py's defaults
        model=dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=384),
        # 2250 steps, about 4 min on two threads: a base that adds in many orders, dead ends
        # included, with mistakes in 0-34% of its samples (seeds 0-7). One logits chunk: V is small.
        # A checkpoint every 250 steps, the newest kept: a kill or a crash loses at most 250 steps
        # of it (Ctrl-C saves the step it stops at).
        pretrain=["--epochs", "6", "--global_batch", "16", "--lr", "2e-3", "--warmup_steps", "20",
                  "--token_budget", "2048", "--loss_chunk", "2048", "--log_every", "25",
                  "--save_every", "250", "--keep_last", "1"],
        # App. E's 3 epochs of 1024 rows: 192 steps, after which cross-entropy has taken P(expert's
        # first number) to 74-100% (seeds 0-7). lr: at 2e-3 with 5 warm-up steps the fresh Adam
        # state knocked the base off its minimum (on an earlier toy task). A checkpoint every 32
        # steps for the branching tokens' curves.
        sft=["--epochs", "3", "--global_batch", "16", "--lr", "1e-3", "--warmup_steps", "16",
             "--token_budget", "2048", "--log_every", "4", "--save_every", "32"],
        eval=["--n_samples", "8", "--max_new_tokens", "48", "--sft_examples", "128", "--batch_size",
              "16"],
        # top_p 1.0: the authors' scripts/2_rl.sh leaves verl's rollout top_p at 1.0 (the paper's
        # text says 0.95, which would never sample a move the model gives less than 5% in all). lr
        # 3e-5: at 1e-4 GRPO lowered its own reward from SFT on an earlier toy task (0.27 in the
        # first 8 steps, 0.20 in the last 8); at 3e-5 it rose
        rl=["--steps", "32", "--prompts_per_step", "8", "--rollouts", "8", "--mini_batch", "4",
            "--micro_batch", "16", "--gen_batch_size", "16", "--max_response_len", "48", "--lr",
            "3e-5", "--top_p", "1.0"],
        # Validation while training (--eval_every, the authors' recipe): 32 questions held out
        # like the test ones, 4 samples each at evaluate.py's temperature 0.6, 4 times in SFT and in
        # GRPO: the entropy and accuracy curves of the demo's validation plot
        n_val=32,
        val_sft=["--eval_every", "48", "--eval_n", "4", "--eval_max_new_tokens", "48"],
        val_rl=["--eval_every", "8", "--eval_n", "4", "--eval_max_new_tokens", "48"],
        probe=[],
        # The base alone on two threads: 1.8x faster steps on 2 cores
        seeds=[0], threads=1, base_threads=2, losses=("sft", "curio", "entropy"), shared_base=False,
        cost=dict(data=9, base=560, sft=60, curio=80, entropy=62, eval=25, rl=110, compare=4,
                  probe=80),
    ),
}
# vanilla cross-entropy, CurioSFT, the entropy-loss baseline (Table 2): a size's "losses" are some
SFT_LOSSES = ("sft", "curio", "entropy")
# The paired differences the tables give with their intervals (evaluate.py compare): A - B, on the
# same questions; those whose models a size trains (comparisons()).
COMPARISONS = (("curio+grpo", "sft+grpo"), ("entropy+grpo", "sft+grpo"), ("curio", "sft"),
               ("entropy", "sft"))
# Where one seed's A - B in avg@n falls: the mean over the 24 seeds of docs/demo.md (`demo/run.py
# --seeds 0 ... 23`, the default size, one machine) and one seed's standard deviation around it, in
# points. Quoted beside a single seed's table, whose numbers are one draw from that spread.
SEED_SPREAD = {"curio+grpo - sft+grpo": (2.9, 9.4), "entropy+grpo - sft+grpo": (2.5, 7.7),
               "curio - sft": (2.1, 6.0), "entropy - sft": (0.4, 5.8)}
# Threads per stage process: one, and a size's "base_threads" for its base. A fixed count keeps the
# float sums, so the results, the same on one machine (--threads changes it, and so the sums' order).
THREADS = 1
# A seed's metrics.json. A seed whose every stage had finished reuses it, as finished stages are
# reused: delete it to measure again after changing how the metrics are computed.
METRICS_KEYS = ("seeds", "seconds", "models", "sft", "grpo", "validation")
PROGRESS_EVERY_S = 5.0


# ------------------------------------------------------------------------------------------------
# Running the stages
# ------------------------------------------------------------------------------------------------
def say(line: str) -> None:
    """Print a line in one write: print() writes the text and its newline apart, so the lines of
    stages running side by side in threads could run together ("[sft] $ ...[curio] $ ...")."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def stage_log(logs: Path, name: str) -> Path:
    """The log of the stage called `name` ("eval curio" -> logs/eval_curio.log)."""
    return logs / (name.replace(" - ", "_vs_").replace(" ", "_") + ".log")


def run_stage(cmd: list, logs: Path, name: str, steps: int | None = None,
              every_s: float = PROGRESS_EVERY_S, threads: int = THREADS, tag: str = "",
              cost: float = 0.0) -> float:
    """Run one stage command from the repository root, echoing it, once SLOTS has room for its
    `threads`. Its output goes to its log in `logs` (stage_log); as lines arrive, one at most every
    every_s seconds is printed after the stage's name (shown after `tag`: "seed 1 "), for a run of
    `steps` steps as progress and ETA. `cost`: its share of the demo's work, for PROGRESS. Returns
    the seconds taken. Stages may run in parallel threads: each line is one write (`say`)."""
    with SLOTS.held(threads):
        return _run_stage(cmd, logs, name, steps, every_s, threads, tag + name, cost)


def _run_stage(cmd, logs, name, steps, every_s, threads, shown_name, cost) -> float:
    if STOPPING.is_set():                          # Ctrl-C came: no stage starts after it
        raise StageStopped(f"[{shown_name}] not started")
    say(f"[{shown_name}] $ " + " ".join(str(c) for c in cmd))
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false",
           "PYTHONUNBUFFERED": "1"}  # the stage's lines arrive as they are printed, not at exit
    t0 = shown = time.time()
    log = stage_log(logs, name)
    logs.mkdir(parents=True, exist_ok=True)
    last, first = "", None              # first: (step, time) of the first step line seen
    # the stage appends to its log (an interrupted stage's goes on when it resumes), so that
    # `tail -f` on it follows the stage
    proc = StageProcess(cmd, log, env)
    try:
        for line in proc.lines():
            last = line.strip() or last
            if first is None and step_of(last) is not None:
                first = (step_of(last), time.time())
            if steps and step_of(last) is not None:
                PROGRESS.running(log, cost * min(1.0, step_of(last) / steps))
            if last and time.time() - shown >= every_s:
                shown = time.time()
                text = progress_text(last, steps, first, shown)
                say(f"[{shown_name}] {shown - t0:4.0f}s  {text}")
    except KeyboardInterrupt:               # Ctrl-C reached the stage too: it saves and says so
        STOPPING.set()
        for line in proc.lines():
            last = line.strip() or last
    returncode = proc.wait()
    # stopped by the signal (saved, or not yet started)
    if returncode in (STOPPED_EXIT, -2, 130):
        STOPPING.set()
        raise StageStopped(f"[{shown_name}] {last}")
    if returncode != 0:
        sys.stdout.write(log.read_text()[-4000:])
        raise SystemExit(f"stage {shown_name} failed (exit {returncode}): see {log}")
    say(f"[{shown_name}] done in {time.time() - t0:.0f}s (log: {log})")
    PROGRESS.finished(log, cost)
    return time.time() - t0


class Slots:
    """Room for `capacity` threads of stage processes at once, whichever seed or branch starts them:
    a stage waits until its threads fit (one wider than all of it, until it runs alone)."""

    def __init__(self, capacity: int):
        self.capacity, self.used, self.changed = capacity, 0, threading.Condition()

    @contextlib.contextmanager
    def held(self, n: int):
        with self.changed:
            self.changed.wait_for(lambda: self.used == 0 or self.used + n <= self.capacity)
            self.used += n
        try:
            yield
        finally:
            with self.changed:
                self.used -= n
                self.changed.notify_all()


SLOTS = Slots(4)                    # main() sets --jobs


class Progress:
    """The demo's work, for the time left: each stage's `cost` (the size's "cost": its seconds on
    one core of the machine that measured them) planned, done, or done in part (a training stage's
    steps so far). The time left is the work left at the speed measured so far; before any, at the
    measuring machine's speed on `cores` cores."""

    def __init__(self, cores: int = 2):
        self.lock, self.t0, self.cores = threading.Lock(), time.time(), cores
        self.planned, self.done, self.stages, self.finished_stages = 0.0, 0.0, 0, 0
        self.parts: dict[Path, float] = {}

    def plan(self, cost: float, stages: int = 1) -> None:
        """`stages` more stages to run, `cost` their work in all."""
        with self.lock:
            self.planned += cost
            self.stages += stages

    def running(self, key: Path, done: float) -> None:
        with self.lock:
            self.parts[key] = done

    def finished(self, key: Path, cost: float) -> None:
        """A stage done: prints the demo's progress line."""
        with self.lock:
            self.parts.pop(key, None)
            self.done += cost
            self.finished_stages += 1
            if self.stages:                         # (a probe run alone plans nothing)
                say(f"   {self.line()}")

    def skipped(self, cost: float) -> None:
        """A planned stage found done (its output kept from an earlier run): no work left there."""
        self.plan(-cost, -1)

    def line(self) -> str:
        elapsed = time.time() - self.t0
        done = self.done + sum(self.parts.values())
        left = max(0.0, self.planned - done)
        seconds = left * elapsed / done if done > 0 and elapsed > 0 else left / self.cores
        return (f"demo: {self.finished_stages} of {self.stages} stages done, {elapsed:.0f}s so "
                f"far, about {seconds:.0f}s left")


PROGRESS = Progress()               # run() plans the stages


class StageStopped(Exception):
    """A stage's process stopped by Ctrl-C or SIGTERM (its last line says what it saved), or a stage
    not started after one."""


STOPPING = threading.Event()        # set by Ctrl-C: the stages running stop, no other one starts


def wait_for_stages(futures: list[concurrent.futures.Future]) -> None:
    """Wait for stages running in threads. Ctrl-C raises KeyboardInterrupt in the main thread only:
    here it stops the queued stages from starting and, once the running ones have saved and stopped,
    raises StageStopped with what each said. A failed stage raises here."""
    try:
        concurrent.futures.wait(futures)
    except KeyboardInterrupt:                      # the stages got it too: they save and stop
        STOPPING.set()
        concurrent.futures.wait(futures)
    stopped = [str(f.exception()) for f in futures if isinstance(f.exception(), StageStopped)]
    if stopped or STOPPING.is_set():
        raise StageStopped("; ".join(stopped) or "once the running stages had finished")
    for future in futures:
        future.result()


def step_of(line: str) -> int | None:
    """The step of a training log line ("step 12 ..."), else None."""
    m = re.match(r"step (\d+)\b", line)
    return int(m.group(1)) if m else None


def progress_text(line: str, steps: int | None, first: tuple[int, float] | None,
                  now: float) -> str:
    """A training log line ("step 12 ... loss 0.31 ...") as "step 12/40, loss 0.31, ETA 50s"; others
    as they are. The ETA comes from the speed measured since `first`, the (step, time) of the first
    step line the stage printed: a resumed stage starts at its checkpoint's step, and loading time
    or stages running side by side must not skew it ("ETA -" until two steps are seen)."""
    done = step_of(line)
    if done is None or not steps:
        return line[:110]
    shown = [f"{k} {v}" for k, v in re.findall(r"\b(loss|reward_mean|zero_std_frac) (\S+)", line)]
    eta = "ETA -"
    if first is not None and done > first[0] and now > first[1]:
        eta = f"ETA {(steps - done) * (now - first[1]) / (done - first[0]):.0f}s"
    return ", ".join([f"step {done}/{steps}", *shown, eta])


def flag(args: list[str], name: str, default: int) -> int:
    """The integer value of --name in a stage's flag list."""
    return int(args[args.index(name) + 1]) if name in args else default


# ------------------------------------------------------------------------------------------------
# Measurements the stage scripts do not make
# ------------------------------------------------------------------------------------------------
# from_pretrained is not thread-safe: seeds measured side by side (threads) loaded tied models whose
# lm_head was left at its random initialisation ("lm_head.weight | MISSING"), 7.9 nats of entropy
LOADING = threading.Lock()


def load_for_scoring(ckpt: Path):
    """The checkpoint's tokenizer, and a function from texts to the model's next-token logits after
    each ([len(texts), V], float32, at temperature 1)."""
    import torch
    import transformers

    # one "Loading weights" bar per checkpoint: noise here
    transformers.utils.logging.disable_progress_bar()
    with LOADING:
        tok = transformers.AutoTokenizer.from_pretrained(ckpt)
        model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()

    def next_token_logits(texts: list[str]) -> torch.Tensor:
        ids = [tok.encode(t) for t in texts]
        batch = torch.full((len(ids), max(map(len, ids))), tok.pad_token_id)
        # right-padded: causal attention never sees the padding before each last token
        for i, x in enumerate(ids):
            batch[i, : len(x)] = torch.tensor(x)
        with torch.no_grad():
            return model(batch).logits[torch.arange(len(ids)),
                                       torch.tensor(list(map(len, ids))) - 1].float()
    return tok, next_token_logits


def branching_stats(ckpt: Path, rows: list[dict]) -> dict:
    """Two branching tokens of the test questions under the model at temperature 1. The first
    number: the entropy of the full next-token distribution (nats) and the probability of the
    expert's (the question's first). And on the questions where the expert's order is a dead end,
    after the expert's lines up to the negative number: the probability of putting it off (a "+",
    adding a positive number first) rather than hitting the floor."""
    import torch

    import curio_loss

    tok, next_token_logits = load_for_scoring(ckpt)
    questions = [toy.parse_floor(r["prompt"][1]["content"]) for r in rows]
    prompts = [data.build_prompt(r["prompt"][1]["content"], tok, toy.FLOOR_SYSTEM) for r in rows]
    logits = next_token_logits(prompts)
    # digits are single tokens (Qwen's regex)
    first = [tok.convert_tokens_to_ids(str(q[0])) for q in questions]
    p_expert = logits.softmax(-1)[torch.arange(len(rows)), torch.tensor(first)].mean().item()
    # The expert's lines before its dead end ("2\n" for 2,-5,...): the next token is "-" (the
    # negative now) or "+".
    fails = [i for i, q in enumerate(questions) if not toy.add_in_order(q)[1]]
    lines = [toy.floor_response(questions[i]).removeprefix(data.THINK).split("\n") for i in fails]
    at_floor = next_token_logits([prompts[i]
                                  + "\n".join(ls[: questions[i].index(min(questions[i]))]) + "\n"
                                  for i, ls in zip(fails, lines)]) if fails else None
    return {"entropy": curio_loss.entropy(logits).mean().item(), "p_expert": p_expert,
            "p_put_off": at_floor.softmax(-1)[:, tok.convert_tokens_to_ids("+")].mean().item()
            if fails else None}


# Samples whose reasoning is a "mistake" but whose boxed answer the grader scores right: the reward
# sees only the answer (no process reward), so RL could learn to break the rule and still be paid.
MISTAKE_GRADED_RIGHT = "mistake, graded right"


def kind_shares(samples_file: Path) -> dict:
    """{question kind: {FLOOR_KINDS entry: share of that kind's samples}} (toy.floor_solution_kind),
    plus the share of MISTAKE_GRADED_RIGHT (part of the mistakes)."""
    counts = collections.defaultdict(collections.Counter)
    for line in samples_file.read_text().splitlines():
        r = json.loads(line)
        kind = toy.floor_solution_kind(r["question"], r["response"])
        counts[r["data_source"]][kind] += 1
        counts[r["data_source"]][MISTAKE_GRADED_RIGHT] += kind == "mistake" and r["score"] == 1.0
    return {source: {k: c[k] / sum(c[k] for k in toy.FLOOR_KINDS)
                     for k in (*toy.FLOOR_KINDS, MISTAKE_GRADED_RIGHT)}
            for source, c in counts.items()}


def model_metrics(result: dict, samples_file: Path, branching: dict) -> dict:
    bench = result["benchmarks"]
    return {"avg": result["summary"]["avg"],  # over the two kinds = over questions (equal counts)
            **{f"avg_{kind}": bench[kind]["avg"] for kind in bench},
            **{f"pass_at_k_{kind}": bench[kind]["pass_at_k"] for kind in bench},
            "expert_token_entropy_top20": (result.get("expert_entropy") or {}).get("top20"),
            "branching": branching, "kinds": kind_shares(samples_file)}


def saved_steps(run_dir: Path, every: int) -> list[tuple[int, Path]]:
    """(step, checkpoint) for the run's scheduled checkpoints, oldest first: every `every` steps and
    the last. A checkpoint that an interruption saved between them is left out, so that a resumed
    run measures what an uninterrupted one does."""
    points = [(json.loads((c / "state.json").read_text())["step"], c)
              for c in checkpoints.complete(run_dir)]
    return [(step, c) for i, (step, c) in enumerate(points)
            if (every and step % every == 0) or i == len(points) - 1]


def sft_metrics(run_dir: Path, base: Path, branching, every: int) -> dict:
    """Over one SFT run: branching(checkpoint), the branching tokens' statistics, at the base and at
    every scheduled checkpoint (saved_steps); the top-20% expert-token entropy and cross-entropy
    from its log, and for CurioSFT its mean w_t where it acts."""
    log = [r for r in map(json.loads, (run_dir / "log.jsonl").read_text().splitlines())
           if "ce" in r]
    points = [(0, base)] + saved_steps(run_dir, every)
    out = {"steps": [s for s, _ in points], "branching": [branching(c) for _, c in points],
           "log_steps": [r["step"] for r in log],
           "top20": [r.get("student_entropy_top20") for r in log], "ce_end": log[-1]["ce"]}
    if "w_top20" in log[0]:
        out["w_top20"], out["w_bottom80"] = (sum(r[k] for r in log) / len(log)
                                             for k in ("w_top20", "w_bottom80"))
    return out


def grpo_metrics(run_dir: Path) -> dict:
    """From rl.py's log: the share of groups with mixed rewards (1 - zero_std_frac: the only ones
    with a gradient) over the run and in its first and last quarter, and the mean reward in those
    quarters."""
    log = [r for r in map(json.loads, (run_dir / "log.jsonl").read_text().splitlines())
           if "zero_std_frac" in r]                                   # not the validation records
    q = max(1, len(log) // 4)

    def mean(rows, key):
        return sum(r[key] for r in rows) / len(rows)

    return {"mixed": 1 - mean(log, "zero_std_frac"),
            "mixed_first": 1 - mean(log[:q], "zero_std_frac"),
            "mixed_last": 1 - mean(log[-q:], "zero_std_frac"),
            "reward_first": mean(log[:q], "reward_mean"),
            "reward_last": mean(log[-q:], "reward_mean")}


def validation_records(run_dir: Path) -> list[dict]:
    """The run's validation records (--eval_every): step, val_accuracy, val_entropy."""
    rows = map(json.loads, (run_dir / "log.jsonl").read_text().splitlines())
    return [{k: r[k] for k in ("step", "val_accuracy", "val_entropy")} for r in rows
            if "val_accuracy" in r]


# ------------------------------------------------------------------------------------------------
# One seed, every stage
# ------------------------------------------------------------------------------------------------
def run_seed(size: dict, out: Path, seed: int, tag: str = "", probe: bool = False,
             base_of: Path | None = None, until_base: bool = False) -> dict:
    """Every stage for one seed into `out`, its stages' names shown after `tag` ("seed 1 "), and
    with probe the decisive-token probe from its base (into out/decisive_token); returns (and
    writes to out/metrics.json) what the tables show. base_of: the folder of the seed whose world
    and base this one starts from (their stages done there), instead of its own; until_base: stop
    after the base (stage 2), returning {}."""
    world = (base_of or out) / "world"
    runs, evals, logs = out / "runs", out / "eval", out / "logs"
    # Finished stages are reused, so an --out must not mix seeds (nor hold a run from before seeds
    # were recorded), sizes or float orders (--threads, --no_pack).
    seed_file, settings = out / "seed", {"size": size["name"], "float_order": float_order(size)}
    if seed_file.exists() or (out / "world").exists():
        recorded = seed_file.read_text().strip() if seed_file.exists() else None
        if recorded != str(seed):
            held = f"--seed {recorded}" if recorded else "an unrecorded --seed"
            raise SystemExit(f"{out} holds a run with {held}: use another --out")
    for key, value in recorded_settings(out).items():
        if settings[key] != value:
            raise SystemExit(f"{out} holds a run with {key} {value}, not {settings[key]}: use "
                             "another --out")
    out.mkdir(parents=True, exist_ok=True)
    seed_file.write_text(f"{seed}\n")
    (out / "settings.json").write_text(json.dumps(settings) + "\n")
    seed_flag, seconds, cost = ["--seed", str(seed)], {}, size["cost"]
    timings_file = out / "seconds.json"

    if base_of is None:
        say(f"\n== 1. the toy world (seed {seed}): data, tokenizer, model config")
        if not (world / "model" / "config.json").exists():
            seconds["data"] = run_stage([PY, "demo/toy.py", "--out", world, *seed_flag,
                                         *size["data"]], logs, "data", tag=tag, cost=cost["data"])
            make_model_dir(world, size["model"])
        else:
            PROGRESS.skipped(cost["data"])
    pretrain_file, expert_file = world / "train_pretrain.jsonl", world / "train_expert.jsonl"
    rl_file, test_file = world / "train_rl.jsonl", world / "test.jsonl"
    test_rows = [json.loads(line) for line in test_file.read_text().splitlines()]
    val_file = world / "val.jsonl"          # validation while training: questions of its own
    if base_of is None and not val_file.exists():
        questions = frozenset(r["prompt"][1]["content"] for r in test_rows)
        positives = flag(size["data"], "--positives", len(toy.POSITIVE))
        data.write_jsonl(toy.make_floor_task(size["n_val"], 1_000_000 + seed, "prompt", 0.5,
                                             exclude=questions, positives=positives,
                                             distinct="--distinct_test" in size["data"]), val_file)
    val_flags = ["--eval_file", val_file, "--grader_workers", "1"]

    def sft(name: str, model: Path, train_file: Path, loss: str, extra: list,
            threads: int) -> Path:
        if run_dir.completed(runs / name) is None:     # not run, or interrupted: sft.py resumes it
            n_rows = len(train_file.read_text().splitlines())
            steps = flag(extra, "--epochs", 1) * (n_rows // flag(extra, "--global_batch", 8))
            seconds[name] = run_stage([PY, "sft.py", "config/sft_tiny.py", "--model", model,
                                       "--train_file", train_file, "--loss", loss, "--out_dir",
                                       runs / name, "--system_prompt", "row", *seed_flag, *extra],
                                      logs, name, steps, threads=threads, tag=tag,
                                      cost=cost[name])
        else:
            PROGRESS.skipped(cost[name])
        return checkpoints.latest(runs / name)

    if base_of is None:
        say(f"\n== 2. pre-train the base model from scratch on every order (seed {seed})")
        ckpts = {"base": sft("base", world / "model", pretrain_file, "sft",
                             ["--scratch", *size["pretrain"]], size["base_threads"])}
    else:
        ckpts = {"base": checkpoints.latest(base_of / "runs" / "base")}
    def evaluate(name: str) -> None:
        if not (evals / name / "results.json").exists():   # (evals: this seed's, also the base's)
            seconds[f"eval {name}"] = run_stage(
                [PY, "evaluate.py", "--model", ckpts[name], "--data", test_file, "--out",
                 evals / name, "--name", name, "--engine", "hf", "--sft_data", expert_file,
                 "--grader_workers", "1", "--system_prompt", "row", *seed_flag, *size["eval"]],
                logs, f"eval {name}", threads=size["threads"], tag=tag, cost=cost["eval"])
        else:
            PROGRESS.skipped(cost["eval"])

    if until_base:                  # (the base's evaluation too, before the seeds read it)
        evaluate("base")
        record_seconds(timings_file, seconds)
        return {}

    def branch(loss: str) -> None:
        """SFT with `loss` from the base, GRPO from that, and the evaluation of both."""
        ckpts[loss] = sft(loss, ckpts["base"], expert_file, loss,
                          [*size["sft"], *size["val_sft"], *val_flags], size["threads"])
        evaluate(loss)
        name = f"{loss}+grpo"
        if run_dir.completed(runs / name) is None:
            seconds[name] = run_stage([PY, "rl.py", "config/rl_tiny.py", "--model", ckpts[loss],
                                       "--train_file", rl_file, "--out_dir", runs / name,
                                       "--save_every", "0", "--grader_workers", "1",
                                       "--system_prompt", "row", *seed_flag, *size["rl"],
                                       *size["val_rl"], *val_flags],
                                      logs, name, flag(size["rl"], "--steps", 20),
                                      threads=size["threads"], tag=tag, cost=cost["rl"])
        else:
            PROGRESS.skipped(cost["rl"])
        ckpts[name] = checkpoints.latest(runs / name)
        evaluate(name)

    def decisive_token() -> None:
        """demo/decisive_token.py from this seed's base: its SFT runs one after another."""
        if not (out / "decisive_token" / "results.json").exists():
            run_stage([PY, "demo/decisive_token.py", "--demo", out, *size["probe"]], logs,
                      "decisive token", threads=size["threads"], tag=tag, cost=cost["probe"])
        else:
            PROGRESS.skipped(cost["probe"])

    say(f"\n== 3-5. (seed {seed}) from the base, side by side: SFT on the expert's rows (always the "
        "question's order) with cross-entropy, CurioSFT and the entropy loss; GRPO from each; "
        "avg@n and pass@k before and after GRPO, where the expert's order works and where it is "
        "a dead end" + ("; the decisive-token probe (7.) beside them" if probe else ""))
    # The branches share nothing but the base, so they run side by side, one thread each: on 2 cores
    # the demo keeps both busy to the end instead of running one stage at a time, and each stage's
    # result does not depend on what runs beside it.
    t0, ran_before = time.time(), len(seconds)
    losses = size["losses"]
    with concurrent.futures.ThreadPoolExecutor(len(losses) + 2) as pool:   # SLOTS: how many run
        # (from another seed's base, that seed evaluated it)
        futures = [pool.submit(evaluate, "base")] if base_of is None else []
        futures += [pool.submit(branch, loss) for loss in losses]
        futures += [pool.submit(decisive_token)] if probe else []
        wait_for_stages(futures)
    if len(seconds) > ran_before:  # something ran: the wall-clock time of stages 3-5, side by side
        seconds["stages 3-5"] = time.time() - t0
    ckpts = {name: ckpts[name] for name in ["base", *losses, *(f"{loss}+grpo" for loss in losses)]}

    say(f"\n== 6. tables and plots (seed {seed})")
    metrics_file = out / "metrics.json"
    recorded = json.loads(metrics_file.read_text()) if not seconds and metrics_file.exists() else {}
    if tuple(recorded) == METRICS_KEYS:     # (an older layout is measured again)
        say(f"every stage had finished: {metrics_file} reused")
        return recorded
    timings = record_seconds(timings_file, seconds)
    # Once per checkpoint: the base starts every SFT curve, and each SFT run's last checkpoint is
    # also a model.
    branching = functools.cache(lambda ckpt: branching_stats(ckpt, test_rows))

    def evaluated(name: str) -> Path:
        return (base_of or out) / "eval" / name if name == "base" else evals / name

    metrics = {
        "seeds": [seed], "seconds": timings,
        "models": {name: model_metrics(json.loads((evaluated(name) / "results.json").read_text()),
                                       evaluated(name) / "samples.jsonl", branching(ckpt))
                   for name, ckpt in ckpts.items()},
        "sft": {loss: sft_metrics(runs / loss, ckpts["base"], branching,
                                  flag(size["sft"], "--save_every", 0)) for loss in losses},
        "grpo": {f"{loss}+grpo": grpo_metrics(runs / f"{loss}+grpo") for loss in losses},
        "validation": {name: validation_records(runs / name)
                       for loss in losses for name in (loss, f"{loss}+grpo")},
    }
    assert tuple(metrics) == METRICS_KEYS
    run_dir.write_atomic(metrics_file, json.dumps(metrics, indent=1))
    return metrics


def record_seconds(timings_file: Path, seconds: dict) -> dict:
    """Each stage's seconds into timings_file, over those it holds: stages skipped this time keep
    the time of the run that did them. Returns them all."""
    timings = json.loads(timings_file.read_text()) if timings_file.exists() else {}
    timings |= seconds
    timings_file.write_text(json.dumps(timings, indent=1))
    return timings


# ------------------------------------------------------------------------------------------------
# Tables and plots, for one seed or the mean and spread over several
# ------------------------------------------------------------------------------------------------
def over_seeds(metrics: list[dict], get) -> list[float]:
    """get(m) for every seed's metrics, the seeds where it is None left out."""
    return [v for v in map(get, metrics) if v is not None]


def cell(values: list[float], fmt: str = "{:.1%}") -> str:
    """One value as it is; several as "mean (min-max)"; none as "-"."""
    if not values:
        return "–"
    if len(values) == 1:
        return fmt.format(values[0])
    low, high = fmt.format(min(values)), fmt.format(max(values))
    return f"{fmt.format(sum(values) / len(values))} ({low}–{high})"


def tables(metrics: list[dict], paired: dict[str, dict] | None = None) -> str:
    """The summary: accuracy (paper Table 3's shape) and, given compare_all's results, the paired
    differences with their intervals; the branching tokens, the orders the samples took, SFT and
    GRPO over training. One value per cell for one seed; mean (min-max) over several."""
    names = list(metrics[0]["models"])
    works, fails = toy.EXPERT_WORKS, toy.EXPERT_FAILS

    def col(name, get, fmt="{:.1%}"):
        return cell(over_seeds(metrics, lambda m: get(m["models"][name])), fmt)

    k_max = max(int(k) for k in metrics[0]["models"]["base"][f"pass_at_k_{fails}"])
    out = [f"Seeds: {', '.join(str(m['seeds'][0]) for m in metrics)}. Test questions: half where "
           "the expert's order (the question's) works, half where it is a dead end.", "",
           f"| model | avg@n | avg@n, expert's order works | avg@n, expert's order fails "
           f"| pass@{k_max}, expert's order fails | first-number entropy (nats) | P(expert's first "
           "number) | P(negative put off), expert's fails |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in names:
        out.append(f"| {name} | {col(name, lambda r: r['avg'])} | "
                   f"{col(name, lambda r: r[f'avg_{works}'])} | "
                   f"{col(name, lambda r: r[f'avg_{fails}'])} | "
                   f"{col(name, lambda r: r[f'pass_at_k_{fails}'][str(k_max)])} | "
                   f"{col(name, lambda r: r['branching']['entropy'], '{:.3f}')} | "
                   f"{col(name, lambda r: r['branching']['p_expert'])} | "
                   f"{col(name, lambda r: r['branching']['p_put_off'])} |")
    out += paired_table(paired) if paired else []
    if paired and len(metrics) == 1:
        spread = ", ".join(f"{mean:+.1f} ± {sd:.0f} ({name})"
                           for name, (mean, sd) in SEED_SPREAD.items())
        out += ["", "One seed: its differences depend on the machine and the version of the code (the "
                    "CPU's kernels order the floating-point sums, and one seed's training on this toy "
                    "is chaotic enough to move them by tens of points): the same distribution, not the "
                    "same numbers. Over 24 seeds of the default size, one seed's A − B in avg@n had the "
                    f"mean ± standard deviation {spread} points: expect most seeds within about "
                    "twice the standard deviation of the mean. The claim is the mean over many "
                    "seeds, `--seeds` (docs/demo.md)."]
    for source, title in ((fails, "where the expert's order is a dead end"),
                          (works, "where the expert's order works")):
        out += ["", "Samples by the order they took and how they ended "
                    f"(`toy.floor_solution_kind`), on the questions {title}:", "",
                "| model | " + " | ".join(toy.FLOOR_KINDS) + f" | {MISTAKE_GRADED_RIGHT} |",
                "| --- |" + " --- |" * (len(toy.FLOOR_KINDS) + 1)]
        for name in names:
            out.append(f"| {name} | " + " | ".join(col(name, lambda r: r["kinds"][source][k])
                                                for k in (*toy.FLOOR_KINDS, MISTAKE_GRADED_RIGHT))
                       + " |")
    steps = " / ".join(map(str, metrics[0]["sft"]["sft"]["steps"]))
    out += ["", f"| SFT run | first-number entropy (nats) at steps {steps} | P(expert's first "
                "number), same steps | P(negative put off), expert's fails, same steps | top-20% "
                "expert-token entropy at the end | cross-entropy at the end | w_t at top-20% / "
                "bottom-80% teacher-entropy tokens |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for loss in metrics[0]["sft"]:
        def points(key):
            n = len(metrics[0]["sft"][loss]["branching"])
            return " / ".join(cell(over_seeds(metrics,
                                              lambda m: m["sft"][loss]["branching"][i][key]),
                                   "{:.2f}" if key == "entropy" else "{:.0%}") for i in range(n))
        sft = [m["sft"][loss] for m in metrics]
        w = (f"{cell([s['w_top20'] for s in sft], '{:.3f}')} / "
             f"{cell([s['w_bottom80'] for s in sft], '{:.3f}')}"
             if "w_top20" in sft[0] else "–")
        out.append(f"| {loss} | {points('entropy')} | {points('p_expert')} | {points('p_put_off')} "
                   f"| {cell([s['top20'][-1] for s in sft], '{:.3f}')} | "
                   f"{cell([s['ce_end'] for s in sft], '{:.4f}')} | {w} |")
    per_stage = []
    for stage in metrics[0]["seconds"]:
        # the median: a stage resumed after Ctrl-C records only the part after it, one paused
        # (SIGSTOP) the pause too
        v = over_seeds(metrics, lambda m: m["seconds"].get(stage))
        spread = f" ({min(v):.0f}–{max(v):.0f})" if len(v) > 1 else ""
        per_stage.append(f"{stage} {statistics.median(v):.0f}{spread}")
    out += ["", "Seconds per stage" + (", median (min–max) over seeds" if len(metrics) > 1 else "")
            + " (stages 3-5 ran side by side, so each took longer than alone): "
            + ", ".join(per_stage) + "."]
    out += ["", "| GRPO run | mixed-reward groups (all steps) | first quarter | last quarter | "
                "reward, first quarter | reward, last quarter |",
            "| --- | --- | --- | --- | --- | --- |"]
    for name in metrics[0]["grpo"]:
        g = [m["grpo"][name] for m in metrics]
        keys = ("mixed", "mixed_first", "mixed_last", "reward_first", "reward_last")
        out.append(f"| {name} | " + " | ".join(cell([x[k] for x in g]) for k in keys) + " |")
    return "\n".join(out) + "\n"


def plots(metrics: list[dict], out: Path) -> list[Path]:
    """The paper's figures for the demo: accuracy before and after RL for each SFT method (bars from
    0), pass@k, the branching tokens during SFT, and the orders the samples took. Bars and points
    are means over seeds, the error bars the min-max spread (none with one seed)."""
    plt = pyplot()
    out.mkdir(parents=True, exist_ok=True)
    names, losses = list(metrics[0]["models"]), list(metrics[0]["sft"])
    works, fails = toy.EXPERT_WORKS, toy.EXPERT_FAILS

    def spread(get):
        v = over_seeds(metrics, get)
        mean = sum(v) / len(v)
        return mean, (mean - min(v), max(v) - mean)

    bars = dict(capsize=3) if len(metrics) > 1 else {}     # one seed: no spread, no zero-width caps

    written = []
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, key, title in ((axes[0], "avg", "all test questions"),
                           (axes[1], f"avg_{fails}", "where the expert's order is a dead end")):
        highs = []
        for i, loss in enumerate(losses):
            for dx, name, color in ((-0.2, loss, "tab:gray"), (0.2, f"{loss}+grpo", "tab:blue")):
                mean, err = spread(lambda m: 100 * m["models"][name][key])
                yerr = {"yerr": [[err[0]], [err[1]]], **bars} if bars else {}
                ax.bar(i + dx, mean, width=0.4, color=color,
                       label=("before GRPO" if dx < 0 else "after GRPO") if i == 0 else None,
                       **yerr)
                ax.annotate(f"{mean:.1f}", (i + dx, mean + err[1]), ha="center", va="bottom",
                            fontsize="small")
                highs.append(mean + err[1])
        ax.set_ylim(0, min(100.0, max(highs) * 1.12 + 1))           # from 0: bar heights compare
        ax.set_xticks(range(len(losses)), losses)
        ax.set(ylabel="avg@n (%)", title=title)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=2, fontsize="small")
    fig.subplots_adjust(bottom=0.2)
    written.append(out / "accuracy_before_after_rl.png")

    k_of = sorted(int(k) for k in metrics[0]["models"]["base"][f"pass_at_k_{fails}"])
    fig2, axes2 = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, source in zip(axes2, (fails, works)):
        for j, name in enumerate(names):
            color = f"C{losses.index(name.split('+')[0]) + 1 if name != 'base' else 0}"
            ys = [spread(lambda m: 100 * m["models"][name][f"pass_at_k_{source}"][str(k)])[0]
                  for k in k_of]
            ax.plot(k_of, ys, marker="o", color=color, linestyle="--" if "+grpo" in name else "-",
                    label=name)
        ax.set_xscale("log", base=2)
        ax.set(xlabel="k", ylabel="pass@k (%)",
               title=f"expert's order {'fails' if source == fails else 'works'}")
    axes2[0].legend(fontsize="small")
    written.append(out / "pass_at_k.png")

    fig3, axes3 = plt.subplots(1, 3, figsize=(14, 3.8))
    for i, loss in enumerate(losses):
        s0 = metrics[0]["sft"][loss]
        for ax, key in ((axes3[0], "entropy"), (axes3[1], "p_expert"), (axes3[2], "p_put_off")):
            pts = [spread(lambda m: m["sft"][loss]["branching"][p][key])
                   for p in range(len(s0["steps"]))]
            low_high = [[p[1][0] for p in pts], [p[1][1] for p in pts]]
            yerr = {"yerr": low_high, **bars} if bars else {}
            ax.errorbar(s0["steps"], [p[0] for p in pts], marker="o", color=f"C{i + 1}", label=loss,
                        **yerr)
    axes3[0].axhline(1.2, color="gray", linestyle=":", label="Eq. 7's pivot")
    axes3[0].set(xlabel="SFT step", ylabel="nats", title="first-number entropy (test questions)")
    axes3[1].set(xlabel="SFT step", ylabel="probability", title="P(expert's first number)")
    axes3[2].set(xlabel="SFT step", ylabel="probability",
                 title="P(negative put off), expert's order fails")
    axes3[0].legend(fontsize="small")
    written.append(out / "entropy_during_sft.png")

    fig4, axes4 = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for ax, source in zip(axes4, (fails, works)):
        bottom = [0.0] * len(names)
        for j, kind in enumerate(toy.FLOOR_KINDS):
            shares = [spread(lambda m: 100 * m["models"][name]["kinds"][source][kind])[0]
                      for name in names]
            ax.bar(range(len(names)), shares, bottom=bottom, color=f"C{j}", label=kind)
            bottom = [b + s for b, s in zip(bottom, shares)]
        ax.set_xticks(range(len(names)), names, rotation=30, fontsize="small")
        ax.set(ylabel="% of samples",
               title=f"expert's order {'fails' if source == fails else 'works'}")
    axes4[1].legend(fontsize="small", loc="center left", bbox_to_anchor=(1.0, 0.5))
    written.append(out / "strategy_shares.png")

    figures = [fig, fig2, fig3, fig4]
    if all(m.get("validation", {}).get("sft") for m in metrics):   # --eval_every's records
        figures.append(validation_plot(metrics, plt))
        written.append(out / "validation_during_training.png")
    for f, path in zip(figures, written):
        if f is not fig:                                           # (fig keeps room for its legend)
            f.tight_layout()
        save_png(f, path, dpi=110)
    return written


def validation_plot(metrics: list[dict], plt):
    """The validation records of each SFT run and of the GRPO run after it (dashed, its steps after
    the SFT run's last evaluation): sampling entropy and accuracy over training, the paper's
    Fig. 1 story.
    Means over seeds."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, loss in enumerate(metrics[0]["sft"]):
        offset = 0
        for name, style in ((loss, "-"), (f"{loss}+grpo", "--")):
            runs = [m["validation"][name] for m in metrics]
            steps = [r["step"] + offset for r in runs[0]]
            for ax, key, scale in ((axes[0], "val_entropy", 1), (axes[1], "val_accuracy", 100)):
                ys = [scale * sum(run[j][key] for run in runs) / len(runs)
                      for j in range(len(steps))]
                ax.plot(steps, ys, marker="o", color=f"C{i + 1}", linestyle=style,
                        label=name)
            offset = steps[-1] if steps else offset
    axes[0].set(xlabel="optimiser step (GRPO after SFT)", ylabel="nats",
                title="sampling entropy, validation questions")
    axes[1].set(xlabel="optimiser step (GRPO after SFT)", ylabel="avg@n (%)",
                title="accuracy, validation questions")
    axes[1].legend(fontsize="small", loc="center left", bbox_to_anchor=(1.0, 0.5))
    return fig


# Up to this many seeds the paired plot draws each seed's interval over its questions; above it,
# each seed's difference alone (its interval is in summary.md), so that the seeds' spread stays
# readable.
SEED_BARS_UP_TO = 8


def paired_plot(paired: dict[str, dict], by_seed: list[dict] | None, out: Path) -> Path:
    """The headline figure: each comparison's paired difference A - B in avg@n over all test
    questions, 0 marked. With several seeds, each seed's difference above (grey) and below it the
    mean over the seeds with two 95% intervals: the two-level bootstrap (evaluate.py compare) and
    Student's t over the seeds' differences; with one seed, its bootstrap interval."""
    plt = pyplot()
    seeds = by_seed or []
    fig, ax = plt.subplots(figsize=(8.5, 0.9 + len(paired) * (0.75 + 0.03 * len(seeds))))

    def interval(difference, low, high, y, **style):
        d = 100 * difference
        ax.errorbar(d, y, xerr=[[d - 100 * low], [100 * high - d]], **style)

    for row, name in enumerate(paired):
        for j, per_seed in enumerate(seeds):
            r = paired_row(per_seed[name])
            y = row - 0.65 + 0.5 * (j + 0.5) / len(seeds)          # in seed order, above the mean
            label = "one seed" if row == j == 0 else None
            if len(seeds) <= SEED_BARS_UP_TO:
                interval(r["difference"], r["low"], r["high"], y, fmt="o", color="0.6",
                         markersize=3, label=label)
            else:
                ax.plot(100 * r["difference"], y, "o", color="0.5", markersize=3, label=label)
        pooled = paired_row(paired[name])
        interval(pooled["difference"], pooled["low"], pooled["high"], row, fmt="D", color="C0",
                 capsize=4, label="mean, two-level bootstrap" if seeds and row == 0 else None)
        if len(seeds) > 1:
            mean, half = t_interval([paired_row(p[name])["difference"] for p in seeds])
            interval(mean, mean - half, mean + half, row + 0.2, fmt="s", color="C1", capsize=4,
                     label="mean, Student's t over seeds" if row == 0 else None)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(paired)), list(paired))
    ax.invert_yaxis()
    ax.set(xlabel="A - B, avg@n over all test questions (points), 95% intervals",
           title="paired differences on the same questions"
           + (f", {len(seeds)} seeds" if seeds else ""))
    if seeds:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return Path(save_png(fig, out / "paired_differences.png", dpi=110))


def comparisons(losses) -> list[tuple[str, str]]:
    """The COMPARISONS between models trained with `losses`."""
    return [(a, b) for a, b in COMPARISONS if a.split("+")[0] in losses]


def compare_all(evals: list[Path], out: Path, losses=SFT_LOSSES, cost: float = 0.0,
                tag: str = "") -> dict[str, dict]:
    """evaluate.py compare for each of comparisons(losses), side by side (SLOTS: how many at once), over the
    evaluations of every seed (eval folders of one seed each, a two-level bootstrap with several):
    {"A - B": its paired.json}. A comparison already written over the same evaluations is reused;
    one over other seeds is redone. cost: each one's, for PROGRESS."""
    def compare(a: str, b: str) -> dict:
        path = out / "compare" / f"{a}_vs_{b}" / "paired.json"
        result = json.loads(path.read_text()) if path.exists() else None
        if result is None or [result["a"]["evaluations"], result["b"]["evaluations"]] != [
                [str(e / a) for e in evals], [str(e / b) for e in evals]]:
            run_stage([PY, "evaluate.py", "compare", "--a", *(e / a for e in evals), "--b",
                       *(e / b for e in evals), "--out", path.parent],
                      out / "logs", f"compare {a} - {b}", tag=tag, cost=cost)
            result = json.loads(path.read_text())
        else:
            PROGRESS.skipped(cost)
        return result

    pairs = comparisons(losses)
    with concurrent.futures.ThreadPoolExecutor(len(pairs)) as pool:
        futures = {f"{a} - {b}": pool.submit(compare, a, b) for a, b in pairs}
        wait_for_stages(list(futures.values()))
    return {name: future.result() for name, future in futures.items()}


def paired_row(result: dict, benchmark: str = "all avg", metric: str = "avg") -> dict:
    """One row of an evaluate.py compare result (paired.json); by default avg@n over all test
    questions."""
    return next(r for r in result["rows"] if r["benchmark"] == benchmark and r["metric"] == metric)


def points(difference: float, low: float, high: float) -> str:
    """A - B and its interval, in points."""
    return f"{100 * difference:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"


def paired_table(paired: dict[str, dict]) -> list[str]:
    """Markdown lines: each comparison's A - B with its 95% interval, overall and per kind of
    question."""
    works, fails = toy.EXPERT_WORKS, toy.EXPERT_FAILS

    def at(result, benchmark, metric):
        r = paired_row(result, benchmark, metric)
        return points(r["difference"], r["low"], r["high"])

    first = next(iter(paired.values()))
    k_max = max(int(r["metric"][5:]) for r in first["rows"] if r["metric"].startswith("pass@"))
    lines = ["", "Paired differences A − B in points, with 95% bootstrap intervals (`evaluate.py "
                 f"compare`, {first['resamples']:,} replicates; resampled: {first['resampled']}):",
             "", f"| A − B | avg@n | avg@n, expert's order works | avg@n, expert's order fails "
             f"| pass@{k_max}, expert's order fails |", "| --- | --- | --- | --- | --- |"]
    for name, result in paired.items():
        lines.append(f"| {name} | {at(result, 'all avg', 'avg')} | {at(result, works, 'avg')} "
                     f"| {at(result, fails, 'avg')} | {at(result, fails, f'pass@{k_max}')} |")
    return lines


# Student's t, the 97.5% quantile by degrees of freedom: a two-sided 95% interval for a mean over a
# few seeds. Above 30 degrees of freedom the value at 30 is used, which only widens the interval (by
# under 4%).
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
         2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
         2.052, 2.048, 2.045, 2.042)


# The 80% quantile likewise: the power of that interval, for the smallest effect it detects.
T_80 = (1.376, 1.061, 0.978, 0.941, 0.920, 0.906, 0.896, 0.889, 0.883, 0.879, 0.876, 0.873, 0.870,
        0.868, 0.866, 0.865, 0.863, 0.862, 0.861, 0.860, 0.859, 0.858, 0.858, 0.857, 0.856, 0.856,
        0.855, 0.855, 0.854, 0.854)


def mean_sd(values: list[float]) -> tuple[float, float]:
    """The mean of `values` and their sample standard deviation (two values or more)."""
    mean = sum(values) / len(values)
    return mean, (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5


def t_interval(values: list[float]) -> tuple[float, float]:
    """The mean of `values` and the half-width of its 95% Student's t interval (two values or
    more)."""
    mean, sd = mean_sd(values)
    return mean, T_975[min(len(values) - 1, len(T_975)) - 1] * sd / len(values) ** 0.5


def detectable_effect(values: list[float]) -> float:
    """The smallest true mean that the 95% t interval over this many seeds, spread as `values` are,
    excludes zero for 4 runs in 5 (two-sided 5%, power 80%): (t_.975 + t_.80) sd / sqrt(n)."""
    df = min(len(values) - 1, len(T_975))
    return (T_975[df - 1] + T_80[df - 1]) * mean_sd(values)[1] / len(values) ** 0.5


def across_seeds(by_seed: list[dict[str, dict]], pooled: dict[str, dict], name: str,
                 benchmark: str = "all avg") -> tuple[list[float], list[str]]:
    """One comparison's A - B in avg@n on `benchmark`, seed by seed, and three cells over the seeds:
    the mean with its 95% Student's t interval, the two-level bootstrap's, the seeds where A > B."""
    differences = [paired_row(paired[name], benchmark)["difference"] for paired in by_seed]
    mean, half = t_interval(differences)
    o = paired_row(pooled[name], benchmark)
    return differences, [points(mean, mean - half, mean + half),
                         points(o["difference"], o["low"], o["high"]),
                         f"{sum(d > 0 for d in differences)} of {len(differences)}"]


def seed_table(metrics: list[dict], by_seed: list[dict[str, dict]],
               pooled: dict[str, dict]) -> list[str]:
    """Markdown lines: each comparison's A - B in avg@n points seed by seed (with the bootstrap over
    that seed's questions), then across seeds: the mean with Student's t interval, the two-level
    bootstrap, the seeds won, one seed's spread and the smallest mean the seeds detect; then the
    first three across seeds on each kind of question."""
    names = list(pooled)
    lines = ["", "A − B in points of avg@n (all test questions), seed by seed with a 95% "
                 "bootstrap over that seed's questions, then across seeds:", "",
             "| seed | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for m, paired in zip(metrics, by_seed):
        overall = [paired_row(paired[name]) for name in names]
        cells = [points(o["difference"], o["low"], o["high"]) for o in overall]
        lines.append(f"| {m['seeds'][0]} | " + " | ".join(cells) + " |")
    columns, spread_cells, detectable = [], [], []
    for name in names:
        differences, cells = across_seeds(by_seed, pooled, name)
        columns.append(cells)
        spread_cells.append(f"{100 * mean_sd(differences)[1]:.1f} ({100 * min(differences):+.1f} "
                            f"to {100 * max(differences):+.1f})")
        detectable.append(f"{100 * detectable_effect(differences):.1f}")
    heads = [f"mean, 95% Student's t over {len(by_seed)} seeds",
             "mean, 95% two-level bootstrap (seeds, then questions)", "seeds where A > B"]
    for i, head in enumerate(heads):
        lines.append(f"| {head} | " + " | ".join(column[i] for column in columns) + " |")
    lines += ["| one seed's A − B: standard deviation over seeds (lowest to highest) | "
              + " | ".join(spread_cells) + " |",
              "| mean A − B these seeds detect with 80% power (two-sided 5%; approx., the seeds' sd "
              "taken as the true one) | "
              + " | ".join(detectable) + " |"]
    kinds = {"expert's order works": toy.EXPERT_WORKS, "expert's order fails": toy.EXPERT_FAILS}
    lines += ["", f"The same across the {len(by_seed)} seeds, by kind of question: mean [95% "
                  "Student's t], mean [95% two-level bootstrap], seeds where A > B:", "",
              "| A − B | " + " | ".join(f"{kind}: {what}" for kind in kinds
                                        for what in ("t", "bootstrap", "A > B")) + " |",
              "| --- |" + " --- |" * (3 * len(kinds))]
    for name in names:
        cells = []
        for benchmark in kinds.values():
            cells += across_seeds(by_seed, pooled, name, benchmark)[1]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def signed(values: list[float], fmt: str = "{:+.3f}") -> str:
    """The mean of per-seed values with its 95% Student's t interval over the seeds, and the seeds
    where a value is above 0."""
    mean, half = t_interval(values)
    return (f"{fmt.format(mean)} [{fmt.format(mean - half)}, {fmt.format(mean + half)}], above 0 "
            f"on {sum(v > 0 for v in values)} of {len(values)} seeds")


def headline(metrics: list[dict], by_seed: list[dict[str, dict]]) -> list[str]:
    """Markdown lines, first in the summary of several seeds: what they support, each claim a mean
    over the seeds with its interval, so that no single seed's chaos (its float order) decides its
    sign. The entropy CurioSFT keeps at the first number, the split by kind of question before RL,
    and the difference after GRPO."""
    def entropy(m, name):
        return m["models"][name]["branching"]["entropy"]

    def over_sft(m, loss):        # the first number's entropy over SFT's checkpoints, the base out
        return statistics.mean(b["entropy"] for b in m["sft"][loss]["branching"][1:])

    def points_over_seeds(name, benchmark):
        return signed([100 * paired_row(p[name], benchmark)["difference"] for p in by_seed],
                      "{:+.1f}")

    def mean(get):
        return statistics.mean(map(get, metrics))

    steps = metrics[0]["sft"]["sft"]["steps"][1:]
    at_end = [entropy(m, "curio") - entropy(m, "sft") for m in metrics]
    along = [over_sft(m, "curio") - over_sft(m, "sft") for m in metrics]
    taken = [entropy(m, "base") - entropy(m, "sft") for m in metrics]
    dead_end = [100 * paired_row(p["curio - sft"], toy.EXPERT_FAILS)["difference"] for p in by_seed]
    works = [100 * paired_row(p["curio - sft"], toy.EXPERT_WORKS)["difference"] for p in by_seed]
    after_rl = [100 * paired_row(p["curio+grpo - sft+grpo"])["difference"] for p in by_seed]
    return [f"## What {len(metrics)} seeds support", "",
            "Means over the seeds, each with its 95% Student's t interval over them: one seed's "
            "numbers depend on the machine (the CPU's kernels order the float sums, and training "
            "on this toy carries a rounding difference far), the mean over seeds much less. Each "
            "claim in bold says what its interval shows at this size; docs/demo.md has 24 seeds of "
            "the full size.", "",
            f"1. **Base − SFT: {verdict(taken, 'SFT takes the exploring away')}; CurioSFT − SFT at "
            f"the end: {verdict(at_end, 'CurioSFT keeps more of it')}; along SFT: "
            f"{verdict(along, 'CurioSFT keeps more of it')}.** The entropy of the first number "
            f"(nats, at temperature 1): the base {mean(lambda m: entropy(m, 'base')):.2f}"
            f", after SFT {mean(lambda m: entropy(m, 'sft')):.3f}, after CurioSFT "
            f"{mean(lambda m: entropy(m, 'curio')):.3f}. Base − SFT: {signed(taken)}. CurioSFT − SFT "
            f"at the end: {signed(at_end)}; over SFT's checkpoints (steps {steps[0]}-{steps[-1]}), "
            f"on average: {signed(along)}.",
            "2. **CurioSFT − SFT before RL, where the expert's order is a dead end: "
            f"{verdict(dead_end, 'above SFT')}; where it works: {verdict(works, 'above SFT')}** "
            "(two intervals among several, none corrected for looking at several). In points of "
            f"avg@n, where it is a dead end: {signed(dead_end, '{:+.1f}')}; where it works: "
            f"{signed(works, '{:+.1f}')}.",
            f"3. **After GRPO, the paper's question: {verdict(after_rl, 'CurioSFT+GRPO above')}.** "
            f"CurioSFT+GRPO − SFT+GRPO: {signed(after_rl, '{:+.1f}')}. One seed's difference after "
            "RL moves by tens of points with the float order alone; 24 seeds of the full size "
            "could not tell the two apart (docs/demo.md).", ""]


def verdict(values: list[float], claim: str) -> str:
    """What the 95% t interval of the per-seed `values` says of `claim` (that their mean is above 0):
    the claim when it lies above zero, else that it holds zero or lies below."""
    mean, half = t_interval(values)
    if mean - half > 0:
        return claim + " (the interval excludes zero)"
    return "the interval holds zero" if mean + half >= 0 else "the reverse (the interval is below zero)"


def report(metrics: list[dict], paired: dict[str, dict], out: Path,
           by_seed: list[dict] | None = None, probe: Path | None = None) -> None:
    """summary.md (with several seeds, what they support first) and the plots; printed, with the
    decisive-token probe's table from its results.json `probe` when there is one."""
    several = by_seed is not None and len(by_seed) > 1     # (one seed's spread is not defined)
    table = ("\n".join(headline(metrics, by_seed)) + "\n" if several else "") + tables(metrics,
                                                                                      paired)
    if several:
        table += "\n".join(seed_table(metrics, by_seed, paired)) + "\n"
    if probe is not None and probe.exists():
        from demo import decisive_token           # (it imports this module)

        table += ("\n## The decisive-token probe (demo/decisive_token.py)\n\n"
                  + decisive_token.table([json.loads(probe.read_text())]) + "\n")
    (out / "summary.md").write_text(table)
    written = [paired_plot(paired, by_seed, out / "plots"), *plots(metrics, out / "plots")]
    print(table + f"\nplots: {', '.join(str(p) for p in written)}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--out", default="out/demo",
                    help="everything goes here: world/, runs/, eval/, logs/, plots/ (with several "
                         "seeds: each seed's in OUT/seed_S)")
    ap.add_argument("--seed", type=int,
                    help="one seed, into OUT itself: of the data, the initial weights, the "
                         "batches and sampling")
    ap.add_argument("--seeds", type=int, nargs="+",
                    help="these seeds side by side, each into OUT/seed_S, then the mean, the "
                         "spread and the paired differences seed by seed with intervals (default: "
                         "the size's, " + "; ".join(f"{name} {default_seeds(size)}"
                                                   for name, size in SIZES.items()) + ")")
    ap.add_argument("--jobs", type=int, default=4,
                    help="stage processes' threads at a time, over every seed and branch")
    ap.add_argument("--threads", type=int,
                    help="threads per stage process (default: 1, the base " +
                         ", ".join(f"{size['base_threads']} at {name}"
                                   for name, size in SIZES.items()) +
                         "); another count orders the float sums otherwise")
    ap.add_argument("--no_pack", action="store_true",
                    help="train on right-padded rows (sft.py and rl.py --no-pack), another order "
                         "of the float sums")
    ap.add_argument("--no_probe", action="store_true",
                    help="without the decisive-token probe (7.)")
    a = ap.parse_args()
    if a.seed is not None and a.seeds:
        ap.error("--seed or --seeds, not both")
    t0, out = time.time(), Path(a.out).resolve()
    try:
        run(a, out)
    except (StageStopped, KeyboardInterrupt) as e:
        what = str(e) if isinstance(e, StageStopped) else "between stages"
        raise SystemExit(f"demo stopped: {what}. The same command resumes it: finished stages are "
                         "kept, an interrupted one goes on from its last checkpoint") from None
    print(f"{a.size} demo: {time.time() - t0:.0f}s", flush=True)


def recorded_settings(out: Path) -> dict:
    """The size and float order a seed's folder was run with ({} before they were recorded)."""
    path = out / "settings.json"
    return json.loads(path.read_text()) if path.exists() else {}


def default_seeds(size: dict) -> str:
    """The size's default seeds, as --help shows them."""
    seeds = size["seeds"]
    return f"--seeds {seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else f"--seed {seeds[0]}"


def float_order(size: dict) -> str:
    """What orders a run's float sums, besides the machine: the threads per stage and the rows'
    form."""
    form = "padded" if "--no-pack" in size["sft"] else "packed"
    return f"threads {size['threads']} (base {size['base_threads']}), {form} rows"


def with_float_order(size: dict, threads: int | None, no_pack: bool) -> dict:
    """The size with --threads and --no_pack applied to its stages."""
    size = dict(size)
    if threads is not None:
        size["threads"] = size["base_threads"] = threads
    if no_pack:
        for stage in ("pretrain", "sft", "rl"):
            size[stage] = [*size[stage], "--no-pack"]
    return size


def run(a, out: Path) -> None:
    """Every seed's stages side by side, each seed's paired comparisons as it ends, then the tables
    and plots over the seeds."""
    size = with_float_order(SIZES[a.size], a.threads, a.no_pack)
    SLOTS.capacity = a.jobs
    several = a.seeds is not None or (a.seed is None and len(size["seeds"]) > 1)
    seeds = a.seeds or ([a.seed] if a.seed is not None else size["seeds"])
    cost, losses = size["cost"], size["losses"]
    n = len(losses)
    # the seeds start from the first one's world and base, or each from its own
    first = out / f"seed_{seeds[0]}" if several else out
    shared = several and size["shared_base"]
    # each base with its data and its evaluation (once when shared); a seed's SFT runs, GRPO runs
    # and their 2n evaluations; then the comparisons
    bases = 1 if shared else len(seeds)
    PROGRESS.plan((cost["data"] + cost["base"] + cost["eval"]) * bases, 3 * bases)
    PROGRESS.plan((sum(cost[loss] for loss in losses) + n * cost["rl"] + 2 * n * cost["eval"])
                  * len(seeds), 4 * n * len(seeds))
    compared = len(comparisons(losses)) * (1 + several * len(seeds))
    PROGRESS.plan(cost["compare"] * compared, compared)
    if not a.no_probe:
        PROGRESS.plan(cost["probe"])
    say(f"{a.size} demo, seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))}, "
        f"{float_order(size)}: "
        f"{PROGRESS.line()} (at the speed of the machine that measured the stages)")

    if shared:      # its base first
        run_seed(size, first, seeds[0], f"seed {seeds[0]} ", until_base=True)

    def seed_and_its_comparisons(i: int, seed: int):
        folder = out / f"seed_{seed}" if several else out
        tag = f"seed {seed} " if several else ""
        metrics = run_seed(size, folder, seed, tag, probe=i == 0 and not a.no_probe,
                           base_of=first if shared else None)
        return metrics, (compare_all([folder / "eval"], folder, losses, cost["compare"], tag)
                         if several else None)

    with concurrent.futures.ThreadPoolExecutor(len(seeds)) as pool:
        futures = [pool.submit(seed_and_its_comparisons, i, s) for i, s in enumerate(seeds)]
        wait_for_stages(futures)
    metrics, by_seed = zip(*(future.result() for future in futures))
    evals = [out / f"seed_{s}" / "eval" for s in seeds] if several else [out / "eval"]
    say("\n== 6. the tables and plots" + (f" over the {len(seeds)} seeds" if several else ""))
    paired = compare_all(evals, out, losses, cost["compare"])
    probe = None if a.no_probe else (evals[0].parent / "decisive_token" / "results.json")
    report(list(metrics), paired, out, list(by_seed) if several else None, probe)


if __name__ == "__main__":
    main()
