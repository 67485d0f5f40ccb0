"""demo/decisive_token.py --grpo on a world and base of its own (the ci size's), apart from tests/test_demo.py's
demo so that the two run side by side: the curves, GRPO from each start, P("+") as a forward pass gives it, the
probe expert's rows."""
import json
import math
from pathlib import Path

import pytest

import data
from demo import decisive_token as decisive
from demo import run as demo
from demo import toy
from plumbing import checkpoints
from plumbing.synthetic import make_model_dir
from run_python import run_python
from test_demo import check_probe_curves

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """A seed's folder as demo/run.py --size ci leaves it before stage 3 (its world and base), then the probe with
    --grpo on it: (the folder, the probe's results.json)."""
    out = tmp_path_factory.mktemp("probe") / "demo"
    size = demo.SIZES["ci"]
    toy._main(["--out", str(out / "world"), "--seed", "0", *size["data"]])
    model = make_model_dir(out / "world", size["model"])
    (out / "seed").write_text("0\n")
    (out / "settings.json").write_text(json.dumps({"size": "ci"}))
    done = run_python(["sft.py", "config/sft_tiny.py", "--model", model, "--train_file",
                       out / "world" / "train_pretrain.jsonl", "--loss", "sft", "--out_dir", out / "runs" / "base",
                       "--system_prompt", "row", "--seed", "0", "--scratch", *size["pretrain"]])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    proc = run_python(["demo/decisive_token.py", "--demo", out, "--n_rows", "16", "--steps", "2", "--save_every",
                       "1", "--losses", "sft", "curio", "--grpo"], timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out, json.loads((out / "decisive_token" / "results.json").read_text())


def test_the_probe_with_grpo_starts_each_run_where_its_curve_ends(probed):
    out, probe = probed
    check_probe_curves(probe, before=2)
    # --grpo: GRPO from the base and from each loss's last checkpoint, P("+") before it as the curves end
    assert list(probe["grpo"]) == ["base", "sft", "curio"]
    assert probe["grpo"]["base"]["p_before"] == probe["p_put_off"]["sft"]["0"]
    assert probe["grpo"]["curio"]["p_before"] == probe["p_put_off"]["curio"]["2"]
    for start, r in probe["grpo"].items():
        assert 0 <= r["p_after"] <= 1 and 0 <= r["mixed"] <= 1
        assert checkpoints.latest(out / "decisive_token" / "runs" / f"{start}+grpo") is not None


def test_p_put_off_is_the_next_token_probability_after_the_experts_lines(probed):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, _ = probed
    ckpt = checkpoints.latest(out / "decisive_token" / "runs" / "sft")
    model, tok = AutoModelForCausalLM.from_pretrained(ckpt), AutoTokenizer.from_pretrained(ckpt)
    rows = [json.loads(line) for line in (out / "world" / "test.jsonl").read_text().splitlines()]
    # at the decisive token: after "a" and "+b=a+b", the two positive numbers' lines
    question = next(q for q in (r["prompt"][1]["content"] for r in rows)
                    if not toy.add_in_order(decisive.positives_then_negative(toy.parse_floor(q)))[1])
    a, b = [v for v in toy.parse_floor(question) if v > 0][:2]
    text = data.build_prompt(question, tok, toy.FLOOR_SYSTEM) + f"{a}\n{b:+d}={a + b}\n"
    with torch.no_grad():
        p = model(torch.tensor([tok.encode(text)])).logits[0, -1].softmax(-1)[tok.convert_tokens_to_ids("+")]
    assert math.isclose(decisive.p_put_off(ckpt, [question]), p.item(), rel_tol=1e-4)
    expert = [json.loads(line) for line in (out / "decisive_token" / "train_expert.jsonl").read_text().splitlines()]
    test_questions = {r["prompt"][1]["content"] for r in rows}
    assert len(expert) == 16 and not test_questions & {r["prompt"][1]["content"] for r in expert}
    for r in expert:
        order = decisive.positives_then_negative(toy.parse_floor(r["prompt"][1]["content"]))
        assert toy.add_in_order(order)[1] and r["target"][0]["content"] == toy.floor_response(order)
