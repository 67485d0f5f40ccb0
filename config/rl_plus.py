# Table 3's RL-PLUS (arXiv:2508.00222) as its authors' exp_scripts/train_RL-PLUS.sh runs it
# (github.com/YihongDong/RL-PLUS at eb4aa4d; hybrid.py cites the code behind each flag), on 8 GPUs:
# torchrun --nproc_per_node 8 rl.py config/rl_plus.py --train_file openr1.parquet
# Their code base is LUFFY's and so is every setting but the expert tokens' loss.
model = "Elliott/Qwen2.5-Math-7B-16k-think"   # line 17 names a local Qwen2.5-Math-7B-16k-think
hybrid = "rl_plus"           # lines 72-82: the whole trace first in each group, off_policy_strategy
adv_std = False              # line 84: grpo_use_std=False, A = r - mean(r)
loss_agg = "rank_sum_over_max_len"            # line 85: loss_remove_token_mean=True
loss_agg_ranks = 8           # lines 67-68: 8 GPUs, whose gradients FSDP averages
entropy_coef = 0.001         # line 61
entropy_pack_tokens = 32768  # line 43: their micro-batches, one entropy mean each
steps = 500                  # line 91 sets total_epochs=30 and no step limit; Table 6's length
prompts_per_step = 128       # line 33
rollouts = 8                 # line 56: 7 sampled + the expert's
mini_batch = 64              # line 40: 2 optimiser steps per step
lr = 1e-6                    # line 38, constant
temperature = 1.0            # line 53
top_p = 1.0                  # never set: verl's default
max_prompt_len = 1024        # line 35
max_response_len = 8192      # lines 36, 59
reward = "paper"             # line 87: math-verify on the text after </think> (theirs: the first)
system_prompt = "messages"   # their rows' prompts as stored, through the chat template
bf16 = True
grad_ckpt = True             # line 47
micro_batch = 4              # lines 41-43 pack up to 32768 tokens per micro-batch instead
loss_chunk = 4096
engine = "vllm"
# theirs 0.8 (line 55) with vLLM over 2 GPUs (tensor parallel, line 51); one engine per GPU
# here holds the whole model, and 0.8 leaves the trainer too little: the preflight's figure
gpu_memory_utilization = 0.7
grader_workers = 8
save_every = 50              # line 69
