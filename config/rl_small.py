# GRPO on 1-2 GPUs: the paper's RL recipe (config/rl_paper.py, Table 6) from a Qwen2.5-Math-1.5B SFT checkpoint
# (config/sft_small.py). Only vLLM's share of the GPU and the logits chunk differ from the paper's preset: the planner
# puts the run at 56.8 GiB on one GPU and 48.2 GiB each on two, both while generating (docs/memory.md).
# torchrun --nproc_per_node 2 rl.py config/rl_small.py --model out/sft_small_curio/step_000540 \
#     --train_file data/curiosft/train.parquet --out_dir out/rl_small_curio
steps = 500
prompts_per_step = 128
rollouts = 8
mini_batch = 64
lr = 1e-6
clip_low = 0.2
clip_high = 0.28
policy_loss = "ppo_clip"
loss_agg = "token_mean"
temperature = 1.0
top_p = 0.95
max_prompt_len = 1024
max_response_len = 8192
system_prompt = "paper"
bf16 = True
grad_ckpt = True
micro_batch = 4
loss_chunk = 2048                # the paper's preset: 4096
engine = "vllm"
gpu_memory_utilization = 0.5     # the paper's preset: 0.7, beside 1/8 of a 7B trainer; here beside all of a 1.5B
grader_workers = 8
save_every = 50
