"""evaluate.py tokens: one SFT example's page, its per-token numbers against the paper's closed forms and the
token-by-token reference, the self-teacher and a second teacher, chunking, and a page that fetches nothing."""
import json
import math
import re

import pytest
import torch
import transformers

import curio_loss as cl
import evaluate as ev
from data import example_prompt, load_examples, tokenize_sft
from test_evaluate import QUESTIONS, _write_sft_data, checkpoint  # noqa: F401 (a fixture)


@pytest.fixture(scope="module")
def peaked(checkpoint, tmp_path_factory):
    """The tiny random checkpoint with its head scaled up: next-token entropies from near 0 to above the pivot,
    so that some temperatures are found by the search and some are clamped."""
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint)
    with torch.no_grad():
        model.lm_head.weight.mul_(40)
    path = tmp_path_factory.mktemp("peaked")
    model.save_pretrained(path)
    transformers.AutoTokenizer.from_pretrained(checkpoint).save_pretrained(path)
    return str(path)


def page_data(path) -> dict:
    return json.loads(re.search(r'<script type="application/json" id="token-data">(.*?)</script>',
                                path.read_text(), re.S).group(1))


def reference(model_dir, teacher_dir, example):
    """The trained positions' logits of student and teacher from plain HF forwards, whole, and the expert tokens."""
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    ids, mask = tokenize_sft(tok, example_prompt(example, tok, "paper"), example.response)
    trained = torch.tensor(mask[1:], dtype=torch.bool)
    logits = [transformers.AutoModelForCausalLM.from_pretrained(d)(torch.tensor([ids])).logits[0, :-1][trained]
              for d in (model_dir, teacher_dir)]
    return tok, ids, mask, *logits, torch.tensor(ids[1:])[trained]


def test_the_page_holds_curiosfts_numbers_at_every_response_token(peaked, tmp_path):
    sft = _write_sft_data(tmp_path)
    page = tmp_path / "view" / "page.html"
    ev.main(["tokens", "--model", peaked, "--data", str(sft), "--row", "2", "--out", str(page),
             "--loss_chunk", "3"])
    data = page_data(page)
    example = load_examples(sft, require_response=True)[2]
    tok, ids, mask, student, _, targets = reference(peaked, peaked, example)
    with torch.no_grad():
        assert data["target"] == targets.tolist()
        assert "".join(data["tokens"]) == example.response + tok.decode([tok.eos_token_id])
        lp, lq, h, delta, tau, w = (torch.tensor(data[k]) for k in ("lp", "lq", "teacher_entropy", "delta", "tau",
                                                                     "weight"))
        assert torch.allclose(lp, torch.log_softmax(student, -1)[torch.arange(len(targets)), targets], atol=1e-4)
        # the vocabulary (< 512) is the whole top-k: H_t is the full entropy; Eq. 7 in closed form
        assert torch.allclose(h, cl.entropy(student), atol=1e-4)
        assert torch.allclose(delta, 0.5 / (1 + torch.exp(-2.0 * (h - 1.2))), atol=1e-5)
        assert ((tau >= 1.1 - 1e-6) & (tau <= 1.5 + 1e-6)).all()
        inside = (tau > 1.1 + 1e-4) & (tau < 1.5 - 1e-4)
        assert 0 < inside.sum() < len(tau) and h.min() < 0.5 < 1.2 < h.max()
        assert torch.allclose(cl.entropy(student[inside], tau[inside].unsqueeze(-1)), (h + delta)[inside], atol=1e-4)
        # the loss these numbers give is the token-by-token reference's, and w_t is its gradient factor
        assert torch.allclose(-lp + 0.5 * (lp - lq) ** 2, cl.curio_loss_reference(student, student, targets),
                              atol=1e-4)
        assert torch.allclose(w, 1 - (lp - lq), atol=1e-5)
    html = page.read_text()
    assert data["about"]["teacher"] == "the model itself (self-teacher)" and html.count('class="t"') == len(targets)
    assert not re.search(r"https?:|src=|<link|@import|url\(", html)             # nothing is fetched


def test_a_second_teacher_chunking_and_bad_rows(checkpoint, peaked, tmp_path):
    sft = _write_sft_data(tmp_path)
    config = transformers.AutoConfig.from_pretrained(checkpoint)
    torch.manual_seed(1)
    teacher_dir = tmp_path / "teacher"
    transformers.Qwen2ForCausalLM(config).save_pretrained(teacher_dir)
    transformers.AutoTokenizer.from_pretrained(checkpoint).save_pretrained(teacher_dir)
    views = {}
    for chunk in ("2", "1000"):
        out = tmp_path / f"page_{chunk}.html"
        ev.main(["tokens", "--model", peaked, "--teacher", str(teacher_dir), "--data", str(sft), "--row", "0",
                 "--out", str(out), "--loss_chunk", chunk])
        views[chunk] = page_data(out)
    assert views["2"]["weight"] == pytest.approx(views["1000"]["weight"], rel=1e-5)   # chunks change nothing
    _, _, _, student, teacher, targets = reference(peaked, teacher_dir, load_examples(sft)[0])
    with torch.no_grad():
        assert views["2"]["teacher_entropy"] == pytest.approx(cl.entropy(teacher).tolist(), abs=1e-4)
        assert views["2"]["lp"] == pytest.approx(torch.log_softmax(student, -1)[torch.arange(len(targets)),
                                                                                targets].tolist(), abs=1e-4)
    losses = [-lp + 0.5 * (lp - lq) ** 2 for lp, lq in zip(views["2"]["lp"], views["2"]["lq"])]
    with torch.no_grad():
        assert losses == pytest.approx(cl.curio_loss_reference(student, teacher, targets).tolist(), rel=1e-5)
    assert views["2"]["about"]["teacher"] == str(teacher_dir)
    with pytest.raises(ValueError, match=f"--row {len(QUESTIONS)}: .* has rows 0 to {len(QUESTIONS) - 1}"):
        ev.main(["tokens", "--model", checkpoint, "--data", str(sft), "--row", str(len(QUESTIONS))])
    assert math.isfinite(views["1000"]["summary"]["w_top20"])


def test_the_checkpoints_own_system_prompt_is_the_default(peaked, tmp_path, capsys):
    """A checkpoint inside a run trained with --system_prompt messages is viewed with it, unless told otherwise,
    and then the difference is said: the page's numbers never silently come from another prompt."""
    import shutil

    ckpt = tmp_path / "run" / "step_000004"
    shutil.copytree(peaked, ckpt)
    (tmp_path / "run" / "run_config.json").write_text(json.dumps({"system_prompt": "messages", "lr": 1e-5}))
    sft = _write_sft_data(tmp_path)
    pages = {}
    for given in ([], ["--system_prompt", "paper"]):
        page = tmp_path / f"page{len(given)}.html"
        ev.main(["tokens", "--model", str(ckpt), "--data", str(sft), "--row", "1", "--out", str(page), *given])
        pages[len(given)] = page_data(page)
    assert pages[0]["about"]["system_prompt"] == "messages" and pages[2]["about"]["system_prompt"] == "paper"
    assert pages[0]["lp"] != pages[2]["lp"]                   # the prompt changes the numbers
    assert f"note: --system_prompt paper, while {ckpt} was trained with messages" in capsys.readouterr().out
    assert ev.trained_system_prompt(peaked, "auto") == "paper"     # nothing recorded: the paper's
