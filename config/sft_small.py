# CurioSFT on 1-2 GPUs: the paper's SFT recipe (config/sft_paper.py) for Qwen2.5-Math-1.5B with its context extended
# to 16k as the paper's 7B base model was (`python data.py download --model_out models --models small`), so that the
# paper's 1024 + 8192 tokens fit. Only the micro-batch and the logits chunk differ from the paper's preset: the
# planner puts its step at 37.4 GiB on one GPU, 23.1 GiB each on two (docs/memory.md).
# torchrun --nproc_per_node 2 sft.py config/sft_small.py --model models/Qwen/Qwen2.5-Math-1.5B-16k \
#     --train_file data/curiosft/train.parquet --loss curio --out_dir out/sft_small_curio
epochs = 3
global_batch = 256
max_prompt_len = 1024
max_response_len = 8192
lr = 1e-5
warmup_steps = 60
lr_horizon = 1
min_lr_ratio = 0.0
adam_beta2 = 0.999
loss_norm = "batch_token_mean"
system_prompt = "paper"
bf16 = True
grad_ckpt = True
token_budget = 18432     # the paper's preset: 32768; two 9k sequences per micro-batch keep one GPU under 40 GiB
loss_chunk = 2048        # the paper's preset: 4096; halves the [chunk, vocab] logits
save_every = 20
log_every = 1
