"""The CPU demo's toy world: a task in which exploration has value, and a small tokenizer in Qwen2's format.

    python toy.py --out out/demo/world --seed 0     # the four data splits (.jsonl) and tokenizer/

The ring task. "Ring: 3,-8,6,2,5,7" asks for the total of a ring of numbers, added one after another going round
from a starting number of the solver's choice, and the running total may never fall below 0:

    <think>                         <think>
    6                               3
    +2=8                            -8: stuck
    +5=13                           </think>
    +7=20                           Stuck.
    +3=23
    -8=15
    </think>
    \\boxed{15}

The starting number is the one branching token of a response: any of the ring's positive numbers is a strategy
(five of them, ln 5 = 1.6 nats when all are equally likely, above Eq. 7's 1.2-nat pivot), and everything after
it is factual. Every start that gets round gives the same total, so the final answer alone decides correctness,
but a start from which the negative number comes too early is a dead end. Starting right after the negative
number always gets round (all the positive numbers come first and the total is positive): the question holds what
a solver needs to choose well.
- Pre-training rows start at a random positive number, dead ends included: the base model knows every strategy
  but not which one works (and, briefly trained, it still often loses its way round the ring).
- Expert (SFT) rows always start at the first number (the question's order), and only on questions where that
  works: the expert is right on every example it shows.
- Test and RL rows: a stated share of the questions (half by default) is one where the expert's start is a dead
  end; every such question has other starts that get round. Their data_source says which kind a question is, so
  evaluate.py reports avg@n and pass@k for each kind.
"""
import argparse
import random
import re
from pathlib import Path

import data

