"""A probe beside the demo: an expert that teaches the wrong move at the decisive token. Does any
SFT loss keep the alternative the base model had?

    python demo/decisive_token.py --demo out/demo/seed_0          # demo/run.py runs this (stage 7)
    python demo/decisive_token.py --demo out/demo/seed_0 --grpo   # then GRPO from each
    python demo/decisive_token.py --demo out/demo_seeds/seed_* --grpo   # over several seeds

The demo's expert adds the numbers in the question's order and is shown only where that works. Its
rows agree with the rule that avoids every dead end (it never adds the negative number on a small
total), so no SFT loss collapses the move that matters there. This expert ignores the floor instead:
it adds the first two positive numbers (three on the small demo's toy, whose numbers 1-4 give two
too small a total), then the negative one, then the rest, and it is shown only where that got
through. On a test question where it does not, the decisive token follows those positive numbers:
"-" (the negative now, a dead end) or "+" (put it off). The probe trains each SFT
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


def positives_then_negative(numbers: list[int], before: int = 2) -> list[int]:
    """This expert's order: the first `before` positive numbers (in the question's order), the
    negative, the rest."""
    positive = [v for v in numbers if v > 0]
    return positive[:before] + [v for v in numbers if v < 0] + positive[before:]


def expert_rows(n: int, seed: int, exclude: frozenset[str], before: int = 2,
                positives: int = len(toy.POSITIVE)) -> list[dict]:
    """n rows whose response adds in positives_then_negative's order, drawn from questions (of
    toy.make_floor_task's `positives`) where it gets through."""
    rows = []
    for row in toy.make_floor_task(4 * n, 10_007 + seed, "prompt", exclude=exclude,
                                   positives=positives):
        order = positives_then_negative(toy.parse_floor(row["prompt"][1]["content"]), before)
        if toy.add_in_order(order)[1]:
            rows.append({**row, "target": [{"role": "assistant",
                                            "content": toy.floor_response(order)}]})
    if len(rows) < n:
        raise SystemExit(f"only {len(rows)} questions where the expert gets through: ask for fewer "
                         f"than {n} rows")
    return rows[:n]


def p_put_off(ckpt: Path, questions: list[str], before: int = 2) -> float:
    """The mean probability of "+" after this expert's lines up to its dead end, on `questions` (all
    dead ends)."""
    tok, next_token_logits = demo.load_for_scoring(ckpt)
    texts = []
    for question in questions:
        lines = toy.floor_response(positives_then_negative(toy.parse_floor(question), before))
        # the positive numbers' lines
        shown = "\n".join(lines.removeprefix(data.THINK).split("\n")[:before]) + "\n"
        texts.append(data.build_prompt(question, tok, toy.FLOOR_SYSTEM) + shown)
    return next_token_logits(texts).softmax(-1)[:, tok.convert_tokens_to_ids("+")].mean().item()


def sft_curves(a, seed: int, size: str, base: Path, train_file: Path, dead_ends: list[str],
               out: Path, before: int) -> dict:
    """Each loss's SFT from the base on this expert's rows, and P("+") at every checkpoint:
    {loss: {step: p}}."""
    p_base = p_put_off(base, dead_ends, before)
    curves = {}
    for loss in a.losses:
        run = out / "runs" / loss
        if run_dir.completed(run) is None:       # not run, or interrupted: the stage resumes it
            demo.run_stage([demo.PY, "sft.py", "config/sft_tiny.py", "--model", base,
                            "--train_file", train_file, "--loss", loss, "--out_dir", run,
                            "--system_prompt", "row", "--seed", str(seed),
                            *demo.SIZES[size]["sft"], "--max_steps", str(a.steps), "--save_every",
                            str(a.save_every)], out / "logs", loss, a.steps)
        curves[loss] = {0: p_base}
        for step, ckpt in demo.saved_steps(run, a.save_every):
            curves[loss][step] = p_put_off(ckpt, dead_ends, before)
    return curves


def grpo_from(a, seed: int, size: str, starts: dict[str, tuple[Path, float]], rl_file: Path,
              dead_ends: list[str], out: Path, before: int) -> dict:
    """The demo's GRPO from each of starts ({name: (model, its P("+"))}): P("+") before and after,
    and demo.grpo_metrics of the run."""
    results, rl_flags = {}, demo.SIZES[size]["rl"]
    for name, (model, p_before) in starts.items():
        run = out / "runs" / f"{name}+grpo"
        if run_dir.completed(run) is None:       # not run, or interrupted: the stage resumes it
            demo.run_stage([demo.PY, "rl.py", "config/rl_tiny.py", "--model", model, "--train_file",
                            rl_file, "--out_dir", run, "--save_every", "0", "--grader_workers", "1",
                            "--system_prompt", "row", "--seed", str(seed), *rl_flags],
                           out / "logs", f"{name}+grpo", demo.flag(rl_flags, "--steps", 20),
                           threads=2)
        results[name] = {"p_before": p_before,
                         "p_after": p_put_off(checkpoints.latest(run), dead_ends, before),
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
    size = a.size or demo.recorded_settings(demo_dir).get("size", "full")    # (older demos: full)
    positives = demo.flag(demo.SIZES[size]["data"], "--positives", len(toy.POSITIVE))
    before = 3 if positives == 4 else 2        # 1-4: two positive numbers never reach 7 but 3 + 4
    test = [json.loads(line)["prompt"][1]["content"]
            for line in (world / "test.jsonl").read_text().splitlines()]
    dead_ends = [q for q in test
                 if not toy.add_in_order(positives_then_negative(toy.parse_floor(q), before))[1]]
    if not dead_ends:
        raise SystemExit(f"{world / 'test.jsonl'}: this expert gets through on every test "
                         "question: nothing to probe")
    train_file = data.write_jsonl(expert_rows(a.n_rows, seed, frozenset(test), before, positives),
                                  out / "train_expert.jsonl")
    print(f"{train_file}: {a.n_rows} rows; this expert adds {before} positive numbers before the "
          f"negative one and hits a dead end on {len(dead_ends)} of {len(test)} test questions "
          f"(seed {seed}, size {size})", flush=True)
    curves = sft_curves(a, seed, size, base, train_file, dead_ends, out, before)
    results = {"seed": seed, "questions": len(dead_ends), "before": before, "p_put_off": curves}
    if a.grpo:
        rl_file = data.write_jsonl(toy.make_floor_task(512, 20_011 + seed, "prompt",
                                                       exclude=frozenset(test),
                                                       positives=positives),
                                   out / "train_rl.jsonl")
        starts = {"base": (base, curves[a.losses[0]][0])}
        for loss in a.losses:
            starts[loss] = (checkpoints.latest(out / "runs" / loss),
                            curves[loss][max(curves[loss])])
        results["grpo"] = grpo_from(a, seed, size, starts, rl_file, dead_ends, out, before)
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
    ap.add_argument("--size", choices=sorted(demo.SIZES),
                    help="the demo's --size, for its SFT flags (default: the one each demo "
                         "recorded)")
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
