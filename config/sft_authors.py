# The SFT run of the authors' scripts/1_sft.sh (github.com/HaoooWang/CurioSFT at 5a77394), where it
# differs from the paper's text (config/sft_paper.py); docs/recipes.md tables every difference with
# its source.
# torchrun --nproc_per_node 8 sft.py config/sft_authors.py \
#     --model models/Hao0oWang/Qwen2.5-Math-7B-16k-think \
#     --train_file data/curiosft/train.parquet --loss curio
epochs = 3                               # 1_sft.sh line 75
global_batch = 256                       # line 29
max_prompt_len = 1024                    # lines 30, 33: longer prompts are filtered out
max_response_len = 8192                  # line 19
lr = 1e-5                                # line 37
warmup_steps = 60                        # line 38
lr_horizon = 4                           # fsdp_workers.py line 442: total_training_steps * 4
min_lr_ratio = 1e-4                      # line 39
adam_beta2 = 0.999                       # verl's default (fsdp_workers.py line 438)
loss_norm = "micro_batch_token_mean"     # a token mean per micro-batch of 2 sequences (line 43)
norm_group = 2
system_prompt = "messages"               # the rows' prompts as stored (train_dataset.py line 295)
offload = True                           # lines 52-53: parameters and optimiser state on the CPU
teacher_every = 5                        # line 91
teacher_mu = 0.99                        # line 92
bf16 = True
grad_ckpt = True                         # line 51
token_budget = 32768
loss_chunk = 4096
save_every = 20
log_every = 1
# Validation while training (lines 50, 57-58, 62, 74, 78): the validation file sampled once per
# question at temperature 0.6 every 59 steps (once an epoch), with its entropy, graded as their
# evaluation grades (main_ppo.py line 218: reward_impl_version=0)
eval_every = 59
eval_file = "data/curiosft/validation.parquet"
eval_n = 1
eval_temperature = 0.6
eval_top_p = 1.0                         # never set: verl's val_kwargs.top_p (rollout.yaml l. 105)
eval_grading = "authors"
gpu_memory_utilization = 0.8             # line 61: the validation engine's share
