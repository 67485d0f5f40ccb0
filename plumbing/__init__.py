"""Plumbing: what the stage scripts need and a reader of the method may skip.

    cli.py          the command line (flags from the settings dataclasses, presets), one-line errors
    distributed.py  the process group (torchrun, or one process as a world of one)
    models.py       loading, FSDP2 sharding, gathering full weights, the optimiser
    checkpoints.py  HF checkpoint directories plus the trainer state, with digests: an exact resume
    run_dir.py      a run's output directory: one run per directory, recorded settings, the log
    generation.py   sampling: vLLM on GPU, HF generate anywhere; vLLM's sleep, wake and weight sync
    grading.py      is a response right: the paper's rule or the authors' grader, in subprocesses
    report.py       tables and plots of evaluation results
    benchmarks.py   the paper's benchmarks as Table 2 groups them (in-distribution, out-of)
    synthetic.py    stand-ins for tests, benchmarks and the demo: LLM-like logits, a tiny model dir

The method itself is at the top level: curio_loss.py, baselines.py, sft.py, rl.py, hybrid.py,
evaluate.py, data.py and chunked_logits.py. The support folders (bench/, demo/, tests/) import
it and plumbing/, never each other.
"""
