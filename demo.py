"""The CPU demo: the whole CurioSFT pipeline on a toy task, one stage command after another.

    python demo.py --size ci   --out out/demo_ci     # every stage, tiny: < 3 minutes on 2 cores (the test)
    python demo.py --size full --out out/demo        # the demo proper

Stages (each is the stage's own command line, printed before it runs, so it can be copied and re-run):
  1. data.py toy     pre-training rows (diverse orders), SFT rows (one canonical order), test rows, a BPE tokenizer
                     with a few thousand tokens; then a tiny Qwen2 config beside it (the "model directory")
  2. sft.py --scratch --loss sft on the diverse rows: "pre-training" the base model from random weights
  3. sft.py --loss sft, curio and entropy from the base, on the canonical rows
  4. evaluate.py     accuracy, pass@k, sampling entropy, and the expert-token entropy (--sft_data) of each model
  5. rl.py           GRPO from the SFT and the CurioSFT checkpoints, then evaluate.py again
  6. summary tables (also written to summary.md): the metrics, how the samples add (expert order, another valid
     order, or a mistake), and entropy during SFT
A stage whose output already exists is skipped, so an interrupted demo continues where it stopped.
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import checkpoints
import data

ROOT = Path(__file__).resolve().parent
PY = sys.executable

# Everything that differs between the CI smoke run and the demo proper. Full sizes: 6 epochs of 6000 diverse
# solutions give a base model that adds the question's numbers in many orders and mostly right (a wrong operand in
# 2-18% of its samples over seeds 0-2; after 3 epochs 72%, after 5 18.5% for seed 0, so the "branching" entropy was
# largely mistakes), and 5 epochs of SFT at a high learning rate are enough for cross-entropy to collapse the
# order entropy.
SIZES = {
    "ci": dict(
        data=["--n_pretrain", "48", "--n_sft", "16", "--n_test", "4", "--vocab_labels", "200", "--vocab_size", "1024"],
        model=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                   intermediate_size=64),
        pretrain=["--epochs", "1", "--global_batch", "16", "--lr", "3e-3"],
        sft=["--epochs", "1", "--global_batch", "8", "--lr", "1e-3"],
        eval=["--n", "2", "--limit", "4", "--max_new_tokens", "40", "--sft_examples", "8"],
        rl=["--steps", "1", "--prompts_per_step", "2", "--rollouts", "2", "--mini_batch", "2",
            "--max_response_len", "40"],
    ),
    "full": dict(
        data=["--n_pretrain", "6000", "--n_sft", "512", "--n_test", "64", "--k_min", "3", "--k_max", "4",
              "--max_operand", "9"],
        model=dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=384),
        pretrain=["--epochs", "6", "--global_batch", "16", "--lr", "2e-3", "--warmup_steps", "20",
                  "--token_budget", "2048", "--loss_chunk", "2048", "--log_every", "25"],  # one logits chunk: V is small
        # lr: at 2e-3 with 5 warm-up steps the fresh Adam state knocked the base off its minimum (cross-entropy
        # 0.12 -> 0.28-0.35 in 10 steps, entropy up with it) before SFT proper began
        sft=["--epochs", "5", "--global_batch", "16", "--lr", "1e-3", "--warmup_steps", "16", "--token_budget", "2048",
             "--log_every", "4"],
        eval=["--n", "8", "--limit", "64", "--max_new_tokens", "64", "--sft_examples", "128", "--batch_size", "16"],
        # lr: at 1e-4, Adam's normalised steps on the few groups with mixed rewards lowered the reward in 16 steps
        rl=["--steps", "32", "--prompts_per_step", "8", "--rollouts", "8", "--mini_batch", "4", "--micro_batch", "16",
            "--gen_batch_size", "16", "--max_response_len", "64", "--lr", "3e-5"],
    ),
}
SFT_LOSSES = ("sft", "curio", "entropy")  # vanilla cross-entropy, CurioSFT, the entropy-loss baseline (Table 2)
RL_FROM = ("sft", "curio")  # paper Table 3's pair; GRPO from the entropy baseline would add ~80 s
# One process runs at a time and these models are tiny: more than a few threads only add synchronisation.
THREADS = str(min(4, os.cpu_count() or 1))


def run(cmd: list[str], log: Path, every_s: float = 10.0) -> None:
    """Run one stage command from the repository root, echoing it; its output goes to `log` (shown on failure).
    While it runs, a line every `every_s` seconds with the elapsed time and the stage's last log line (sft.py and
    rl.py log their step and ETA), so a long stage is never silent."""
    print("$ " + " ".join(str(c) for c in cmd), flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": THREADS, "MKL_NUM_THREADS": THREADS, "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.time()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        proc = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
        while True:
            try:
                proc.wait(timeout=every_s)
                break
            except subprocess.TimeoutExpired:
                lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
                last = lines[-1].strip()[:100] if lines else ""
                print(f"  {time.time() - t0:4.0f}s  {last}", flush=True)
    if proc.returncode != 0:
        sys.stdout.write(log.read_text()[-4000:])
        raise SystemExit(f"stage failed (exit {proc.returncode}): see {log}")
    print(f"  done in {time.time() - t0:.0f}s (log: {log})", flush=True)


def last_checkpoint(run_dir: Path) -> Path:
    ckpt = checkpoints.latest(run_dir)
    if ckpt is None:
        raise SystemExit(f"{run_dir}: no checkpoint")
    return ckpt


def make_model_dir(world: Path, model_kwargs: dict) -> Path:
    """The tokenizer and a tiny Qwen2 config.json in one HF directory: what sft.py --scratch initialises from."""
    import transformers

    model_dir = world / "model"
    tok = transformers.AutoTokenizer.from_pretrained(world / "tokenizer")
    cfg = transformers.Qwen2Config(vocab_size=len(tok), max_position_embeddings=1024, tie_word_embeddings=True,
                                   eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **model_kwargs)
    cfg.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    n_params = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(cfg).parameters())
    print(f"  {model_dir}: Qwen2 config, vocab {len(tok)}, {n_params / 1e6:.2f}M parameters", flush=True)
    return model_dir


def summary_table(results: dict[str, dict]) -> str:
    """One row per model: accuracy, pass@k, sampling entropy and diversity, expert-token entropy."""
    lines = ["| model | avg@n | pass@k (largest k) | truncated | sampling entropy | diversity "
             "| expert-token entropy (all / top 20%) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]

    def num(x, fmt="{:.3f}"):
        return "–" if x is None else fmt.format(x)

    for name, r in results.items():
        bench = next(iter(r["benchmarks"].values()))
        k, p = max(((int(k), v) for k, v in bench["pass_at_k"].items()), default=(None, None))
        s, e = r["summary"], r.get("expert_entropy") or {}
        lines.append(f"| {name} | {num(s.get('avg'), '{:.1%}')} | {num(p, '{:.1%}')} (k={k}) "
                     f"| {num(bench.get('truncated'), '{:.0%}')} | {num(s.get('entropy'))} | {num(s.get('diversity'))} "
                     f"| {num(e.get('all'))} / {num(e.get('top20'))} |")
    return "\n".join(lines) + "\n"


def sft_curve_table(logs: dict[str, Path]) -> str:
    """Expert-token entropy of the top 20% (the branching tokens) and cross-entropy during each SFT run, at five
    points of training (paper Fig. 2a), and for CurioSFT its weight on CE, w_t = 1 - alpha (lp - lq), at the
    top-20% and bottom-80% teacher-entropy tokens (mean over the logged steps; 1 is plain CE)."""
    lines = ["| SFT run | top-20% expert-token entropy at 0 / 25 / 50 / 75 / 100% of training | cross-entropy at the end "
             "| w_t at top-20% / bottom-80% teacher-entropy tokens |",
             "| --- | --- | --- | --- |"]
    for name, path in logs.items():
        rows = [r for r in map(json.loads, path.read_text().splitlines()) if "student_entropy_top20" in r]
        curve = [rows[round(f * (len(rows) - 1))]["student_entropy_top20"] for f in (0, 0.25, 0.5, 0.75, 1)]
        w = [sum(r[k] for r in rows) / len(rows) for k in ("w_top20", "w_bottom80")] if "w_top20" in rows[0] else None
        lines.append(f"| {name} | {' / '.join(f'{h:.3f}' for h in curve)} | {rows[-1]['ce']:.4f} "
                     f"| {'–' if w is None else f'{w[0]:.3f} / {w[1]:.3f}'} |")
    return "\n".join(lines) + "\n"


def solution_kinds_table(samples: dict[str, Path]) -> str:
    """How each model's samples add the numbers (data.toy_solution_kind): the share that follows the expert's
    order, another valid order (the diversity that SFT collapses), or makes a mistake."""
    lines = ["| model | " + " | ".join(data.TOY_SOLUTION_KINDS) + " |",
             "| --- |" + " --- |" * len(data.TOY_SOLUTION_KINDS)]
    for name, path in samples.items():
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        kinds = collections.Counter(data.toy_solution_kind(r["question"], r["response"]) for r in rows)
        shares = (f"{kinds[k] / len(rows):.1%}" if rows else "–" for k in data.TOY_SOLUTION_KINDS)
        lines.append(f"| {name} | " + " | ".join(shares) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="full")
    ap.add_argument("--out", default="out/demo", help="everything goes here: world/, runs/, eval/, logs/")
    ap.add_argument("--seed", type=int, default=0, help="of the data, the initial weights, the batches and sampling")
    a = ap.parse_args()
    size, out, seed = SIZES[a.size], Path(a.out).resolve(), ["--seed", str(a.seed)]
    world, runs, evals, logs = out / "world", out / "runs", out / "eval", out / "logs"
    t_start = time.time()
    # Finished stages are reused, so an --out must not mix seeds (nor hold a run from before seeds were recorded).
    seed_file = out / "seed"
    if seed_file.exists() or world.exists():
        recorded = seed_file.read_text().strip() if seed_file.exists() else None
        if recorded != str(a.seed):
            held = f"--seed {recorded}" if recorded else "an unrecorded --seed"
            raise SystemExit(f"{out} holds a run with {held}: use another --out")
    out.mkdir(parents=True, exist_ok=True)
    seed_file.write_text(f"{a.seed}\n")

    print("\n== 1. the toy world: data, tokenizer, model config")
    if not (world / "model" / "config.json").exists():
        run([PY, "data.py", "toy", "--out", world, *seed, *size["data"]], logs / "data.log")
        make_model_dir(world, size["model"])
    diverse, canonical, test = world / "train_diverse.jsonl", world / "train_canonical.jsonl", world / "test.jsonl"

    def sft(name: str, model: Path, train_file: Path, loss: str, extra: list) -> Path:
        if checkpoints.latest(runs / name) is None:
            run([PY, "sft.py", "config/sft_tiny.py", "--model", model, "--train_file", train_file, "--loss", loss,
                 "--out_dir", runs / name, "--system_prompt", "row", *seed, *extra], logs / f"{name}.log")
        return last_checkpoint(runs / name)

    print("\n== 2. pre-train the base model from scratch on diverse solutions")
    base = sft("base", world / "model", diverse, "sft", ["--scratch", *size["pretrain"]])

    print("\n== 3. SFT on the canonical expert style: cross-entropy, CurioSFT, entropy loss")
    models = {"base": base}
    for loss in SFT_LOSSES:
        models[loss] = sft(loss, base, canonical, loss, size["sft"])

    def evaluate(name: str, ckpt: Path) -> dict:
        result = evals / name / "results.json"
        if not result.exists():
            run([PY, "evaluate.py", "--model", ckpt, "--data", test, "--out", evals / name, "--name", name,
                 "--engine", "hf", "--sft_data", canonical, "--grader_workers", "1", "--system_prompt", "row",
                 *seed, *size["eval"]],
                logs / f"eval_{name}.log")
        return json.loads(result.read_text())

    print("\n== 4. evaluate: accuracy, pass@k, entropy")
    results = {name: evaluate(name, ckpt) for name, ckpt in models.items()}

    print("\n== 5. GRPO from the SFT and the CurioSFT checkpoints, then evaluate")
    for loss in RL_FROM:
        name = f"{loss}+grpo"
        if checkpoints.latest(runs / name) is None:
            run([PY, "rl.py", "config/rl_tiny.py", "--model", models[loss], "--train_file", canonical,
                 "--out_dir", runs / name, "--save_every", "0", "--grader_workers", "1", "--system_prompt", "row",
                 *seed, *size["rl"]],
                logs / f"{name}.log")
        results[name] = evaluate(name, last_checkpoint(runs / name))

    print("\n== 6. plots and summary")
    sft_logs = {loss: runs / loss / "log.jsonl" for loss in SFT_LOSSES}
    run([PY, "evaluate.py", "plot", "--results", *(evals / name / "results.json" for name in results),
         "--logs", *sft_logs.values(), "--log_keys", "student_entropy_top20", "student_entropy_bottom80", "ce",
         "--out", out / "plots"], logs / "plot.log")
    table = (summary_table(results) + "\n" + solution_kinds_table({name: evals / name / "samples.jsonl" for name in results})
             + "\n" + sft_curve_table(sft_logs))
    (out / "summary.md").write_text(table)
    print(table + f"\n{a.size} demo: {time.time() - t_start:.0f}s; plots in {out / 'plots'}")


if __name__ == "__main__":
    main()
