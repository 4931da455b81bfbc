"""RL math and trainer plumbing as small pieces: advantages, losses, micro-batching, checkpoints.

Pure tensor functions live in `advantages.py` and `losses.py` (in the manner of verl's core_algos);
`batching.py` turns batch shards into padded micro-batches and scores trained tokens; `checkpoint.py`
reads and writes trainer checkpoints and policy directories. The recipe that uses them is stages/train.py.
"""
