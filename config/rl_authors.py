# The RL run of the authors' scripts/2_rl.sh (github.com/HaoooWang/CurioSFT at 5a77394), where it
# differs from the paper's text (config/rl_paper.py); docs/recipes.md tables every difference with
# its source.
# torchrun --nproc_per_node 8 rl.py config/rl_authors.py --model out/sft_authors/step_000540 \
#     --train_file data/curiosft/train.parquet
steps = 500                          # Table 6; 2_rl.sh: total_epochs=12 (line 71), no step limit
prompts_per_step = 128               # line 29
rollouts = 8                         # line 58
mini_batch = 32                      # line 38: 4 optimiser steps per batch
lr = 1e-6                            # line 36
clip_low = 0.2                       # never set: verl's clip_ratio, both sides (dp_actor.py l. 471)
clip_high = 0.2
# lines 78-79: custom_loss with algo_type="rl" (core_algos.py lines 779-783)
policy_loss = "custom_loss_rl"
loss_agg = "seq_sum_over_max_len"    # core_algos.py line 783, micro-batches of 1 sequence (line 39)
# line 81: reward_impl_version=1, with the boxed grader (reward_manager.py line 58)
reward = "authors_rl"
temperature = 1.0                    # line 56
# never set: verl's default (recipe/curio_sft/config/rollout/rollout.yaml line 14)
top_p = 1.0
max_prompt_len = 1024                # lines 30, 32
max_response_len = 8192              # line 18
system_prompt = "messages"           # the rows' prompts as stored (train_dataset.py line 295)
offload = True                       # lines 48-49
bf16 = True
grad_ckpt = True                     # line 47
micro_batch = 4
loss_chunk = 4096
engine = "vllm"
gpu_memory_utilization = 0.8         # line 57 (offloaded, the trainer keeps little on the GPU)
grader_workers = 8
save_every = 50
# Validation while training (lines 46, 53-54, 70, 74): the validation file sampled once per question
# at temperature 0.6 every 20 steps, with its entropy, graded as their evaluation grades
# (main_ppo.py line 218: reward_impl_version=0)
eval_every = 20
eval_file = "data/curiosft/validation.parquet"
eval_n = 1
eval_temperature = 0.6
eval_top_p = 1.0                     # never set: verl's val_kwargs.top_p (rollout.yaml line 105)
eval_grading = "authors"
