"""Built-in model families: mtbench's own Transformer and pretrained MarianMT checkpoints."""
