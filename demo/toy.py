"""The CPU demo's toy world: a task where exploration has value, and a small Qwen2-style tokenizer.

    python demo/toy.py --out out/demo/world --seed 0   # the four data splits (.jsonl), tokenizer/

The floor task. "Add: 2,-5,6,3,7" asks for the total of the numbers, added one at a time in any
order the solver likes, and the running total may never go below 0 (the floor):

    <think>                         <think>
    6                               2
    +2=8                            -5: stuck
    -5=3                            </think>
    +3=6                            Stuck.
    +7=13
    </think>
    \\boxed{13}

Which number comes next is a branching token at every line (the first: any of the four positive
numbers, ln 4 = 1.39 nats when all are equally likely, above Eq. 7's 1.2-nat pivot); the running
totals are factual tokens. Every order that gets through gives the same total, so the final answer
alone decides correctness (as in the paper: a response whose lines go wrong but box the right total
is graded right, and the demo counts those), but an order that adds the negative number while the
total is below its size is a dead end. Adding it last always gets through (it is smaller than the
positive numbers' sum): the question holds what a solver needs to choose well.
- Pre-training rows add the numbers in a random order (a positive one first), dead ends included:
  the base model knows every order but not which ones work.
- Expert (SFT) rows always add in the question's order, and only on questions where that works: the
  expert is right on every example it shows.
- Test and RL rows: a stated share of the questions (half by default) is one where the question's
  order is a dead end. Their data_source says which kind a question is, so evaluate.py reports avg@n
  and pass@k for each kind.
Why not a lookup task (a route, a ring gone round from a chosen start): each step there copies from
the question the number after the last one, which needs an induction head, and a 1M-parameter model
pre-trained for 4 minutes on 2 cores grew one on some seeds and not on others. Choosing any number
not yet added needs no such circuit.
"""
import argparse
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root
import data  # noqa: E402
from plumbing.synthetic import build_toy_tokenizer  # noqa: E402

_CONSONANTS, _VOWELS = "bdfgklmnprstvz", "aeiou"
# 14 x 5 = 70 syllables; two-syllable pseudo-words give 4900 words that the task never uses. The
# tokenizer learns them, so the toy's vocabulary has thousands of entries the model learns to rule
# out: a real LM's rare tail.
TOY_LABELS = [a + b + c + d for a in _CONSONANTS for b in _VOWELS for c in _CONSONANTS
              for d in _VOWELS]


def toy_tokenizer_texts(rows: list[dict], n_labels: int = 2000,
                        label_repeats: int = 8) -> list[str]:
    """Texts to train the toy tokenizer on: every question under both system prompts (Table 7's and
    the row's), every response, and n_labels pseudo-words `label_repeats` times each (each becomes a
    token of the tail)."""
    texts = [data.build_prompt(r["prompt"][-1]["content"], system=s)
             for r in rows for s in (data.SYSTEM_PROMPT, r["prompt"][0]["content"])]
    texts += [r["target"][0]["content"] for r in rows]
    return texts + [" ".join(f"{a} 1," for a in TOY_LABELS[:n_labels])] * label_repeats


# ------------------------------------------------------------------------------------------------
# The floor task
# ------------------------------------------------------------------------------------------------
FLOOR_SYSTEM = "Add every number once, in any order, never going below 0."
FLOOR_STUCK = "Stuck."  # the answer of a dead end: no number, so the grader scores it 0
# The data_source of a test or RL row: whether the expert's order (the question's) gets through.
# evaluate.py reports each as a benchmark; with equal counts, its mean over benchmarks is the mean
# over questions.
EXPERT_WORKS, EXPERT_FAILS = "floor_expert_works", "floor_expert_fails"
# The positive numbers and the negative one's size come from disjoint digits, so a number's digit
# alone says its sign. Read from the question, a sign is the token before the digit, and a model
# that must look back one token to tell +3 from -3 needs two attention layers composed (as an
# induction head does); pre-trained for 4 minutes, the 1M-parameter base learnt which numbers a
# question holds but not their signs (91% of its samples were mistakes).
POSITIVE, NEGATIVE = range(1, 7), range(7, 10)


def floor_question(numbers: list[int]) -> str:
    """"Add: 2,-5,6,3,7". No spaces: 4 tokens fewer in every prompt."""
    return "Add: " + ",".join(map(str, numbers))


def parse_floor(question: str) -> list[int]:
    """The numbers of a floor question."""
    m = re.fullmatch(r"Add: (-?\d+(?:,-?\d+)+)", question)
    if not m:
        raise ValueError(f"not a floor question: {question!r}")
    return [int(v) for v in m.group(1).split(",")]


def add_in_order(order: list[int]) -> tuple[list[int], bool]:
    """The running totals of adding `order` from 0, and whether every number was added: it stops
    before the first number that would take the total below 0 (a dead end)."""
    totals = []
    for v in order:
        total = (totals[-1] if totals else 0) + v
        if total < 0:
            return totals, False
        totals.append(total)
    return totals, True


