"""The extra `loss-log`: wraps whatever train step was chosen before it (the backend's fast step, Keras's own,
or an earlier extra's) and records what really went through it."""

import math

from mtbench import Extra, WrappingStep


class LossLogStep(WrappingStep):
    """Calls the step it wraps and records each step's loss and every `finalize`. `WrappingStep` passes on
    `finalize` and whether the inner step trains through Keras's compiled function."""

    def __init__(self, inner, log):
        super().__init__(inner)
        self.log = log  # the extra's state for this run, kept in run.extras_state["loss-log"]
        self.name = f"{inner.name}+loss-log"

    def __call__(self, x, y, sample_weight):
        logs = self.inner(x, y, sample_weight)
        # The loss is the batch's, computed before the update; float() reads it from the device. The built-in
        # fast steps already return Python floats, so this adds nothing to the timed step.
        self.log["losses"].append(float(logs["loss"]))
        return logs

    def finalize(self):
        # A step that keeps the weights outside the Keras variables (the JAX fast step) writes them back in its
        # finalize, and evaluation reads the Keras variables: always pass it on.
        self.log["finalize_calls"] += 1
        super().finalize()


class LossLog(Extra):
    name = "loss-log"
    description = "wraps the train step and records each step's loss and the step it wrapped"
    backends = ("jax", "torch")

    def make_train_step(self, run, model, step):
        log = {"wrapped_step": step.name, "losses": [], "finalize_calls": 0}
        run.extras_state[self.name] = log
        return LossLogStep(step, log)

    def record(self, run):
        """Facts, not intentions: how many steps really went through the wrapper and with which losses (null
        where a loss was not finite, as in the result's history)."""
        log = run.extras_state[self.name]
        losses = [loss if math.isfinite(loss) else None for loss in log["losses"]]
        return {"wrapped_step": log["wrapped_step"], "steps": len(losses), "losses": losses,
                "finalize_calls": log["finalize_calls"]}
