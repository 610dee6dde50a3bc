"""Built-in backend plugins: Keras on JAX and on PyTorch, with the fast train steps each trains with."""
