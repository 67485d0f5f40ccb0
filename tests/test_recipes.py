"""The two recipes (docs/recipes.md): every flag that separates the paper's text from the authors' scripts
changes what it says, and every preset parses and sets what its table says."""
import json
import math
import os
from dataclasses import fields
from pathlib import Path

import pytest
import torch

import curio_loss as cl
import data
import evaluate
import rl
import sft
from plumbing import cli, models
from run_python import run_python

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- SFT: schedule, optimiser, loss normalisation
def verl_lr_lambda(num_warmup_steps, num_training_steps, min_lr_ratio):
    """The lr_lambda of verl's get_cosine_schedule_with_warmup (num_cycles 0.5), as the authors' fork writes it
    (custom_verl/verl/utils/torch_functional.py lines 538-548): the reference sft.lr_at must match."""
    coef, intercept = (1 - min_lr_ratio) * 0.5, (1 + min_lr_ratio) * 0.5

    def lr_lambda(step):
        if step < num_warmup_steps:
            return min_lr_ratio + (1.0 - min_lr_ratio) * (float(step) / float(max(1, num_warmup_steps)))
        progress = float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
        return max(min_lr_ratio, math.cos(math.pi * 0.5 * 2.0 * progress) * coef + intercept)

    return lr_lambda


@pytest.mark.parametrize("horizon,floor,last", [(1, 0.0, (0.0, 1e-4)), (4, 1e-4, (0.87, 0.88))])
def test_lr_schedule_is_verls_at_every_step(horizon, floor, last):
    """3 epochs of 179 batches (46k rows / 256): the paper's horizon decays to 0; the authors' 4x horizon with
    min_lr_ratio 1e-4 ends at 88% of the peak. Driven as verl drives it: LambdaLR, optimiser step, scheduler step."""
    total, args = 537, sft.Args(lr=1e-5, warmup_steps=60, lr_horizon=horizon, min_lr_ratio=floor)
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=args.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, verl_lr_lambda(60, total * horizon, floor))
    ours = [sft.lr_at(step, total, args) for step in range(total)]
    for step in range(total):                                   # fsdp_workers.py update_actor: update, then step()
        assert ours[step] == pytest.approx(optimizer.param_groups[0]["lr"], rel=1e-12, abs=1e-20), step
        optimizer.step()
        scheduler.step()
    assert ours[0] == floor * args.lr and ours[30] == pytest.approx(args.lr * (floor + (1 - floor) * 0.5))
    assert ours[60] == args.lr and last[0] <= ours[-1] / args.lr < last[1]


def test_adamw_betas_are_verls():
    def adamw(a):
        return models.make_optimizer(torch.nn.Linear(2, 2), a.lr, a.weight_decay, a.adam_beta2, torch.device("cpu"),
                                     a.offload)
    optimizer = adamw(sft.Args())
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.999) and optimizer.param_groups[0]["weight_decay"] == 0.01
    assert adamw(sft.Args(adam_beta2=0.95)).param_groups[0]["betas"] == (0.9, 0.95)


N_TARGETS = {10: 1, 11: 3, 12: 2, 13: 6}          # response tokens of four examples
TOKEN_LOSS = {10: 4.0, 11: 0.0, 12: 1.0, 13: 2.0}  # the same loss at each token of an example


def step_loss(weights):
    return sum(weights[i] * N_TARGETS[i] * TOKEN_LOSS[i] for i in weights)


def groups_of(weights):
    """The groups of examples, told apart by their weight (1 / (groups x the group's tokens))."""
    groups = {}
    for i, w in weights.items():
        groups.setdefault(w, set()).add(i)
    return frozenset(map(frozenset, groups.values()))


