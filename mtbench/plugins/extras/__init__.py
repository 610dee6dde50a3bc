"""Built-in extras: flash attention, torch.compile, JAX data parallelism (pmap, sharded) and the TPU strategy."""
