"""Training infrastructure shared by the recipes: data order, checkpoints, logging, DDP.

Resuming is exact: the data order is a function of (seed, epoch), per-example randomness is seeded by
the example's global index, and the checkpoint holds the weights (safetensors), optimizer and
scheduler state, every rank's torch RNG state (dropout) and the data position. So after a kill -9, a
resumed run sees exactly the batches an uninterrupted run would have seen: none lost, none repeated.
"""
