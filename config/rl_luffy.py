# Table 3's LUFFY (arXiv:2504.14945) as its authors' exp_scripts/train.sh runs it
# (github.com/ElliottYan/LUFFY at 01f4ae0; hybrid.py cites the code behind each flag), on 8 GPUs:
# torchrun --nproc_per_node 8 rl.py config/rl_luffy.py --train_file openr1.parquet
# The SFT rows' targets are the expert responses. The paper's LUFFY row matches LUFFY's published
# numbers (their README, lines 297 and 314) in 8 of 9 columns: docs/recipes.md, Table 3.
model = "Elliott/Qwen2.5-Math-7B-16k-think"   # line 18
hybrid = "luffy"             # lines 70-80: the whole trace first in each group, p/(p+0.1)
adv_std = False              # line 82: grpo_use_std=False, A = r - mean(r)
loss_agg = "rank_sum_over_max_len"            # line 83: loss_remove_token_mean=True
loss_agg_ranks = 8           # lines 65-66: 8 GPUs, whose gradients FSDP averages
entropy_coef = 0.001         # line 59
entropy_pack_tokens = 32768  # line 41: their micro-batches, one entropy mean each
steps = 500                  # line 89 sets total_epochs=30 and no step limit; Table 6's length
prompts_per_step = 128       # line 31
rollouts = 8                 # line 54: 7 sampled + the expert's
mini_batch = 64              # line 38: 2 optimiser steps per step
lr = 1e-6                    # line 36, constant (their yaml: warmup_style constant)
temperature = 1.0            # line 51
top_p = 1.0                  # never set: verl's default
max_prompt_len = 1024        # line 33
max_response_len = 8192      # lines 34, 57
reward = "paper"             # line 85: math-verify on the text after </think> (theirs: the first)
system_prompt = "messages"   # their rows' prompts as stored, through the chat template
bf16 = True
grad_ckpt = True             # line 45
micro_batch = 4              # lines 39-41 pack up to 32768 tokens per micro-batch instead
loss_chunk = 4096
engine = "vllm"
# theirs 0.8 (line 53) with vLLM over 2 GPUs (tensor parallel, line 49); one engine per GPU
# here holds the whole model, and 0.8 leaves the trainer too little: the preflight's figure
gpu_memory_utilization = 0.7
grader_workers = 8
save_every = 50              # line 67
