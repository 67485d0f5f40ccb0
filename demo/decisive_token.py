"""A probe beside the demo: an expert that teaches the wrong move at the decisive token. Does any
SFT loss keep the alternative the base model had?

    python demo/decisive_token.py --demo out/demo         # bash run.sh's last step: 40 s on 2 cores
    python demo/decisive_token.py --demo out/demo --grpo  # then GRPO from each: about 3 minutes
    python demo/decisive_token.py --demo out/demo_seeds/seed_* --grpo   # after demo/run.py --seeds

The demo's expert adds the numbers in the question's order and is shown only where that works. Its
rows agree with the rule that avoids every dead end (it never adds the negative number on a small
total), so no SFT loss collapses the move that matters there. This expert ignores the floor instead:
it adds the first two positive numbers, then the negative one, then the rest, and it is shown only
where that got through. On a test question where it does not, the decisive token follows the two
positive numbers: "-" (the negative now, a dead end) or "+" (put it off). The probe trains each SFT
loss from the demo's base on such rows with the demo's SFT flags, a checkpoint every few steps, and
prints P("+") at that token, averaged over those test questions, step by step. With --grpo it then
runs the demo's GRPO from the base and from each loss's last checkpoint, and prints P("+") after it
and the share of GRPO groups with mixed rewards: can RL find the move that SFT left, or took away?
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import data  # noqa: E402
from demo import run as demo  # noqa: E402
from demo import toy  # noqa: E402
from plumbing import checkpoints, run_dir  # noqa: E402


def first_two_then_negative(numbers: list[int]) -> list[int]:
    """This expert's order: the first two positive numbers (in the question's order), the negative,
    the rest."""
    positive = [v for v in numbers if v > 0]
    return positive[:2] + [v for v in numbers if v < 0] + positive[2:]


def expert_rows(n: int, seed: int, exclude: frozenset[str]) -> list[dict]:
    """n rows whose response adds in first_two_then_negative's order, drawn from questions where it
    gets through."""
    rows = []
    for row in toy.make_floor_task(4 * n, 10_007 + seed, "prompt", exclude=exclude):
        order = first_two_then_negative(toy.parse_floor(row["prompt"][1]["content"]))
        if toy.add_in_order(order)[1]:
            rows.append({**row, "target": [{"role": "assistant",
                                            "content": toy.floor_response(order)}]})
    if len(rows) < n:
        raise SystemExit(f"only {len(rows)} questions where the expert gets through: ask for fewer "
                         f"than {n} rows")
    return rows[:n]


def p_put_off(ckpt: Path, questions: list[str]) -> float:
    """The mean probability of "+" after this expert's lines up to its dead end, on `questions` (all
    dead ends)."""
    tok, next_token_logits = demo.load_for_scoring(ckpt)
    texts = []
    for question in questions:
        lines = toy.floor_response(first_two_then_negative(toy.parse_floor(question)))
        # the two positive numbers
        before = "\n".join(lines.removeprefix(data.THINK).split("\n")[:2]) + "\n"
        texts.append(data.build_prompt(question, tok, toy.FLOOR_SYSTEM) + before)
    return next_token_logits(texts).softmax(-1)[:, tok.convert_tokens_to_ids("+")].mean().item()


def sft_curves(a, seed: int, base: Path, train_file: Path, dead_ends: list[str], out: Path) -> dict:
    """Each loss's SFT from the base on this expert's rows, and P("+") at every checkpoint:
    {loss: {step: p}}."""
    p_base = p_put_off(base, dead_ends)
    curves = {}
    for loss in a.losses:
        run = out / "runs" / loss
        if run_dir.completed(run) is None:       # not run, or interrupted: the stage resumes it
            demo.run_stage([demo.PY, "sft.py", "config/sft_tiny.py", "--model", base,
                            "--train_file", train_file, "--loss", loss, "--out_dir", run,
                            "--system_prompt", "row", "--seed", str(seed),
                            *demo.SIZES[a.size]["sft"], "--max_steps", str(a.steps), "--save_every",
                            str(a.save_every)], out / "logs", loss, a.steps)
        curves[loss] = {0: p_base}
        for step, ckpt in demo.saved_steps(run, a.save_every):
            curves[loss][step] = p_put_off(ckpt, dead_ends)
    return curves


def grpo_from(a, seed: int, starts: dict[str, tuple[Path, float]], rl_file: Path,
              dead_ends: list[str], out: Path) -> dict:
    """The demo's GRPO from each of starts ({name: (model, its P("+"))}): P("+") before and after,
    and demo.grpo_metrics of the run."""
    results, rl_flags = {}, demo.SIZES[a.size]["rl"]
    for name, (model, p_before) in starts.items():
        run = out / "runs" / f"{name}+grpo"
        if run_dir.completed(run) is None:       # not run, or interrupted: the stage resumes it
            demo.run_stage([demo.PY, "rl.py", "config/rl_tiny.py", "--model", model, "--train_file",
                            rl_file, "--out_dir", run, "--save_every", "0", "--grader_workers", "1",
                            "--system_prompt", "row", "--seed", str(seed), *rl_flags],
                           out / "logs", f"{name}+grpo", demo.flag(rl_flags, "--steps", 20),
                           threads=2)
        results[name] = {"p_before": p_before,
                         "p_after": p_put_off(checkpoints.latest(run), dead_ends),
                         **demo.grpo_metrics(run)}
    return results


def probe(a, demo_dir: Path) -> dict:
    """Every step for one finished demo (its world, base and seed) into
    DEMO/decisive_token/results.json."""
    world, out = demo_dir / "world", demo_dir / "decisive_token"
    base = checkpoints.latest(demo_dir / "runs" / "base")
    if base is None or not (world / "test.jsonl").exists() or not (demo_dir / "seed").exists():
        raise SystemExit(f"{demo_dir}: no finished demo there (seed, world/test.jsonl, "
                         "runs/base/): run demo/run.py")
    seed = int((demo_dir / "seed").read_text())
    test = [json.loads(line)["prompt"][1]["content"]
            for line in (world / "test.jsonl").read_text().splitlines()]
    dead_ends = [q for q in test
                 if not toy.add_in_order(first_two_then_negative(toy.parse_floor(q)))[1]]
    if not dead_ends:
        raise SystemExit(f"{world / 'test.jsonl'}: this expert gets through on every test "
                         "question: nothing to probe")
    train_file = data.write_jsonl(expert_rows(a.n_rows, seed, frozenset(test)),
                                  out / "train_expert.jsonl")
    print(f"{train_file}: {a.n_rows} rows; this expert hits a dead end on {len(dead_ends)} of "
          f"{len(test)} test questions (seed {seed})", flush=True)
    curves = sft_curves(a, seed, base, train_file, dead_ends, out)
    results = {"seed": seed, "questions": len(dead_ends), "p_put_off": curves}
    if a.grpo:
        rl_file = data.write_jsonl(toy.make_floor_task(512, 20_011 + seed, "prompt",
                                                       exclude=frozenset(test)),
                                   out / "train_rl.jsonl")
        starts = {"base": (base, curves[a.losses[0]][0])}
        for loss in a.losses:
            starts[loss] = (checkpoints.latest(out / "runs" / loss),
                            curves[loss][max(curves[loss])])
        results["grpo"] = grpo_from(a, seed, starts, rl_file, dead_ends, out)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return results


def table(results: list[dict]) -> str:
    """The curves and the GRPO rows: one demo's values, or the mean (min-max) over several
    (demo.cell)."""
    losses = list(results[0]["p_put_off"])
    lines = ['P("+", put the negative off) at the decisive token, the mean over the test '
             "questions where this expert hits a dead end; seeds "
             f"{', '.join(str(r['seed']) for r in results)}:", "",
             "| SFT step | " + " | ".join(losses) + " |", "| --- |" + " --- |" * len(losses)]
    for step in results[0]["p_put_off"][losses[0]]:
        cells = [demo.cell([r["p_put_off"][loss][step] for r in results], "{:.3f}")
                 for loss in losses]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    if "grpo" in results[0]:
        lines += ["", 'GRPO from each: P("+") before and after, and its groups with mixed rewards '
                      "(the only ones with a gradient):", "",
                  '| GRPO from | P("+") before | after | mixed-reward groups | reward, first '
                  "quarter | last quarter |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for name in results[0]["grpo"]:
            runs = [r["grpo"][name] for r in results]
            cells = [demo.cell([run[key] for run in runs], fmt) for key, fmt in (
                ("p_before", "{:.3f}"), ("p_after", "{:.3f}"), ("mixed", "{:.1%}"),
                ("reward_first", "{:.1%}"), ("reward_last", "{:.1%}"))]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demo", required=True, nargs="+", type=Path,
                    help="finished demos' --out (with --seeds: OUT/seed_S): each one's world, base "
                         "model and seed")
    ap.add_argument("--size", choices=sorted(demo.SIZES), default="full",
                    help="the demo's --size: its SFT flags")
    ap.add_argument("--losses", nargs="+", default=list(demo.SFT_LOSSES))
    ap.add_argument("--n_rows", type=int, default=1024, help="expert rows (the demo's 1024)")
    ap.add_argument("--steps", type=int, default=32, help="SFT steps per loss")
    ap.add_argument("--save_every", type=int, default=4,
                    help="a checkpoint, so a point of the curve, every N steps")
    ap.add_argument("--grpo", action="store_true",
                    help="then GRPO from the base and each loss's last checkpoint")
    a = ap.parse_args()
    print(table([probe(a, demo_dir) for demo_dir in a.demo]), flush=True)


if __name__ == "__main__":
    main()
