# The paper's evaluation (Sec. 5.1): avg@8 (one sample per MMLU-Pro question) at temperature 0.6,
# top_p 0.95.
# python evaluate.py config/eval_paper.py --model CKPT --data BENCHMARK_DIR \
#     --out out/eval/NAME --name NAME
# config/eval_authors.py is what the authors' scripts ran instead; docs/recipes.md tables the
# differences.
n_samples = 8
n_mmlu_pro = 1
temperature = 0.6
top_p = 0.95
max_new_tokens = 8192        # "keep other settings consistent with the training" (Sec. 5.1)
system_prompt = "paper"      # Table 7, as in training
grading = "paper"            # only the text after </think>, as the RL reward (App. E)
