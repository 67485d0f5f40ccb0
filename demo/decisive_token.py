"""A probe beside the demo: an expert that teaches the wrong move at the decisive token. Does any SFT loss keep the
alternative the base model had?

    python demo/decisive_token.py --demo out/demo      # after bash run.sh; about 30 s on 2 cores

The demo's expert adds the numbers in the question's order and is shown only where that works. Its rows agree with
the rule that avoids every dead end (it never adds the negative number on a small total), so no SFT loss collapses
the move that matters there. This expert ignores the floor instead: it adds the first two positive numbers, then the
negative one, then the rest, and it is shown only where that got through. On a test question where it does not, the
decisive token follows the two positive numbers: "-" (the negative now, a dead end) or "+" (put it off). The probe
trains each SFT loss from the demo's base on such rows with the demo's SFT flags, a checkpoint every few steps, and
prints P("+") at that token, averaged over those test questions, step by step.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import data  # noqa: E402
from demo import run as demo  # noqa: E402
from demo import toy  # noqa: E402
from plumbing import checkpoints  # noqa: E402


def first_two_then_negative(numbers: list[int]) -> list[int]:
    """This expert's order: the first two positive numbers (in the question's order), the negative, the rest."""
    positive = [v for v in numbers if v > 0]
    return positive[:2] + [v for v in numbers if v < 0] + positive[2:]


def expert_rows(n: int, seed: int, exclude: frozenset[str]) -> list[dict]:
    """n rows whose response adds in first_two_then_negative's order, drawn from questions where it gets through."""
    rows = []
    for row in toy.make_floor_task(4 * n, 10_007 + seed, "prompt", exclude=exclude):
        order = first_two_then_negative(toy.parse_floor(row["prompt"][1]["content"]))
        if toy.add_in_order(order)[1]:
            rows.append({**row, "target": [{"role": "assistant", "content": toy.floor_response(order)}]})
    if len(rows) < n:
        raise SystemExit(f"only {len(rows)} questions where the expert gets through: ask for fewer than {n} rows")
    return rows[:n]


def p_put_off(ckpt: Path, questions: list[str]) -> float:
    """The mean probability of "+" after this expert's lines up to its dead end, on `questions` (all dead ends)."""
    tok, next_token_logits = demo.load_for_scoring(ckpt)
    texts = []
    for question in questions:
        lines = toy.floor_response(first_two_then_negative(toy.parse_floor(question)))
        before = "\n".join(lines.removeprefix(data.THINK).split("\n")[:2]) + "\n"   # the two positive numbers
        texts.append(data.build_prompt(question, tok, toy.FLOOR_SYSTEM) + before)
    return next_token_logits(texts).softmax(-1)[:, tok.convert_tokens_to_ids("+")].mean().item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demo", required=True, help="a finished demo's --out: its world/ and its base model")
    ap.add_argument("--out", help="the probe's rows, runs and results.json (default: DEMO/decisive_token)")
    ap.add_argument("--size", choices=sorted(demo.SIZES), default="full", help="the demo's --size: its SFT flags")
    ap.add_argument("--losses", nargs="+", default=list(demo.SFT_LOSSES))
    ap.add_argument("--n_rows", type=int, default=1024, help="expert rows (the demo's 1024)")
    ap.add_argument("--steps", type=int, default=32, help="SFT steps per loss")
    ap.add_argument("--save_every", type=int, default=4, help="a checkpoint, so a point of the curve, every N steps")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    world, out = Path(a.demo) / "world", Path(a.out or Path(a.demo) / "decisive_token")
    base = checkpoints.latest(Path(a.demo) / "runs" / "base")
    if base is None or not (world / "test.jsonl").exists():
        raise SystemExit(f"{a.demo}: no finished demo there (world/test.jsonl and runs/base/): run demo/run.py first")
    test = [json.loads(line)["prompt"][1]["content"] for line in (world / "test.jsonl").read_text().splitlines()]
    dead_ends = [q for q in test if not toy.add_in_order(first_two_then_negative(toy.parse_floor(q)))[1]]
    if not dead_ends:
        raise SystemExit(f"{world / 'test.jsonl'}: this expert gets through on every test question: nothing to probe")
    train_file = data.write_jsonl(expert_rows(a.n_rows, a.seed, frozenset(test)), out / "train_expert.jsonl")
    print(f"{train_file}: {a.n_rows} rows; this expert hits a dead end on {len(dead_ends)} of {len(test)} test "
          "questions", flush=True)

    curves = {}
    for loss in a.losses:
        run = out / "runs" / loss
        if checkpoints.latest(run) is None:
            demo.run_stage([demo.PY, "sft.py", "config/sft_tiny.py", "--model", base, "--train_file", train_file,
                            "--loss", loss, "--out_dir", run, "--system_prompt", "row", "--seed", str(a.seed),
                            *demo.SIZES[a.size]["sft"], "--max_steps", str(a.steps), "--save_every",
                            str(a.save_every)], out / "logs" / f"{loss}.log", a.steps, loss)
        curves[loss] = {0: p_put_off(base, dead_ends)}
        for ckpt in checkpoints.complete(run):
            curves[loss][json.loads((ckpt / "state.json").read_text())["step"]] = p_put_off(ckpt, dead_ends)
    steps = sorted(curves[a.losses[0]])
    lines = [f'P("+", put the negative off) at the decisive token, mean over {len(dead_ends)} test questions:', "",
             "| SFT step | " + " | ".join(a.losses) + " |", "| --- |" + " --- |" * len(a.losses)]
    lines += [f"| {step} | " + " | ".join(f"{curves[loss][step]:.3f}" for loss in a.losses) + " |" for step in steps]
    (out / "results.json").write_text(json.dumps({"questions": len(dead_ends), "p_put_off": curves}, indent=1) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
