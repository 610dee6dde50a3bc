"""Benchmarks of mtbench against hand-written native baselines (Flax + optax, plain PyTorch)."""
