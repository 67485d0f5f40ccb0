# A tiny CPU setting (tests, the toy demo): small batches, short sequences, float32, no
# checkpointing.
epochs = 1
global_batch = 8
token_budget = 512
max_prompt_len = 512
max_response_len = 256
lr = 1e-3
warmup_steps = 2
bf16 = False
grad_ckpt = False
loss_chunk = 64
log_every = 1
adam_beta2 = 0.95   # nanoGPT's: the toy demo was tuned with it (the 7B presets use verl's 0.999)
