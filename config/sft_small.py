# CurioSFT on 1-2 GPUs: Qwen2.5-Math-1.5B with the paper's SFT recipe and lengths. Use after
# config/sft_paper.py:
#   torchrun --nproc_per_node 2 sft.py config/sft_paper.py config/sft_small.py \
#       --model models/Qwen/Qwen2.5-Math-1.5B-16k --train_file data/curiosft/train.parquet \
#       --loss curio
# The model's 4k context is extended to 16k as the paper's 7B base was (`python data.py download
# --model_out models --models small`), so that 1024 + 8192 tokens fit. The planner puts a CurioSFT
# step at 37.4 GiB on one 80 GB GPU and 23.1 GiB each on two (docs/memory.md).
token_budget = 18432     # the paper's 32768: 18k tokens per micro-batch, one GPU under 40 GiB
loss_chunk = 2048        # the paper's 4096: halves the [chunk, vocab] logits