# ---------------------------------------------------------------------------------------------------------
# Toy tokenizer for the CPU demo and tests: byte-level BPE in Qwen2's format
# ---------------------------------------------------------------------------------------------------------
# Qwen2's pre-tokenizer regex, as transformers' Qwen2Tokenizer rebuilds it. A tokenizer saved beside a config.json
# with model_type=qwen2 is reloaded by AutoTokenizer (and vLLM) as Qwen2Tokenizer, which replaces the saved
# normaliser and pre-tokenizer with Qwen's; training with the same ones keeps the ids identical after reload.
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
# Qwen2.5's plain ChatML template (without tools or a default system turn); data._chatml() writes the same text.
CHATML_TEMPLATE = (
    r"{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    r"{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_toy_tokenizer(texts: list[str], vocab_size: int = 2048):
    """A byte-level BPE tokenizer trained on `texts`, as a transformers tokenizer with eos = pad =
    <|endoftext|>, ChatML special tokens and a ChatML chat template. "<think>" and "</think>" are added
    (non-special) tokens so that they stay one token each and survive decode(skip_special_tokens=True).
    The vocabulary has at most vocab_size + 2 entries (fewer when the texts have fewer merges to learn):
    size models with len(tokenizer). Training is deterministic."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: any text stays encodable
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


_CONSONANTS, _VOWELS = "bdfgklmnprstvz", "aeiou"
# 14 x 5 = 70 syllables; two-syllable pseudo-words give 4900 words that the task never uses. The tokenizer learns
# them, so the toy's vocabulary has thousands of entries the model learns to rule out: a real LM's rare tail.
TOY_LABELS = [a + b + c + d for a in _CONSONANTS for b in _VOWELS for c in _CONSONANTS for d in _VOWELS]


def toy_tokenizer_texts(rows: list[dict], n_labels: int = 2000, label_repeats: int = 8) -> list[str]:
    """Texts to train the toy tokenizer on: every question under both system prompts (Table 7's and the row's),
    every response, and n_labels pseudo-words `label_repeats` times each (each becomes a token of the tail)."""
    texts = [data.build_prompt(r["prompt"][-1]["content"], system=s)
             for r in rows for s in (data.SYSTEM_PROMPT, r["prompt"][0]["content"])]
    texts += [r["target"][0]["content"] for r in rows]
    return texts + [" ".join(f"{a} 1," for a in TOY_LABELS[:n_labels])] * label_repeats


# ---------------------------------------------------------------------------------------------------------
# The ring task
# ---------------------------------------------------------------------------------------------------------
RING_SYSTEM = "Go round the ring, never below 0."
RING_STUCK = "Stuck."  # the answer of a dead end: no number, so the grader scores it 0
# The data_source of a test or RL row: whether the expert's start (the first number) gets round. evaluate.py
# reports each as a benchmark; with equal counts, its mean over benchmarks is the mean over questions.
EXPERT_WORKS, EXPERT_FAILS = "ring_expert_works", "ring_expert_fails"


def ring_question(ring: list[int]) -> str:
    """"Ring: 3,-8,6,2,5,7,3...": the first number again at the end, as a ring is written. No spaces: 7 tokens
    fewer in every prompt."""
    return "Ring: " + ",".join(map(str, ring)) + f",{ring[0]}..."


def parse_ring(question: str) -> list[int]:
    """The numbers of a ring question."""
    m = re.fullmatch(r"Ring: (-?\d+(?:,-?\d+)+)\.\.\.", question)
    ring = [int(v) for v in m.group(1).split(",")] if m else []
    if len(ring) < 3 or ring[-1] != ring[0]:
        raise ValueError(f"not a ring question: {question!r}")
    return ring[:-1]


def go_round(ring: list[int], start: int) -> tuple[list[int], bool]:
    """The running totals from ring[start] on, going round, and whether the round got all the way: it stops
    before the first number that would take the running total below 0 (a dead end)."""
    totals = [ring[start]]
    for i in range(1, len(ring)):
        value = ring[(start + i) % len(ring)]
        if totals[-1] + value < 0:
            return totals, False
        totals.append(totals[-1] + value)
    return totals, True


def working_starts(ring: list[int]) -> list[int]:
    """Indices of the positive numbers from which the round gets all the way."""
    return [i for i, v in enumerate(ring) if v > 0 and go_round(ring, i)[1]]


def ring_response(ring: list[int], start: int) -> str:
    """The response that starts at ring[start]: one line "a,b=t" per number b added after a (the pair as the
    question writes it, so that the next number is found by matching the last one: a model learns that copy
    far sooner than one that has to recall a number from lines back), t the running total, up to a dead end
    "a,b: stuck" or round to the total."""
    lines, total = [], ring[start]
    for i in range(1, len(ring)):
        before, value = ring[(start + i - 1) % len(ring)], ring[(start + i) % len(ring)]
        if total + value < 0:
            return data.THINK + "\n".join(lines + [f"{before},{value}: stuck"]) + f"\n</think>\n{RING_STUCK}"
        total += value
        lines.append(f"{before},{value}={total}")
    return data.THINK + "\n".join(lines) + f"\n</think>\n\\boxed{{{total}}}"


def make_ring_task(n: int, seed: int, style: str, expert_fails: float | None = None, n_terms: int = 6) -> list[dict]:
    """n rows in the authors' schema. A ring: n_terms - 1 numbers in 1..9 and one negative number -m, never
    first, m >= 2 and below the others' sum (so every ring can be gone round). The n_terms magnitudes are distinct
    digits: each number is one token (its sign aside), and the number after it in the question is unambiguous.
    style "pretrain": the response starts at a random positive number;
    "expert": starts at the first number, on rings where that works (expert_fails must be 0 or None);
    "prompt": no response (test and RL rows).
    expert_fails: the share of rows whose expert start is a dead end (None: as the rings fall, about 1 in 4).
    The rows of one (n, seed, expert_fails, n_terms) are the same questions in every style."""
    if style not in ("pretrain", "expert", "prompt"):
        raise ValueError(f"style {style!r}: expected 'pretrain', 'expert' or 'prompt'")
    if style == "expert" and expert_fails:
        raise ValueError(f"expert_fails {expert_fails}: expert rows are rings where the expert's start works")
    if not 3 <= n_terms <= 8:
        raise ValueError(f"n_terms {n_terms}: expected 3..8 (the numbers are distinct digits, the negative one >= 2)")
    if expert_fails is not None and not 0 <= expert_fails <= 1:
        raise ValueError(f"expert_fails {expert_fails}: expected a share in [0, 1]")
    if style == "expert":
        expert_fails = 0.0
    rng, answer_rng = random.Random(seed), random.Random(seed + 1_000_003)  # responses do not shift the questions
    n_fails = None if expert_fails is None else round(expert_fails * n)
    rings, fails = [], 0
    while len(rings) < n:
        positive = rng.sample(range(1, 10), n_terms - 1)
        negatives = [m for m in range(2, min(10, sum(positive))) if m not in positive]
        if not negatives:
            continue
        m = rng.choice(negatives)
        at = rng.randint(1, n_terms - 1)
        ring = positive[:at] + [-m] + positive[at:]
        fail = not go_round(ring, 0)[1]
        if n_fails is not None and (fails == n_fails if fail else len(rings) - fails == n - n_fails):
            continue  # this kind is full
        rings.append(ring)
        fails += fail
    rows = []
    for ring in rings:
        rows.append({"data_source": EXPERT_WORKS if go_round(ring, 0)[1] else EXPERT_FAILS,
                     "prompt": [{"role": "system", "content": RING_SYSTEM},
                                {"role": "user", "content": ring_question(ring)}],
                     "reward_model": {"ground_truth": str(sum(ring)), "style": "rule"}})
        if style == "expert":
            response = ring_response(ring, 0)
        elif style == "pretrain":
            response = ring_response(ring, answer_rng.choice([i for i, v in enumerate(ring) if v > 0]))
        if style != "prompt":
            rows[-1]["target"] = [{"role": "assistant", "content": response}]
    return rows


# What a sampled response did: its start (the expert's, i.e. the first number, or another positive number) and
# whether it went round or stopped at a dead end, both written correctly; or it added every number once with the
# right running totals, never below 0, but not in the ring's order: the right total by a route the ring rule
# forbids, which only the final answer is graded on (no process reward) and no data showed; anything else is a
# "mistake" (a wrong running total or next number, a dead end written where the round could go on or the reverse,
# a number skipped or added twice, a malformed line).
RING_KINDS = ("expert start, round", "expert start, stuck", "other start, round", "other start, stuck",
              "out of ring order", "mistake")
_LINE = re.compile(r"(-?\d),(-?\d)(?:=(\d+)|: stuck)")


def ring_solution_kind(question: str, response: str) -> str:
    """One of RING_KINDS for a sampled response to a ring question. The reasoning up to the last "</think>" is
    checked line by line against the right round from the start it chose (its first number); the text after it
    is evaluate's to grade (a model could box a number after a dead end; the grader decides)."""
    ring = parse_ring(question)
    reasoning, closed, _ = response.rpartition("</think>")
    lines = reasoning.removeprefix(data.THINK).strip().split("\n")
    first = lines[0].partition(",")[0]
    if not closed or first not in {str(v) for v in ring if v > 0}:
        return "mistake"
    start = ring.index(int(first))
    if lines == ring_response(ring, start).removeprefix(data.THINK).partition("\n</think>")[0].split("\n"):
        return f"{'expert' if start == 0 else 'other'} start, {'round' if go_round(ring, start)[1] else 'stuck'}"
    steps = [_LINE.fullmatch(line) for line in lines]
    if not all(steps) or any(m[3] is None for m in steps):
        return "mistake"
    added, totals = [int(steps[0][1])] + [int(m[2]) for m in steps], [int(m[3]) for m in steps]
    chained = all(int(m[1]) == int(prev[2]) for prev, m in zip(steps, steps[1:]))
    sums = [sum(added[: i + 2]) for i in range(len(totals))]
    return "out of ring order" if chained and sorted(added) == sorted(ring) and totals == sums else "mistake"


def _main(argv: list[str] | None = None) -> None:
    """python toy.py --out DIR: the ring task's four splits (.jsonl) and a tokenizer/ for them."""
    p = argparse.ArgumentParser(prog="toy.py", description=_main.__doc__)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--n_pretrain", type=int, default=6000, help="pre-training rows: random starts")
    p.add_argument("--n_sft", type=int, default=1024, help="expert rows: the first number's start, where it works")
    p.add_argument("--n_rl", type=int, default=512, help="GRPO prompts")
    p.add_argument("--n_test", type=int, default=64, help="test questions")
    p.add_argument("--expert_fails", type=float, default=0.5,
                   help="share of the RL and test questions on which the expert's start is a dead end")
    p.add_argument("--n_terms", type=int, default=6, help="numbers per ring (one of them negative)")
    p.add_argument("--vocab_labels", type=int, default=2000,
                   help="pseudo-words made tokens of the tokenizer, never used by the task: the vocabulary's tail")
    p.add_argument("--vocab_size", type=int, default=4096, help="BPE vocabulary size (merges permitting)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    out, shape = Path(a.out), dict(n_terms=a.n_terms)
    # A seed per split: different questions in each, and no split shared between runs with different --seed.
    splits = {"train_pretrain": make_ring_task(a.n_pretrain, 4 * a.seed, "pretrain", **shape),
              "train_expert": make_ring_task(a.n_sft, 4 * a.seed + 1, "expert", **shape),
              "train_rl": make_ring_task(a.n_rl, 4 * a.seed + 2, "prompt", a.expert_fails, **shape),
              "test": make_ring_task(a.n_test, 4 * a.seed + 3, "prompt", a.expert_fails, **shape)}
    for name, rows in splits.items():
        fails = sum(r["data_source"] == EXPERT_FAILS for r in rows)
        print(f"{data.write_jsonl(rows, out / f'{name}.jsonl')}: {len(rows)} rows, {fails} where the expert's start "
              f"is a dead end")
    texts = toy_tokenizer_texts(splits["train_pretrain"] + splits["train_expert"], a.vocab_labels)
    tokenizer = build_toy_tokenizer(texts, a.vocab_size)
    tokenizer.save_pretrained(out / "tokenizer")
    print(f"{out / 'tokenizer'}: {len(tokenizer)} tokens")


if __name__ == "__main__":
    _main()
