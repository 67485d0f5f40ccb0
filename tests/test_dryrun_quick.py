"""bench/dryrun.py's quick runs, moved out of tests/test_dryrun.py so that they run beside its paper presets
(--dist loadfile keeps a file on one worker): the flags sft.py refuses, refused alike, and GRPO on one simulated
GPU."""
import json
import subprocess
import sys

from test_dryrun import DRYRUN, ROOT, tiny_model

def test_a_flag_sft_py_refuses_is_refused_alike(library):
    """A flag sft.py refuses, a missing preset and a GPU count that does not divide the batch: sft.py's own
    one-line errors (the three at once)."""
    cases = {("config/sft_paper.py", "--loss", "curio_typo", "--gpus", "8"): "curio_typo",
             ("config/nope.py", "--gpus", "8"): "config/nope.py",
             ("config/sft_paper.py", "--gpus", "7"): "--global_batch 256 is not divisible by the number of GPUs "
                                                     "(ranks), 7"}
    procs = {argv: subprocess.Popen([sys.executable, DRYRUN, *argv], cwd=ROOT, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for argv in cases}
    for argv, proc in procs.items():
        stderr = proc.communicate(timeout=300)[1]
        assert proc.returncode != 0 and cases[argv] in stderr, (argv, stderr[-2000:])


def test_one_gpu_runs_as_rank_0(library, tmp_path):
    """--gpus 1, what most users try first: the dry run plays rank 0, which loads the weights on the CPU and lets
    fully_shard move them to the GPU (bench/sim_gpu.py's fsdp_moves_fake_tensors), gathers its own log record and
    writes it. GRPO here; SFT on one GPU runs in tests/test_roofline.py (the H200's configurations)."""
    model = tiny_model(tmp_path)
    out = tmp_path / "rl.json"
    done = subprocess.run([sys.executable, DRYRUN, "config/rl_paper.py", "--model", str(model), "--max_prompt_len",
                           "64", "--max_response_len", "448", "--loss_chunk", "256", "--gpus", "1", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["gpus"] == 1 and r["steps_run"] == 2 and "failed" not in r and 0.9 <= r["ratio"] <= 1.1, r
    assert "step 2 " in done.stdout                                 # rank 0's log line of the second step