def floor_response(order: list[int]) -> str:
    """The response that adds `order`: the first number alone, then "+v=t" per number v (t the
    running total), up to a dead end "v: stuck" or through to the total."""
    lines, total = [], 0
    for i, v in enumerate(order):
        if total + v < 0:
            return data.THINK + "\n".join(lines + [f"{v}: stuck"]) + f"\n</think>\n{FLOOR_STUCK}"
        total += v
        lines.append(str(v) if i == 0 else f"{v:+d}={total}")
    return data.THINK + "\n".join(lines) + f"\n</think>\n\\boxed{{{total}}}"


def make_floor_task(n: int, seed: int, style: str, expert_fails: float | None = None,
                    n_terms: int = 5, exclude: frozenset[str] = frozenset(),
                    positives: int = len(POSITIVE), distinct: bool = False,
                    question_order: float = 0.0) -> list[dict]:
    """n rows in the authors' schema. A question: n_terms - 1 distinct numbers from the first
    `positives` of POSITIVE and one negative number -m, m from NEGATIVE, never first and below the
    others' sum (so adding it last always gets through). Each number is one digit token (its sign
    aside) and names one number of the question. With positives = n_terms - 1 every question holds
    the same positive numbers (1-4 at 5 terms), in its own order: a model needs not read which ones
    it holds, only their order and the negative one (the small demo's toy).
    style "pretrain": the numbers in a random order, a positive one first (in the question's order
    for a `question_order` share of the rows);
    "expert": in the question's order, where that gets through (expert_fails must be 0 or None);
    "prompt": no response (test and RL rows).
    expert_fails: the share of rows whose question order is a dead end (None: as questions fall).
    exclude: question texts never drawn (another split's, held out).
    distinct: no question drawn twice (test questions: evaluate.py drops a repeated one; the small
    toy has 288 questions, so 64 draws repeat about ten).
    The rows of one (n, seed, expert_fails, n_terms, exclude, positives) are the same questions in
    every style; expert rows are those of expert_fails=0.0."""
    if style not in ("pretrain", "expert", "prompt"):
        raise ValueError(f"style {style!r}: expected 'pretrain', 'expert' or 'prompt'")
    if style == "expert" and expert_fails:
        raise ValueError(f"expert_fails {expert_fails}: expert rows are questions where the "
                         "expert's order works")
    if not 3 <= n_terms <= len(POSITIVE) + 1:
        raise ValueError(f"n_terms {n_terms}: expected 3..{len(POSITIVE) + 1} (distinct positive "
                         f"digits from {POSITIVE.start} to {POSITIVE.stop - 1}, and one negative "
                         "number)")
    if not n_terms - 1 <= positives <= len(POSITIVE):
        raise ValueError(f"positives {positives}: expected {n_terms - 1}..{len(POSITIVE)} (the "
                         f"{n_terms - 1} positive numbers of a question are distinct)")
    pool = POSITIVE[:positives]
    if expert_fails is not None and not 0 <= expert_fails <= 1:
        raise ValueError(f"expert_fails {expert_fails}: expected a share in [0, 1]")
    if style == "expert":
        expert_fails = 0.0
    # responses do not shift the questions
    rng, answer_rng = random.Random(seed), random.Random(seed + 1_000_003)
    n_fails = None if expert_fails is None else round(expert_fails * n)
    questions, fails, drawn, tries = [], 0, set(exclude), 0
    while len(questions) < n:
        tries += 1
        if tries > 1000 * n:
            raise ValueError(f"{n} questions of {n_terms} numbers (positives up to {positives}): "
                             "too few of each kind left to draw from")
        positive = rng.sample(pool, n_terms - 1)
        negatives = [m for m in NEGATIVE if m < sum(positive)]
        if not negatives:
            continue
        at = rng.randint(1, n_terms - 1)
        numbers = positive[:at] + [-rng.choice(negatives)] + positive[at:]
        if floor_question(numbers) in drawn:
            continue
        fail = not add_in_order(numbers)[1]
        if n_fails is not None and (fails == n_fails if fail
                                    else len(questions) - fails == n - n_fails):
            continue  # this kind is full
        questions.append((numbers, fail))
        fails += fail
        if distinct:
            drawn.add(floor_question(numbers))
    rows = []
    for numbers, fail in questions:
        rows.append({"data_source": EXPERT_FAILS if fail else EXPERT_WORKS,
                     "prompt": [{"role": "system", "content": FLOOR_SYSTEM},
                                {"role": "user", "content": floor_question(numbers)}],
                     "reward_model": {"ground_truth": str(sum(numbers)), "style": "rule"}})
        if style == "expert":
            rows[-1]["target"] = [{"role": "assistant", "content": floor_response(numbers)}]
        elif style == "pretrain":
            if question_order and answer_rng.random() < question_order:
                order = numbers
            else:
                first = answer_rng.choice([v for v in numbers if v > 0])
                rest = [v for v in numbers if v != first]
                answer_rng.shuffle(rest)
                order = [first, *rest]
            rows[-1]["target"] = [{"role": "assistant", "content": floor_response(order)}]
    return rows


