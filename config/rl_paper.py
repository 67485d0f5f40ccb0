# The paper's RL stage (App. E, Table 6): GRPO from an SFT checkpoint on OpenR1-Math-46K, 8 GPUs.
# torchrun --nproc_per_node 8 rl.py config/rl_paper.py --model out/sft/step_000540 \
#     --train_file TRAIN.parquet
# config/rl_authors.py is what the authors' scripts ran instead; docs/recipes.md tables the
# differences.
steps = 500
prompts_per_step = 128       # Table 6 "Batch Size"
rollouts = 8                 # Table 6 "Rollout Numbers"
mini_batch = 64              # Table 6 "Mini Batch Size": 2 optimiser steps per batch
lr = 1e-6
clip_low = 0.2
clip_high = 0.28
policy_loss = "ppo_clip"     # GRPO with DAPO's clip-higher
clip_ratio_c = None          # no dual clip: the paper names none (verl's vanilla caps at -3A, A<0)
# not said: DAPO's mean over the mini-batch's tokens, not verl's per micro-batch
loss_agg = "token_mean"
reward = "paper"             # App. E: math-verify on the text after </think>
temperature = 1.0
top_p = 0.95
max_prompt_len = 1024
max_response_len = 8192
system_prompt = "paper"      # Table 7
bf16 = True
grad_ckpt = True
micro_batch = 4              # sequences per forward per GPU (up to 4 x 9216 tokens); lower on OOM
loss_chunk = 4096
engine = "vllm"
# vLLM's share of each GPU while it generates (weights + KV cache). It sleeps while the trainer
# works, and the trainer then keeps its shards only: 7.6B parameters x 12 bytes / 8 GPUs = 11 GB,
# plus 0.7 x 80 GB = 67 GB. An estimate, not a measurement: lower it on an out-of-memory error at
# wake_up.
gpu_memory_utilization = 0.7
grader_workers = 8
save_every = 50
# Validation while training: the text names none, so off; --eval_every 20 validates as the authors'
# scripts do (config/rl_authors.py), here at Sec. 5.1's temperature 0.6, top_p 0.95, one sample per
# question, graded as App. E says
eval_every = 0
eval_file = "data/curiosft/validation.parquet"
