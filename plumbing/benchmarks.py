"""Plumbing (a reader of the method may skip this file): the paper's benchmarks as its Table 2
groups them. evaluate.py and compare's statistics average each group; report.py's tables put the
columns in this order."""
ID_BENCHMARKS = ["aime", "aime25", "amc", "math", "minerva", "olympiad_bench"]  # Table 2, left
OOD_BENCHMARKS = ["gpqa", "mmlu_pro", "arc_c"]  # Table 2, right: multiple choice