# What a sampled response did: added in the question's order (the expert's) or another one, and got
# through or stopped at a dead end, every line written right; anything else is a "mistake" (a wrong
# running total, a number not in the question or added twice, a dead end written where the total
# allows the number or the reverse, a number left out, a malformed line).
FLOOR_KINDS = ("question order, through", "question order, stuck", "other order, through",
               "other order, stuck", "mistake")
_FIRST_LINE, _LINE = re.compile(r"(-?\d)(?:: stuck)?"), re.compile(r"([+-]\d)(?:=\d+|: stuck)")


def floor_solution_kind(question: str, response: str) -> str:
    """One of FLOOR_KINDS for a sampled response to a floor question. The reasoning up to the last
    "</think>" is checked line by line against the right lines for the order it chose; the text
    after it is evaluate's to grade (a model could box a number after a dead end; the grader
    decides)."""
    numbers = parse_floor(question)
    reasoning, closed, _ = response.rpartition("</think>")
    lines = reasoning.removeprefix(data.THINK).strip().split("\n")
    steps = [(_LINE if i else _FIRST_LINE).fullmatch(line) for i, line in enumerate(lines)]
    if not closed or not all(steps):
        return "mistake"
    chosen, left = [int(m[1]) for m in steps], list(numbers)
    for v in chosen:
        if v not in left:
            return "mistake"
        left.remove(v)
    # the numbers not reached, in any order: the lines up to where it ends do not depend on it
    order = chosen + left
    right = floor_response(order).removeprefix(data.THINK).partition("\n</think>")[0].split("\n")
    if lines != right:
        return "mistake"
    return f"{'question' if chosen == numbers[:len(chosen)] else 'other'} order, " \
           f"{'through' if add_in_order(order)[1] else 'stuck'}"


def _main(argv: list[str] | None = None) -> None:
    """python demo/toy.py --out DIR: the floor task's four splits (.jsonl) and a tokenizer/ for
    them."""
    p = argparse.ArgumentParser(prog="demo/toy.py", description=_main.__doc__)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--n_pretrain", type=int, default=6000, help="pre-training rows: random orders")
    p.add_argument("--n_sft", type=int, default=1024,
                   help="expert rows: the question's order, where it works")
    p.add_argument("--n_rl", type=int, default=512, help="GRPO prompts")
    p.add_argument("--n_test", type=int, default=64, help="test questions")
    p.add_argument("--expert_fails", type=float, default=0.5,
                   help="share of the RL and test questions on which the question's order is a "
                        "dead end")
    p.add_argument("--n_terms", type=int, default=5,
                   help="numbers per question (one of them negative)")
    p.add_argument("--distinct_test", action="store_true",
                   help="no test question drawn twice (the full toy's 4,320 questions seldom repeat: "
                        "seed 0's 64 test questions hold one repeat, which evaluate.py drops)")
    p.add_argument("--question_order", type=float, default=0.0,
                   help="the share of pre-training rows in the question's order (the rest random)")
    p.add_argument("--positives", type=int, default=len(POSITIVE),
                   help="the positive numbers are drawn from 1..POSITIVES; at n_terms - 1 every "
                        "question holds all of them, in its own order")
    p.add_argument("--vocab_labels", type=int, default=2000,
                   help="pseudo-words made tokens of the tokenizer, never used by the task: the "
                        "vocabulary's tail")
    p.add_argument("--vocab_size", type=int, default=4096,
                   help="BPE vocabulary size (merges permitting)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    out, shape = Path(a.out), dict(n_terms=a.n_terms, positives=a.positives)
    # A seed per split, and no split shared between runs with different --seed. The task has only a
    # few thousand questions (4,320 at 5 numbers; 288 with --positives 4), so the training splits
    # draw around the test questions: held out.
    test = make_floor_task(a.n_test, 4 * a.seed + 3, "prompt", a.expert_fails, **shape,
                           distinct=a.distinct_test)
    shape["exclude"] = frozenset(r["prompt"][1]["content"] for r in test)
    splits = {"train_pretrain": make_floor_task(a.n_pretrain, 4 * a.seed, "pretrain", **shape,
                                                question_order=a.question_order),
              "train_expert": make_floor_task(a.n_sft, 4 * a.seed + 1, "expert", **shape),
              "train_rl": make_floor_task(a.n_rl, 4 * a.seed + 2, "prompt", a.expert_fails,
                                          **shape), "test": test}
    for name, rows in splits.items():
        fails = sum(r["data_source"] == EXPERT_FAILS for r in rows)
        print(f"{data.write_jsonl(rows, out / f'{name}.jsonl')}: {len(rows)} rows, {fails} where "
              "the question's order is a dead end")
    texts = toy_tokenizer_texts(splits["train_pretrain"] + splits["train_expert"], a.vocab_labels)
    tokenizer = build_toy_tokenizer(texts, a.vocab_size)
    tokenizer.save_pretrained(out / "tokenizer")
    print(f"{out / 'tokenizer'}: {len(tokenizer)} tokens")


if __name__ == "__main__":
    _main()
