# PSFT as the authors ran it: old log-probs per batch of 64, 8 optimiser steps on mini-batches of 8.
# Use after config/sft_paper.py:  sft.py config/sft_paper.py config/sft_psft.py --loss psft ...
global_batch = 64
updates_per_batch = 8
