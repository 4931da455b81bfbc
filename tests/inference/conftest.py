"""Shared setup for the inference tests."""

import torch

# The tiny model gains nothing from intra-op threads, and on a shared 2-core machine OpenMP workers
# spinning against other processes make every small op ~10x slower.
torch.set_num_threads(1)
