# Table 3's "Vanilla GRPO": the paper's RL stage (config/rl_paper.py, Table 6) from the base model,
# with no SFT stage before it. Give this preset after the paper's:
# torchrun --nproc_per_node 8 rl.py config/rl_paper.py config/rl_vanilla.py --train_file TRAIN.pq
# The base with its context extended to 16k, as the authors' scripts fetch it: 8192-token responses
# do not fit Qwen2.5-Math-7B's 4k context.
model = "Hao0oWang/Qwen2.5-Math-7B-16k-think"
