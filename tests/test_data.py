"""Tests for data.py: prompt, loaders, loss mask, micro-batch plan, collate, toy tokenizer."""
import itertools
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import transformers

import data
from plumbing.synthetic import build_toy_tokenizer

QUESTION = "What is $12 + 34$?"
RESPONSE = "Add the units: 2 + 4 = 6.\nThen the tens.\n</think>\nThe answer is \\boxed{46}."


@pytest.fixture(scope="module")
def tok():
    sums = [f"{a} + {b} = {a + b}, so \\boxed{{{a + b}}}. IT'S ({a})\n" for a in range(40) for b in range(9)]
    return build_toy_tokenizer([data.SYSTEM_PROMPT, QUESTION, RESPONSE] + sums, vocab_size=512)


@pytest.fixture(scope="module")
def tok_no_template():
    tokenizer = build_toy_tokenizer([data.SYSTEM_PROMPT, RESPONSE], vocab_size=512)
    tokenizer.chat_template = None  # forces build_prompt's plain ChatML fallback
    return tokenizer


# ---------------------------------------------------------------------------------------------------------
# Prompt
# ---------------------------------------------------------------------------------------------------------
def test_prompt_is_table_7(tok):
    expected = (
        f"<|im_start|>system\n{data.SYSTEM_PROMPT}<|im_end|>\n"
        f"<|im_start|>user\nHere is the question:{QUESTION}<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )
    assert data.build_prompt(QUESTION) == expected  # plain fallback
    assert data.build_prompt(QUESTION, tok) == expected  # the toy's chat template is the same ChatML
    assert data.SYSTEM_PROMPT.startswith("You are an exceptional mathematician.")
    assert data.SYSTEM_PROMPT.endswith("within \\boxed{}.") and "\\\\" not in data.SYSTEM_PROMPT


def test_prompt_does_not_open_think_twice():
    class R1Style:  # a template that opens the think block itself, like DeepSeek-R1 distills
        chat_template = "stub"

        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            return "".join(m["content"] for m in messages) + "<|Assistant|><think>\n"

    prompt = data.build_prompt(QUESTION, R1Style())
    assert prompt.endswith("<|Assistant|><think>\n") and prompt.count("<think>\n") == 2  # 1 in SYSTEM_PROMPT


# ---------------------------------------------------------------------------------------------------------
# Loaders
# ---------------------------------------------------------------------------------------------------------
def row(question=QUESTION, ground_truth="46", response="<think>\n" + RESPONSE, source="openr1"):
    r = {
        "data_source": source,
        "prompt": [{"role": "system", "content": "sys"}, {"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"ground_truth": ground_truth, "style": "rule"},
        "extra_info": {"index": 0, "split": "train"},
    }
    if response is not None:
        r["target"] = [{"role": "assistant", "content": response}]
    return r


def write(path, rows):
    if path.suffix == ".parquet":
        pd.DataFrame(rows).to_parquet(path)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        path.write_text(json.dumps(rows))
    return path


@pytest.mark.parametrize("ext", ["parquet", "jsonl", "json"])
def test_load_parses_fields(tmp_path, ext):
    rows = [row(), row(question="Q2", ground_truth="\\frac{1}{2}", response="no think prefix", source="amc")]
    examples = data.load_examples(write(tmp_path / f"train.{ext}", rows), require_response=True)
    stored = [{"role": "system", "content": "sys"}, {"role": "user", "content": QUESTION}]
    # leading "<think>\n" stripped; the prompt messages kept as stored
    assert examples[0] == data.Example(QUESTION, "46", RESPONSE, "openr1", 0, "sys", stored)
    assert examples[1] == data.Example("Q2", "\\frac{1}{2}", "no think prefix", "amc", 1, "sys",
                                       [stored[0], {"role": "user", "content": "Q2"}])


def test_example_prompt_paper_or_row_system(tmp_path):
    rows = [row(), row()]
    rows[1]["prompt"] = rows[1]["prompt"][1:]  # a user turn only
    with_system, without = data.load_examples(write(tmp_path / "p.jsonl", rows))
    assert without.system is None
    assert data.example_prompt(with_system) == data.example_prompt(without) == data.build_prompt(QUESTION)
    assert data.example_prompt(with_system, system_prompt="row") == (
        f"<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\n{data.USER_PREFIX}{QUESTION}<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n")
    with pytest.raises(ValueError, match=r"p.jsonl row 1: field 'prompt' has no system message"):
        data.example_prompt(without, system_prompt="row")
    with pytest.raises(ValueError, match="system_prompt 'table7': expected one of paper, row, messages"):
        data.example_prompt(with_system, system_prompt="table7")


def test_example_prompt_messages_is_the_stored_prompt_through_the_template(tmp_path, tok):
    """The authors' prompt (train_dataset.py): the row's messages as stored, chat template applied, nothing added."""
    rows = [row(), row()]
    rows[0]["prompt"] = [{"role": "system", "content": data.SYSTEM_PROMPT},
                         {"role": "user", "content": data.USER_PREFIX + QUESTION}]
    rows[1]["prompt"] = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "Hint."},
                         {"role": "user", "content": "Go on."}]
    table7, several = data.load_examples(write(tmp_path / "m.parquet", rows))
    want = tok.apply_chat_template(rows[1]["prompt"], add_generation_prompt=True, tokenize=False)
    assert data.example_prompt(several, tok, "messages") == want
    assert want.endswith("<|im_start|>assistant\n") and "<think>" not in want      # no "<think>\n" appended
    assert data.example_prompt(several, None, "messages") == want                   # ChatML without a template
    # a row that stores Table 7 gives Table 7 up to the "<think>\n" that "paper" opens the assistant turn with;
    # "paper" does not prefix "Here is the question:" twice
    assert data.example_prompt(table7, tok, "messages") + data.THINK == data.example_prompt(table7, tok, "paper")
    assert data.example_prompt(table7, tok, "paper") == data.build_prompt(QUESTION, tok)
    broken = data.Example(QUESTION, "1", None, "x", 7, None, [{"role": "user", "content": ["not", "text"]}])
    with pytest.raises(ValueError, match=r"row 7: field 'prompt\[0\]' is not a \{role, content\} message"):
        data.example_prompt(broken, tok, "messages")
    with pytest.raises(ValueError, match=r"row 7: field 'prompt\[0\]'"):
        data.example_prompt(data.Example(QUESTION, "1", None, "x", 7), tok, "messages")


def test_load_numeric_ground_truth_and_eval_file(tmp_path):
    examples = data.load_examples(write(tmp_path / "eval.jsonl", [row(ground_truth=42, response=None)]))
    assert examples[0].ground_truth == "42" and examples[0].response is None
    with pytest.raises(ValueError, match=r"eval\.jsonl row 0: field 'target' is missing"):
        data.load_examples(tmp_path / "eval.jsonl", require_response=True)


def _drop_reward_model(r):
    del r["reward_model"]


@pytest.mark.parametrize("ext, break_row, field", [
    ("parquet", lambda r: r.update(reward_model=None), "reward_model"),
    ("parquet", lambda r: r["target"][0].update(content=""), "target[0].content"),
    ("jsonl", _drop_reward_model, "reward_model"),
    ("jsonl", lambda r: r["target"][0].update(content="<think>\n"), "target[0].content"),
    ("jsonl", lambda r: r["prompt"][1].update(content=123), "prompt[1].content"),
    ("jsonl", lambda r: r["prompt"][1].update(content="  "), "prompt[1].content"),
    ("jsonl", lambda r: r["reward_model"].update(ground_truth=""), "reward_model.ground_truth"),
    ("jsonl", lambda r: r["reward_model"].update(ground_truth=float("nan")), "reward_model.ground_truth"),
    ("json", lambda r: r["reward_model"].update(ground_truth="\\frac{"), "reward_model.ground_truth"),
    ("parquet", lambda r: r["reward_model"].update(ground_truth="\\frac{1}2}"), "reward_model.ground_truth"),
    ("json", lambda r: r.update(prompt=[{"role": "system", "content": "sys"}]), "prompt"),
])
def test_bad_row_names_file_row_and_field(tmp_path, ext, break_row, field):
    rows = [row(), row(), row()]
    break_row(rows[1])
    path = write(tmp_path / f"train.{ext}", rows)
    with pytest.raises(ValueError) as e:
        data.load_examples(path)
    assert f"train.{ext} row 1: field '{field}'" in str(e.value)


def test_bad_files(tmp_path):
    with pytest.raises(ValueError, match=r"missing\.parquet: file not found"):
        data.load_examples(tmp_path / "missing.parquet")
    with pytest.raises(ValueError, match=r"train\.csv: unknown extension"):
        data.load_examples(write(tmp_path / "train.csv", [row()]))
    (tmp_path / "broken.jsonl").write_text(json.dumps(row()) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"broken\.jsonl row 1: invalid JSON"):
        data.load_examples(tmp_path / "broken.jsonl")


# ---------------------------------------------------------------------------------------------------------
# Tokenisation and the loss mask
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tokenizer_name", ["tok", "tok_no_template"])
def test_loss_mask_is_response_and_eos(request, tokenizer_name):
    tokenizer = request.getfixturevalue(tokenizer_name)
    prompt = data.build_prompt(QUESTION, tokenizer)
    ids, mask = data.tokenize_sft(tokenizer, prompt, RESPONSE)
    n_response = len(tokenizer.encode(RESPONSE, add_special_tokens=False))
    n_prompt = len(ids) - n_response - 1
    assert len(mask) == len(ids) and mask == [0] * n_prompt + [1] * (n_response + 1)
    assert ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode([i for i, m in zip(ids, mask) if m]) == RESPONSE + "<|endoftext|>"
    assert tokenizer.decode([i for i, m in zip(ids, mask) if not m]) == prompt  # nothing of the prompt trained


def test_tokenize_needs_eos(tok):
    class NoEos:
        eos_token_id = None

        def encode(self, text, add_special_tokens):
            return tok.encode(text, add_special_tokens=add_special_tokens)

    with pytest.raises(ValueError, match="eos"):
        data.tokenize_sft(NoEos(), "p", "r")


def test_build_sft_data_drops_and_counts_overlong(tok):
    def ex(question, response, r=0):
        return data.Example(question, "1", response, "toy", r)

    examples = [ex("short", "ok"), ex("long question " * 200, "ok", 1), ex("short", "long answer " * 200, 2),
                ex("short", "fine too", 3)]
    n_prompt = len(tok.encode(data.build_prompt("short", tok), add_special_tokens=False))
    out, stats = data.build_sft_data(tok, examples, max_prompt_len=n_prompt, max_response_len=20)
    assert stats == {"kept": 2, "dropped_prompt": 1, "dropped_response": 1}
    want = [data.tokenize_sft(tok, data.build_prompt("short", tok), r) for r in ("ok", "fine too")]
    assert [(ids.tolist(), mask.tolist()) for ids, mask in out] == want
    # The response limit counts the EOS: a response of exactly max_response_len tokens no longer fits.
    n_ok = len(tok.encode("ok", add_special_tokens=False))
    assert data.build_sft_data(tok, examples[:1], max_response_len=n_ok)[1]["dropped_response"] == 1
    with pytest.raises(ValueError, match="row 5: no expert response"):
        data.build_sft_data(tok, [ex("q", None, 5)])


# ---------------------------------------------------------------------------------------------------------
# Micro-batch plan
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("world_size", [1, 2, 8])
@pytest.mark.parametrize("token_budget", [600, 10**6])
def test_plan_covers_each_example_once_with_equal_counts(world_size, token_budget, pack):
    rng = random.Random(world_size)
    lengths = [rng.randint(10, 300) for _ in range(203)] + [700, 900]  # two over the 600 budget
    global_batch = 32
    plan = data.plan_micro_batches(lengths, global_batch, token_budget, world_size, seed=0, epoch=0, pack=pack)

    def tokens(mb):   # computed: end to end when packed, else padded to the longest
        return sum(lengths[i] for i in mb) if pack else max(lengths[i] for i in mb) * len(mb)

    assert len(plan) == len(lengths) // global_batch  # last partial batch dropped
    seen = []
    for step in plan:
        assert len(step) == world_size
        assert len({len(mbs) for mbs in step}) == 1  # same micro-batch count on every rank
        step_ids = [i for mbs in step for mb in mbs for i in mb]
        assert len(step_ids) == len(set(step_ids)) == global_batch  # each once, ranks disjoint
        seen += step_ids
        costs = []
        for mbs in step:
            for mb in mbs:
                assert mb and (tokens(mb) <= token_budget or len(mb) == 1)
            costs.append(sum(tokens(mb) for mb in mbs))
        biggest = max(tokens(mb) for mbs in step for mb in mbs)
        assert max(costs) - min(costs) <= biggest  # snake dealing keeps ranks within one micro-batch
    assert len(seen) == len(set(seen))  # no example twice in an epoch


def test_a_packed_plan_fills_micro_batches_first_fit():
    # budget 10: padded, 6 then 5 cannot share (2 x 6 > 10) and 4 joins only 5 (2 x 5); packed,
    # first fit puts 4 beside 6 and 5 alone: 2 micro-batches of 10 and 5 tokens, none padded
    lengths = [6, 5, 4]
    padded = data.plan_micro_batches(lengths, 3, 10, 1, seed=0, epoch=0)[0][0]
    packed = data.plan_micro_batches(lengths, 3, 10, 1, seed=0, epoch=0, pack=True)[0][0]
    assert sorted(map(sorted, padded)) == [[0], [1, 2]]
    assert sorted(map(sorted, packed)) == [[0, 2], [1]]
    assert data.padding_efficiency(lengths, packed, pack=True) == 1.0
    assert data.padding_efficiency(lengths, padded) == 15 / 16


def test_balanced_groups_balance_tokens_within_the_sequence_count():
    lengths = [9, 8, 7, 3, 2, 1]
    # longest first to the emptier group: 9 | 8, 7 | 3, 2 to the first (9 < 15, 12 < 15) | 1 to the second (full)
    assert data.balanced_groups(lengths, 2, 3) == [[0, 3, 4], [1, 2, 5]]          # 14 and 16 tokens
    rng = random.Random(0)
    for _ in range(50):
        lengths = [rng.randint(1, 100) for _ in range(rng.randint(1, 30))]
        most = rng.randint(1, 6)
        groups = -(-len(lengths) // most)
        parts = data.balanced_groups(lengths, groups, most)
        assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
        assert len(parts) == groups and all(len(p) <= most for p in parts)
        sums = [sum(lengths[i] for i in p) for p in parts]
        # LPT: the fullest is within one sequence of the emptiest when no group is full
        if all(len(p) < most for p in parts):
            assert max(sums) - min(sums) <= max(lengths)
    with pytest.raises(ValueError, match="do not fit 1 micro-batches of 2"):
        data.balanced_groups([1, 2, 3], 1, 2)


def test_plan_deals_in_snake_order():
    # Budget 1: every sequence is its own micro-batch, costs 40 > 30 > 20 > 10. Snake order gives both ranks
    # 50 tokens ({40, 10} and {30, 20}); round robin would give 60 and 40.
    plan = data.plan_micro_batches([40, 30, 20, 10], global_batch=4, token_budget=1, world_size=2, seed=0, epoch=0)
    assert plan == [[[[0], [3]], [[1], [2]]]]


def test_plan_is_deterministic_and_reshuffles_per_epoch():
    lengths = list(range(1, 101))
    args = dict(global_batch=20, token_budget=400, world_size=2, seed=3)
    assert data.plan_micro_batches(lengths, epoch=0, **args) == data.plan_micro_batches(lengths, epoch=0, **args)
    assert data.plan_micro_batches(lengths, epoch=0, **args) != data.plan_micro_batches(lengths, epoch=1, **args)


def test_plan_rejects_bad_sizes():
    with pytest.raises(ValueError, match="divisible"):
        data.plan_micro_batches([10] * 30, global_batch=10, token_budget=100, world_size=4, seed=0, epoch=0)
    with pytest.raises(ValueError, match="fewer"):
        data.plan_micro_batches([10] * 5, global_batch=8, token_budget=100, world_size=1, seed=0, epoch=0)


# ---------------------------------------------------------------------------------------------------------
# Collate and padding efficiency
# ---------------------------------------------------------------------------------------------------------
def test_collate_right_pads():
    batch = [([5, 6, 7], [0, 1, 1]), ([8, 9, 10, 11, 12], [0, 0, 1, 1, 1])]
    out = data.collate(batch, pad_id=0)
    assert out["input_ids"].tolist() == [[5, 6, 7, 0, 0], [8, 9, 10, 11, 12]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert out["loss_mask"].tolist() == [[0, 1, 1, 0, 0], [0, 0, 1, 1, 1]]
    assert out["input_ids"].dtype == out["attention_mask"].dtype == torch.long
    assert out["loss_mask"].dtype == torch.float32
    # the positions b * T + t - 1 that predict the trained targets (b, t), as the loss mask says
    b, t = out["loss_mask"].nonzero().unbind(-1)
    assert out["target_index"].tolist() == (b * 5 + t - 1).tolist() == [0, 1, 6, 7, 8]
    assert out["padded"] is True and data.collate(batch[1:], pad_id=0)["padded"] is False
    with pytest.raises(ValueError, match="batch item 0"):
        data.collate([([1, 2], [1])], pad_id=0)


def test_collate_packs_end_to_end():
    batch = [([5, 6, 7], [0, 1, 1]), ([8, 9, 10, 11, 12], [0, 0, 1, 1, 1])]
    out = data.collate(batch, pad_id=0, pack=True)
    assert out["input_ids"].tolist() == [[5, 6, 7, 8, 9, 10, 11, 12]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 4]]
    assert out["cu_seq_lens"].tolist() == [0, 3, 8] and out["cu_seq_lens"].dtype == torch.int32
    assert out["loss_mask"].tolist() == [[0, 1, 1, 0, 0, 1, 1, 1]]
    assert "attention_mask" not in out and out["padded"] is False and out["seq_lens"] == [3, 5]
    # the same trained tokens as the padded layout, at their packed positions (never across a boundary:
    # the first sequence's last token predicts nothing)
    padded = data.collate(batch, pad_id=0)
    assert out["input_ids"].flatten()[out["target_index"] + 1].tolist() == \
        padded["input_ids"].flatten()[padded["target_index"] + 1].tolist() == [6, 7, 10, 11, 12]
    assert out["target_index"].tolist() == [0, 1, 4, 5, 6]


def test_padding_efficiency_by_hand():
    # [[0, 1], [2]]: real 2 + 4 + 3 = 9 tokens; padded 2 * 4 + 1 * 3 = 11.
    assert data.padding_efficiency([2, 4, 3], [[0, 1], [2]]) == pytest.approx(9 / 11)
    assert data.padding_efficiency([5, 5], [[0, 1]]) == 1.0


# ---------------------------------------------------------------------------------------------------------
# Toy tokenizer
# ---------------------------------------------------------------------------------------------------------
STRINGS = [
    "12345 + 678 = 7023", "so \\boxed{46}. IT'S (7)", "  two  spaces\n\n\nand newlines\r\n", "\\boxed{12}",
    "<think>\nhmm</think>\n", "<|im_start|>user\nHi<|im_end|>\n", "it's 'quoted' I'll",
    "café ü 数学 ∑ x² ﬁ",  # NFC keeps ² and ﬁ (NFKC would not)
]


def test_toy_tokenizer_basics(tok):
    assert tok.eos_token_id == tok.pad_token_id == tok.convert_tokens_to_ids("<|endoftext|>")
    for t in ["<think>", "</think>", "<|im_start|>", "<|im_end|>"]:
        assert len(tok.encode(t, add_special_tokens=False)) == 1
    for s in STRINGS:
        assert tok.decode(tok.encode(s, add_special_tokens=False)) == s


def test_toy_tokenizer_survives_qwen2_reload(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    transformers.Qwen2Config(vocab_size=len(tok), hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                             num_key_value_heads=1, intermediate_size=128).save_pretrained(tmp_path)
    reloaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert type(reloaded).__name__ == "Qwen2Tokenizer"  # the class that rebuilds the pre-tokenizer
    assert len(reloaded) == len(tok)
    assert (reloaded.eos_token_id, reloaded.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
    for s in STRINGS + [data.build_prompt(QUESTION, tok) + RESPONSE]:
        assert reloaded.encode(s, add_special_tokens=False) == tok.encode(s, add_special_tokens=False), s
    assert data.build_prompt(QUESTION, reloaded) == data.build_prompt(QUESTION)  # chat template saved too


def test_download_offline_is_a_clear_error(tmp_path, monkeypatch):
    import huggingface_hub

    def offline(repo_id, **kwargs):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(SystemExit, match=r"could not download dataset Hao0oWang/CurioSFT_Data .*"
                                         r"Network is unreachable.*needs a machine online"):
        data._download_main(["--out", str(tmp_path)])


def fake_hub(calls, files):
    """A snapshot_download that records its calls and writes `files` ({relative path: rows}) under a dataset's
    local_dir (a model gets a config.json)."""
    def download(repo_id, repo_type, local_dir):
        calls.append((repo_id, repo_type, Path(local_dir)))
        Path(local_dir).mkdir(parents=True)
        if repo_type == "model":
            (Path(local_dir) / "config.json").write_text("{}")
        for name, rows in files.items():
            (Path(local_dir) / name).parent.mkdir(parents=True, exist_ok=True)
            write(Path(local_dir) / name, rows)
    return download


def test_download_fetches_the_authors_data_and_both_models(tmp_path, monkeypatch, capsys):
    import huggingface_hub

    calls = []
    files = {"train.parquet": [row(), row()], "validation.parquet": [row(response=None)],
             "test.math.parquet": [row(response=None)] * 3, "test.gpqa.parquet": [row(response=None, ground_truth="A")]}
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_hub(calls, files))
    data._download_main(["--out", str(tmp_path / "data"), "--model_out", str(tmp_path / "models")])
    assert [(repo, kind) for repo, kind, _ in calls] == [
        ("Hao0oWang/CurioSFT_Data", "dataset"), ("Elliott/Openr1-Math-46k-8192", "dataset"),
        ("Hao0oWang/Qwen2.5-Math-7B-16k-think", "model"), ("Elliott/Qwen2.5-Math-7B-16k-think", "model")]
    # the two models share a name: each gets its own folder
    assert calls[2][2] == tmp_path / "models" / "Hao0oWang" / "Qwen2.5-Math-7B-16k-think"
    assert calls[3][2] == tmp_path / "models" / "Elliott" / "Qwen2.5-Math-7B-16k-think"
    out = capsys.readouterr().out
    authors = tmp_path / "data" / "curiosft"
    assert f"{authors / 'test.math.parquet'}: 3 rows" in out and f"{authors / 'train.parquet'}: 2 rows" in out
    # the benchmark files are the test.* ones: not train.parquet, not validation.parquet
    assert out.splitlines()[-1] == (f"training file: {authors / 'train.parquet'}; benchmark files: "
                                    f"{authors / 'test.gpqa.parquet'}, {authors / 'test.math.parquet'}")

    calls.clear()
    data._download_main(["--out", str(tmp_path / "d2"), "--model_out", str(tmp_path / "m2"), "--models", "authors"])
    assert [repo for repo, kind, _ in calls if kind == "model"] == ["Hao0oWang/Qwen2.5-Math-7B-16k-think"]

    # the small model: Qwen2.5-Math-1.5B, its 4k context extended as the 7B models' was, in a folder that says so
    data._download_main(["--out", str(tmp_path / "d3"), "--model_out", str(tmp_path / "m3"), "--models", "small"])
    small = tmp_path / "m3" / "Qwen" / "Qwen2.5-Math-1.5B-16k"
    assert calls[-1] == ("Qwen/Qwen2.5-Math-1.5B", "model", small)
    assert json.loads((small / "config.json").read_text()) == {"rope_theta": 40000.0, "max_position_embeddings": 16384}
    assert json.loads((tmp_path / "m2" / "Hao0oWang" / "Qwen2.5-Math-7B-16k-think" / "config.json").read_text()) == {}


def test_download_checks_the_files_it_fetched(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_hub([], {"train.parquet": [{"x": 1}]}))
    with pytest.raises(ValueError, match=r"train\.parquet row 0"):                # not in the schema
        data._download_main(["--out", str(tmp_path / "bad")])
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_hub([], {"data/train.parquet": [row()]}))
    with pytest.raises(SystemExit, match=r"Hao0oWang/CurioSFT_Data gave no train\.parquet or no test\.\*\.parquet"):
        data._download_main(["--out", str(tmp_path / "moved")])                   # another layout


def test_bytes_that_are_not_utf8_name_the_file_and_row(tmp_path):
    good = json.dumps({"data_source": "x", "prompt": [{"role": "user", "content": "q"}],
                       "reward_model": {"ground_truth": "1"}}).encode()
    (tmp_path / "bad.jsonl").write_bytes(good + b"\n" + good.replace(b'"q"', b'"q \xff"') + b"\n")
    with pytest.raises(ValueError, match=r"bad.jsonl row 1: not UTF-8"):
        data.load_examples(tmp_path / "bad.jsonl")
    (tmp_path / "bad.json").write_bytes(b"[" + good.replace(b'"q"', b'"\xfe"') + b"]")
    with pytest.raises(ValueError, match=r"bad.json: not UTF-8"):
        data.load_examples(tmp_path / "bad.json")


def test_least_padded_split_is_the_cheapest_split_within_the_cap():
    """Against every split of a few sorted lengths into a fixed number of consecutive micro-batches."""
    rng = random.Random(0)
    for _ in range(30):
        lengths = sorted((rng.randint(1, 50) for _ in range(rng.randint(3, 9))), reverse=True)
        groups = rng.randint(1, len(lengths))
        cap = rng.randint(lengths[0], 4 * lengths[0])

        def cost(sizes):
            starts = [0, *itertools.accumulate(sizes)][:-1]
            return sum(size * lengths[s] for s, size in zip(starts, sizes))

        def valid(sizes):
            starts = [0, *itertools.accumulate(sizes)][:-1]
            return all(size * lengths[s] <= cap for s, size in zip(starts, sizes))

        n = len(lengths)                    # every split: groups - 1 cut points among the n - 1 gaps
        every = [[b - a for a, b in zip((0, *cuts), (*cuts, n))]
                 for cuts in itertools.combinations(range(1, n), groups - 1)]
        feasible = [c for c in every if valid(c)]
        if not feasible:
            with pytest.raises(ValueError, match="do not split"):
                data.least_padded_split(lengths, groups, cap)
            continue
        sizes = data.least_padded_split(lengths, groups, cap)
        assert len(sizes) == groups and sum(sizes) == len(lengths) and valid(sizes)
        assert cost(sizes) == min(cost(c) for c in feasible)


def test_the_paper_presets_pad_under_5_percent_and_packing_pads_nothing_in_fewer_micro_batches():
    """bench/padding.py: long-tailed lengths (a few hundred to 8,192 tokens) through sft.py's and rl.py's own
    micro-batch plans at the paper's presets, padded and packed."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "bench" / "padding.py"), "--examples", "8000",
                           "--mini_batches", "20"], cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    shares = [float(x) for x in re.findall(r"padding ([\d.]+)%", done.stdout)]
    assert len(shares) == 4 and all(0 < s < 5 for s in shares[0::2]), done.stdout
    assert shares[1::2] == [0, 0], done.stdout
    padded, packed = (float(x) for x in re.findall(r"([\d.]+) micro-batches a step", done.stdout))
    assert packed < padded, done.stdout          # fuller micro-batches, as the budget now counts real tokens
    padded, packed = (float(x) for x in re.findall(r"fullest micro-batch ([\d.]+)x", done.stdout))
    assert packed < 1.2 < padded, done.stdout    # packed: tokens balanced; padded: long ones go alone


def test_a_chat_template_that_breaks_or_escapes_its_sandbox_is_one_line(tok):
    import copy

    hostile = copy.deepcopy(tok)
    hostile.chat_template = "{{ messages.__class__.__mro__[1].__subclasses__() }}"    # refused by jinja's sandbox
    with pytest.raises(ValueError, match=r": its chat template failed \(SecurityError: "):
        data.chat_prompt([{"role": "user", "content": "hi"}], hostile)
    hostile.chat_template = "{% for m in messages %}"                                    # never closed
    with pytest.raises(ValueError, match=r": its chat template failed \(TemplateSyntaxError: "):
        data.chat_prompt([{"role": "user", "content": "hi"}], hostile)
