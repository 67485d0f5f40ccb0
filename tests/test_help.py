"""Every script's --help: exits 0, keeps its usage examples, lists choices, marks required flags, groups settings."""
from pathlib import Path

import pytest

from run_python import run_python

REPO = Path(__file__).resolve().parents[1]

CASES = {
    "sft.py": ["usage: sft.py [config/PRESET.py ...]", "torchrun --nproc_per_node 8 sft.py config/sft_paper.py",
               "(required) the model to start from: a Hugging Face model directory", "sft.py settings:",
               "settings sft.py and rl.py share:", "loss settings (curio_loss.LossConfig):",
               "{sft,curio,curio_fixed_tau,curio_self_teacher,",
               "--loss_norm {batch_token_mean,micro_batch_token_mean}",
               "(default: 1e-05)", "validation during training: measure.validate",
               "--eval_top_p EVAL_TOP_P, --eval-top-p EVAL_TOP_P validation nucleus sampling"],
    "rl.py": ["usage: rl.py [config/PRESET.py ...]", "(required) the model to start from", "rl.py settings:",
              "settings sft.py and rl.py share:", "Table 3's hybrids (hybrid.py): rl.py --hybrid:", "(default: 1e-06)",
              "--policy_loss {ppo_clip,custom_loss_rl}", "--engine {auto,hf,vllm}",
              "--reward {paper,authors,authors_rl}", "--clip_ratio_c CLIP_RATIO_C",
              "validation during training: measure.validate", "--eval_grading {paper,authors,authors_rl}"],
    "evaluate.py": ["usage: evaluate.py [config/PRESET.py ...]", "--grading {paper,authors,authors_rl}"],
    "evaluate.py plot": ["usage: evaluate.py plot", "--results"],
    "evaluate.py tokens": ["usage: evaluate.py tokens", "--teacher", "loss settings (curio_loss.LossConfig):"],
    "evaluate.py compare": ["usage: evaluate.py compare", "--resamples", "(required) evaluations of checkpoint A"],
    "data.py": ["usage: python data.py download"],
    "demo/toy.py": ["usage: demo/toy.py", "--expert_fails"],
    "demo/run.py": ["python demo/run.py --size full --seeds 0 1 2", "--size {ci,full,small}"],
    "bench/loss_speed.py": ["--tokens", "--vocab"],
    "data.py download": ["usage: data.py download", "(default: data)"],
    "bench/memory.py": ["--model", "--stage"],
}


@pytest.mark.parametrize("script", sorted(CASES))
def test_help_exits_0_and_says_what_the_flags_are(script):
    proc = run_python([*script.split(), "--help"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    flat = " ".join(proc.stdout.split())                     # argparse wraps lines at the terminal's width
    for expected in CASES[script]:
        assert " ".join(expected.split()) in flat, expected


def test_the_readme_names_table_names_what_rl_py_logs_and_takes():
    """The README's table of names against TRL's and verl's: each of this project's names is a field of rl.py's log
    record or a flag of rl.py or evaluate.py, so the table cannot drift from the code."""
    import re
    from dataclasses import fields

    import evaluate
    import rl

    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("**Names, against TRL's and verl's.**"):].split("\n\n")[1]
    ours = [re.findall(r"`([^`]+)`", row.split("|")[1]) for row in table.splitlines()[2:]]
    flags = {f.name for cls in (rl.Args, evaluate.Args) for f in fields(cls)}
    source = (REPO / "rl.py").read_text() + (REPO / "plumbing" / "grpo_log.py").read_text()
    logged = set(re.findall(r'"(\w+)":', source))                  # the keys of its records
    assert len(ours) >= 12
    for name in (name for names in ours for name in names):
        flag = next((w[2:] for w in name.split() if w.startswith("--")), None)
        if flag is not None:
            assert flag in flags, name
        else:                                                       # a logged field, or the file it writes
            assert name in logged or (name.endswith(".jsonl") and f'"{name}"' in source), name


def test_mistyped_words_get_a_suggestion_and_empty_defaults_are_not_shown(capsys):
    import evaluate
    import sft
    from plumbing.cli import parse_config

    with pytest.raises(SystemExit) as e:
        evaluate.main(["comapre", "a", "b"])
    assert e.value.code == ("evaluate.py: unknown subcommand 'comapre', did you mean compare? (subcommands: plot, "
                            "compare, tokens; an evaluation takes flags)")
    with pytest.raises(SystemExit) as e:
        parse_config(sft.Args, argv=["config/sft_papr.py"])
    assert e.value.code == "preset config/sft_papr.py: no such file, did you mean config/sft_paper.py?"
    with pytest.raises(SystemExit):
        evaluate.main(["--help"])
    shown = capsys.readouterr().out
    assert "(default: 0.6)" in shown and "(default: )" not in shown


def test_tokens_help_lists_only_the_loss_settings_the_page_uses(capsys):
    """evaluate.py tokens shows (and takes) the loss settings its numbers depend on, not the Table 2
    baselines' ones, with LossConfig's types, defaults and help; compare shows no loss settings."""
    from dataclasses import fields

    import curio_loss as cl
    import evaluate
    from plumbing.cli import field_docs
    from plumbing.token_view import TokensLossConfig

    baselines = ("entropy_coef", "kl_coef", "gem_beta", "psft_clip_low", "psft_clip_high")
    with pytest.raises(SystemExit):
        evaluate.main(["tokens", "--help"])
    shown = capsys.readouterr().out
    assert "loss settings (curio_loss.LossConfig):" in shown
    assert "--alpha" in shown and "--h_pivot" in shown and "--low_entropy_threshold" in shown
    for name in baselines:
        assert name not in shown, name
    with pytest.raises(SystemExit):
        evaluate.main(["compare", "--help"])
    shown = capsys.readouterr().out
    assert "--resamples" in shown and "alpha" not in shown and "kl_coef" not in shown
    full, docs = {f.name: f for f in fields(cl.LossConfig)}, field_docs(cl.LossConfig)
    kept = fields(TokensLossConfig)
    assert {f.name for f in kept} == full.keys() - set(baselines)   # a new LossConfig field: decide
    for f in kept:
        assert (f.type, f.default) == (full[f.name].type, full[f.name].default), f.name
        assert field_docs(TokensLossConfig)[f.name] == docs[f.name], f.name
    assert TokensLossConfig(alpha=0.5, top_k=64).loss_config() == cl.LossConfig(alpha=0.5, top_k=64)
