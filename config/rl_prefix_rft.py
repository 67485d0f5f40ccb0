# Table 3's Prefix-RFT (arXiv:2507.01679), reconstructed: its repository (github.com/ZeroYuHuang/
# prefix_rft at 5f5d2a1) has the method but no training configuration (run_single_node.sh line 10
# reads a $TRAIN_CONFIG defined nowhere), so each value says where it comes from: "code" (a file
# under recipe/prefix_rft/, its line; yaml: config/prefix_rft_trainer.yaml, verl's template the
# run configuration would override), "paper" (its published description), or "chosen here", with
# the reason; where the three hybrids' papers share a setup, LUFFY's script (config/rl_luffy.py).
# torchrun --nproc_per_node 8 rl.py config/rl_prefix_rft.py --train_file openr1.parquet
model = "Elliott/Qwen2.5-Math-7B-16k-think"   # chosen here: LUFFY's model (same base, 8192 tokens)
hybrid = "prefix_rft"        # code and paper: the method (hybrid.py cites its functions)
prefix_rollouts = 1          # chosen here: 1 of 8 continues a prefix, as LUFFY's 1 expert trace
prefix_schedule = "cosine_decay"              # paper: a cosine decay (global_step.py 148-186)
prefix_low_start = 0.95      # paper: from 95%; both bounds (chosen here: the ratio is the schedule)
prefix_low_end = 0.05        # paper: to 5%
prefix_high_start = 0.95     # paper, as the lower bound
prefix_high_end = 0.05       # paper
prefix_warmup_ratio = 0.0    # code: CosineDecayController's default (global_step.py 149)
prefix_schedule_steps = 0    # chosen here: the decay spans the run (the --steps it starts with)
prefix_entropy_mask = 0.8    # paper: the top 20% of prefix tokens by entropy keep their advantage
adv_std = False              # paper: Dr. GRPO (code: core_algos.py 262-308 has no std)
loss_agg = "seq_sum_over_max_len"   # paper: Dr. GRPO; code: agg_loss "dr_grpo" (core_algos.py
#   533-536) with one sequence per micro-batch (micro_batch below)
policy_loss = "ppo_clip"     # code: compute_policy_loss (core_algos.py 604-618)
clip_low = 0.2               # code: yaml line 45
clip_high = 0.2              # code: yaml line 46
clip_ratio_c = 3.0           # code: yaml line 47, core_algos.py 553; the prefix tokens take it too
#   (lines 620-630, enable_clip; chosen here: enabled, its value is unset)
entropy_coef = 0.0           # chosen here: yaml line 50's 0.001 is verl's template; rl.py's bonus
#   is LUFFY's token-mean-per-micro-batch one, which needs --loss_agg rank_sum_over_max_len
steps = 500                  # chosen here: LUFFY's (yaml line 224: total_epochs 30, no step limit)
prompts_per_step = 128       # chosen here: LUFFY's (yaml line 9's 1024 is the gsm8k template's)
rollouts = 8                 # paper setup shared with LUFFY: 8 rollouts (7 unprefixed + 1 here)
mini_batch = 64              # chosen here: LUFFY's, 2 optimiser steps per step
lr = 1e-6                    # code: yaml line 61, constant (line 66)
weight_decay = 0.01          # code: yaml line 68
grad_clip = 1.0              # code: yaml line 42
temperature = 1.0            # code: yaml line 94
top_p = 1.0                  # code: yaml line 96
max_prompt_len = 1024        # chosen here: LUFFY's (yaml line 7's 512 is the template's)
max_response_len = 8192      # paper setup shared with LUFFY; prefix + continuation, cut to it
reward = "paper"             # chosen here: math-verify after </think>, as LUFFY's preset
system_prompt = "messages"   # chosen here: the rows' prompts through the chat template (code:
#   rl_dataset.py 312, apply_chat_template)
bf16 = True                  # code: yaml line 101, bf16 rollouts
grad_ckpt = True             # code: yaml line 30
micro_batch = 1              # chosen here (theirs is unset): one sequence per micro-batch makes
#   agg_loss "dr_grpo" Dr. GRPO's mean over sequences, and the entropy rule rank each prefix alone
loss_chunk = 4096            # chosen here: memory only, the same result
engine = "vllm"              # code: yaml line 91
gpu_memory_utilization = 0.7  # chosen here: one engine per GPU (yaml: 0.5 over 2 GPUs, 102, 107)
grader_workers = 8           # chosen here: host processes, the same result
save_every = 50              # chosen here: LUFFY's (yaml line 234: -1, never)