def test_loss_norms_on_a_hand_made_batch():
    def weights(step=0, **kw):
        return sft.token_weights(list(N_TARGETS), N_TARGETS, sft.Args(**kw), step)

    assert step_loss(weights()) == pytest.approx((4 + 0 + 2 + 12) / 12)                  # every token alike
    micro = dict(loss_norm="micro_batch_token_mean")
    assert step_loss(weights(**micro, norm_group=1)) == pytest.approx((4 + 0 + 1 + 2) / 4)  # a mean per sequence
    assert step_loss(weights(**micro, norm_group=4)) == pytest.approx(18 / 12)           # one group: the batch mean
    # pairs: whatever the pairing, the mean over pairs of each pair's token mean. The pairs' token counts differ
    # within every pairing of (1, 3, 2, 6) tokens, so the weights tell the pairs apart
    pair = weights(**micro)
    pairs = groups_of(pair)
    assert sorted(map(len, pairs)) == [2, 2]
    want = sum(sum(N_TARGETS[i] * TOKEN_LOSS[i] for i in p) / sum(N_TARGETS[i] for i in p) for p in pairs) / 2
    assert step_loss(pair) == pytest.approx(want) and want != pytest.approx(1.5)        # not the batch mean
    # a pure function of (examples, step): every rank gets the same pairs; other steps pair otherwise
    assert pair == weights(**micro)
    assert len({groups_of(weights(step, **micro)) for step in range(20)}) > 1


def test_bad_recipe_flags_are_one_line_errors():
    with pytest.raises(SystemExit, match="--loss_norm 'sequence': expected one of batch_token_mean, "
                                         "micro_batch_token_mean"):
        sft.Args(loss_norm="sequence")
    with pytest.raises(SystemExit, match="--system_prompt 'table7': expected one of paper, row, messages"):
        sft.Args(system_prompt="table7")
    with pytest.raises(SystemExit, match=r"--lr_horizon 0.5: must be >= 1"):
        sft.Args(lr_horizon=0.5)
    sft.Args()


