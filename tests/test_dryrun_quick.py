"""bench/dryrun.py's quick runs, moved out of tests/test_dryrun.py so that they run beside its paper presets
(--dist loadfile keeps a file on one worker): the flags sft.py refuses, refused alike, and GRPO on one simulated
GPU."""
import json
import sys

from demo.stage_process import StageProcess
from run_python import run_python
from test_dryrun import DRYRUN, tiny_model


def test_a_flag_sft_py_refuses_is_refused_alike(library, tmp_path):
    """A flag sft.py refuses, a missing preset and a GPU count that does not divide the batch: sft.py's own
    one-line errors; --compile and the compiled form, which the dry run cannot price (all at once)."""
    cases = {("config/sft_paper.py", "--loss", "curio_typo", "--gpus", "8"): "curio_typo",
             ("config/nope.py", "--gpus", "8"): "config/nope.py",
             ("config/sft_paper.py", "--gpus", "7"): "--global_batch 256 is not divisible by the number of GPUs "
                                                     "(ranks), 7",
             # torch.compile cannot run on simulated GPUs (no data): the dry run says so
             ("config/sft_paper.py", "--gpus", "8", "--compile"): "--compile: the dry run prices eager kernels",
             ("config/sft_paper.py", "--form", "compiled"): "--form compiled: the dry run prices eager"}
    procs = {argv: StageProcess([sys.executable, DRYRUN, *argv], tmp_path / f"{i}.out", {}, tmp_path / f"{i}.err")
             for i, argv in enumerate(cases)}
    for i, (argv, proc) in enumerate(procs.items()):
        code, stderr = proc.wait(timeout=300), (tmp_path / f"{i}.err").read_text()
        assert code != 0 and cases[argv] in stderr, (argv, stderr[-2000:])


def test_one_gpu_runs_as_rank_0(library, tmp_path):
    """--gpus 1, what most users try first: the dry run plays rank 0, which loads the weights on the CPU and lets
    fully_shard move them to the GPU (bench/sim_gpu.py's fsdp_moves_fake_tensors), gathers its own log record and
    writes it. GRPO here; SFT on one GPU runs in tests/test_roofline.py (the H200's configurations)."""
    model = tiny_model(tmp_path)
    out = tmp_path / "rl.json"
    done = run_python([DRYRUN, "config/rl_paper.py", "--model", model, "--max_prompt_len", "64",
                       "--max_response_len", "448", "--loss_chunk", "256", "--gpus", "1", "--json", out])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["gpus"] == 1 and r["steps_run"] == 2 and "failed" not in r and 0.9 <= r["ratio"] <= 1.1, r
    assert "step 2 " in done.stdout                                 # rank 0's log line of the second step
