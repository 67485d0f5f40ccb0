# The paper's SFT run (App. E, Table 5): Qwen2.5-Math-7B (16k context) on OpenR1-Math-46K, 8 GPUs.
# torchrun --nproc_per_node 8 sft.py config/sft_paper.py --model MODEL_DIR --train_file TRAIN.parquet --loss curio
epochs = 3
global_batch = 256
max_prompt_len = 1024
max_response_len = 8192
lr = 1e-5
warmup_steps = 60
bf16 = True
grad_ckpt = True
token_budget = 32768   # padded tokens per micro-batch per GPU (two to four 8k sequences); lower it on OOM
loss_chunk = 4096
save_every = 20
log_every = 1
