"""bench/dryrun.py, the half of tests/test_dryrun.py that runs beside it: GRPO with the paper's RL preset at 7B on 8
simulated GPUs, and the flags sft.py refuses, refused alike."""
import subprocess
import sys

from test_dryrun import DRYRUN, ROOT, library, run_paper_presets  # noqa: F401 (library: a fixture)


def test_the_paper_rl_preset_runs_on_8_simulated_gpus_within_10_percent_of_the_plan(library, tmp_path):
    """GRPO with the paper's RL preset, its validation included (rl.py's, with its rollout engine)."""
    r = run_paper_presets(["rl_paper"], tmp_path)["rl_paper"]
    assert r["stage"] == "rl" and r["validations"] == 2


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
