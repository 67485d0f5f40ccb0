# The paper's SFT run (App. E, Table 5): Qwen2.5-Math-7B (16k context) on OpenR1-Math-46K, 8 GPUs.
# torchrun --nproc_per_node 8 sft.py config/sft_paper.py --model MODEL_DIR \
#     --train_file TRAIN.parquet --loss curio
# config/sft_authors.py is what the authors' scripts ran instead; docs/recipes.md tables the
# differences.
epochs = 3
global_batch = 256
max_prompt_len = 1024
max_response_len = 8192
lr = 1e-5
warmup_steps = 60
lr_horizon = 1                   # Table 5: cosine, over the run
min_lr_ratio = 0.0               # the paper names no floor
# the paper names no optimiser settings: verl's default, which produced its numbers
adam_beta2 = 0.999
loss_norm = "batch_token_mean"   # not in the paper: each trained token of a step weighs the same
system_prompt = "paper"          # Table 7 (App. E: "for both SFT and RL training")
bf16 = True
grad_ckpt = True
token_budget = 32768   # tokens per GPU micro-batch (packed: sequences end to end); lower on OOM
loss_chunk = 4096
save_every = 20
log_every = 1
# Validation while training: the text names none (its curves are evaluate.py on checkpoints), so
# off; --eval_every 59 validates once an epoch as the authors' scripts do (config/sft_authors.py),
# here at Sec. 5.1's temperature 0.6, top_p 0.95, one sample per question, graded as App. E says
eval_every = 0
eval_file = "data/curiosft/validation.parquet"
