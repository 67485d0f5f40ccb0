"""evaluate.py's generation: stopping on every Qwen EOS token, rollouts without log-probs, finish reasons as the
engine gives them, and the prompt-length filter of the evaluation run. vLLM is a recording fake here
(tests/fake_vllm.py): these tests check what the code asks of vLLM 0.32, not vLLM itself."""
import json
import re

import pytest
import torch
import transformers

import evaluate as ev
import measure
from data import build_prompt
from plumbing.synthetic import build_toy_tokenizer
from fake_vllm import install
from plumbing import generation

QUESTIONS = ["What is 2+3?", "Compute 7*6.", "What is 10-4?"]
LONG = "Add up the following numbers one after another and report the total: " + " + ".join(map(str, range(40)))


@pytest.fixture(scope="module")
def chat_checkpoint(tmp_path_factory):
    """A tiny Qwen2 whose tokenizer and generation_config both name only <|im_end|> as EOS, as a chat checkpoint
    may, while its vocabulary also has <|endoftext|>."""
    texts = [build_prompt(q) + "Add.\n</think>\nThe answer is \\boxed{5}." for q in QUESTIONS + [LONG]] * 20
    tok = build_toy_tokenizer(texts, vocab_size=400)
    tok.eos_token = "<|im_end|>"
    cfg = transformers.Qwen2Config(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, intermediate_size=128, max_position_embeddings=512,
                                   eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    path = tmp_path_factory.mktemp("ckpt") / "tiny-chat"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def qwen_eos(tok):
    return tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")


def test_eos_ids_add_every_qwen_eos_token(chat_checkpoint):
    engine, tok = generation.load_engine(chat_checkpoint, "hf")
    im_end, endoftext = qwen_eos(tok)
    assert tok.eos_token_id == engine.model.generation_config.eos_token_id == im_end != endoftext   # names one
    assert generation._eos_ids(engine.model, tok) == [im_end, endoftext]
    assert generation._eos_ids(None, tok) == [im_end, endoftext]                    # vLLM: no generation_config here


def test_hf_generation_stops_on_endoftext_that_the_checkpoint_does_not_name(chat_checkpoint):
    engine, tok = generation.load_engine(chat_checkpoint, "hf")
    _, endoftext = qwen_eos(tok)

    def force_endoftext(module, inputs, logits):          # the model wants to end with <|endoftext|>
        logits[..., endoftext] += 1e4
        return logits

    engine.model.lm_head.register_forward_hook(force_endoftext)
    out = generation.generate(engine, tok, [build_prompt(q, tok) for q in QUESTIONS[:2]], n=2, max_new_tokens=5)
    for s in (s for q in out for s in q):
        assert (s.token_ids, s.text, s.stop_text, s.finish_reason) == ([endoftext], "", "<|endoftext|>", "stop")
        assert len(s.logprobs) == len(s.entropy) == 1


def test_hf_generation_without_logprobs_samples_the_same_tokens(chat_checkpoint):
    engine, tok = generation.load_engine(chat_checkpoint, "hf")
    calls, alone = [], []
    real_generate, real_alone = engine.model.generate, generation._scored_alone

    def spy(**kwargs):
        assert "output_scores" not in kwargs                     # never every step's [B * n, V] scores
        calls.append(len(alone))
        return real_generate(**kwargs)

    engine.model.generate = spy
    generation._scored_alone = lambda *args: alone.append(1) or real_alone(*args)
    prompts = [build_prompt(q, tok) for q in QUESTIONS]
    try:
        full = generation.generate(engine, tok, prompts, n=3, max_new_tokens=10, seed=5, batch_size=2)
        lean = generation.generate(engine, tok, prompts, n=3, max_new_tokens=10, seed=5, batch_size=2,
                                   logprobs=False)
    finally:
        generation._scored_alone = real_alone
    assert calls == [0, 6, 9, 9] and len(alone) == 9          # a forward per sample only where log-probs are asked
    assert [[(s.token_ids, s.finish_reason) for s in q] for q in lean] == \
           [[(s.token_ids, s.finish_reason) for s in q] for q in full]
    assert all(s.logprobs is None and s.entropy is None for q in lean for s in q)
    assert all(len(s.logprobs) == len(s.token_ids) for q in full for s in q)


def test_hf_samples_do_not_depend_on_how_prompts_are_batched(chat_checkpoint):
    """Each sample draws from its own seed (seed + the prompt's global index x n + its index): the same tokens
    whatever --gen_batch_size / --batch_size and however the prompts are split (offset), and the caller's RNG is
    left as it was. Another seed gives other samples."""
    engine, tok = generation.load_engine(chat_checkpoint, "hf")
    prompts = [build_prompt(q, tok) for q in QUESTIONS + QUESTIONS[:1]]

    def tokens(batch_size, seed=7, part=slice(None), offset=0):
        out = generation.generate(engine, tok, prompts[part], n=3, temperature=1.0, top_p=0.95, max_new_tokens=10,
                                  seed=seed, batch_size=batch_size, logprobs=False, offset=offset)
        return [[s.token_ids for s in q] for q in out]

    state = torch.get_rng_state()
    whole = tokens(4)
    assert torch.equal(torch.get_rng_state(), state)
    assert tokens(1) == tokens(3) == whole
    assert tokens(1, part=slice(2, None), offset=2) == whole[2:]
    assert whole[0] != whole[3] and len({tuple(s) for s in whole[0]}) > 1   # same prompt, other seeds: other samples
    assert tokens(4, seed=8) != whole


def reference_alone(model, tok, prompt, sample, temperature, top_p, raw):
    """A sample's per-token log-probs and entropies from the whole [T, V] logits of prompt + sample alone
    (model(ids).logits): the warpers HF generate draws with (temperature, then top-p) for the entropy; the log-prob
    the raw logits' (raw) or the warped ones', the drawn token kept in the nucleus."""
    prompt_ids = generation.encode(tok, prompt)
    ids = torch.tensor([prompt_ids + sample.token_ids])
    logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()                     # [T, V]
    y = torch.tensor(sample.token_ids)[:, None]
    tempered = logits / temperature
    scores = transformers.TopPLogitsWarper(top_p)(ids, tempered) if top_p < 1 else tempered
    if raw:
        logp = logits.log_softmax(-1).gather(-1, y)[:, 0]
    else:
        logp = scores.scatter(-1, y, tempered.gather(-1, y)).log_softmax(-1).gather(-1, y)[:, 0]
    return logp, generation.entropy(scores)


@pytest.mark.parametrize("temperature,top_p,raw", [(0.6, 0.95, False), (1.0, 1.0, True), (1.3, 0.5, True)])
def test_hf_log_probs_and_entropies_are_each_samples_alone(chat_checkpoint, temperature, top_p, raw):
    """Per token, the sampling distribution's entropy and a log-prob (of it, or raw: the model's own, temperature
    1 and no top-p, as rl.py's engine check wants) from a forward of the sample alone: the same, bit for bit,
    however the prompts were batched (a batched forward rounds each row by its batch: val_entropy would follow
    --gen_batch_size), and those of the sample's whole logits to float32's rounding."""
    engine, tok = generation.load_engine(chat_checkpoint, "hf", raw_logprobs=raw)
    prompts = [build_prompt(q, tok) for q in QUESTIONS]
    runs = [generation.generate(engine, tok, prompts, n=3, temperature=temperature, top_p=top_p, max_new_tokens=12,
                                seed=4, batch_size=size) for size in (1, 3)]
    figures = [[(s.token_ids, s.logprobs, s.entropy) for q in run for s in q] for run in runs]
    assert figures[0] == figures[1] and len(figures[0]) == 9
    flat = [s for q in runs[1] for s in q]
    for prompt, s in zip([p for p in prompts for _ in range(3)], flat):
        logp, ent = reference_alone(engine.model, tok, prompt, s, temperature, top_p, raw)
        assert torch.allclose(torch.tensor(s.logprobs), logp, atol=1e-5) and torch.isfinite(logp).all()
        assert torch.allclose(torch.tensor(s.entropy), ent, atol=1e-5)
    assert any(s.finish_reason == "length" for s in flat) and max(len(s.token_ids) for s in flat) == 12
    if raw:                       # the same samples and entropies as the sampling distribution's log-probs
        processed = generation.generate(generation.Engine("hf", engine.model), tok, prompts, n=3,
                                        temperature=temperature, top_p=top_p, max_new_tokens=12, seed=4)
        processed = [s for q in processed for s in q]
        assert [(s.token_ids, s.entropy) for s in processed] == [(s.token_ids, s.entropy) for s in flat]
        assert ([s.logprobs for s in processed] == [s.logprobs for s in flat]) == (temperature == top_p == 1)


HF_MEMORY_PROBE = r"""
import resource, sys, torch, transformers
sys.path.insert(0, {repo!r})
from plumbing.synthetic import build_toy_tokenizer
from plumbing import generation
torch.manual_seed(0)
tok = build_toy_tokenizer(["a b c 1 2 3"] * 10, vocab_size=300)
cfg = transformers.Qwen2Config(vocab_size=151936, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               num_key_value_heads=1, intermediate_size=64, max_position_embeddings=1024)
model = transformers.Qwen2ForCausalLM(cfg).eval()
eos = torch.tensor(generation._eos_ids(model, tok))          # never drawn: every sample runs to 256 tokens
model.lm_head.register_forward_hook(lambda module, inputs, out: out.index_fill_(-1, eos, -float("inf")))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = generation.generate(model, tok, ["a b c"], n=8, temperature=1.0, top_p=1.0, max_new_tokens=256, seed=0)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
lengths = [len(s.logprobs) for s in out[0]]
print("PEAK_GROWTH_MB", (after - before) / 1024, "TOKENS", sum(lengths), min(lengths), flush=True)
"""


def test_hf_sampling_memory_is_one_steps_logits_at_the_real_vocabulary(tmp_path):
    """8 samples x 256 tokens at Qwen's 151,936-token vocabulary with log-probs: keeping every step's scores would
    hold 256 x 8 x 151,936 floats (1.2 GB; 2.4 GB more resident, as measured with output_scores=True); a forward
    of each sample alone meets the head 32 positions at a time (19 MB of float32 logits; 147 MB more resident,
    measured). The peak resident memory may grow by less than 600 MB while it samples."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    script = tmp_path / "probe.py"
    script.write_text(HF_MEMORY_PROBE.format(repo=str(repo)))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    growth, tokens, shortest = re.search(r"PEAK_GROWTH_MB (\S+) TOKENS (\d+) (\d+)", proc.stdout).groups()
    assert int(tokens) == 8 * 256 and int(shortest) == 256        # no sample stopped early
    assert float(growth) < 600, f"peak resident memory grew by {float(growth):.0f} MB"


def test_vllm_sampling_params_finish_reasons_and_lean_engine(chat_checkpoint, monkeypatch):
    vllm = install(monkeypatch)
    engine, tok = generation.load_engine(chat_checkpoint, "vllm", "bfloat16", seed=3, max_model_len=64)
    llm = vllm.engines[-1]
    assert llm.kwargs["logprobs_mode"] == "processed_logprobs" and llm.kwargs["max_model_len"] == 64
    im_end, endoftext = qwen_eos(tok)
    body = tok.encode(" The answer is 5.", add_special_tokens=False)
    llm.scripted = [[(body + [endoftext], "stop"), (body, "length")], [(body, "abort"), (body, "repetition")]]
    prompts = [build_prompt(q, tok) for q in QUESTIONS[:2]]
    out = generation.generate(engine, tok, prompts, n=2, max_new_tokens=16, seed=7)
    calls = [p.kwargs for p in vllm.sampling_params]
    assert [c["seed"] for c in calls] == [7, 9]                  # seed + i * n: no two samples share a seed
    for c in calls:
        assert set(c["stop_token_ids"]) == {im_end, endoftext}   # both, though the checkpoint names one
        assert (c["logprobs"], c["detokenize"], c["max_tokens"], c["n"]) == (0, False, 16, 2)
    assert [s.finish_reason for q in out for s in q] == ["stop", "length", "abort", "repetition"]
    stopped = out[0][0]
    assert stopped.token_ids[-1] == endoftext and stopped.text == tok.decode(body)   # the EOS kept, not in text
    # the EOS as text beside it: the authors grade the decode with special tokens, which is text + stop_text
    assert stopped.stop_text == "<|endoftext|>" and out[0][1].stop_text == ""
    assert stopped.text + stopped.stop_text == tok.decode(stopped.token_ids, skip_special_tokens=False)
    assert len(stopped.logprobs) == len(stopped.token_ids) and max(stopped.logprobs) < 0
    assert stopped.entropy == [-lp for lp in stopped.logprobs]      # vLLM's one-sample estimate
    scores = [[1.0, 0.0], [0.0, 0.0]]
    assert measure.benchmark_metrics(out, scores)["truncated"] == 0.25    # abort and repetition are not truncations

    # a lean engine: built without processed log-probs, asked for none
    lean, _ = generation.load_engine(chat_checkpoint, "vllm", "bfloat16", logprobs=False)
    assert "logprobs_mode" not in vllm.engines[-1].kwargs and not lean.logprobs
    out = generation.generate(lean, tok, prompts, n=2, max_new_tokens=4, logprobs=False)
    assert all(s.logprobs is None and s.entropy is None and len(s.token_ids) <= 4 for q in out for s in q)
    with pytest.raises(ValueError, match="logprobs=False"):
        generation.generate(lean, tok, prompts, n=2, max_new_tokens=4)



# ---------------------------------------------------------------- the evaluation run: prompt length
def write_benchmark(root, questions):
    rows = [{"data_source": source, "prompt": [{"role": "user", "content": q}],
             "reward_model": {"ground_truth": "5"}} for source, q in questions]
    (root / "bench").mkdir()
    (root / "bench" / "valid.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root / "bench"


def test_evaluation_drops_and_counts_prompts_over_max_prompt_len(chat_checkpoint, tmp_path):
    bench = write_benchmark(tmp_path, [("math", QUESTIONS[0]), ("math", LONG), ("math", QUESTIONS[1]),
                                       ("aime", LONG + " Twice.")])
    tok = transformers.AutoTokenizer.from_pretrained(chat_checkpoint)
    lengths = {ex.question: len(generation.encode(tok, ev.example_prompt(ex, tok, "paper")))
               for exs in ev.load_benchmarks(str(bench)).values() for ex in exs}
    limit = max(lengths[q] for q in QUESTIONS[:2])             # the short ones fit exactly, the long ones do not
    assert min(lengths[LONG], lengths[LONG + " Twice."]) > limit
    out = tmp_path / "eval"
    ev.main(["--model", chat_checkpoint, "--data", str(bench), "--out", str(out), "--engine", "hf", "--n_samples", "2",
             "--max-new-tokens", "4", "--grader-workers", "1", "--max-prompt-len", str(limit)])
    result = json.loads((out / "results.json").read_text())
    assert result["long_prompts_dropped"] == {"math": 1, "aime": 1}
    assert {b: m["questions"] for b, m in result["benchmarks"].items()} == {"math": 2}   # aime had nothing left
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert sorted({r["question"] for r in records}) == sorted(QUESTIONS[:2])


def test_vllm_evaluation_needs_room_for_the_longest_prompt_and_response(chat_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(generation, "vllm_device", lambda: None)   # also where vLLM's CPU build is installed
    bench = write_benchmark(tmp_path, [("math", QUESTIONS[0])])
    argv = ["--model", chat_checkpoint, "--data", str(bench), "--out", str(tmp_path / "o"), "--engine", "vllm",
            "--max-prompt-len", "1024", "--max-new-tokens", "8192"]
    with pytest.raises(ValueError) as exc:                     # main raises; run_script prints it as one line
        ev.main(argv + ["--max-model-len", "9215"])
    assert "--max-prompt-len 1024 + --max-new-tokens 8192 is over --max-model-len 9215" in str(exc.value)
    with pytest.raises(ValueError) as exc:                     # 9216 fits: it gets as far as loading vLLM
        ev.main(argv + ["--max-model-len", "9216"])
    assert "needs CUDA and the vllm package" in str(exc.value)


def test_generation_says_how_far_it_is_where_no_bar_is_drawn(chat_checkpoint, capsys, monkeypatch):
    """Output to a file or a pipe (as under pytest): a line with samples done, samples/s, tokens/s and ETA."""
    engine, tok = generation.load_engine(chat_checkpoint, "hf")
    monkeypatch.setattr(generation.Progress.__init__, "__defaults__", (False, 0.0))      # a line every batch
    prompts = [build_prompt(q, tok) for q in QUESTIONS[:3]]
    out = generation.generate(engine, tok, prompts, n=2, max_new_tokens=6, seed=5, batch_size=1)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("generating: ")]
    assert [line.split(",")[0] for line in lines] == ["generating: 2/6 samples", "generating: 4/6 samples",
                                                     "generating: 6/6 samples"]
    assert all(re.search(r"[\d.]+ samples/s, \d+ tokens/s, ETA \d+s$", line) for line in lines)
    assert lines[-1].endswith("ETA 0s") and len(out) == 3