def test_sft_logs_the_step_loss_its_loss_norm_says(world_of_one, tiny_model_dir, tmp_path):
    """A whole sft.py step per normalisation on 8 examples of 1 to 11 lines (one global batch), the logged loss
    (before the update) against cross-entropy computed here: the token weights reach the right tokens."""
    import shutil

    from transformers import AutoTokenizer

    from conftest import toy_rows

    rows = toy_rows(8, seed=5)
    for k, r in enumerate(rows):
        first, _, rest = r["target"][0]["content"].partition("\n</think>")
        again = (" Check:" + first.removeprefix("<think>")) * (3 * k // 2)
        r["target"][0]["content"] = first + again + "\n</think>" + rest
    train_file = data.write_jsonl(rows, tmp_path / "train.jsonl")
    model_dir = tmp_path / "model"                                 # larger initial weights: token losses that vary
    shutil.copytree(tiny_model_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps(config | {"initializer_range": 1.0}))
    tok = AutoTokenizer.from_pretrained(model_dir)
    items, stats = data.build_sft_data(tok, data.load_examples(train_file, require_response=True), 512, 256)
    n_targets = [int(mask[1:].sum()) for _, mask in items]
    assert stats["kept"] == 8 and n_targets[-1] > 5 * n_targets[0]
    model = models.load_full_model(str(model_dir), scratch=True, seed=0)
    with torch.no_grad():                                          # [token losses] of each example
        per_example = [torch.nn.functional.cross_entropy(model(ids[None].long()).logits[0, :-1], ids[1:].long(),
                                                         reduction="none")[mask[1:].bool()] for ids, mask in items]
    want = {"batch_token_mean": torch.cat(per_example).mean().item(),
            "micro_batch_token_mean": torch.stack([ce.mean() for ce in per_example]).mean().item()}
    assert want["batch_token_mean"] != pytest.approx(want["micro_batch_token_mean"], rel=1e-3)
    for norm, value in want.items():
        out = tmp_path / norm
        proc = run_python(["sft.py", "config/sft_tiny.py", "--model", model_dir, "--scratch", "--train_file",
                           train_file, "--out_dir", out, "--loss", "sft", "--token_budget", "1024", "--max_steps",
                           "1", "--loss_norm", norm, "--norm_group", "1"], env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        logged = json.loads((out / "log.jsonl").read_text().splitlines()[0])["loss"]
        assert logged == pytest.approx(value, rel=1e-5), norm


# ---------------------------------------------------------------- presets
# What docs/recipes.md gives each preset. Fields the presets set and other branches add (offload to
# sft.py and rl.py, grading and max_prompt_len to evaluate.py) are checked once those fields exist.
PRESETS = {
    "config/sft_paper.py": ((sft.Args, cl.LossConfig), dict(
        epochs=3, global_batch=256, lr=1e-5, warmup_steps=60, lr_horizon=1, min_lr_ratio=0.0, adam_beta2=0.999,
        loss_norm="batch_token_mean", system_prompt="paper", max_prompt_len=1024, max_response_len=8192)),
    "config/sft_authors.py": ((sft.Args, cl.LossConfig), dict(
        epochs=3, global_batch=256, lr=1e-5, warmup_steps=60, lr_horizon=4, min_lr_ratio=1e-4, adam_beta2=0.999,
        loss_norm="micro_batch_token_mean", norm_group=2, system_prompt="messages", max_prompt_len=1024,
        max_response_len=8192, offload=True, eval_every=59, eval_n=1, eval_temperature=0.6, eval_top_p=1.0,
        eval_grading="authors", eval_file="data/curiosft/validation.parquet")),
    "config/rl_paper.py": ((rl.Args,), dict(
        steps=500, prompts_per_step=128, rollouts=8, mini_batch=64, lr=1e-6, clip_low=0.2, clip_high=0.28,
        policy_loss="ppo_clip", clip_ratio_c=None, loss_agg="token_mean", reward="paper", temperature=1.0,
        top_p=0.95, system_prompt="paper")),
    "config/rl_authors.py": ((rl.Args,), dict(
        steps=500, prompts_per_step=128, rollouts=8, mini_batch=32, lr=1e-6, clip_low=0.2, clip_high=0.2,
        policy_loss="custom_loss_rl", clip_ratio_c=None, loss_agg="seq_sum_over_max_len", reward="authors_rl",
        temperature=1.0, top_p=1.0, system_prompt="messages", offload=True, eval_every=20, eval_n=1,
        eval_temperature=0.6, eval_top_p=1.0, eval_grading="authors", eval_file="data/curiosft/validation.parquet")),
    "config/eval_paper.py": ((evaluate.Args,), dict(
        n_samples=8, n_mmlu_pro=1, temperature=0.6, top_p=0.95, max_new_tokens=8192, system_prompt="paper",
        grading="paper")),
    "config/eval_authors.py": ((evaluate.Args,), dict(
        n_samples=8, n_mmlu_pro=1, temperature=0.6, top_p=1.0, max_new_tokens=8192, system_prompt="messages",
        grading="authors", max_prompt_len=1024)),
}
# the settings each pair of presets differs in: the rows of docs/recipes.md, nothing else
DIFFERENCES = {"sft": {"lr_horizon", "min_lr_ratio", "loss_norm", "system_prompt", "offload", "eval_every",
                       "eval_top_p", "eval_grading", "gpu_memory_utilization"},
               "rl": {"mini_batch", "clip_high", "policy_loss", "loss_agg", "reward", "top_p", "system_prompt",
                      "offload", "gpu_memory_utilization", "eval_every", "eval_top_p", "eval_grading"},
               "eval": {"top_p", "grading", "system_prompt"}}


def parse_preset(preset):
    classes, _ = PRESETS[preset]
    required = [a for c in classes for name in getattr(c, "REQUIRED", ()) for a in (f"--{name}", "x")]
    parsed = cli.parse_config(*classes, argv=[str(REPO / preset), *required])
    return {f.name: getattr(p, f.name) for p in parsed for f in fields(p)}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_parses_and_sets_what_the_table_says(preset):
    got, (_, want) = parse_preset(preset), PRESETS[preset]
    assert {k: got[k] for k in want} == want
    assert got["system_prompt"] in data.SYSTEM_PROMPT_MODES
    if "loss_norm" in got:
        sft.Args(**{f.name: got[f.name] for f in fields(sft.Args)})
    if "policy_loss" in got:
        assert got["policy_loss"] in rl.POLICY_LOSSES and got["loss_agg"] in rl.LOSS_AGGS


@pytest.mark.parametrize("stage", sorted(DIFFERENCES))
def test_paper_and_authors_presets_differ_only_in_the_tables_rows(stage):
    paper, authors = parse_preset(f"config/{stage}_paper.py"), parse_preset(f"config/{stage}_authors.py")
    assert {k for k in paper if paper[k] != authors[k]} == DIFFERENCES[stage]
