"""Training: takes a built model, its train step and the batches, and gives trained weights with a step history
timed honestly, plus checkpoints to resume from, a stop on signals or divergence, and the target-quality record."""
