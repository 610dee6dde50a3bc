"""A Keras callback that counts the batches of a training run and appends one JSON line to the example's log
when training ends. keras is imported inside `batch_counter`, which only the `mtbench_keras_callbacks` hook
calls, after mtbench has imported keras on the run's backend."""

import math

from mtbench_example.jsonl_reporter import append_line


def batch_counter(config, path):
    """A new callback for the run of `config` (mtbench's run configuration: backend, extras, steps, out, ...)."""
    import keras

    class BatchCounter(keras.callbacks.Callback):
        """mtbench calls on_train_begin, then on_train_batch_begin(step) and on_train_batch_end(step, logs) around
        every train step (`step` counts from 1 over the whole run, not per epoch; `logs` holds the batch's `loss`
        and `accuracy` as floats), then on_train_end. None of these calls is inside a step's timing."""

        def __init__(self):
            super().__init__()
            self.begun, self.steps, self.losses = 0, [], []

        def on_train_begin(self, logs=None):
            self.begun += 1

        def on_train_batch_end(self, batch, logs=None):
            self.steps.append(batch)
            loss = logs["loss"]
            self.losses.append(loss if math.isfinite(loss) else None)

        def on_train_end(self, logs=None):
            append_line(path, {"kind": "callback", "backend": config.backend, "out": config.out,
                               "train_begin_calls": self.begun, "batches": len(self.steps),
                               "steps": self.steps, "losses": self.losses})

    return BatchCounter()
