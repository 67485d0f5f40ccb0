"""Plumbing: what the stage scripts need and a reader of the method may skip.

    cli.py          the command line (flags from the settings dataclasses, presets) and the one-line error style
    distributed.py  the process group (torchrun, or one process as a world of one)
    models.py       loading, FSDP2 sharding, gathering full weights, the optimiser
    checkpoints.py  Hugging Face checkpoint directories plus the trainer state, with digests, for an exact resume
    run_dir.py      a run's output directory: one run per directory, recorded settings, the log
    generation.py   sampling responses: vLLM on GPU, HF generate anywhere; vLLM's sleep, wake and weight sync
    grading.py      is a response right: the paper's rule or the authors' grader, in worker processes
    report.py       tables and plots of evaluation results

The method itself is at the top level: curio_loss.py, sft.py, rl.py, evaluate.py, data.py, chunked_logits.py.
"""
