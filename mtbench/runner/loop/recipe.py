"""The optimizer recipe a run trains with, stated once: the Keras optimizer is built from it, the training log
reads its learning rate from it on the host, and the hand-written references in benchmarks/ follow it."""


def optimizer_recipe(config, total_steps):
    """AdamW's settings for `config` over `total_steps`: linear warm-up from 0 to the learning rate, cosine decay
    to `alpha` of it, each gradient clipped to `clipnorm` on its own (Keras's `clipnorm`)."""
    warmup = min(config.warmup_steps, max(total_steps - 1, 0))
    return {"learning_rate": config.learning_rate, "warmup_steps": warmup,
            "decay_steps": max(total_steps - warmup, 1), "alpha": 0.1, "weight_decay": config.weight_decay,
            "beta_1": 0.9, "beta_2": 0.98, "epsilon": 1e-9, "clipnorm": 1.0}
