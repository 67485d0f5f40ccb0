"""Plumbing (a reader of the method may skip this file): evaluate.py's tables and PNG plots.

    results_table   one checkpoint, one row per benchmark
    compare_table   several checkpoints in the layout of the paper's Table 2
    paired_table    evaluate.py compare: A - B with its bootstrap interval per benchmark and metric
    plot_results    pass@k, accuracy against entropy and diversity (Figs. 1, 4), before and after RL
                    (Table 3), curves over training from sft.py and rl.py logs (Fig. 2)
"""
import io
import json
from pathlib import Path

from plumbing.benchmarks import ID_BENCHMARKS, OOD_BENCHMARKS
from plumbing.run_dir import write_atomic


def pyplot():
    """matplotlib's pyplot, imported at the first plot: sft.py and rl.py import this module for
    its tables and plot nothing, and start about half a second sooner without it."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def percent(x) -> str:
    """A share as a percentage with one decimal, or a dash for None."""
    return "–" if x is None else f"{100 * x:.1f}"


def results_table(result: dict) -> str:
    """Markdown: one row per benchmark, then the paper's ID / OOD averages."""
    bench = result["benchmarks"]
    ks = sorted({int(k) for m in bench.values() for k in m["pass_at_k"]})
    head = ["benchmark", "questions", "n", "avg@n", "s.e."] + [f"pass@{k}" for k in ks] + [
        "mixed", "length", "entropy", "diversity", "truncated"]
    lines = [f"## {result['name']}", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for b, m in bench.items():
        cells = [b, m["questions"], m["n"], percent(m["avg"]), percent(m.get("avg_stderr"))]
        cells += [percent(m["pass_at_k"].get(str(k))) for k in ks] + [
            percent(m.get("mixed_frac")), f"{m['response_length']:.0f}", f"{m['entropy']:.3f}",
            "–" if m["diversity"] is None else f"{m['diversity']:.3f}", percent(m["truncated"])]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    s = result["summary"]
    grading = result.get("settings", {}).get("grading", "paper")
    lines += ["", f"ID avg {percent(s['id_avg'])} · OOD avg {percent(s['ood_avg'])} · grading "
                  f"{grading} · grader failures {result['grader_failures']}",
              "s.e.: standard error of avg@n over questions; mixed: the share of questions whose n "
              "samples are neither all right nor all wrong (what GRPO learns from)"]
    if result.get("expert_entropy"):
        e = result["expert_entropy"]
        lines.append(f"expert-token entropy (nats): top 20% {e['top20']:.3f}, bottom 80% "
                     f"{e['bottom80'] or 0:.3f}, all {e['all']:.3f}, over {e['tokens']} positions")
    return "\n".join(lines) + "\n"


def compare_table(results: list[dict]) -> str:
    """Markdown in paper Table 2's layout: avg@n per benchmark, ID and OOD averages, entropy."""
    present = {b for r in results for b in r["benchmarks"]}
    names = [b for b in ID_BENCHMARKS if b in present] + ["ID avg"]
    names += [b for b in OOD_BENCHMARKS if b in present]
    names += ["OOD avg"] + sorted(present - set(ID_BENCHMARKS) - set(OOD_BENCHMARKS))
    head = ["checkpoint"] + names + ["entropy", "diversity"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in results:
        s = r["summary"]
        cells = [r["name"]] + [percent(s["id_avg"]) if b == "ID avg"
                               else percent(s["ood_avg"]) if b == "OOD avg"
                               else percent(r["benchmarks"].get(b, {}).get("avg")) for b in names]
        cells += ["–" if s[k] is None else f"{s[k]:.3f}" for k in ("entropy", "diversity")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def signed(x) -> str:
    """A difference of shares in points, with its sign."""
    return f"{100 * x:+.1f}"


def paired_table(result: dict) -> str:
    """Markdown of evaluate.py compare's result: A, B, A - B and its interval, one row per benchmark
    (then the ID, OOD and overall averages) and metric."""
    a, b = result["a"], result["b"]
    lines = [f"## {a['name']} − {b['name']}", "",
             f"A: {a['name']} ({', '.join(a['evaluations'])}); "
             f"B: {b['name']} ({', '.join(b['evaluations'])}). "
             f"{result['level']:.0%} percentile bootstrap intervals of A − B, paired over "
             f"questions ({result['resamples']:,} replicates, seed {result['seed']}; resampled: "
             f"{result['resampled']}). Points of accuracy.", "",
             "| benchmark | questions | metric | A | B | A − B | 95% interval |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        metric = r["metric"] if r["metric"] != "avg" else f"avg@{r['n'] or 'n'}"
        lines.append(f"| {r['benchmark']} | {r['questions']} | {metric} | {percent(r['a'])} | "
                     f"{percent(r['b'])} | {signed(r['difference'])} | [{signed(r['low'])}, "
                     f"{signed(r['high'])}] |")
    return "\n".join(lines) + "\n"


def stage_pairs(results: list[dict], acc_key: str) -> list[tuple[dict, dict]]:
    """(X, X+stage) for every result named "X+stage" (e.g. "curio+grpo") whose X is also there: a
    checkpoint before and after a later stage (paper Table 3). Pairs where either accuracy is
    missing are left out of the plot."""
    by_name = {r["name"]: r for r in results}
    pairs = [(by_name[r["name"].rpartition("+")[0]], r) for r in results
             if r["name"].rpartition("+")[0] in by_name]
    return [(b, a) for b, a in pairs if b["summary"][acc_key] is not None
            and a["summary"][acc_key] is not None]


def plot_results(results: list[dict], out_dir: str, logs: list[str] = (),
                 log_keys: list[str] = ()) -> list[str]:
    """pass@k curves per benchmark, accuracy vs entropy and vs diversity across checkpoints (paper
    Figs. 1, 4), accuracy before and after RL for each pair named X / X+grpo (`stage_pairs`, paper
    Table 3), `log_keys` over training from sft.py logs (paper Fig. 2), and from rl.py logs the
    share of GRPO groups with mixed rewards (the only groups with a learning signal) and the mean
    reward; from logs with validation records (--eval_every) the validation curves
    (`_validation_curves`). Returns the written paths."""
    out, written, plt = Path(out_dir), [], pyplot()
    benchmarks = list(dict.fromkeys(b for r in results for b in r["benchmarks"]))
    cols = min(3, len(benchmarks))
    rows = -(-len(benchmarks) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows + 0.6), squeeze=False)
    for ax, b in zip(axes.flat, benchmarks):
        for i, r in enumerate(results):                    # a run keeps its colour in every panel
            if b in r["benchmarks"]:
                curve = r["benchmarks"][b]["pass_at_k"]
                ax.plot([int(k) for k in curve], [100 * v for v in curve.values()], marker="o",
                        label=r["name"], color=f"C{i}")
        ax.set(title=b, xlabel="k (samples)", ylabel="pass@k (%)")
        ax.set_xscale("log", base=2)
        ks = sorted({int(k) for r in results if b in r["benchmarks"]
                     for k in r["benchmarks"][b]["pass_at_k"]})
        ax.set_xticks(ks, [str(k) for k in ks])
    for ax in axes.flat[len(benchmarks):]:
        ax.axis("off")
    _legend(fig, [r["name"] for r in results], marker="o")
    fig.suptitle("pass@k: the chance that one of k samples is right (unbiased estimator)")
    written.append(_save(fig, out / "pass_at_k.png"))

    acc_key = "id_avg" if all(r["summary"]["id_avg"] is not None for r in results) else "avg"
    acc_label = "in-distribution accuracy, avg@n (%)" if acc_key == "id_avg" \
        else "accuracy, avg@n (%)"
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    xlabels = ("sampling entropy (nats per token)", "diversity (1 - 4-gram Jaccard similarity)")
    for ax, key, xlabel in zip(axes, ("entropy", "diversity"), xlabels):
        for i, r in enumerate(results):
            x, y = r["summary"][key], r["summary"][acc_key]
            if x is not None and y is not None:
                ax.scatter(x, 100 * y, color=f"C{i}")
                ax.annotate(r["name"], (x, 100 * y), fontsize="small")
        ax.set(xlabel=xlabel, ylabel=acc_label, title=f"accuracy against {key}")
    written.append(_save(fig, out / "accuracy_vs_entropy_diversity.png"))

    pairs = stage_pairs(results, acc_key)
    if pairs:
        fig, ax = plt.subplots(figsize=(1.6 + 1.6 * len(pairs), 3.8))
        values = []
        for i, (before, after) in enumerate(pairs):
            for dx, r, color, label in ((-0.2, before, "tab:gray", "before RL"),
                                        (0.2, after, "tab:blue", "after RL")):
                y = 100 * r["summary"][acc_key]
                values.append(y)
                ax.bar(i + dx, y, width=0.4, color=color, label=label if i == 0 else None)
                ax.annotate(f"{y:.1f}", (i + dx, y), ha="center", va="bottom", fontsize="small")
        low, high = min(values), max(values)
        margin = max(2.0, 0.3 * (high - low))
        # the differences, not the bars' height
        ax.set_ylim(max(0.0, low - margin), min(100.0, high + margin))
        ax.set_xticks(range(len(pairs)), [f"{b['name']}\n→ {a['name']}" for b, a in pairs],
                      fontsize="small")
        ax.set(ylabel=acc_label, title="accuracy before and after RL (y axis zoomed)")
        ax.legend(fontsize="small", loc="lower right")
        written.append(_save(fig, out / "accuracy_before_after_rl.png"))

    if logs:
        runs = [(Path(path).parent.name,
                 [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()])
                for path in logs]
        sft_runs = [(n, rows) for n, rows in runs
                    if not any("zero_std_frac" in row for row in rows)]
        rl_runs = [(n, rows) for n, rows in runs if any("zero_std_frac" in row for row in rows)]
        keys = list(log_keys) or sorted({k for _, rows in sft_runs for row in rows
                                         for k, v in row.items() if "entropy" in k and
                                         not k.startswith("val_") and isinstance(v, (int, float))})
        if sft_runs and keys:
            panels = [(k, k, "nats" if "entropy" in k else "") for k in keys]
            written.append(_curves(sft_runs, panels, "SFT: over training",
                                   out / "over_training.png"))
        if rl_runs:
            for _, rows in rl_runs:
                for row in rows:
                    if "zero_std_frac" in row:                   # not the validation records
                        row["mixed_reward_groups"] = 100 * (1 - row["zero_std_frac"])
            panels = [("mixed_reward_groups", "groups with mixed rewards", "%"),
                      ("reward_mean", "mean reward", ""), ("entropy", "rollout entropy", "nats")]
            written.append(_curves(rl_runs, panels,
                                   "GRPO: only groups with mixed rewards carry a learning signal",
                                   out / "rl_over_training.png"))
        if any("val_accuracy" in row for _, rows in runs for row in rows):
            written.append(_validation_curves(runs, logs, out / "validation.png"))
    return written


def _validation_curves(runs, logs, path) -> str:
    """The val_* records of sft.py and rl.py runs (--eval_every) over training. An rl.py run whose
    --model is a checkpoint of a plotted run continues that run's curve after its last step, in its
    colour, dashed: entropy and accuracy through SFT, then RL (the paper's Fig. 1 story)."""
    last = {Path(p).parent.resolve(): max((r["step"] for r in rows if "step" in r), default=0)
            for p, (_, rows) in zip(logs, runs)}
    fig, axes = pyplot().subplots(1, 3, figsize=(12, 3.8), squeeze=False)
    panels = (("val_accuracy", "validation accuracy", 100, "%"),
              ("val_entropy", "validation sampling entropy", 1, "nats"),
              ("val_response_len", "validation response length", 1, "tokens"))
    colours, names = {}, []
    for p, (name, rows) in zip(logs, runs):
        start = _started_from(Path(p).parent)
        before = start if start in last and start != Path(p).parent.resolve() else None
        colour = colours.get(before) or f"C{len(names)}"
        colours[Path(p).parent.resolve()] = colour
        if before is None:
            names.append(name)
        offset = last[before] if before is not None else 0
        for ax, (key, title, scale, unit) in zip(axes.flat, panels):
            points = [(row["step"] + offset, scale * row[key]) for row in rows if key in row]
            if points:
                ax.plot(*zip(*points), marker="o", color=colour, linestyle="--" if before else "-")
            ax.set(xlabel="optimiser step (RL after its SFT run's last)", title=title,
                   ylabel=f"{title} ({unit})")
    _legend(fig, names)
    fig.suptitle("Validation during training (--eval_every): SFT solid, the RL run after it dashed")
    return _save(fig, path)


def _started_from(run_dir: Path) -> Path | None:
    """The run directory whose checkpoint a run's --model is (run_config.json), or None."""
    try:
        model = json.loads((run_dir / "run_config.json").read_text())["model"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Path(model).resolve().parent if model else None


def _curves(runs, panels, title, path) -> str:
    """One panel per (log key, title, unit), one line per run, one legend for the figure."""
    fig, axes = pyplot().subplots(1, len(panels), figsize=(4 * len(panels), 3.8), squeeze=False)
    for ax, (key, panel_title, unit) in zip(axes.flat, panels):
        for i, (name, rows) in enumerate(runs):            # a run keeps its colour in every panel
            points = [(row["step"], row[key]) for row in rows if "step" in row and key in row]
            if points:
                ax.plot(*zip(*points), label=name, color=f"C{i}")
        ax.set(xlabel="optimiser step", ylabel=f"{panel_title} ({unit})" if unit else panel_title,
               title=panel_title)
    _legend(fig, [name for name, _ in runs])
    fig.suptitle(title)
    return _save(fig, path)


def _legend(fig, names: list[str], marker: str | None = None) -> None:
    """One legend for the whole figure: every run in its colour (C0, C1, ... by its place in
    `names`), whether or not the first panel draws it."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=f"C{i}", marker=marker) for i in range(len(names))]
    fig.legend(handles, names, loc="lower center", ncol=min(len(names), 6), fontsize="small")


def _save(fig, path: Path) -> str:
    # room for the legend and the suptitle
    fig.tight_layout(rect=(0, 0.09 if fig.legends else 0, 1, 0.93 if fig.get_suptitle() else 1))
    return save_png(fig, path)


def save_png(fig, path: Path, dpi: int = 120) -> str:
    """The figure as a PNG, written whole or not at all (a full disk: one line, the old file kept);
    closed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=dpi, format="png")
    pyplot().close(fig)
    write_atomic(path, buffer.getvalue())
    return str(path)
