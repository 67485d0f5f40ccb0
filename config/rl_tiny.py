# A tiny CPU setting (tests, the toy demo): a few short rollouts per step, float32, HF generate, no
# checkpointing.
# python rl.py config/rl_tiny.py --model out/sft_tiny/step_000010 --train_file toy.jsonl
steps = 20
prompts_per_step = 8
rollouts = 4
mini_batch = 4               # 2 optimiser steps per step, as in the paper
micro_batch = 8
max_prompt_len = 512
max_response_len = 64
lr = 1e-4
bf16 = False
grad_ckpt = False
loss_chunk = 256
engine = "hf"
gen_batch_size = 8
grader_workers = 2
save_every = 0
