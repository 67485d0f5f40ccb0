# The evaluation of the authors' scripts/3_eval_math.sh and 4_eval_ood_*.sh
# (github.com/HaoooWang/CurioSFT at 5a77394), where it differs from the paper's text
# (config/eval_paper.py); docs/recipes.md tables the differences.
# python evaluate.py config/eval_authors.py --model CKPT --data BENCHMARK_DIR \
#     --out out/eval/NAME --name NAME
n_samples = 8                # 3_eval_math.sh line 101, 4_eval_ood_gpqa_arc.sh line 101
n_mmlu_pro = 1               # 4_eval_ood_mmlu.sh line 100
temperature = 0.6            # line 77
# never set: verl's val_kwargs.top_p (recipe/curio_sft/config/rollout/rollout.yaml l. 105)
top_p = 1.0
max_new_tokens = 8192        # line 39
system_prompt = "messages"   # the benchmark rows' prompts as stored (train_dataset.py line 295)
grading = "authors"          # reward_impl_version=0 (line 95): the whole response is graded
max_prompt_len = 1024        # lines 53, 55: longer prompts are filtered out
