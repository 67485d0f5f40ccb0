# GRPO on 1-2 GPUs: the paper's RL recipe (Table 6) from a Qwen2.5-Math-1.5B SFT checkpoint. Use
# after config/rl_paper.py:
#   torchrun --nproc_per_node 2 rl.py config/rl_paper.py config/rl_small.py \
#       --model out/sft_small_curio/step_000540 --train_file data/curiosft/train.parquet
# The planner puts the run at 56.8 GiB on one 80 GB GPU and 48.2 GiB each on two, both while
# generating (docs/memory.md).
loss_chunk = 2048                # the paper's 4096
gpu_memory_utilization = 0.5     # the paper's 0.7 is beside 1/8 of a 7B trainer; this, a whole 1.5B
